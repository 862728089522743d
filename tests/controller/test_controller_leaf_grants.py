"""powerd.controller.scoping.LeafGrants: which budget a leaf holds, grant by grant, in time."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from policies import NORMAL, PHASE_CODES, ClusterState, PolicySettings, decide
from powerd.controller.scoping import LeafGrants
from powerd.protocol import Grant
from powerd.topology import parse_budgets
from powerd.topology.scope import parse_scope, scoped
from tests.support.tree_sites import three_rows

WALL = 1_800_000_000.0


def leaf() -> LeafGrants:
    return LeafGrants("r1", scoped(parse_budgets(three_rows()), parse_scope("r1")))


def grant(budget_w: float, seq: int = 1, epoch: int = 5, ttl_s: float = 10.0, **kw) -> Grant:
    fields: dict[str, Any] = dict(v=1, scope="r1", coordinator="co", epoch=epoch, seq=seq, ts=WALL,
                  ttl_s=ttl_s, budget_w=budget_w, ramp_w_per_s=500.0)  # fmt: skip
    fields.update(kw)
    return Grant(**fields)


def test_without_a_grant_the_file_budget_holds():
    grants = leaf()
    force = grants.in_force(0.0)
    assert (force.budget_w, force.source, force.grant) == (12_000.0, "file", None)
    assert force.ramp_w_per_s == pytest.approx(4_000.0)  # 12 kW/s x 12 / 36


def test_a_grant_holds_its_ttl_then_the_lower_of_grant_and_file_then_the_file():
    grants = leaf()
    assert grants.on_grant(grant(13_000.0), now_mono=100.0, wall=WALL) is None
    assert grants.in_force(110.0).budget_w == 13_000.0  # ttl 10 s from receipt
    assert grants.in_force(110.0).source == "grant"
    expiring = grants.in_force(110.5)
    assert (expiring.budget_w, expiring.source) == (12_000.0, "expiring")  # min(13, 12)
    assert grants.in_force(120.0).source == "expiring"
    assert (grants.in_force(120.5).budget_w, grants.in_force(120.5).source) == (12_000, "file")
    # a grant below the file budget: held below it while it expires
    grants.on_grant(grant(9_000.0, seq=2), now_mono=200.0, wall=WALL)
    assert grants.in_force(215.0).budget_w == 9_000.0
    assert grants.in_force(215.0).source == "expiring"
    assert grants.in_force(221.0).budget_w == 12_000.0


def test_older_replayed_and_foreign_grants_are_refused():
    grants = leaf()
    assert grants.on_grant(grant(13_000.0, seq=7), 0.0, WALL) is None
    assert "not newer" in (grants.on_grant(grant(14_000.0, seq=7), 1.0, WALL) or "")
    assert "not newer" in (grants.on_grant(grant(14_000.0, seq=9, epoch=4), 1.0, WALL) or "")
    old = grant(14_000.0, seq=8)  # retained (on subscribe), older than its TTL: a replay
    assert "past its ttl_s" in (grants.on_grant(old, 1.0, WALL + 11, live=False) or "")
    assert "scope r2" in (grants.on_grant(grant(1.0, seq=9, scope="r2"), 1.0, WALL) or "")
    assert grants.in_force(1.0).budget_w == 13_000.0
    assert (grants.grants_taken, grants.grants_refused) == (1, 4)
    # a new coordinator epoch starts its seq again
    assert grants.on_grant(grant(11_000.0, seq=1, epoch=6), 2.0, WALL) is None


def test_a_live_grant_is_taken_whatever_the_clocks_skew_behind() -> None:
    """A leaf whose clock runs a minute ahead of its coordinator's (a grant's ts a minute
    old by it, past its 10 s TTL): a grant delivered live is the coordinator's now, in
    force ttl_s from receipt (the leaf refused every grant for good before)."""
    grants = leaf()
    assert grants.on_grant(grant(13_000.0, seq=7), 0.0, WALL + 60.0) is None
    assert grants.in_force(9.0).source == "grant"
    assert grants.in_force(11.0).source == "expiring"


def test_a_grant_from_the_future_is_a_clock_alarm() -> None:
    """A coordinator an hour ahead: its grants would pass the age check for an hour, so a
    capture could be replayed that long. Refused, and counted."""
    grants = leaf()
    why = grants.on_grant(grant(13_000.0, seq=7), 0.0, WALL - 3600.0)
    assert "clock alarm" in (why or "")
    assert grants.clock_alarms == 1
    assert grants.in_force(0.0).source == "file"
    assert grants.on_grant(grant(13_000.0, seq=8), 0.0, WALL - 29.0) is None  # within 30 s


def test_no_grant_lifts_the_root_past_its_breakers():
    grants = leaf()
    grants.on_grant(grant(1e9), 0.0, WALL)
    assert grants.in_force(0.0).budget_w == pytest.approx(14_000.0 / 0.98)


def test_the_tree_follows_what_is_in_force_and_is_rebuilt_only_on_change():
    grants = leaf()
    base = grants.tree_for(0.0)
    assert base.budget_w[0] == 12_000.0
    assert grants.tree_for(1.0) is base
    grants.on_grant(grant(13_000.0), 2.0, WALL)
    granted = grants.tree_for(2.0)
    assert granted.budget_w[0] == 13_000.0
    assert granted.cap_threshold_w[0] == pytest.approx(13_000.0 * 0.98)
    assert granted.ramp_w_per_s[0] == 500.0
    assert grants.tree_for(3.0) is granted
    assert grants.tree_for(100.0).budget_w[0] == 12_000.0


def test_a_reloaded_file_keeps_the_live_grant_and_takes_the_new_file_budget():
    grants = leaf()
    grants.on_grant(grant(13_000.0), 0.0, WALL)
    lower = three_rows().replace("budget_kw = 12", "budget_kw = 11", 1)
    moved = grants.rebased(scoped(parse_budgets(lower), parse_scope("r1")))
    assert moved.file_budget_w == 11_000.0
    assert moved.in_force(1.0).budget_w == 13_000.0  # the grant stays in force
    assert moved.in_force(10.5).budget_w == 11_000.0  # expiring: min(grant, the new file)
    assert moved.grants_taken == 1


def test_under_grid_smoothing_a_leaf_ramps_at_most_its_gpus_share_of_the_grid():
    """The coordinator splits the file's site ramp (12 kW/s) among the leaves; under grid
    smoothing each leaf's caps also rise at most the sum of its GPUs' shares of the grid's
    ramp-up (0.9 x 2.4 kW/s / 24 GPUs = 90 W/s a GPU; 8 GPUs: 720 W/s), so the leaves
    together stay within 0.9 x the grid's limit whatever the grants say. On reload too."""
    from powerd.controller.app import build_service
    from powerd.controller.config import ControllerConfig
    from powerd.controller.smoothing import grid_ramp_w_per_s, grid_smoothing
    from tests.support.keys import STRANGER

    site = parse_budgets(
        three_rows() + "[site.grid]\nramp_up_kw_per_s = 2.4\nramp_down_kw_per_s = 2.4\n"
    )
    smoothing = grid_smoothing(site)
    assert smoothing.ramp_up_w_per_s == pytest.approx(90.0)
    scope_top = scoped(site, parse_scope("r1"))
    bound = grid_ramp_w_per_s(smoothing, scope_top.tree.n_gpus)
    assert bound == pytest.approx(720.0)
    grants = LeafGrants("r1", scope_top, max_ramp_w_per_s=bound)
    assert grants.in_force(0.0).ramp_w_per_s == pytest.approx(720.0)  # file: 4 kW/s
    grants.on_grant(grant(13_000.0, ramp_w_per_s=500.0), now_mono=1.0, wall=WALL)
    assert grants.in_force(2.0).ramp_w_per_s == 500.0  # a grant below the bound stands
    assert grants.rebased(scope_top, bound).in_force(2.0).ramp_w_per_s == 500.0
    assert grants.rebased(scope_top).in_force(200.0).ramp_w_per_s == pytest.approx(4_000.0)

    config = ControllerConfig(scope="r1", grid_smoothing=True)
    service = build_service(config, site, signer=STRANGER)  # any key: nothing is sent
    assert service.leaf is not None
    assert service.leaf.in_force(0.0).ramp_w_per_s == pytest.approx(720.0)
    assert service.core.tree.ramp_w_per_s[0] == pytest.approx(720.0)
    assert site.grid is not None and scope_top.grid is None  # the site's, not the leaf's


def test_a_leaf_under_caps_reports_its_caps_in_force_and_one_under_the_bands_none():
    grants = leaf()
    tree = grants.tree_for(0.0)
    n = tree.n_gpus
    state = ClusterState(
        power_w=np.full(n, 500.0),
        cap_w=np.full(n, 700.0),
        priority=np.full(n, NORMAL, dtype=np.int8),
        floor_w=np.asarray(tree.cap_min_w, dtype=float),
        phase=np.full(n, PHASE_CODES["compute"], dtype=np.int8),
        controllable=np.ones(n, dtype=bool),
    )
    by_caps = PolicySettings(safety_by_caps=True)
    decision = decide(tree, state, 1.0, by_caps)
    fields: dict[str, Any] = dict(controller="l", epoch=1, seq=1, ts=WALL, now_mono=0.0,
                                  stale_nodes=0)  # fmt: skip
    caps = grants.summary(tree, state, decision, policy=by_caps, **fields)
    assert caps.caps_in_force_w == pytest.approx(700.0 * n + float(tree.overhead_below_w[0]))
    bands = grants.summary(
        tree, state, decision, policy=PolicySettings(safety_by_caps=False), **fields
    )
    assert bands.caps_in_force_w is None


def test_a_grant_of_a_round_older_than_the_coordinators_heartbeat_says_is_a_replay():
    grants = leaf()  # restarted: it holds no grant
    grants.on_coordinator_round(epoch=5, seq=9)
    grants.on_coordinator_round(epoch=5, seq=4)  # an older heartbeat lowers nothing
    assert "a replay" in (grants.on_grant(grant(14_000.0, seq=8), 0.0, WALL) or "")
    assert grants.in_force(0.0).source == "file"
    assert grants.on_grant(grant(13_000.0, seq=9), 0.0, WALL) is None  # the current round
    assert grants.on_grant(grant(11_000.0, seq=1, epoch=6), 1.0, WALL) is None  # a new epoch
