"""policies.causes: which rule a held GPU's loss is charged to."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from policies.causes import (
    CAPPING,
    CLOCK_LOCK,
    FAILSAFE,
    GRID_RAMP,
    LOST_CAUSES,
    NOT_HELD,
    PRIORITY_SHIFT,
    STAGED,
    cap_causes,
    held_causes,
    initial_causes,
    job_causes,
    loss_by_cause,
)
from policies.settings import Decision
from policies.tree import PHASE_CODES

COMPUTE, STARTUP = PHASE_CODES["compute"], PHASE_CODES["startup"]


def decision(cap_w, cut_levels, shifted) -> Decision:
    n = len(cap_w)
    return Decision(
        cap_w=np.asarray(cap_w, float),
        max_sm_clock_mhz=np.full(n, np.nan),
        node_power_w=np.zeros(1),
        node_predicted_w=np.zeros(1),
        node_capping=np.zeros(1, bool),
        floor_hold_energy_j=0.0,
        cut_levels=np.asarray(cut_levels, np.uint8),
        shifted=np.asarray(shifted, bool),
    )


def test_the_rule_that_lowered_a_cap_is_its_cause_and_a_rise_keeps_it():
    causes = initial_causes(5)
    old = np.full(5, 500.0)
    # 0: cut (and staged: capping wins); 1: shifted; 2: staged; 3: raised; 4: unchanged
    d = decision([400, 450, 480, 550, 500], [1, 0, 0, 0, 0], [False, True, False, False, False])
    phase = np.array([STARTUP, COMPUTE, STARTUP, COMPUTE, COMPUTE], np.int8)
    out = cap_causes(causes, old, d, phase)
    assert list(out) == [CAPPING, PRIORITY_SHIFT, STAGED, FAILSAFE, FAILSAFE]
    assert list(causes) == [FAILSAFE] * 5  # not changed in place


def test_a_cap_lowered_to_level_its_class_is_charged_to_capping():
    causes = initial_causes(3)
    # 0: levelled down; 1: levelled up (keeps its cause); 2: untouched
    d = decision([450, 550, 500], [0, 0, 0], [False, False, False])
    d.levelled = np.array([True, True, False])
    out = cap_causes(causes, np.full(3, 500.0), d, np.full(3, COMPUTE, np.int8))
    assert list(out) == [CAPPING, FAILSAFE, FAILSAFE]


def test_under_caps_a_gpu_a_full_node_holds_at_its_failsafe_start_is_charged_to_capping():
    causes = initial_causes(3)
    causes[2] = PRIORITY_SHIFT
    # 0: asks, its node full; 1: asks, given what it asked; 2: short, but its cause stands
    d = decision([500, 550, 500], [0, 0, 0], [False, False, False])
    d.short = np.array([True, False, True])
    out = cap_causes(causes, np.full(3, 500.0), d, np.full(3, COMPUTE, np.int8))
    assert list(out) == [CAPPING, FAILSAFE, PRIORITY_SHIFT]


def test_a_full_rack_under_caps_reports_its_askers_short():
    from policies import PolicySettings, decide
    from tests.support.policy_trees import make_state, tree_from_fanout

    tree = tree_from_fanout([[1]], [4], cap_min_w=200.0, cap_max_w=1200.0)
    limit = np.full(tree.n_nodes, np.inf)
    limit[0] = 4 * 960.0
    tree = dataclasses.replace(
        tree, limit_w=limit, overhead_w=np.zeros(tree.n_nodes), failsafe_cap_w=np.full(4, 960.0)
    )
    state = make_state(tree, 960.0, 960.0)  # every GPU at its failsafe cap, asking for more
    d = decide(tree, state, 1.0, PolicySettings(safety_by_caps=True))
    assert d.short.all()
    assert list(cap_causes(initial_causes(4), state.cap_w, d, state.phase)) == [CAPPING] * 4


def test_held_causes_separate_the_cap_the_ramp_and_the_clock():
    demand = np.array([600.0, 600.0, 600.0, 600.0])
    capped = np.array([600.0, 500.0, 600.0, 500.0])  # min(demand, cap)
    drawn = np.array([600.0, 500.0, 550.0, 500.0])
    causes = np.array([CAPPING, CAPPING, CAPPING, STAGED], np.int8)
    locked = np.array([False, False, False, True])
    out = held_causes(drawn, demand, capped, causes, locked)
    assert list(out) == [NOT_HELD, CAPPING, GRID_RAMP, CLOCK_LOCK]


def test_a_job_pays_for_its_slowest_gpu_cause():
    speed = np.array([1.0, 0.9, 0.95, 1.0, 1.0])
    cause = np.array([NOT_HELD, STAGED, CAPPING, NOT_HELD, NOT_HELD], np.int8)
    out = job_causes(speed, cause, np.array([0, 3]))  # job 0: GPUs 0-2, job 1: GPUs 3-4
    assert list(out) == [STAGED, NOT_HELD]


def test_loss_by_cause_puts_uncharged_loss_last():
    out = loss_by_cause(np.array([0.1, 0.2, 0.05]), np.array([CAPPING, NOT_HELD, CAPPING]))
    assert len(out) == len(LOST_CAUSES)
    assert out[CAPPING] == pytest.approx(0.15)
    assert out[-1] == pytest.approx(0.2)


def test_the_grid_holds_back_its_ramp_and_its_staged_caps_not_the_budgets():
    """Four GPUs wanting 500 W. A: capped at 400 W by a budget, drawing 400 W: nothing is
    the grid's. B: its cap staged to 300 W, drawing 300 W: 200 W held, all beyond what it
    draws. C: capped at 450 W by a budget, its smoothing holding it at 420 W: 30 W (the
    ramp's), the 50 W under the cap the budget's. D: staged to 300 W, ramping at 250 W:
    50 W + 200 W."""
    from policies.causes import CAPPING, STAGED, grid_held_w

    demand = np.full(4, 500.0)
    capped = np.array([400.0, 300.0, 450.0, 300.0])
    drawn = np.array([400.0, 300.0, 420.0, 250.0])
    cause = np.array([CAPPING, STAGED, CAPPING, STAGED], dtype=np.int8)
    held, beyond = grid_held_w(drawn, demand, capped, cause)
    assert held.tolist() == [0.0, 200.0, 30.0, 250.0]
    assert beyond.tolist() == [0.0, 200.0, 0.0, 200.0]


def test_a_stage_cut_under_a_budget_holds_only_what_it_took():
    """The demo's checkpoint under a row budget: a GPU capped at 530 W by the budget (its
    compute wants 631 W) is staged to 518 W as compute resumes, then handed back 525 W, 532 W
    and 539 W. The stage holds 530 - cap of it while the cap climbs back (the 101 W above 530 W
    stay the budget's), and none once the cap is back at 530 W: the GPU is the budget's
    again. A GPU staged from its failsafe start (a job's start) carries the stage as
    before, all the way up."""
    from policies.causes import carry_causes, grid_held_w, initial_carried

    carried = initial_carried(2)
    carried = dataclasses.replace(carried, cause=np.array([CAPPING, FAILSAFE], np.int8))
    compute = np.full(2, COMPUTE, np.int8)
    staged = np.full(2, STARTUP, np.int8)  # a staged phase, as the controller saw it
    carried = carry_causes(
        carried, np.array([530.0, 500.0]), decision([518, 200], [0, 0], [0, 0]), staged
    )
    assert list(carried.cause) == [STAGED, STAGED]
    assert carried.staged_from_w.tolist() == [530.0, np.inf]
    demand = np.full(2, 631.0)
    for cap_w, held_w in ((518.0, 12.0), (525.0, 5.0)):
        capped = np.array([cap_w, cap_w])
        _, beyond = grid_held_w(capped, demand, capped, carried.cause, carried.staged_from_w)
        assert beyond.tolist() == [held_w, 631.0 - cap_w]
        old = capped
        carried = carry_causes(
            carried, old, decision([cap_w + 7, cap_w + 7], [0, 0], [0, 0]), compute
        )
    carried = carry_causes(
        carried, np.full(2, 532.0), decision([539, 539], [0, 0], [0, 0]), compute
    )
    assert list(carried.cause) == [CAPPING, STAGED]  # back at the budget's cap: the budget's
    assert carried.staged_from_w[0] == np.inf
    capped = np.full(2, 539.0)
    _, beyond = grid_held_w(capped, demand, capped, carried.cause, carried.staged_from_w)
    assert beyond.tolist() == [0.0, 92.0]
    # staged again later, from the budget's cap: a new cut, found where the cap stands
    carried = carry_causes(carried, np.full(2, 539.0), decision([500, 539], [0, 0], [0, 0]), staged)
    assert list(carried.cause) == [STAGED, STAGED] and carried.staged_from_w[0] == 539.0
