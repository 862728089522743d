"""NodeViews on its own: telemetry and statuses in, per-node arrays and belief out."""

from __future__ import annotations

import numpy as np

from powerd.controller.counters import CycleCounters
from powerd.controller.inbox import Waiting
from powerd.controller.node_views import CAP_SETTLE_S, PLAUSIBLE_TO_CLEAR, NodeViews
from powerd.protocol import Status
from tests.controller.controller_parts import Parts, parts
from tests.controller.test_controller_core import (
    CAP_MAX_W,
    FAILSAFE_W,
    WALL0,
    telemetry_payload,
)


def views_of(p: Parts) -> NodeViews:
    return NodeViews(p.tree, p.settings, p.clock, p.log_once, p.reject)


def take(
    views: NodeViews, p: Parts, node: str, payload: bytes, counters: CycleCounters | None = None
) -> list:
    server = p.tree.server_ordinal[node]
    batch = [Waiting(server, payload, p.clock.t, 0)]
    return views.ingest(batch, counters or CycleCounters()).samples


def test_a_batch_writes_power_caps_and_when_each_node_was_heard() -> None:
    p = parts()
    views = views_of(p)
    assert take(views, p, "k2-n1", telemetry_payload("k2-n1", [300.0, 310.0], 600.0))
    gpus = p.tree.server_gpus[p.tree.server_ordinal["k2-n1"]]
    assert list(views.power_w[gpus.start : gpus.stop]) == [300.0, 310.0]
    assert list(views.cap_w[gpus.start : gpus.stop]) == [600.0, 600.0]
    assert views.last_seen[p.tree.server_ordinal["k2-n1"]] == p.clock.t
    assert views.in_mode("controlled")[p.tree.server_ordinal["k2-n1"]]
    assert views.last_seen[p.tree.server_ordinal["k1-n1"]] == -np.inf  # the others: unheard


def test_a_refused_payload_is_handed_to_reject_and_changes_nothing() -> None:
    p = parts()
    views = views_of(p)
    before = views.power_w.copy()
    assert take(views, p, "k1-n1", b"{not json") == []
    assert p.rejected == [("k1-n1", None)]
    np.testing.assert_array_equal(views.power_w, before)


def test_caps_sampled_before_the_ack_settled_are_not_taken() -> None:
    p = parts()
    views = views_of(p)
    server = p.tree.server_ordinal["k1-n1"]
    views.acked_ts[server] = WALL0
    take(views, p, "k1-n1", telemetry_payload("k1-n1", 300.0, 500.0, ts=WALL0))
    assert views.power_w[0] == 300.0 and views.cap_w[0] == FAILSAFE_W  # power only
    later = WALL0 + CAP_SETTLE_S
    take(views, p, "k1-n1", telemetry_payload("k1-n1", 300.0, 500.0, ts=later, seq=1))
    assert views.cap_w[0] == 500.0


def test_gaps_in_seq_are_lost_samples_and_a_restart_is_not() -> None:
    p = parts()
    views = views_of(p)
    counters = CycleCounters()
    take(views, p, "k3-n1", telemetry_payload("k3-n1", 300.0, seq=20), counters)
    take(views, p, "k3-n1", telemetry_payload("k3-n1", 300.0, seq=24), counters)
    assert counters.telemetry_lost == 3
    take(views, p, "k3-n1", telemetry_payload("k3-n1", 300.0, seq=1), counters)  # restarted
    assert counters.telemetry_lost == 3


def test_absurd_power_is_disbelieved_until_enough_plausible_samples() -> None:
    p = parts()
    views = views_of(p)
    server = p.tree.server_ordinal["k2-n2"]
    take(views, p, "k2-n2", telemetry_payload("k2-n2", 3 * CAP_MAX_W, seq=20))
    assert views.implausible[server] and views.implausible_samples[server] == 1
    for seq in range(21, 21 + PLAUSIBLE_TO_CLEAR):
        assert views.implausible[server]
        take(views, p, "k2-n2", telemetry_payload("k2-n2", 300.0, seq=seq))
    assert not views.implausible[server]


def test_a_node_over_its_rate_is_disbelieved() -> None:
    p = parts(telemetry_period_s=1.0)
    views = views_of(p)
    views.period_s[:] = 0.5  # its status says 2 Hz; the site's agents send at 1 Hz
    np.testing.assert_array_equal(views.allowed_hz(), np.full(p.tree.n_servers, 2.0))
    received = np.zeros(p.tree.n_servers)
    received[1] = 30  # 3 a second over 10 s
    views.check_rates(received, 10.0)
    assert list(np.flatnonzero(views.implausible)) == [1]


def test_a_status_says_offline_and_a_failsafe_cap_above_the_plan() -> None:
    p = parts()
    views = views_of(p)
    status = Status(
        v=1,
        node="k1-n1",
        state="offline",
        ts=WALL0,
        gpus=2,
        agent_version="0.1.0",
        failsafe_cap_w=450.0,
    )
    views.take_status(0, "k1-n1", status)
    assert views.offline[0] and views.failsafe_over_plan[0]
    assert list(views.failsafe_cap_w[:2]) == [450.0, 450.0]
    online = Status(v=1, node="k1-n1", state="online", ts=WALL0, gpus=2, agent_version="0.1.0")
    views.take_status(0, "k1-n1", online)
    assert not views.offline[0]


def test_nodes_by_mode_count_each_node_once_an_unheard_one_as_stale() -> None:
    p = parts()
    views = views_of(p)
    n = len(p.tree.server_names)
    assert views.by_mode(p.clock.t, p.settings.stale_after_s) == {
        "controlled": 0, "failsafe": 0, "local": 0, "stale": n,
    }  # fmt: skip
    assert take(views, p, "k2-n1", telemetry_payload("k2-n1", [300.0, 310.0], 600.0))
    counts = views.by_mode(p.clock.t, p.settings.stale_after_s)
    assert (counts["controlled"], counts["stale"]) == (1, n - 1)
    later = p.clock.t + p.settings.stale_after_s + 0.1  # not heard since: stale again
    assert views.by_mode(later, p.settings.stale_after_s)["stale"] == n
    assert sum(counts.values()) == n
