"""decide() with ``cut_fall_w_per_s`` (grid power smoothing): capping over a budget brings a
GPU's draw down no faster than its share of the grid's ramp-down, over several cycles; over a
limit, at once, as without it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import PHASE_CODES, SERVER, PolicySettings, decide
from tests.support.policy_trees import make_state, random_tree_and_state, uniform_tree, with_bands

TOL_W = 1e-6
# cut_fall_w_per_s bounds rule 3 of the bands (policies/capping.py); safety by caps, the
# default, paces its cuts by the site's ramp instead (policies/allocation.py, rule 4)
BANDS = PolicySettings(safety_by_caps=False)
SLOW = PolicySettings(safety_by_caps=False, cut_fall_w_per_s=50.0)


def one_server_over_its_threshold(limit_w: float = np.inf):
    """Four GPUs at 1000 W under one server (node 3) with its threshold at 3700 W and its
    target at 3600 W: 400 W to take."""
    tree = with_bands(uniform_tree(1, 1, 1, 4), [3], 3700.0, 3600.0, 3000.0)
    limit = tree.limit_w.copy()
    limit[3] = limit_w
    return dataclasses.replace(tree, limit_w=limit)


def test_over_a_budget_the_cut_comes_at_the_rate_over_several_cycles():
    tree = one_server_over_its_threshold()
    first = decide(tree, make_state(tree, 1000.0), 1.0, SLOW)
    np.testing.assert_allclose(first.cap_w, 950.0)  # 50 W/s for 1 s, not the 100 W due
    assert first.node_cut_w[3] == pytest.approx(200.0)
    assert first.node_capping[3] and np.all(first.cut_levels == 1 << SERVER)
    # the GPUs follow; still over the threshold (3800 W): the next 50 W, to the target
    second = decide(tree, make_state(tree, 950.0, first.cap_w), 1.0, SLOW)
    np.testing.assert_allclose(second.cap_w, 900.0)
    assert second.node_predicted_w[3] == pytest.approx(3600.0)
    # a shorter cycle cuts less
    short = decide(tree, make_state(tree, 1000.0), 0.5, SLOW)
    np.testing.assert_allclose(short.cap_w, 975.0)
    # without the setting, all of it at once
    np.testing.assert_allclose(decide(tree, make_state(tree, 1000.0), 1.0, BANDS).cap_w, 900.0)


def test_over_a_limit_the_cut_is_whole_at_once():
    tree = one_server_over_its_threshold(limit_w=3900.0)  # it draws 4000 W
    np.testing.assert_allclose(decide(tree, make_state(tree, 1000.0), 1.0, SLOW).cap_w, 900.0)
    # a limit passed above it (the rack's) counts for the GPUs under it too
    rack = dataclasses.replace(tree, limit_w=np.where(np.arange(tree.n_nodes) == 2, 3900.0, np.inf))
    np.testing.assert_allclose(decide(rack, make_state(rack, 1000.0), 1.0, SLOW).cap_w, 900.0)


def test_a_waiting_gpu_is_not_cut_below_its_draw_over_a_budget():
    """Its smoothing lets it fall on its own at the rate; a cut would add to that fall."""
    tree = one_server_over_its_threshold()
    phase = [PHASE_CODES["communication"]] * 2 + [PHASE_CODES["compute"]] * 2
    d = decide(tree, make_state(tree, 1000.0, phase=phase), 1.0, SLOW)
    np.testing.assert_allclose(d.cap_w, [1200.0, 1200.0, 950.0, 950.0])  # not cut
    # over a limit, the waiting GPUs are cut at once with the others
    over = one_server_over_its_threshold(limit_w=3900.0)
    d = decide(over, make_state(over, 1000.0, phase=phase), 1.0, SLOW)
    np.testing.assert_allclose(d.cap_w, 900.0)


def test_a_cap_the_gpu_has_not_followed_is_not_cut_again_faster():
    """The fall is from what the GPU is predicted to draw, ``min(power, cap)``: a cap cut last
    cycle that it has not followed yet is where the next cut starts from."""
    tree = one_server_over_its_threshold()
    d = decide(tree, make_state(tree, 1000.0, 950.0), 1.0, SLOW)  # still drawing 1000 W
    np.testing.assert_allclose(d.cap_w, 900.0)  # from 950 W, 50 W more


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    fall_w_per_s=st.sampled_from([1.0, 10.85, 70.0, 500.0]),
    shift=st.booleans(),
)
def test_no_gpu_under_no_passed_limit_falls_faster_than_the_rate(seed, fall_w_per_s, shift):
    rng = np.random.default_rng(seed)
    tree, state, dt_s = random_tree_and_state(rng)
    # limits a little above the thresholds, some of them passed by what the nodes draw
    limit = tree.cap_threshold_w * rng.uniform(1.0, 1.3, tree.n_nodes)
    limit[rng.random(tree.n_nodes) < 0.3] = np.inf
    tree = dataclasses.replace(tree, limit_w=limit)
    policy = PolicySettings(
        safety_by_caps=False, cut_fall_w_per_s=fall_w_per_s, priority_shift=shift
    )
    d = decide(tree, state, dt_s, policy)

    cap_min, cap_max = tree.cap_min_w, tree.cap_max_w
    cap_before = np.clip(state.cap_w, cap_min, cap_max)
    floor = np.clip(state.floor_w, cap_min, cap_max)
    before = np.minimum(state.power_w, cap_before)
    after = np.minimum(state.power_w, d.cap_w)
    node_power = tree.node_sum(np.asarray(state.power_w, float)) + tree.overhead_below_w
    over_limit = node_power > tree.limit_w
    urgent = np.zeros(tree.n_gpus, dtype=bool)
    for lvl in range(len(tree.gpu_ancestor)):
        urgent |= over_limit[tree.gpu_ancestor[lvl]]
    slow = state.controllable & ~urgent
    least = np.minimum(before, np.maximum(floor, before - fall_w_per_s * dt_s))
    assert np.all(after[slow] >= least[slow] - TOL_W)
    # a waiting GPU falls on its own: not cut below what it draws
    waiting = np.isin(state.phase, [PHASE_CODES["communication"], PHASE_CODES["checkpoint"]])
    assert np.all(after[slow & waiting] >= before[slow & waiting] - TOL_W)
    # a node over its limit still reaches its target whenever its floors allow
    reachable = tree.node_sum(np.where(state.controllable, np.minimum(floor, state.power_w),
                                       state.power_w)) + tree.overhead_below_w  # fmt: skip
    checked = d.node_capping & over_limit & (reachable <= tree.cap_target_w)
    assert np.all(d.node_predicted_w[checked] <= tree.cap_target_w[checked] + TOL_W)


def test_the_setting_is_checked():
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="cut_fall_w_per_s"):
            PolicySettings(cut_fall_w_per_s=bad)
