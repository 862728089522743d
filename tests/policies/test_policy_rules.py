"""policies.rules on its own: rule 1 and the tests both cycles share."""

from __future__ import annotations

import numpy as np

from policies import PHASE_CODES, PolicySettings
from policies.rules import held_at_cap, sanitised, stage_headroom_w, staged_gpus
from tests.support.policy_trees import make_state, uniform_tree


def test_rule_1_reads_what_cannot_be_trusted_as_the_failsafe_cap_or_the_range():
    tree = uniform_tree(1, 1, 1, 4)
    state = make_state(
        tree,
        [np.nan, -5.0, 500.0, 2000.0],
        [np.inf, 100.0, 5000.0, 700.0],
        floor_w=[np.nan, 100.0, 300.0, 9000.0],
        priority=[0, 1, 2, 7],
    )
    s = sanitised(tree, state)
    failsafe = np.asarray(tree.failsafe_cap_w, dtype=float)
    np.testing.assert_allclose(s.power, [failsafe[0], 0.0, 500.0, 2000.0])
    np.testing.assert_allclose(s.cap, [failsafe[0], 200.0, 1200.0, 700.0])
    np.testing.assert_allclose(s.floor, [200.0, 200.0, 300.0, 1200.0])
    assert s.priority.tolist() == [0, 1, 2, 2]


def test_held_and_staged_are_judged_alike_for_both_cycles():
    tree = uniform_tree(1, 1, 1, 4)
    phases = ["compute", "startup", "checkpoint", "compute"]
    state = make_state(
        tree,
        [690.0, 600.0, 300.0, 1200.0],
        [700.0, 700.0, 700.0, 1200.0],
        phase=[PHASE_CODES[p] for p in phases],
    )
    s = sanitised(tree, state)
    span = s.cap_max - s.cap_min
    held = held_at_cap(s.ctl, s.power, s.cap, s.cap_max, span, PolicySettings())
    # within 5 % of the range (50 W) below a cap under cap_max; at cap_max nobody is held
    assert held.tolist() == [True, False, False, False]
    assert staged_gpus(s).tolist() == [False, True, True, False]


def test_a_staged_cap_leaves_room_for_two_cycles_of_the_fill_under_software_smoothing():
    span = np.array([500.0, 1000.0])  # an H100's 200-700 W, a GB200's 200-1200 W
    plain = PolicySettings()  # 5 % of the range
    np.testing.assert_allclose(stage_headroom_w(span, 0.5, plain), [25.0, 50.0])
    # the demo's H100s: a 70 W/s share, 0.5 s cycles: 25 + 2 * 70 * 0.5 = 95 W, where 25 W
    # a cycle (50 W/s) held a fill rising at 70 W/s below its share
    smoothed = PolicySettings(startup_rise_w_per_s=70.0)
    np.testing.assert_allclose(stage_headroom_w(span, 0.5, smoothed), [95.0, 120.0])
    np.testing.assert_allclose(stage_headroom_w(span, 1.0, smoothed), [165.0, 190.0])
