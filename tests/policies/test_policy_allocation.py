"""Safety by caps (policies.allocation) and its solver (policies.fill): what must hold.

The invariant: every node's caps in force plus its overheads within its limit, at every
instant, whichever of a cycle's commands lands first (make before break). Then the
caps go where the work is: lenders give only what GPUs that ask take, classes in order.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from policies import HIGH, LOW, NORMAL, ClusterState, PolicySettings, decide
from policies.allocation import caps_in_force_fit
from policies.fill import fill, nested_sum
from policies.tree import PHASE_CODES, SERVER, Tree
from tests.support.policy_trees import make_state, random_tree_and_state, tree_from_fanout

CAPS = PolicySettings(safety_by_caps=True)
TOL_W = 1e-6
seeds = st.integers(0, 2**32 - 1)
many = settings(max_examples=150, deadline=None)
COMPUTE, COMM, IDLE, CHECKPOINT = (
    PHASE_CODES[p] for p in ("compute", "communication", "idle", "checkpoint")
)


def fitting(seed: int) -> tuple[Tree, ClusterState, float]:
    """A random tree and state whose caps in force fit every limit (the invariant holds),
    with limits drawn from just above the caps (full nodes) to roomy."""
    rng = np.random.default_rng(seed)
    tree, state, dt_s = random_tree_and_state(rng)
    cap = np.clip(state.cap_w, tree.cap_min_w, tree.cap_max_w)
    state.cap_w = cap
    # uncontrollable GPUs count at what they may hold: their caps in force
    in_force = tree.node_sum(cap) + tree.overhead_below_w
    limit = in_force * rng.uniform(1.0, 1.3, tree.n_nodes)
    full = rng.random(tree.n_nodes) < 0.3
    limit[full] = in_force[full]  # full nodes: not a watt of room
    limit = np.maximum(limit, in_force)
    return dataclasses.replace(tree, limit_w=limit), state, dt_s


def rooms(tree: Tree) -> np.ndarray:
    return np.asarray(tree.limit_w, dtype=float) - tree.overhead_below_w


# --- the solver ---------------------------------------------------------------------------


@many
@given(seed=seeds)
def test_fill_fits_every_room_and_leaves_no_watt_a_gpu_could_take(seed):
    rng = np.random.default_rng(seed)
    tree, _, _ = random_tree_and_state(rng)
    n = tree.n_gpus
    low = rng.uniform(0, 300, n)
    high = low + rng.uniform(0, 900, n) * (rng.random(n) < 0.9)
    room = tree.node_sum(low) + rng.uniform(0, 1.0, tree.n_nodes) * tree.node_sum(high - low)
    x = fill(tree, np.zeros(n), rng.uniform(0.1, 3.0, n), low, high, room)
    assert np.all(x >= low - TOL_W) and np.all(x <= high + TOL_W)
    sums = tree.node_sum(x)
    assert np.all(sums <= room + 1e-6 * np.maximum(1.0, room))
    # a GPU below its high has a full node over it (else the level could rise); the
    # levels are found by bisection: full to within a twentieth of a watt
    full = sums >= room - 0.05
    starved = x < high - 0.05
    blocked = np.zeros(n, dtype=bool)
    for lvl in range(4):
        blocked |= full[tree.gpu_ancestor[lvl]]
    assert not np.any(starved & ~blocked)


def test_fill_equals_the_optimum_of_the_speed_law_on_a_small_tree():
    """(o)'s allocation: the maximum of sum (x / d) ** a under nested limits, checked
    against a general-purpose solver."""
    tree = tree_from_fanout([[2, 1]], [2, 3, 2], cap_min_w=200.0, cap_max_w=1200.0)
    d = np.array([1200.0, 700.0, 1100.0, 900.0, 1000.0, 500.0, 1150.0])
    limit = np.full(tree.n_nodes, np.inf)
    limit[0] = 5200.0  # the site binds
    limit[tree.gpu_ancestor[SERVER][2]] = 2600.0  # and the second server
    tree = dataclasses.replace(tree, limit_w=limit, overhead_w=np.zeros(tree.n_nodes))
    a = 0.28
    low = np.minimum(d, 200.0)
    x = fill(tree, np.zeros(7), d ** (-a / (1 - a)), low, d, rooms(tree))

    def minus_speed(v: np.ndarray) -> float:
        return -float(np.sum((v / d) ** a))

    servers = tree.gpu_ancestor[SERVER]
    cons = [{"type": "ineq", "fun": lambda v: 5200.0 - v.sum()}]
    s2 = servers == servers[2]
    cons.append({"type": "ineq", "fun": lambda v: 2600.0 - v[s2].sum()})
    best = minimize(
        minus_speed, np.full(7, 300.0), bounds=list(zip(low, d, strict=True)), constraints=cons
    )
    assert best.success
    # as good as the solver's optimum (the objective is flat near it: the caps may differ
    # by watts where the speeds differ by a millionth)
    assert minus_speed(x) <= best.fun + 1e-6
    assert x.sum() <= 5200.0 + 1e-6 and x[s2].sum() <= 2600.0 + 1e-6


def test_nested_sum_counts_each_node_at_most_its_room():
    tree = tree_from_fanout([[1, 1]], [2, 2])
    x = np.array([100.0, 100.0, 300.0, 300.0])
    room = np.full(tree.n_nodes, np.inf)
    room[tree.gpu_ancestor[SERVER][2]] = 500.0
    assert nested_sum(tree, x, room, 0)[0] == pytest.approx(700.0)


# --- the invariant ------------------------------------------------------------------------


@many
@given(seed=seeds)
def test_caps_fit_every_limit_whichever_command_lands_first(seed):
    tree, state, dt_s = fitting(seed)
    old = np.asarray(state.cap_w, dtype=float)
    d = decide(tree, state, dt_s, CAPS)
    assert np.all(np.isfinite(d.cap_w))
    assert np.all(d.cap_w >= tree.cap_min_w - TOL_W) and np.all(d.cap_w <= tree.cap_max_w + TOL_W)
    # every command may land before or after every other: the worst is the higher of the two
    assert caps_in_force_fit(tree, np.maximum(old, d.cap_w), 1e-6).all()
    # an uncontrollable GPU is not moved
    ctl = np.asarray(state.controllable)
    np.testing.assert_array_equal(d.cap_w[~ctl], old[~ctl])


@many
@given(seed=seeds)
def test_a_broken_invariant_is_restored_by_cuts_where_the_floors_fit(seed):
    rng = np.random.default_rng(seed)
    tree, state, dt_s = random_tree_and_state(rng)
    state.cap_w = np.clip(state.cap_w, tree.cap_min_w, tree.cap_max_w)
    ctl = np.asarray(state.controllable)
    floor = np.clip(state.floor_w, tree.cap_min_w, tree.cap_max_w)
    least = tree.node_sum(np.where(ctl, floor, state.cap_w)) + tree.overhead_below_w
    in_force = tree.node_sum(state.cap_w) + tree.overhead_below_w
    limit = least + rng.uniform(0.0, 1.0, tree.n_nodes) * np.maximum(in_force - least, 0.0)
    tree = dataclasses.replace(tree, limit_w=limit)
    d = decide(tree, state, dt_s, CAPS)
    assert caps_in_force_fit(tree, np.maximum(np.minimum(state.cap_w, d.cap_w), 0), 1e-3).all()
    assert caps_in_force_fit(tree, d.cap_w, 1e-3).all()


# --- where the caps go --------------------------------------------------------------------


def one_rack(limit_w: float, gpus: int = 4) -> Tree:
    tree = tree_from_fanout([[1]], [gpus], cap_min_w=200.0, cap_max_w=1200.0)
    limit = np.full(tree.n_nodes, np.inf)
    limit[0] = limit_w
    return dataclasses.replace(tree, limit_w=limit, overhead_w=np.zeros(tree.n_nodes))


def test_an_idle_gpu_lends_to_one_held_at_its_cap_cut_first_raised_once_acknowledged():
    tree = one_rack(4 * 900.0)
    state = make_state(
        tree, power_w=[900.0, 900.0, 900.0, 100.0], cap_w=900.0, phase=[COMPUTE] * 3 + [IDLE]
    )
    first = decide(tree, state, 1.0, CAPS)
    # the idle GPU is cut to its floor (it draws less than that less its headroom); nothing
    # is raised yet
    assert first.cap_w[3] == pytest.approx(200.0)
    np.testing.assert_allclose(first.cap_w[:3], 900.0)
    # acknowledged: the watts it freed go to the three that want them, evenly
    state.cap_w = first.cap_w
    second = decide(tree, state, 1.0, CAPS)
    np.testing.assert_allclose(second.cap_w[:3], (3600.0 - 200.0) / 3)
    assert second.cap_w.sum() == pytest.approx(3600.0)


def test_a_short_communication_wait_keeps_its_cap_a_long_one_lends():
    tree = one_rack(2 * 900.0, gpus=2)
    state = make_state(tree, power_w=[900.0, 200.0], cap_w=900.0, phase=[COMPUTE, COMM])
    state.phase_s = np.array([1.0, 1.0])
    assert decide(tree, state, 1.0, CAPS).cap_w[1] == 900.0
    state.phase_s = np.array([1.0, CAPS.lend_after_s + 1.0])
    # it lends what the other takes (up to its maximum), no more
    np.testing.assert_allclose(decide(tree, state, 1.0, CAPS).cap_w, [900.0, 600.0])
    state.phase_s = None  # not announced: not known to be long
    assert decide(tree, state, 1.0, CAPS).cap_w[1] == 900.0


def test_an_announced_wait_lends_from_its_start_and_its_cap_is_back_before_it_ends():
    tree = dataclasses.replace(one_rack(2 * 900.0, gpus=2), failsafe_cap_w=np.full(2, 900.0))
    state = make_state(tree, power_w=[900.0, 200.0], cap_w=900.0, phase=[COMPUTE, COMM])
    state.phase_s = np.array([1.0, 0.5])
    state.phase_expected_s = np.array([np.nan, 10.0])  # said to last 10 s: lends at once
    np.testing.assert_allclose(decide(tree, state, 1.0, CAPS).cap_w, [900.0, 600.0])
    state.phase_expected_s = np.array([np.nan, CAPS.return_ahead_s])  # ends too soon
    np.testing.assert_allclose(decide(tree, state, 1.0, CAPS).cap_w, [900.0, 900.0])
    # lent; the wait ends within return_ahead_s: the borrower is cut at once, the lender
    # raised to its entitlement once that is acknowledged, both before the job resumes
    state.power_w, state.cap_w = np.array([1200.0, 200.0]), np.array([1200.0, 600.0])
    state.phase_s = np.array([9.0, 10.0 - CAPS.return_ahead_s + 0.5])
    state.phase_expected_s = np.array([np.nan, 10.0])
    d = decide(tree, state, 1.0, CAPS)
    np.testing.assert_allclose(d.cap_w, [900.0, 600.0])
    state.cap_w = d.cap_w
    np.testing.assert_allclose(decide(tree, state, 1.0, CAPS).cap_w, [900.0, 900.0])
    # not said: it lends on until its job resumes
    state.cap_w, state.phase_expected_s = np.array([1200.0, 600.0]), None
    np.testing.assert_allclose(decide(tree, state, 1.0, CAPS).cap_w, [1200.0, 600.0])


def test_high_takes_from_low_under_a_full_node_and_never_the_reverse():
    tree = one_rack(2 * 700.0, gpus=2)
    state = make_state(
        tree, power_w=[700.0, 700.0], cap_w=700.0, priority=[HIGH, LOW], phase=COMPUTE
    )
    d = decide(tree, state, 1.0, CAPS)
    assert d.cap_w[1] == pytest.approx(200.0)  # LOW down to its floor at once
    assert d.cap_w[0] == pytest.approx(700.0)  # HIGH raised only once that is acknowledged
    state.cap_w = d.cap_w
    assert decide(tree, state, 1.0, CAPS).cap_w[0] == pytest.approx(1200.0)
    # the other way round: LOW held, HIGH not wanting more: LOW gets nothing of HIGH's
    state = make_state(
        tree, power_w=[600.0, 700.0], cap_w=700.0, priority=[HIGH, LOW], phase=COMPUTE
    )
    np.testing.assert_allclose(decide(tree, state, 1.0, CAPS).cap_w, [700.0, 700.0])


def test_a_class_is_levelled_to_one_cap():
    tree = one_rack(4 * 800.0)
    state = make_state(
        tree, power_w=[1000.0, 600.0, 900.0, 700.0], cap_w=[1000.0, 600.0, 900.0, 700.0]
    )
    d = decide(tree, state, 1.0, CAPS)
    np.testing.assert_allclose(d.cap_w, [800.0, 600.0, 800.0, 700.0])  # cuts now
    state.cap_w = d.cap_w
    state.power_w = d.cap_w
    np.testing.assert_allclose(decide(tree, state, 1.0, CAPS).cap_w, 800.0)


def test_the_site_caps_rise_no_faster_than_its_ramp_and_the_root_limit_holds():
    tree = one_rack(4 * 1200.0)
    ramp = np.full(tree.n_nodes, np.inf)
    ramp[0] = 100.0
    tree = dataclasses.replace(tree, ramp_w_per_s=ramp)
    state = make_state(tree, power_w=500.0, cap_w=500.0, phase=COMPUTE)
    d = decide(tree, state, 1.0, CAPS)
    assert d.cap_w.sum() == pytest.approx(2000.0 + 100.0)
    # a root limit lowered under the caps (an operator's line, a grant): the draw the cuts
    # take off is at most the site's ramp a cycle ...
    tree = dataclasses.replace(tree, root_caps_limit_w=1800.0)
    d = decide(tree, state, 1.0, CAPS)
    assert d.cap_w.sum() == pytest.approx(2000.0 - 100.0)
    # ... less what cuts still in flight will take off (their acks not yet back): the two
    # racks cut last cycle are out of turn, their cuts stand; those in turn give nothing
    pending = dataclasses.replace(
        state,
        pending_cap_w=np.array([450.0, 450.0, np.nan, np.nan]),
        cut_turn=np.array([False, False, True, True]),
    )
    np.testing.assert_allclose(decide(tree, pending, 1.0, CAPS).cap_w, [450.0] * 2 + [500.0] * 2)
    # ... headroom nobody draws goes at once
    d = decide(tree, make_state(tree, power_w=400.0, cap_w=500.0, phase=COMPUTE), 1.0, CAPS)
    assert d.cap_w.sum() == pytest.approx(1800.0)
    # ... and over the breaker (its limit) every watt goes at once
    tree = dataclasses.replace(tree, limit_w=tree.overhead_below_w + 1700.0)
    d = decide(tree, state, 1.0, CAPS)
    assert d.cap_w.sum() <= 1700.0 + 1e-6


def test_a_gpu_with_a_command_in_flight_asks_no_more():
    tree = one_rack(4 * 1200.0)
    state = make_state(tree, power_w=500.0, cap_w=500.0, phase=COMPUTE)
    state.uncap_cycles = np.array([0.0, 1.0, 1.0, 1.0])
    d = decide(tree, state, 1.0, CAPS)
    assert d.cap_w[0] == 500.0 and np.all(d.cap_w[1:] == 1200.0)


def test_normal_priority_default_state_is_stable():
    """Caps that already fit, GPUs neither asking nor lending: no command."""
    tree = one_rack(4 * 800.0)
    # within h of the cap (50 W on this range) a GPU asks; more than 3 h under, it lends
    state = make_state(tree, power_w=[700.0, 690.0, 720.0, 705.0], cap_w=800.0, priority=NORMAL)
    np.testing.assert_array_equal(decide(tree, state, 1.0, CAPS).cap_w, 800.0)


def test_cuts_that_restore_the_invariant_wait_their_turn_unless_a_limit_is_drawn_over():
    """Caps over a limit (a site taken over from the bands, every cap at its maximum): the
    cuts are made, but where every node over the GPUs draws within its limit they are
    marked to go in turn with the raises (Decision.levelled); where one draws over it,
    at once."""
    tree = one_rack(4 * 600.0)
    state = make_state(tree, power_w=400.0, cap_w=1200.0, phase=COMPUTE)
    d = decide(tree, state, 1.0, CAPS)
    assert caps_in_force_fit(tree, d.cap_w).all()
    assert d.levelled.all() and (d.cut_levels != 0).all()
    state.power_w = np.full(4, 700.0)  # 2,800 W drawn on a 2,400 W limit
    d = decide(tree, state, 1.0, CAPS)
    assert caps_in_force_fit(tree, d.cap_w).all()
    assert not d.levelled.any() and (d.cut_levels != 0).all()


# --- under grid smoothing ------------------------------------------------------------------

STARTUP = PHASE_CODES["startup"]


def test_under_grid_smoothing_a_start_holds_caps_a_headroom_and_two_cycles_of_fill_over_its_draw():
    tree = one_rack(4 * 1200.0)
    state = make_state(tree, 400.0, 960.0, phase=STARTUP)
    smoothed = dataclasses.replace(CAPS, startup_rise_w_per_s=50.0)
    h = CAPS.stage_headroom_fraction * 1000.0  # 50 W of the 200-1200 W range
    d = decide(tree, state, 1.0, smoothed)
    # follows the draw, not its entitlement: one headroom over it, and what its fill rises
    # by in two 1 s cycles at 50 W/s (with the headroom alone the cap paced the start,
    # below its share of the ramp: policies.rules.stage_headroom_w)
    np.testing.assert_allclose(d.cap_w, 400.0 + h + 2 * 50.0)
    # a cycle 0.1 s after the last: two of its seconds, unless told the period's
    np.testing.assert_allclose(decide(tree, state, 0.1, smoothed).cap_w, 400.0 + h + 0.2 * 50.0)
    told = dataclasses.replace(smoothed, stage_fill_s=2.0)
    np.testing.assert_allclose(decide(tree, state, 0.1, told).cap_w, 400.0 + h + 2 * 50.0)
    # without grid smoothing a start keeps its cap: nothing asks for its watts
    np.testing.assert_allclose(decide(tree, state, 1.0, CAPS).cap_w, 960.0)


def test_under_grid_smoothing_raises_leave_the_site_ramp_to_the_starts_rising_on_their_own():
    tree = one_rack(8 * 1200.0, gpus=8)
    ramp = np.full(tree.n_nodes, np.inf)
    ramp[0] = 1000.0  # W/s at the site
    tree = dataclasses.replace(tree, ramp_w_per_s=ramp)
    # 4 GPUs computing at their 600 W caps ask; 4 start, rising on their own at 50 W/s each
    cap = np.array([600.0] * 4 + [300.0] * 4)
    power = np.array([600.0] * 4 + [250.0] * 4)
    phase = np.array([COMPUTE] * 4 + [STARTUP] * 4, dtype=np.int8)
    state = make_state(tree, power, cap)
    state.phase = phase
    smoothed = dataclasses.replace(CAPS, startup_rise_w_per_s=50.0)
    d = decide(tree, state, 1.0, smoothed)
    raised = float(np.sum(d.cap_w[:4] - 600.0))
    # the ramp less the starts' own rise (50 W/s each) and the headroom each holds over its
    # draw (50 W and two cycles of its fill, 100 W: it draws it at once when its compute
    # begins; policies.rules.stage_headroom_w)
    h = CAPS.stage_headroom_fraction * 1000.0 + 2 * 50.0
    np.testing.assert_allclose(d.cap_w[4:], 250.0 + h)
    assert raised == pytest.approx(1000.0 - 4 * 50.0 - 4 * h)


def test_under_grid_smoothing_raises_leave_the_site_ramp_to_a_start_on_idle_gpus():
    """A job's first step from idle (loading, before any cap is staged) is its own: `powerd
    demo --smoothing` broke the ramp by it, 3.6 kW of a job starting on top of a window of
    caps handed back. Each GPU that may start (idle, announced or jobless; or with no phase
    announced, drawing under its least cap) keeps one stage headroom per window (the
    profile's hysteresis, 1 s) out of the raises; one whose job announced compute, that
    draws like a job's GPU or whose smoothing hardware ramps it, none; without grid
    smoothing, none."""
    tree = one_rack(8 * 1200.0, gpus=8)
    ramp = np.full(tree.n_nodes, np.inf)
    ramp[0] = 1000.0  # W/s at the site
    tree = dataclasses.replace(tree, ramp_w_per_s=ramp)
    # 4 GPUs computing at their 600 W caps ask; 2 idle (one announced, one jobless), one
    # unannounced drawing like a job's GPU, one announced computing at a low draw
    cap = np.array([600.0] * 4 + [500.0] * 4)
    power = np.array([600.0] * 4 + [70.0, 70.0, 450.0, 150.0])
    state = make_state(tree, power, cap)
    state.phase = np.array([COMPUTE] * 4 + [IDLE, COMPUTE, COMPUTE, COMPUTE], dtype=np.int8)
    state.phase_s = np.array([3.0] * 4 + [3.0, np.nan, np.nan, 3.0])
    smoothed = dataclasses.replace(CAPS, startup_rise_w_per_s=50.0, wait_rise_after_s=1.0)
    no_window = dataclasses.replace(smoothed, wait_rise_after_s=float("inf"))

    def raised(policy: PolicySettings) -> float:
        return float(np.sum(np.maximum(decide(tree, state, 1.0, policy).cap_w - cap, 0.0)))

    h = CAPS.stage_headroom_fraction * 1000.0  # 50 W of a 200-1200 W range, per 1 s window
    assert raised(no_window) == pytest.approx(raised(CAPS))  # no hysteresis: none kept
    assert raised(no_window) > 2 * h
    assert raised(smoothed) == pytest.approx(raised(no_window) - 2 * h)
    # a GPU whose own smoothing hardware ramps its draw starts with no step: none kept for it
    state.ramps_in_hardware = np.array([False] * 4 + [True, False, False, False])
    assert raised(smoothed) == pytest.approx(raised(no_window) - h)


def test_under_grid_smoothing_a_starts_headroom_is_its_own_not_a_raise_for_a_higher_class():
    """A staged GPU's raise to its stage cap is counted in the ramp already, as headroom it
    draws at once when its compute begins; a HIGH GPU computing held at its cap must not
    take it: it would draw it at once, uncounted, while the headroom counted went
    ungranted (``powerd demo --smoothing``: a high-priority job's 128 GPUs drew 8 kW of a
    low-priority start's headroom the moment the start's caps were due)."""
    tree = one_rack(8 * 1200.0, gpus=8)
    ramp = np.full(tree.n_nodes, np.inf)
    ramp[0] = 400.0  # W/s at the site: less than the starts rise by and hold over their draw
    tree = dataclasses.replace(tree, ramp_w_per_s=ramp)
    cap = np.array([600.0] * 4 + [260.0] * 4)
    power = np.array([600.0] * 4 + [250.0] * 4)
    state = make_state(tree, power, cap)
    state.phase = np.array([COMPUTE] * 4 + [STARTUP] * 4, dtype=np.int8)
    state.priority = np.array([HIGH] * 4 + [LOW] * 4, dtype=np.int8)
    smoothed = dataclasses.replace(CAPS, startup_rise_w_per_s=50.0)
    d = decide(tree, state, 1.0, smoothed)
    h = CAPS.stage_headroom_fraction * 1000.0 + 2 * 50.0  # over its draw, as above
    np.testing.assert_allclose(d.cap_w[4:], 250.0 + h)  # the starts get their stage caps
    np.testing.assert_allclose(d.cap_w[:4], 600.0)  # and the ramp has nothing left to raise
