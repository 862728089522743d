"""Rule 3 in turn (``ClusterState.cut_turn``): a budget's cut from fewer GPUs, never less.

A demand-response glide on the 150 MW site cut all 82,944 GPUs by ~11 W every second, so
the controller commanded all 20,736 nodes every cycle. With turns, the GPUs in turn give
first (each at most ``cut_turn_max_fraction`` of its range), class by class; only what they
could not give comes from the rest. Every level takes what it took without turns.

The tree: one row, two racks of four 4-GPU servers (200-1200 W), GPUs 0-15 and 16-31.
"""

from __future__ import annotations

import dataclasses

import numpy as np
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

N = 32
FIRST_SERVER = slice(0, 4)  # the one server in turn
STEP_W = PolicySettings().cut_turn_max_fraction * 1000.0  # 100 W: a tenth of the range


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
    d = decide(tree, dataclasses.replace(state, cut_turn=in_turn(FIRST_SERVER)), 1.0)
    np.testing.assert_allclose(d.cap_w[FIRST_SERVER], 950.0)  # 200 W from four GPUs
    np.testing.assert_allclose(d.cap_w[4:], 1100.0)  # the others keep their caps
    assert d.node_cut_w[0] == np.float64(200.0)
    # without turns the same 200 W comes from all 32 GPUs, 6.25 W each: every node moved
    plain = decide(tree, state, 1.0)
    np.testing.assert_allclose(plain.cap_w, 1000.0 - 200.0 / N)
    assert plain.node_predicted_w[0] == d.node_predicted_w[0]


def test_what_the_turn_cannot_give_comes_from_everyone():
    tree, state = site_over_by(1000.0)  # 1 kW: more than four GPUs' 100 W steps
    d = decide(tree, dataclasses.replace(state, cut_turn=in_turn(FIRST_SERVER)), 1.0)
    # the 600 W left, water-filled over all 32 from the top: from the 28 out of turn,
    # still above the four cut to 900 W
    np.testing.assert_allclose(d.cap_w[FIRST_SERVER], 1000.0 - STEP_W)
    np.testing.assert_allclose(d.cap_w[4:], 1000.0 - (1000.0 - 4 * STEP_W) / 28)
    assert d.node_cut_w[0] == np.float64(1000.0)


def test_a_class_in_turn_never_gives_before_a_lower_class_out_of_turn():
    tree, state = site_over_by(300.0)
    priority = np.full(N, HIGH, dtype=np.int8)
    priority[16:] = LOW  # the second rack runs the low-priority job, none of it in turn
    priority[8:16] = NORMAL
    state = dataclasses.replace(state, priority=priority, cut_turn=in_turn(slice(0, 16)))
    d = decide(tree, state, 1.0)
    np.testing.assert_allclose(d.cap_w[:16], [1100.0] * 8 + [1100.0] * 8)  # HIGH, NORMAL
    assert np.all(d.cap_w[16:] < 1000.0)  # LOW gave all 300 W, out of turn
    assert d.node_cut_w[0] == np.float64(300.0)


def test_over_a_limit_every_gpu_gives_at_once():
    tree, state = site_over_by(200.0, limit_w=31_500.0)  # 32 kW drawn: over the breaker
    turned = decide(tree, dataclasses.replace(state, cut_turn=in_turn(FIRST_SERVER)), 1.0)
    np.testing.assert_array_equal(turned.cap_w, decide(tree, state, 1.0).cap_w)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), share=st.floats(0.0, 1.0))
def test_every_level_takes_what_it_took_without_turns(seed, share):
    rng = np.random.default_rng(seed)
    tree, state, dt_s = random_tree_and_state(rng)
    turn = rng.random(tree.n_gpus) < share
    plain = decide(tree, state, dt_s, PolicySettings(priority_shift=False,
                                                     level_within_class=False))  # fmt: skip
    turned = decide(tree, dataclasses.replace(state, cut_turn=turn), dt_s,
                    PolicySettings(priority_shift=False, level_within_class=False))  # fmt: skip
    np.testing.assert_allclose(turned.node_cut_w, plain.node_cut_w, rtol=1e-9, atol=1e-6)
    # and within every bound the policy keeps: the GPUs' ranges and floors
    ctl = np.asarray(state.controllable)
    cap_min, cap_max = np.asarray(tree.cap_min_w), np.asarray(tree.cap_max_w)
    assert np.all(turned.cap_w >= cap_min - 1e-9) and np.all(turned.cap_w <= cap_max + 1e-9)
    cut = ctl & (turned.cap_w < np.minimum(state.cap_w, cap_max) - 1e-6)
    floor = np.clip(state.floor_w, cap_min, cap_max)
    assert np.all(turned.cap_w[cut] >= floor[cut] - 1e-6)
