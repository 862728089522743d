"""Rule 3c: between the bands, the caps of one class's GPUs held at them come level.

The tree: one rack (node 2) of two 4-GPU servers (3: GPUs 0-3, 4: GPUs 4-7), 200-1200 W
GPUs. Only the rack has bands, 3500 / 3450 / 3000 W; every other node always hands back.
At 508 W and 342 W caps, drawn whole, the rack draws 3400 W: between its bands."""

from __future__ import annotations

import numpy as np
import pytest

from policies import HIGH, NORMAL, PolicySettings, decide
from tests.support.policy_trees import (
    make_state,
    uncapping_everywhere,
    uniform_tree,
    with_bands,
    with_ramp,
)

RACK, LEFT, RIGHT = 2, 3, 4
BANDS = (3500.0, 3450.0, 3000.0)  # threshold, target, uncapping threshold
APART = np.array([508.0] * 4 + [342.0] * 4)
# Rule 3c is the bands' (policies/capping.py); safety by caps, the default, levels a class
# its own way (tests/policies/test_policy_allocation.py)
BANDS_POLICY = PolicySettings(safety_by_caps=False)
# rule 3c alone: rule 4 hands nothing back between the bands
ONLY_LEVELLING = PolicySettings(safety_by_caps=False, uncap_between_bands=False)


def rack_tree(**kw):
    return with_bands(uncapping_everywhere(uniform_tree(1, 1, 2, 4, **kw)), [RACK], *BANDS)


def test_one_cycle_moves_each_gpu_a_fifth_of_its_way_and_keeps_the_sum():
    tree = rack_tree()
    d = decide(tree, make_state(tree, APART, APART), 1.0, ONLY_LEVELLING)
    # the level is the mean, 425 W; each moves uncap_step_fraction (0.2) of its 83 W
    np.testing.assert_allclose(d.cap_w, [508.0 - 16.6] * 4 + [342.0 + 16.6] * 4)
    assert d.cap_w.sum() == pytest.approx(APART.sum())
    assert d.levelled.all()
    assert not d.cut_levels.any() and not d.shifted.any()
    assert d.node_predicted_w[RACK] <= d.node_power_w[RACK] + 1e-9


def test_in_a_closed_loop_the_caps_settle_level_without_capping():
    tree = rack_tree()
    cap = APART.copy()
    for _ in range(30):
        d = decide(tree, make_state(tree, np.minimum(1000.0, cap), cap), 1.0, BANDS_POLICY)
        assert not d.node_capping.any()
        cap = d.cap_w
    # within max(uncap_min_step_w, 1 % of the range) = 10 W of one level, at the target
    assert np.abs(cap - cap.mean()).max() <= 10.0
    assert cap.sum() == pytest.approx(BANDS[1], abs=10.0)


def test_off_the_caps_stay_apart():
    tree = rack_tree()
    off = PolicySettings(safety_by_caps=False, uncap_between_bands=False, level_within_class=False)
    d = decide(tree, make_state(tree, APART, APART), 1.0, off)
    np.testing.assert_allclose(d.cap_w, APART)


def test_classes_are_not_levelled_with_each_other():
    tree = rack_tree()
    priority = [HIGH] * 4 + [NORMAL] * 4  # HIGH above NORMAL: not rule 3c's to undo
    settings = PolicySettings(safety_by_caps=False, uncap_between_bands=False, priority_shift=False)
    d = decide(tree, make_state(tree, APART, APART, priority=priority), 1.0, settings)
    np.testing.assert_allclose(d.cap_w, APART)


def test_a_gpu_that_does_not_draw_its_cap_gives_nothing():
    tree = rack_tree()
    power = np.array([450.0] * 4 + [342.0] * 4)  # 58 W under its cap: not held (50 W)
    d = decide(tree, make_state(tree, power, APART), 1.0, ONLY_LEVELLING)
    np.testing.assert_allclose(d.cap_w, APART)


def test_gpus_of_different_ranges_level_to_one_share_of_their_ranges():
    cap_min = np.array([200.0] * 4 + [100.0] * 4)
    cap_max = np.array([1200.0] * 4 + [600.0] * 4)
    tree = rack_tree(cap_min_w=cap_min, cap_max_w=cap_max)
    tree = with_bands(tree, [RACK], 4500.0, 4450.0, 4000.0)  # 4400 W: between
    cap = np.array([800.0] * 4 + [300.0] * 4)  # shares 0.6 and 0.4
    d = decide(tree, make_state(tree, cap, cap), 1.0, ONLY_LEVELLING)
    # the share that keeps the sum: (4 x 600 + 4 x 200) / (4 x 1000 + 4 x 500) = 0.5333
    level = cap_min + (3200.0 / 6000.0) * (cap_max - cap_min)
    np.testing.assert_allclose(d.cap_w, cap + 0.2 * (level - cap))
    same = decide(tree, make_state(tree, level, level), 1.0, ONLY_LEVELLING)
    np.testing.assert_allclose(same.cap_w, level)  # already level: nothing moves


def test_a_receiving_server_gains_no_more_than_its_own_room_and_ramp():
    # the right server's target leaves 32 W above its 1368 W (it is below its uncapping
    # threshold, so it does not block the rack's levelling)
    tree = with_bands(rack_tree(), [RIGHT], 1450.0, 1400.0, 1390.0)
    d = decide(tree, make_state(tree, APART, APART), 1.0, ONLY_LEVELLING)
    np.testing.assert_allclose(d.cap_w[4:], 342.0 + 32.0 / 4)
    np.testing.assert_allclose(d.cap_w[:4], 508.0 - 32.0 / 4)  # donors give only that
    ramped = decide(with_ramp(rack_tree(), [RIGHT], 10.0), make_state(rack_tree(), APART, APART),
                    1.0, ONLY_LEVELLING)  # fmt: skip
    np.testing.assert_allclose(ramped.cap_w[4:], 342.0 + 10.0 / 4)


def test_a_donor_gives_no_lower_than_its_floor_or_its_cut_fall():
    tree = rack_tree()
    floors = PolicySettings(safety_by_caps=False, uncap_between_bands=False)
    state = make_state(tree, APART, APART, floor_w=[500.0] * 4 + [200.0] * 4)
    d = decide(tree, state, 1.0, floors)
    np.testing.assert_allclose(d.cap_w, [500.0] * 4 + [350.0] * 4)
    slow = PolicySettings(safety_by_caps=False, uncap_between_bands=False, cut_fall_w_per_s=5.0)
    d = decide(tree, make_state(tree, APART, APART), 1.0, slow)
    np.testing.assert_allclose(d.cap_w, [503.0] * 4 + [347.0] * 4)


def test_a_node_under_a_blocking_node_is_levelled_by_it_first():
    # the left server between its own bands: it blocks the rack's levelling of its GPUs
    tree = with_bands(rack_tree(), [LEFT], 2100.0, 2050.0, 2000.0)  # 2032 W: between
    d = decide(tree, make_state(tree, APART, APART), 1.0, ONLY_LEVELLING)
    np.testing.assert_allclose(d.cap_w, APART)  # level inside the server, blocked above it


def test_caps_within_the_tolerance_of_their_level_stay():
    tree = rack_tree()
    near = np.array([504.0] * 4 + [496.0] * 4)  # 4 W from the level: under max(5 W, 10 W)
    tree = with_bands(tree, [RACK], 4100.0, 4050.0, 3900.0)  # 4000 W: between
    d = decide(tree, make_state(tree, near, near), 1.0, ONLY_LEVELLING)
    np.testing.assert_allclose(d.cap_w, near)


def test_a_levelled_gpu_moves_once_a_cycle():
    tree = rack_tree()
    # rule 4 on, 50 W below the target: the levelled GPUs do not ask for it this cycle
    d = decide(tree, make_state(tree, APART, APART), 1.0, BANDS_POLICY)
    np.testing.assert_allclose(d.cap_w, [508.0 - 16.6] * 4 + [342.0 + 16.6] * 4)
    # a GPU of the class already at its level is not levelled, and asks
    cap = np.array([508.0] * 3 + [425.0] + [342.0] * 3 + [425.0])
    d = decide(tree, make_state(tree, cap, cap), 1.0, BANDS_POLICY)
    assert list(d.levelled) == [True] * 3 + [False] + [True] * 3 + [False]
    np.testing.assert_allclose(d.cap_w[[3, 7]], 425.0 + 50.0 / 2)  # the rack's 50 W, shared
