"""Priorities between the bands (rule 3b) and in uncapping (HIGH first).

The inversion this closes: a high-priority job comes out of a checkpoint at its
staged caps while a low-priority job, uncapped in the meantime, fills the site
to between its bands. Capping never starts (the site is not over its
threshold), uncapping never starts (it is not below its uncapping threshold):
without rule 3b the high-priority job would stay at its staged caps for as long
as the low-priority one runs.
"""

from __future__ import annotations

import numpy as np
import pytest

from policies import HIGH, LOW, NORMAL, PolicySettings, decide
from tests.support.policy_trees import (
    make_state,
    uncapping_everywhere,
    uniform_tree,
    with_bands,
    with_ramp,
)

SITE_BANDS = (6000.0, 5800.0, 5000.0)  # threshold, target, uncapping threshold
# Rule 3b and the bands' uncapping are policies/capping.py's; safety by caps, the default,
# moves watts between classes its own way (tests/policies/test_policy_allocation.py).
BANDS = PolicySettings(safety_by_caps=False)


def two_servers():
    """One rack of two 4-GPU servers (200-1200 W): GPUs 0-3 on server 3, 4-7 on server 4.
    Only the site has bands; every other node always hands back."""
    return with_bands(uncapping_everywhere(uniform_tree(1, 1, 2, 4)), [0], *SITE_BANDS)


def run(tree, demand_w, cap_w, priority, cycles: int, settings: PolicySettings = BANDS):
    """Closed loop: each GPU draws min(demand, cap); the caps of each cycle feed the next."""
    demand_w = np.asarray(demand_w, dtype=float)
    cap = np.asarray(cap_w, dtype=float)
    site_w = []
    for _ in range(cycles):
        power = np.minimum(demand_w, cap)
        d = decide(tree, make_state(tree, power, cap, priority=priority), 1.0, settings)
        site_w.append(d.node_power_w[0])
        cap = d.cap_w
    return cap, np.array(site_w)


HIGH_LOW = np.array([HIGH] * 4 + [LOW] * 4)


def test_a_high_job_held_at_staged_caps_takes_the_watts_back_from_low():
    tree = two_servers()
    # after the checkpoint: HIGH at its 450 W staged caps wants 1000 W, LOW draws 1000 W
    demand = [1000.0] * 8
    start = [450.0] * 4 + [1200.0] * 4
    cap, site_w = run(tree, demand, start, HIGH_LOW, cycles=40)
    assert np.all(cap[:4] >= 1000.0)  # HIGH no longer held below its demand
    assert np.all(cap[4:] < 500.0)  # LOW gave it
    assert site_w.max() <= SITE_BANDS[0] + 1e-6  # never above the capping threshold


def test_without_the_shift_the_inversion_stays():
    tree = two_servers()
    start = [450.0] * 4 + [1200.0] * 4
    cap, _ = run(
        tree,
        [1000.0] * 8,
        start,
        HIGH_LOW,
        40,
        PolicySettings(safety_by_caps=False, priority_shift=False),
    )
    np.testing.assert_allclose(cap, start)


def test_no_shift_when_the_high_gpus_are_not_held_by_their_caps():
    tree = two_servers()
    state = make_state(tree, [300.0] * 4 + [1000.0] * 4, [450.0] * 4 + [1200.0] * 4,
                       priority=HIGH_LOW)  # fmt: skip
    tree = with_bands(tree, [0], 6000.0, 5800.0, 4000.0)  # 5200 W: between the bands
    d = decide(tree, state, 1.0, BANDS)
    assert not d.shifted.any() and d.node_shift_w.sum() == 0.0
    np.testing.assert_allclose(d.cap_w, state.cap_w)


def test_no_shift_among_equals():
    tree = two_servers()
    state = make_state(tree, [450.0] * 4 + [1000.0] * 4, [450.0] * 4 + [1200.0] * 4,
                       priority=NORMAL)  # fmt: skip
    d = decide(tree, state, 1.0, BANDS)
    assert not d.shifted.any()
    np.testing.assert_allclose(d.cap_w, state.cap_w)


def test_a_shift_takes_just_enough_to_go_below_the_uncapping_threshold():
    tree = two_servers()
    state = make_state(tree, [450.0] * 4 + [1000.0] * 4, [450.0] * 4 + [1200.0] * 4,
                       priority=HIGH_LOW)  # fmt: skip
    d = decide(tree, state, 1.0, BANDS)
    # 5800 W measured; down to just under 5000 W: ~800 W, water-filled over the LOW GPUs
    assert d.node_shift_w[0] == pytest.approx(805.0)  # margin: 0.1 % of 5000 W
    np.testing.assert_allclose(d.cap_w[4:], 1000.0 - 805.0 / 4)
    assert list(d.shifted) == [False] * 4 + [True] * 4
    assert not d.cut_levels.any()  # a shift is not capping
    # the held HIGH GPUs gain at once, between the bands, up to the site's target at most
    np.testing.assert_allclose(d.cap_w[:4], 450.0 + 0.2 * (1200.0 - 450.0))
    assert d.node_predicted_w[0] <= tree.cap_target_w[0] + 1e-9
    later = decide(
        tree, state, 1.0, PolicySettings(safety_by_caps=False, uncap_between_bands=False)
    )
    np.testing.assert_allclose(later.cap_w[:4], 450.0)  # without: they gain next cycle


def test_a_shift_is_bounded_by_what_the_held_gpus_can_use_and_by_floors():
    tree = with_bands(two_servers(), [0], 9000.0, 8800.0, 2000.0)  # 8600 W: between
    # HIGH 50 W short of cap_max: at most 4 x 50 = 200 W moves, though 3800 W would be needed
    state = make_state(tree, [1150.0] * 4 + [1000.0] * 4, [1150.0] * 4 + [1200.0] * 4,
                       priority=HIGH_LOW, floor_w=[200.0] * 4 + [980.0] * 4)  # fmt: skip
    d = decide(tree, state, 1.0, BANDS)
    assert d.node_shift_w[0] == pytest.approx(80.0)  # LOW floors at 980 W leave 4 x 20 W
    np.testing.assert_allclose(d.cap_w[4:], 980.0)
    state.floor_w[4:] = 200.0
    d = decide(tree, state, 1.0, BANDS)
    assert d.node_shift_w[0] == pytest.approx(200.0)


def test_normal_gives_to_high_and_low_gives_first():
    tree = with_bands(uncapping_everywhere(uniform_tree(1, 1, 3, 2)), [0], 6000.0, 5800.0, 4000.0)
    priority = [HIGH, HIGH, NORMAL, NORMAL, LOW, LOW]
    state = make_state(tree, [450.0, 450.0, 1000.0, 1000.0, 1000.0, 1000.0],
                       [450.0, 450.0, 1200.0, 1200.0, 1200.0, 1200.0], priority=priority)  # fmt: skip
    d = decide(tree, state, 1.0, BANDS)  # 4900 W: must shed ~904 W, LOW can give 1600 W
    np.testing.assert_allclose(d.cap_w[2:4], 1200.0)  # NORMAL untouched: LOW sufficed
    assert np.all(d.cap_w[4:] < 1000.0)


def test_uncapping_serves_high_before_normal_before_low():
    tree = with_ramp(uncapping_everywhere(uniform_tree(1, 1, 1, 3)), [3], 100.0)
    settings = PolicySettings(safety_by_caps=False, uncap_step_fraction=0.1)
    # drawing 300 W under 500 W caps: not held by them, just capped from before
    state = make_state(tree, 300.0, 500.0, priority=[LOW, HIGH, NORMAL])
    d = decide(tree, state, 1.0, settings)
    # each asks 70 W; the server may rise 100 W: HIGH gets 70, NORMAL 30, LOW nothing
    np.testing.assert_allclose(d.cap_w, [500.0, 570.0, 530.0])


def test_lower_classes_wait_while_a_higher_one_is_held_at_its_caps():
    tree = with_ramp(uncapping_everywhere(uniform_tree(1, 1, 1, 3)), [3], 100.0)
    settings = PolicySettings(safety_by_caps=False, uncap_step_fraction=0.1)
    # HIGH draws its whole 500 W cap: what it leaves would be shifted back to it next cycle
    state = make_state(tree, [300.0, 500.0, 300.0], 500.0, priority=[LOW, HIGH, NORMAL])
    d = decide(tree, state, 1.0, settings)
    np.testing.assert_allclose(d.cap_w, [500.0, 570.0, 500.0])


def test_a_high_gpu_its_own_rack_holds_does_not_starve_low_gpus_elsewhere():
    """Rack 2 (HIGH, 2 x 1000 W at 1000 W caps) sits at its 2000 W target: nothing more for
    its GPUs there. Rack 3's LOW GPUs want more and rack 3, the row and the site have room:
    the watts the HIGH GPUs cannot reach go to them (they got nothing when any held HIGH
    GPU zeroed every ancestor's budget; a 150 MW replay sat 2 MW under its target so)."""
    tree = uncapping_everywhere(uniform_tree(1, 2, 1, 2))  # site 0, row 1, racks 2-3
    tree = with_bands(tree, [2], 2100.0, 2000.0, 1900.0)
    state = make_state(tree, [1000.0, 1000.0, 500.0, 500.0], [1000.0, 1000.0, 500.0, 500.0],
                       priority=[HIGH, HIGH, LOW, LOW])  # fmt: skip
    d = decide(tree, state, 1.0, BANDS)
    np.testing.assert_allclose(d.cap_w[:2], 1000.0)  # held by their rack's target
    assert np.all(d.cap_w[2:] > 500.0)  # LOW under another rack is handed watts back
    # a HIGH GPU held only by its own step (its rack has room) still holds LOW back
    roomy = decide(uncapping_everywhere(uniform_tree(1, 2, 1, 2)), state, 1.0, BANDS)
    assert np.all(roomy.cap_w[:2] > 1000.0) and np.all(roomy.cap_w[2:] == 500.0)
