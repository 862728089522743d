"""policies.coordination: the coordinator's allocation, by hand-computed cases and properties.

Hand-computed cases use a site whose bands are easy to divide by: target 0.5
(a leaf that draws W and wants no more is granted 2 W of budget), uncapping
threshold 0.4 (a leaf with held GPUs is granted 2.5 W per watt it wants),
threshold 1.0.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import ClusterState, PolicySettings, decide
from policies.coordination import (
    RAMP_BASE_FRACTION,
    Leaves,
    SitePool,
    allocate,
    summarise,
    with_root_budget,
)
from policies.tree import HIGH, LOW, NORMAL, PHASE_CODES, ROW
from powerd.topology import parse_budgets
from powerd.topology.scope import parse_scope, scoped
from tests.support.tree_sites import three_rows

TOL_W = 1e-6
SITE = SitePool(
    pool_w=300.0, cap_threshold=1.0, cap_target=0.5, uncap_threshold=0.4, ramp_w_per_s=float("inf")
)


def leaves(
    fixed: list[float],
    demand: list[list[float]],
    budget: list[float] | None = None,
    heard: list[bool] | None = None,
    held: list[list[float]] | None = None,
    file_budget: list[float] | None = None,
    limit: list[float] | None = None,
) -> Leaves:
    n = len(fixed)
    file_w = np.array(file_budget or [100.0] * n)
    return Leaves(
        heard=np.array(heard if heard is not None else [True] * n),
        fixed_w=np.array(fixed, dtype=float),
        demand_w=np.array(demand, dtype=float),
        held_w=np.array(held if held is not None else [[0.0] * 3] * n),
        predicted_w=np.array(fixed) + np.sum(demand, axis=1),
        budget_w=np.array(budget, dtype=float) if budget is not None else file_w.copy(),
        file_budget_w=file_w,
        limit_w=np.array(limit or [1000.0] * n),
    )


def test_every_leaf_gets_what_it_wants_and_the_rest_by_file_budget():
    # wants 20+20, 20+10, 10+10 W at target 0.5: budgets 80, 60, 40 = 180 of 300;
    # the 120 W left goes by file budget (100 each): 40 more each
    got = allocate(
        leaves([20, 20, 10], [[20, 0, 0], [0, 10, 0], [0, 0, 10]], budget=[100, 100, 100]),
        SITE,
    )
    assert got.wanted_w == pytest.approx([120, 100, 80])
    assert got.budget_w == pytest.approx([100, 100, 80])  # rises wait (make before break)
    assert got.budget_w.sum() <= SITE.pool_w + TOL_W


def test_low_priority_watts_anywhere_go_before_high_priority_watts_anywhere():
    # fixed 10 W each (20 W of budget); high wants 60 W (120), normal 60 W (120),
    # low 60 W (120): pool 300 - 60 fixed = 240: high and normal whole, low nothing
    got = allocate(
        leaves([10, 10, 10], [[60, 0, 0], [0, 60, 0], [0, 0, 60]], budget=[140, 140, 20]),
        SITE,
    )
    assert got.wanted_w == pytest.approx([140, 140, 20])
    assert got.budget_w == pytest.approx([140, 140, 20])


def test_a_class_that_does_not_fit_is_shared_in_proportion():
    # after fixed (60) and high (2 x 60 = 120 of budget), 120 left for normal wants of
    # 120 and 240 (budget): scaled by 120 / 360
    got = allocate(
        leaves([10, 10, 10], [[60, 0, 0], [0, 60, 0], [0, 120, 0]], budget=[140, 60, 100]),
        SITE,
    )
    assert got.wanted_w == pytest.approx([140, 20 + 40, 20 + 80])


def test_a_mixed_row_loses_its_low_watts_before_another_row_loses_normal_watts():
    got = allocate(
        leaves([0, 0], [[0, 50, 100], [0, 100, 0]], budget=[150, 150]),
        SitePool(
            pool_w=300.0,
            cap_threshold=1.0,
            cap_target=1.0,
            uncap_threshold=1.0,
            ramp_w_per_s=np.inf,
        ),
    )
    # normal: 50 + 100 = 150 fit; 150 left for the low 100: all of it; then spare by file
    assert got.wanted_w[1] >= 100 - TOL_W
    got = allocate(
        leaves([0, 0], [[0, 50, 200], [0, 100, 0]], budget=[150, 150]),
        SitePool(
            pool_w=250.0,
            cap_threshold=1.0,
            cap_target=1.0,
            uncap_threshold=1.0,
            ramp_w_per_s=np.inf,
        ),
    )
    assert got.wanted_w == pytest.approx([50 + 100, 100])  # low gets what normal left


def test_held_watts_count_as_wanted_at_the_uncapping_threshold():
    # leaf 0: fixed 10 W, draws 10 W more, and its held GPUs want 50 W more: everything it
    # asks is at 0.4 (25 W fixed, 150 W for high) so that under the grant it hands back
    # until it draws them; leaf 1 holds nothing: 20 W fixed, its low 20 W at 0.5
    got = allocate(
        leaves([10, 10], [[10, 0, 0], [0, 0, 10]], held=[[50, 0, 0], [0, 0, 0]]),
        SitePool(
            pool_w=160.0,
            cap_threshold=1.0,
            cap_target=0.5,
            uncap_threshold=0.4,
            ramp_w_per_s=np.inf,
        ),
    )
    # 160 - 45 fixed = 115 left for high's 150: all of it; nothing for low
    assert got.wanted_w == pytest.approx([25 + 115, 20])


def test_no_leaf_is_granted_past_its_breakers():
    got = allocate(
        leaves([10, 10], [[500, 0, 0], [0, 0, 10]], limit=[90, 1000]),
        SitePool(
            pool_w=1000.0,
            cap_threshold=0.9,
            cap_target=0.5,
            uncap_threshold=0.4,
            ramp_w_per_s=np.inf,
        ),
    )
    assert got.wanted_w[0] == pytest.approx(100.0)  # 90 W limit / 0.9 threshold


def test_rises_take_only_watts_free_while_lowered_leaves_still_hold_theirs():
    # leaf 0 wants less (down to 40), leaf 1 more (up to 260); pool 300, in force 150 + 150
    got = allocate(leaves([10, 10], [[10, 0, 0], [120, 0, 0]], budget=[150, 150]), SITE)
    assert got.wanted_w == pytest.approx([40.0, 260.0])  # 20 W and 130 W at target 0.5
    assert got.budget_w[0] == pytest.approx(got.wanted_w[0])  # lowered at once
    # leaf 1 may rise only by what is free with leaf 0 still at 150: 300 - 150 - 150 = 0
    assert got.budget_w[1] == pytest.approx(150.0)
    # next period leaf 0 reports its lower budget in force: leaf 1 rises
    again = allocate(
        leaves([10, 10], [[10, 0, 0], [120, 0, 0]], budget=[float(got.budget_w[0]), 150]), SITE
    )
    assert again.budget_w[1] == pytest.approx(again.wanted_w[1])


def test_a_leaf_under_caps_counts_at_its_caps_in_force_until_its_cuts_land():
    # as above, but leaf 0 runs under safety by caps: it reports its lower budget in
    # force while its caps (cut at its ramp) still sum to 120 W
    state = leaves([10, 10], [[10, 0, 0], [120, 0, 0]], budget=[40, 150])
    caps = dataclasses.replace(state, caps_in_force_w=np.array([120.0, 150.0]))
    assert allocate(caps, SITE).budget_w[1] == pytest.approx(300.0 - 120.0)
    # its cuts landed: leaf 1 rises to what it wants
    landed = dataclasses.replace(state, caps_in_force_w=np.array([40.0, 150.0]))
    got = allocate(landed, SITE)
    assert got.budget_w[1] == pytest.approx(got.wanted_w[1])
    # a leaf under the bands (NaN) counts at its budget, as ever
    bands = dataclasses.replace(state, caps_in_force_w=np.array([np.nan, np.nan]))
    assert allocate(bands, SITE).budget_w[1] == pytest.approx(got.wanted_w[1])


def test_a_silent_leaf_is_reserved_the_larger_of_its_last_budget_and_its_file_budget():
    got = allocate(
        leaves(
            [10, 10],
            [[100, 0, 0], [0, 0, 0]],
            budget=[100, 180],
            heard=[True, False],
            file_budget=[100, 120],
        ),
        SITE,
    )
    assert got.reserved_w == pytest.approx(180.0)
    assert got.budget_w[1] == pytest.approx(120.0)  # granted its file budget
    assert got.budget_w[0] <= SITE.pool_w - 180.0 + TOL_W


def test_ramp_shares_sum_to_the_site_ramp_and_follow_room_to_rise():
    site = SitePool(
        pool_w=300.0, cap_threshold=1.0, cap_target=0.5, uncap_threshold=0.4, ramp_w_per_s=1000.0
    )
    got = allocate(leaves([10, 10], [[50, 0, 0], [0, 0, 0]], budget=[150, 150]), site)
    assert got.ramp_w_per_s.sum() == pytest.approx(1000.0)
    assert np.all(got.ramp_w_per_s > 0)  # every leaf keeps some ramp
    room = np.maximum(got.budget_w * 0.5 - np.array([60.0, 10.0]), 0)  # at target
    weight = room + RAMP_BASE_FRACTION * 100 * 0.5
    assert got.ramp_w_per_s == pytest.approx(1000.0 * weight / weight.sum())


@settings(max_examples=200, deadline=None)
@given(
    data=st.lists(
        st.tuples(
            st.floats(0, 100),  # fixed
            st.lists(st.floats(0, 300), min_size=3, max_size=3),  # demand
            st.lists(st.floats(0, 100), min_size=3, max_size=3),  # held
            st.floats(1, 400),  # budget in force
            st.floats(1, 200),  # file budget
            st.booleans(),  # heard
        ),
        min_size=1,
        max_size=12,
    ),
    pool_extra=st.floats(0, 2000),
)
def test_budgets_in_force_never_exceed_the_pool_whatever_order_grants_land(data, pool_extra):
    fixed, demand, held, budget, file_w, heard = (list(col) for col in zip(*data, strict=True))
    pool = sum(file_w) + pool_extra  # the file budgets fit (checked when the file loads)
    # the budgets in force fit the pool (the invariant, inductively)
    old = np.array(budget) * min(1.0, pool / sum(budget))
    state = Leaves(
        heard=np.array(heard),
        fixed_w=np.array(fixed),
        demand_w=np.array(demand),
        held_w=np.array(held),
        predicted_w=np.array(fixed) + np.sum(demand, axis=1),
        budget_w=old,
        file_budget_w=np.array(file_w),
        limit_w=np.full(len(fixed), 1e6),
    )
    site = SitePool(
        pool_w=pool, cap_threshold=0.98, cap_target=0.95, uncap_threshold=0.90, ramp_w_per_s=5000.0
    )
    got = allocate(state, site)
    heard_mask, silent = state.heard, ~state.heard
    # make before break: heard leaves at whichever of their old and new budgets is higher
    # (a grant not yet landed), silent ones at the budgets they hold
    in_flight = np.where(heard_mask, np.maximum(got.budget_w, old), old)
    assert in_flight.sum() <= pool * (1 + 1e-9) + TOL_W
    # once landed, with every silent leaf at the larger of its budget and its file budget
    # (it may fall back to either), whenever the heard leaves' fixed watts fit beside them
    reserve = np.where(silent, np.maximum(old, file_w), 0.0).sum()
    if reserve + np.sum(np.where(heard_mask, fixed, 0.0)) / 0.90 <= pool:
        landed = np.where(heard_mask, got.budget_w, 0.0).sum() + reserve
        assert landed <= pool * (1 + 1e-9) + TOL_W
    assert np.all(got.budget_w >= 0)
    assert got.ramp_w_per_s.sum() == pytest.approx(5000.0)


def test_with_root_budget_moves_the_root_and_its_rows_never_past_a_breaker():
    topology = scoped(parse_budgets(three_rows()), parse_scope("r1"))
    tree = topology.tree
    granted = with_root_budget(tree, 13_000.0, 700.0, (0.98, 0.95, 0.90))
    row = tree.level_nodes[ROW][0]
    assert granted.budget_w[0] == 13_000.0 and granted.cap_target_w[0] == pytest.approx(12_350)
    assert granted.ramp_w_per_s[0] == 700.0
    assert granted.budget_w[row] == pytest.approx(13_000.0)  # one row: the grant
    assert granted.cap_threshold_w[row] == pytest.approx(13_000.0 * 0.98)
    rack = tree.level_nodes[ROW + 1][0]
    assert granted.budget_w[rack] == tree.budget_w[rack]  # racks keep their bands
    huge = with_root_budget(tree, 50_000.0, 700.0, (0.98, 0.95, 0.90))
    assert huge.cap_threshold_w[row] == pytest.approx(14_000.0)  # at its 14 kW limit
    assert tree.budget_w[0] == 12_000.0  # the original is untouched


def test_summarise_splits_the_scope_by_class_and_counts_held_gpus():
    topology = scoped(parse_budgets(three_rows()), parse_scope("r1"))
    tree = topology.tree
    n = tree.n_gpus  # 8 H100 (200-700 W) on 2 nodes: high on the first, low on the second
    priority = np.array([HIGH] * 4 + [LOW] * 4, dtype=np.int8)
    state = ClusterState(
        power_w=np.array([650.0] * 4 + [500.0] * 4),
        cap_w=np.array([700.0] * 4 + [510.0] * 4),
        priority=priority,
        floor_w=tree.cap_min_w.copy(),
        phase=np.full(n, PHASE_CODES["compute"], dtype=np.int8),
        controllable=np.ones(n, dtype=bool),
    )
    # the bands, whose caps barely rise at this step (safety by caps, which has no such
    # step, raises every cap to 700 W at once: the node's limit holds them all)
    slow = PolicySettings(safety_by_caps=False, uncap_step_fraction=0.01, uncap_min_step_w=0.0)
    decision = decide(tree, state, 1.0, slow)
    leaf = summarise(tree, state, decision, slow)
    assert leaf.fixed_w == pytest.approx(2 * 500 + 8 * 200)
    predicted = np.minimum(state.power_w, decision.cap_w)
    assert leaf.demand_w[0] == pytest.approx(float((predicted[:4] - 200).sum()))
    assert leaf.demand_w[1] == 0.0
    assert leaf.demand_w[2] == pytest.approx(float((predicted[4:] - 200).sum()))
    assert leaf.held_w[0] == 0.0  # high GPUs at their maximum: nothing held
    # low GPUs at 500 W of a 510 W cap are held; they could have 4 x 190 W more, but their
    # node hands back only up to its uncapping threshold
    node = tree.server_nodes[1]
    node_w = float(predicted[4:].sum()) + tree.overhead_w[node]
    room = tree.uncap_threshold_w[node] - node_w
    assert 0 < room < 4 * 190
    cap = decision.cap_w[4:]
    assert leaf.held_w[2] == pytest.approx(min(float((700 - cap).sum()), room))
    assert leaf.measured_w == pytest.approx(decision.node_power_w[0])
    assert NORMAL == 1 and LOW == 0


def test_summarise_counts_gpus_handed_back_this_cycle_as_held_until_they_draw_it():
    """A leaf that hands its caps back reports its GPUs still held: they draw their old caps
    and want the new ones. Reported at what they draw, with nothing held, the coordinator
    would grant the leaf less than its GPUs are about to draw (a standby's first cycle
    after it took over, seen in tests/fleet/test_tree_of_controllers.py)."""
    topology = scoped(parse_budgets(three_rows()), parse_scope("r1"))
    tree = topology.tree
    n = tree.n_gpus  # 8 H100 (200-700 W) on 2 nodes, every one held at 450 W
    state = ClusterState(
        power_w=np.full(n, 449.0),
        cap_w=np.full(n, 450.0),
        priority=np.full(n, NORMAL, dtype=np.int8),
        floor_w=tree.cap_min_w.copy(),
        phase=np.full(n, PHASE_CODES["compute"], dtype=np.int8),
        controllable=np.ones(n, dtype=bool),
    )
    fast = PolicySettings(uncap_step_fraction=1.0)
    decision = decide(tree, state, 1.0, fast)
    assert (decision.cap_w > 450.0 + 1.0).all()  # handed back this cycle
    leaf = summarise(tree, state, decision, fast)
    assert leaf.demand_w[NORMAL] == pytest.approx(n * (449.0 - 200.0))
    # each node's GPUs want 4 x 250 W more, as far as the node's band hands back
    room = [
        min(4 * 250.0, float(tree.uncap_threshold_w[node] - tree.overhead_w[node] - 4 * 449.0))
        for node in tree.server_nodes
    ]
    assert min(room) > 0
    assert leaf.held_w[NORMAL] == pytest.approx(sum(room))
    assert leaf.held_w[HIGH] == leaf.held_w[LOW] == 0.0
