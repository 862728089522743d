"""Rule 3 in turn (``ClusterState.cut_turn``): a budget's cut from fewer GPUs.

A demand-response glide on the 150 MW site cut all 82,944 GPUs by ~11 W every second, so
the controller commanded all 20,736 nodes every cycle. With turns, only the GPUs in turn
give (each at most ``cut_turn_max_fraction`` of its range), class by class; what they could
not give waits for the next turns. No level takes more than without turns; over a limit,
every GPU gives at once.

The tree: one row, two racks of four 4-GPU servers (200-1200 W), GPUs 0-15 and 16-31.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import HIGH, LOW, NORMAL, PolicySettings, decide
from tests.support.policy_trees import (
    make_state,
    random_tree_and_state,
    uncapping_everywhere,
    uniform_tree,
    with_bands,
)

# The bands' turns (policies/capping.py, rule 3); safety by caps, the default, cuts in turn
# its own way (policies.turns.invariant_cut_in_turn, tests/policies/test_policy_allocation.py)
BANDS = PolicySettings(safety_by_caps=False)
N = 32
FIRST_SERVER = slice(0, 4)  # the one server in turn
STEP_W = BANDS.cut_turn_max_fraction * 1000.0  # 150 W of the 1,000 W range


def site_over_by(over_w: float, limit_w: float = np.inf):
    """Every GPU draws 1,000 W under 1,100 W caps; the site is over its threshold, its
    target ``over_w`` under what it draws (32 kW), and its limit ``limit_w``."""
    tree = with_bands(uncapping_everywhere(uniform_tree(1, 2, 4, 4)), [0], 31_000.0,
                      32_000.0 - over_w, 20_000.0)  # fmt: skip
    limit = tree.limit_w.copy()
    limit[0] = limit_w
    tree = dataclasses.replace(tree, limit_w=limit)
    return tree, make_state(tree, 1000.0, 1100.0)


def in_turn(gpus) -> np.ndarray:
    mask = np.zeros(N, dtype=bool)
    mask[gpus] = True
    return mask


def test_a_small_cut_comes_from_the_gpus_in_turn_alone():
    tree, state = site_over_by(200.0)
    d = decide(tree, dataclasses.replace(state, cut_turn=in_turn(FIRST_SERVER)), 1.0, BANDS)
    np.testing.assert_allclose(d.cap_w[FIRST_SERVER], 950.0)  # 200 W from four GPUs
    np.testing.assert_allclose(d.cap_w[4:], 1100.0)  # the others keep their caps
    assert d.node_cut_w[0] == np.float64(200.0)
    # without turns the same 200 W comes from all 32 GPUs, 6.25 W each: every node moved
    plain = decide(tree, state, 1.0, BANDS)
    np.testing.assert_allclose(plain.cap_w, 1000.0 - 200.0 / N)
    assert plain.node_predicted_w[0] == d.node_predicted_w[0]


def test_what_the_turn_cannot_give_waits_for_the_next_turns():
    tree, state = site_over_by(1000.0)  # 1 kW: more than four GPUs' 150 W steps
    d = decide(tree, dataclasses.replace(state, cut_turn=in_turn(FIRST_SERVER)), 1.0, BANDS)
    np.testing.assert_allclose(d.cap_w[FIRST_SERVER], 1000.0 - STEP_W)
    np.testing.assert_allclose(d.cap_w[4:], 1100.0)  # not their turn
    assert d.node_cut_w[0] == np.float64(4 * STEP_W)  # the site stays over a little longer
    # the next server's turn takes the 400 W left
    state = dataclasses.replace(state, power_w=np.minimum(state.power_w, d.cap_w), cap_w=d.cap_w)
    d = decide(tree, dataclasses.replace(state, cut_turn=in_turn(slice(4, 8))), 1.0, BANDS)
    np.testing.assert_allclose(d.cap_w[4:8], 1000.0 - (1000.0 - 4 * STEP_W) / 4)
    assert d.node_cut_w[0] == pytest.approx(1000.0 - 4 * STEP_W)


def test_a_class_in_turn_never_gives_before_a_lower_class_out_of_turn():
    tree, state = site_over_by(300.0)
    priority = np.full(N, HIGH, dtype=np.int8)
    priority[16:] = LOW  # the second rack runs the low-priority job
    priority[8:16] = NORMAL
    # HIGH and NORMAL in turn, LOW not: LOW has watts out of turn, so nothing is cut yet
    state = dataclasses.replace(state, priority=priority, cut_turn=in_turn(slice(0, 16)))
    d = decide(tree, state, 1.0, BANDS)
    np.testing.assert_allclose(d.cap_w, 1100.0)
    assert d.node_cut_w[0] == 0.0
    # one LOW server in turn: it gives its 4 x 75 W, HIGH and NORMAL nothing
    d = decide(tree, dataclasses.replace(state, cut_turn=in_turn(slice(16, 20))), 1.0, BANDS)
    np.testing.assert_allclose(d.cap_w[16:20], 1000.0 - 75.0)
    np.testing.assert_allclose(np.delete(d.cap_w, range(16, 20)), 1100.0)
    # LOW all at its floor: NORMAL in turn gives
    low_at_floor = state.floor_w.copy()
    low_at_floor[16:] = 1000.0
    floored = dataclasses.replace(state, floor_w=low_at_floor, cut_turn=in_turn(slice(8, 12)))
    d = decide(tree, floored, 1.0, BANDS)
    np.testing.assert_allclose(d.cap_w[8:12], 1000.0 - 75.0)
    np.testing.assert_allclose(d.cap_w[:8], 1100.0)


def test_over_a_limit_every_gpu_gives_at_once():
    tree, state = site_over_by(200.0, limit_w=31_500.0)  # 32 kW drawn: over the breaker
    turned = decide(tree, dataclasses.replace(state, cut_turn=in_turn(FIRST_SERVER)), 1.0, BANDS)
    np.testing.assert_array_equal(turned.cap_w, decide(tree, state, 1.0, BANDS).cap_w)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), share=st.floats(0.0, 1.0))
def test_only_gpus_in_turn_give_for_a_budget_and_no_more_than_their_step(seed, share):
    rng = np.random.default_rng(seed)
    tree, state, dt_s = random_tree_and_state(rng)
    turn = rng.random(tree.n_gpus) < share
    policy = PolicySettings(safety_by_caps=False, priority_shift=False, level_within_class=False)
    plain = decide(tree, state, dt_s, policy)
    turned = decide(tree, dataclasses.replace(state, cut_turn=turn), dt_s, policy)
    # GPUs under a node over its limit give as they must; the others only in turn, and
    # at most their step under what they would draw
    over_limit = plain.node_power_w > tree.limit_w
    urgent = np.zeros(tree.n_gpus, dtype=bool)
    for level in range(tree.gpu_ancestor.shape[0]):
        urgent |= over_limit[tree.gpu_ancestor[level]]
    cut = turned.cut_levels > 0
    assert not np.any(cut & ~turn & ~urgent)
    cap_min, cap_max = np.asarray(tree.cap_min_w), np.asarray(tree.cap_max_w)
    power = np.clip(np.nan_to_num(state.power_w, nan=0.0), 0.0, None)
    drawn = np.minimum(power, np.clip(state.cap_w, cap_min, cap_max))
    step = policy.cut_turn_max_fraction * (cap_max - cap_min)
    budget_cut = cut & ~urgent & np.isfinite(np.asarray(state.power_w, dtype=float))
    assert np.all(turned.cap_w[budget_cut] >= drawn[budget_cut] - step[budget_cut] - 1e-6)
    # a node over its limit takes what it took without turns (all below it is the same)
    np.testing.assert_allclose(turned.node_cut_w[over_limit], plain.node_cut_w[over_limit],
                               rtol=1e-9, atol=1e-6)  # fmt: skip
    # and every bound the policy keeps: the GPUs' ranges and floors
    ctl = np.asarray(state.controllable)
    assert np.all(turned.cap_w >= cap_min - 1e-9) and np.all(turned.cap_w <= cap_max + 1e-9)
    lowered = ctl & (turned.cap_w < np.minimum(state.cap_w, cap_max) - 1e-6)
    floor = np.clip(state.floor_w, cap_min, cap_max)
    assert np.all(turned.cap_w[lowered] >= floor[lowered] - 1e-6)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_every_gpu_in_turn_with_a_whole_range_is_the_rule_without_turns(seed):
    tree, state, dt_s = random_tree_and_state(np.random.default_rng(seed))
    policy = PolicySettings(safety_by_caps=False, priority_shift=False, level_within_class=False)
    everyone = dataclasses.replace(state, cut_turn=np.ones(tree.n_gpus, dtype=bool))
    whole = dataclasses.replace(policy, cut_turn_max_fraction=1.0)
    np.testing.assert_allclose(decide(tree, everyone, dt_s, whole).cap_w,
                               decide(tree, state, dt_s, policy).cap_w, atol=1e-6)  # fmt: skip
