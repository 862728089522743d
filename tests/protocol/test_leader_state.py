"""The leader state message's bounds, and how `powerd limit` reads one (issue 36)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from powerd.cli.leader_states import Seen, verdict
from powerd.cli.limit_wait import Outcome
from powerd.leadership.state_report import StateReport, levels_over, node_counts
from powerd.protocol import LeaderState, ProtocolError, SiteLimit, decode, encode
from powerd.site_limits.limits import SiteLimits
from tests.support.keys import SIGNER

STATE = {
    "v": 1, "role": "controller", "name": "ctl-a", "epoch": 7, "ts": 1795320426.0,
    "limit": {"operator": "grid-desk", "ts": 1795320400.0, "seq": 1795320400000,
              "limit_w": 120000000.0, "starts_ts": 1795320400.0, "expires_ts": 1795321300.0,
              "in_force": True},
    "refused": {"ts": 1795320300.0, "seq": 1795320300000, "reason": "not newer"},
    "nodes": {"controlled": 20730, "failsafe": 2, "local": 0, "stale": 4},
    "over_limit": {"site": 0, "row": 0, "rack": 1},
}  # fmt: skip


def with_(path: tuple[str, ...], value: object) -> bytes:
    state = json.loads(json.dumps(STATE))
    node = state
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return json.dumps(state).encode()


def test_a_full_state_round_trips() -> None:
    state = decode(LeaderState, json.dumps(STATE))
    assert json.loads(encode(state)) == STATE


@pytest.mark.parametrize(
    "path, value",
    [
        (("role",), "agent"),
        (("epoch",), -1),
        (("name",), "bad name"),
        (("nodes", "stale"), -1),
        (("over_limit", "rack"), 1.5),
        (("limit", "limit_w"), 0.0),
        (("refused", "reason"), "x" * 301),
        (("nodes",), {"controlled": 1}),  # every count, always
    ],
)
def test_out_of_bounds_states_are_refused(path: tuple[str, ...], value: object) -> None:
    with pytest.raises(ProtocolError):
        decode(LeaderState, with_(path, value))


def test_the_verdict_is_by_ts_and_seq() -> None:
    state = decode(LeaderState, json.dumps(STATE))
    found = verdict(state, 1795320400.0, 1795320400000)
    assert found is not None and found[0] == "confirmed" and "120,000.0 kW" in found[1]
    assert verdict(state, 1795320300.0, 1795320300000) == ("refused", "not newer")
    assert verdict(state, 1795320400.0, 1) is None  # same ts, another message


def test_a_refusal_of_the_limit_held_coming_back_is_not_remembered() -> None:
    """A retained copy of the held limit, redelivered on a reconnect, is refused as not
    newer: the state must not then say the operator's confirmed limit was refused."""
    held = SiteLimit(v=1, operator="o", seq=5, ts=10.0, limit_w=1e3, starts_ts=10, expires_ts=20)
    limits = SiteLimits()
    assert limits.take(held) is None
    report = StateReport("t", SIGNER, "controller", "ctl-a")
    assert limits.take(held) is not None  # refused: not newer
    report.refuse(held, "not newer", limits.holds(held))
    assert report.refused is None
    older = SiteLimit(v=1, operator="o", seq=4, ts=9.0, limit_w=1e3, starts_ts=9, expires_ts=20)
    assert limits.take(older) is not None
    report.refuse(older, "not newer", limits.holds(older))
    assert report.refused is not None and report.refused.seq == 4


def test_counts_by_mode_and_level() -> None:
    counts = node_counts({"controlled": 1, "failsafe": 2, "local": 3, "stale": 4})
    assert (counts.controlled, counts.failsafe, counts.local, counts.stale) == (1, 2, 3, 4)
    level = np.array([0, 1, 2, 2, 3])
    over = levels_over(level, np.array([5.0, 5, 5, 1, 9]), np.array([6.0, 4, 4, 4, 1]))
    assert (over.site, over.row, over.rack) == (0, 1, 1)


def test_the_operator_is_told_why() -> None:
    state = decode(LeaderState, json.dumps(STATE))
    seen = Seen("powerd/v1/c/controller/state", state, verified=False)
    args = ("site limit of 9 kW", "mqtt://b:1883", "powerd/v1/c/operator/site-limit", "KEYID")
    assert "(unverified" in Outcome("confirmed", "x", seen).text(*args)
    assert "REFUSED by controller ctl-a (epoch 7): why" in Outcome("refused", "why", seen).text(
        *args
    )
    timeout = Outcome("timeout", "", None, 2.0).text(*args)
    assert "NOT confirmed within 2 s" in timeout and "KEYID" in timeout
    assert "no leader state seen at all" in timeout
    denied = Outcome("denied", "Not authorized").text(*args)
    assert "Not authorized" in denied and "may not publish" in denied
    assert not Outcome("timeout").ok and Outcome("sent").ok
