"""Phases in decide() (clock locks, staged start and checkpoint caps, floor cost) and infer_phases()."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import PHASE_CODES, ROW, SERVER, PolicySettings, decide, infer_phases
from policies.phases import _row_quantile
from tests.support.policy_trees import make_state, uncapping_everywhere, uniform_tree, with_ramp

INF = float("inf")
COMPUTE, COMM, CKPT, STARTUP = (
    PHASE_CODES["compute"],
    PHASE_CODES["communication"],
    PHASE_CODES["checkpoint"],
    PHASE_CODES["startup"],
)
# Staged phases and the rises kept out of the ramp are the bands' (policies/capping.py,
# rules 2 and 4); clock locks and the floor's cost (rules 5 and 6) are safety by caps' too.
BANDS = PolicySettings(safety_by_caps=False)


# --- clock locks ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [BANDS, PolicySettings()], ids=["bands", "caps"])
def test_communication_locks_the_sm_clock(policy):
    tree = uniform_tree(1, 1, 1, 4, comm_clock_mhz=1100.0)
    state = make_state(tree, 500.0, phase=[COMM, COMPUTE, COMM, CKPT])
    d = decide(tree, state, 1.0, policy)
    np.testing.assert_array_equal(d.max_sm_clock_mhz, [1100.0, np.nan, 1100.0, np.nan])


@pytest.mark.parametrize("policy", [BANDS, PolicySettings()], ids=["bands", "caps"])
def test_no_clock_lock_when_off_unknown_or_offline(policy):
    tree = uniform_tree(1, 1, 1, 4, comm_clock_mhz=1100.0)
    state = make_state(tree, 500.0, phase=COMM)
    off = decide(tree, state, 1.0, dataclasses.replace(policy, comm_clock_lock=False))
    assert np.all(np.isnan(off.max_sm_clock_mhz))
    unknown = dataclasses.replace(tree, comm_clock_mhz=np.array([np.nan, 900.0, 900.0, 900.0]))
    d = decide(unknown, state, 1.0, policy)
    np.testing.assert_array_equal(d.max_sm_clock_mhz, [np.nan, 900.0, 900.0, 900.0])
    state.controllable[1] = False
    d = decide(unknown, state, 1.0, policy)
    np.testing.assert_array_equal(d.max_sm_clock_mhz, [np.nan, np.nan, 900.0, 900.0])


# --- staged start and checkpoint ------------------------------------------------------------


def test_startup_lowers_caps_to_the_staged_cap():
    tree = uncapping_everywhere(uniform_tree(1, 1, 1, 4))  # 200-1200 W
    settings = PolicySettings(
        safety_by_caps=False, startup_cap_fraction=0.25, stage_headroom_fraction=0.05
    )
    state = make_state(tree, [150.0, 150.0, 600.0, 150.0], [1200.0, 300.0, 1200.0, 1200.0])
    state.phase[:3] = STARTUP
    d = decide(tree, state, 1.0, settings)
    # 450 W = 200 + 0.25 x 1000; never raised (300 stays); a GPU drawing 600 W keeps 50 W
    # above its draw; the GPU in compute (uncapping everywhere) keeps its cap_max
    np.testing.assert_allclose(d.cap_w, [450.0, 300.0, 650.0, 1200.0])


def test_staged_cap_respects_the_jobs_floor():
    tree = uniform_tree(1, 1, 1, 2)
    state = make_state(tree, 150.0, phase=STARTUP, floor_w=[800.0, 200.0])
    d = decide(tree, state, 1.0, BANDS)
    np.testing.assert_allclose(d.cap_w, [800.0, 450.0])


def test_checkpoint_caps_follow_the_gpus_down():
    tree = uncapping_everywhere(uniform_tree(1, 1, 1, 3))
    state = make_state(tree, [300.0, 800.0, 1000.0], phase=[CKPT, CKPT, COMPUTE])
    d = decide(tree, state, 1.0, BANDS)
    np.testing.assert_allclose(d.cap_w, [450.0, 850.0, 1200.0])


def simulate_job(phases: list[int], demand_w: list[float], staged: bool):
    """A 16-GPU job on a ramp-limited tree; each cycle's power is min(demand, cap in force)."""
    tree = uncapping_everywhere(uniform_tree(1, 2, 2, 4))
    tree = with_ramp(tree, [0], 1000.0)
    tree = with_ramp(tree, tree.level == ROW, 800.0)
    tree = with_ramp(tree, tree.level == SERVER, 400.0)
    state = make_state(tree, demand_w[0])
    site_power, caps = [], []
    for phase, demand in zip(phases, demand_w, strict=True):
        state.phase[:] = phase if staged else COMPUTE
        state.power_w = np.minimum(demand, state.cap_w)
        site_power.append(state.power_w.sum())
        new_cap = decide(tree, state, 1.0, BANDS).cap_w
        caps.append(new_cap.sum() - state.cap_w.sum())
        state.cap_w = new_cap
    return np.array(site_power), np.array(caps), state


def test_job_start_rise_is_bounded_by_the_site_ramp():
    n_start, n_run = 5, 40
    phases = [STARTUP] * n_start + [COMPUTE] * n_run
    demand = [150.0] * n_start + [1000.0] * n_run
    power, cap_rise, state = simulate_job(phases, demand, staged=True)
    np.testing.assert_allclose(state.cap_w, 1200.0)  # caps are all handed back in the end
    steps = np.diff(power)
    # one staged step when compute begins: at most up to the 450 W staged cap per GPU
    assert steps[n_start - 1] == pytest.approx(16 * (450.0 - 150.0))
    # after it, the site (1000 W/s) bounds every rise, of the caps and of the power
    assert np.all(steps[n_start:] <= 1000.0 + 1e-6)
    assert np.all(cap_rise <= 1000.0 + 1e-6)
    assert power[-1] == pytest.approx(16 * 1000.0)  # and the job does get to full power
    # without the startup phase the whole swing arrives in one cycle
    unstaged, _, _ = simulate_job(phases, demand, staged=False)
    assert np.diff(unstaged).max() == pytest.approx(16 * (1000.0 - 150.0))


def test_checkpoint_resume_is_ramp_limited():
    phases = [COMPUTE] * 3 + [CKPT] * 5 + [COMPUTE] * 40
    demand = [1000.0] * 3 + [250.0] * 5 + [1000.0] * 40
    power, _, _ = simulate_job(phases, demand, staged=True)
    resume = 8
    assert power[resume] - power[resume - 1] == pytest.approx(16 * (450.0 - 250.0))
    assert np.all(np.diff(power)[resume:] <= 1000.0 + 1e-6)
    assert power[-1] == pytest.approx(16 * 1000.0)
    unstaged, _, _ = simulate_job(phases, demand, staged=False)
    assert unstaged[resume] - unstaged[resume - 1] == pytest.approx(16 * 750.0)


def test_gpus_starting_on_their_own_take_their_rise_out_of_the_ramp_handed_back():
    """Under software grid smoothing a starting job fills up at its GPUs' ramp-up share by
    itself: 8 GPUs computing and 4 starting under a 1000 W/s site ramp, each start rising
    50 W/s, leave 800 W/s for the caps handed back; 300 W/s each would leave nothing."""
    tree = with_ramp(uncapping_everywhere(uniform_tree(1, 1, 3, 4)), [0], 1000.0)
    state = make_state(tree, 400.0, 400.0)  # caps at 400 W of 200-1200 W, drawing them
    state.phase[8:] = STARTUP
    alone = decide(tree, state, 1.0, PolicySettings(safety_by_caps=False, uncap_step_fraction=1.0))
    assert alone.cap_w[:8].sum() - 8 * 400.0 == pytest.approx(1000.0)
    shared = decide(
        tree,
        state,
        1.0,
        PolicySettings(safety_by_caps=False, uncap_step_fraction=1.0, startup_rise_w_per_s=50.0),
    )
    assert shared.cap_w[:8].sum() - 8 * 400.0 == pytest.approx(1000.0 - 4 * 50.0)
    np.testing.assert_array_equal(shared.cap_w[8:], alone.cap_w[8:])  # the starts as before
    none_left = decide(
        tree,
        state,
        1.0,
        PolicySettings(safety_by_caps=False, uncap_step_fraction=1.0, startup_rise_w_per_s=300.0),
    )
    np.testing.assert_allclose(none_left.cap_w[:8], 400.0)
    with pytest.raises(ValueError, match="startup_rise_w_per_s"):
        PolicySettings(startup_rise_w_per_s=-1.0)


@pytest.mark.parametrize(("phase", "reserved"), [(CKPT, True), (COMM, False)])
def test_gpus_in_a_checkpoint_keep_their_rise_out_of_the_ramp_too(phase, reserved):
    """A checkpoint ends with its job filling its GPUs back up to their staged caps at the
    ramp-up share before compute resumes (FillFollower.must_rise_first): an H100 staged at
    its 200 W minimum, drawing 98 W, would otherwise step up 102 W at once, and the caps
    handed back elsewhere in the same second passed 19.4 of a 20 kW/s limit in the demo.
    A collective is held whole by the hysteresis (the replays' model) and takes nothing."""
    tree = with_ramp(uncapping_everywhere(uniform_tree(1, 1, 3, 4)), [0], 1000.0)
    state = make_state(tree, 400.0, 400.0)
    state.phase[8:] = phase
    shared = decide(
        tree,
        state,
        1.0,
        PolicySettings(safety_by_caps=False, uncap_step_fraction=1.0, startup_rise_w_per_s=50.0),
    )
    handed_back_w = shared.cap_w[:8].sum() - 8 * 400.0
    assert handed_back_w == pytest.approx(1000.0 - (4 * 50.0 if reserved else 0.0))


HARDWARE, SOFTWARE = True, False  # what ramps a waiting GPU's draw down (ramps_in_hardware)


@pytest.mark.parametrize(
    ("phase", "phase_s", "wait_before_s", "down_w_per_s", "reserved_w", "in_hardware"),
    [
        (
            COMM,
            0.5,
            0.0,
            INF,
            0.0,
            HARDWARE,
        ),  # within the hysteresis: held whole, nothing to rise back
        (COMM, 1.5, 0.0, INF, 50.0, HARDWARE),  # past it: falling, rises back as compute resumes
        (
            COMM,
            3.0,
            0.0,
            INF,
            50.0,
            HARDWARE,
        ),  # far down: fills back up under `communication` first
        (COMPUTE, 0.4, 1.5, INF, 25.0, HARDWARE),  # 0.4 s after a 1.5 s wait: a half-window step
        (COMPUTE, 0.4, 1.5, 100.0, 50.0, HARDWARE),  # ... falling twice as fast: a whole window's
        (
            COMPUTE,
            0.4,
            3.0,
            INF,
            50.0,
            HARDWARE,
        ),  # after a long wait: at most a window's, filled first
        (COMPUTE, 1.2, 1.5, INF, 0.0, HARDWARE),  # a window on: done
        (COMPUTE, 0.4, 0.8, INF, 0.0, HARDWARE),  # after a wait held whole: no step
        (COMM, np.nan, 0.0, INF, 0.0, HARDWARE),  # not known (an inferred phase): not counted
        # smoothed in software, a GPU falls at once (powerd/jobhook/fill.py), ready for a
        # step of its window's share: counted from the wait's start
        (COMM, 0.5, 0.0, INF, 25.0, SOFTWARE),  # half a window's fall so far
        (COMM, 1.5, 0.0, INF, 50.0, SOFTWARE),
        (COMPUTE, 0.4, 0.8, INF, 40.0, SOFTWARE),  # after a short wait: what it fell
        (COMPUTE, 0.4, 0.8, 25.0, 20.0, SOFTWARE),  # ... falling at half the rise
        (COMPUTE, 1.2, 0.8, INF, 0.0, SOFTWARE),  # a window on: done
        (COMM, 0.5, 0.0, INF, 0.0, None),  # a replay's GPUs: the hysteresis, as modelled
    ],
)
def test_gpus_after_a_long_wait_keep_their_rise_out_of_the_ramp(
    phase, phase_s, wait_before_s, down_w_per_s, reserved_w, in_hardware
):
    """A collective longer than the smoothing profile's hysteresis (1 s) has begun to fall,
    and its GPUs come back up on their own as compute resumes: at once by what they fell
    (``down × (wait - 1 s)``, at most a window's rise), or filling back up first under
    `communication` when they fell further (policies/smoothing.py's docstring; the fill-up
    rule: powerd/jobhook/fill.py). Rule 4 keeps their ramp-up share (50 W/s) out of the
    ramp from the hysteresis on, and the step's share of it for a window after compute
    resumed. A GPU smoothed in software falls at once: counted from the wait's start."""
    tree = with_ramp(uncapping_everywhere(uniform_tree(1, 1, 3, 4)), [0], 1000.0)
    state = make_state(tree, 400.0, 400.0)
    state.phase[8:] = phase
    state.phase_s = np.full(12, 30.0)
    state.phase_s[8:] = phase_s
    state.wait_before_s = np.zeros(12)
    state.wait_before_s[8:] = wait_before_s
    if in_hardware is not None:
        state.ramps_in_hardware = np.full(12, in_hardware)
    settings = PolicySettings(
        safety_by_caps=False,
        uncap_step_fraction=1.0,
        startup_rise_w_per_s=50.0,
        wait_rise_after_s=1.0,
        cut_fall_w_per_s=down_w_per_s,
    )
    shared = decide(tree, state, 1.0, settings)  # handed back to every GPU that asks
    handed_back_w = shared.cap_w.sum() - 12 * 400.0
    assert handed_back_w == pytest.approx(1000.0 - 4 * reserved_w)
    never = dataclasses.replace(settings, wait_rise_after_s=INF)
    assert decide(tree, state, 1.0, never).cap_w.sum() - 12 * 400.0 == pytest.approx(1000.0)
    with pytest.raises(ValueError, match="wait_rise_after_s"):
        PolicySettings(wait_rise_after_s=float("nan"))


# --- power floor cost ------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [BANDS, PolicySettings()], ids=["bands", "caps"])
def test_floor_hold_energy_counts_waiting_gpus_below_the_floor(policy):
    tree = uniform_tree(1, 1, 1, 5)
    state = make_state(
        tree, [300.0, 200.0, 700.0, 300.0, 300.0], phase=[COMM, CKPT, COMM, COMPUTE, COMM]
    )
    state.controllable[4] = False
    d = decide(tree, state, 2.0, dataclasses.replace(policy, hold_floor_w_per_gpu=600.0))
    assert d.floor_hold_energy_j == pytest.approx((300.0 + 400.0 + 0.0) * 2.0)
    assert decide(tree, state, 2.0, policy).floor_hold_energy_j == 0.0


# --- phase inference -------------------------------------------------------------------------


def trace(n_gpus: int = 8, n: int = 60, level: float = 1000.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return level + rng.normal(0.0, 20.0, (n_gpus, n))


def test_a_short_synchronised_drop_is_communication():
    power = trace()
    power[:, -2:] = 350.0
    phases = infer_phases(power, np.zeros(8, dtype=int))
    assert np.all(phases == COMM)


def test_a_long_synchronised_drop_is_a_checkpoint():
    power = trace()
    power[:, -8:] = 300.0
    phases = infer_phases(power, np.zeros(8, dtype=int), checkpoint_min_s=5.0)
    assert np.all(phases == CKPT)
    # the same drop, sampled ten times as often, is still short
    assert np.all(infer_phases(power, np.zeros(8, dtype=int), sample_period_s=0.1) == COMM)


def test_a_synchronised_rise_is_compute():
    power = trace()
    power[:, -10:-1] = 300.0  # a checkpoint that just ended
    assert np.all(infer_phases(power, np.zeros(8, dtype=int)) == COMPUTE)


def test_a_drop_of_a_few_gpus_is_not_a_phase():
    power = trace()
    power[:5, -3:] = 300.0  # 5 of 8 < 75 %
    assert np.all(infer_phases(power, np.zeros(8, dtype=int)) == COMPUTE)
    power[:6, -3:] = 300.0  # 6 of 8 = 75 %: the whole job waits
    assert np.all(infer_phases(power, np.zeros(8, dtype=int)) == COMM)


def test_a_shallow_dip_is_not_a_phase():
    power = trace()
    power[:, -3:] = 700.0  # 70 % of compute: a lighter kernel, not a wait
    assert np.all(infer_phases(power, np.zeros(8, dtype=int)) == COMPUTE)


def test_jobs_are_inferred_separately_and_no_job_is_compute():
    power = np.vstack([trace(4, seed=1), trace(4, seed=2), trace(4, seed=3)])
    power[:4, -2:] = 300.0  # job 7 waits on a collective
    power[8:, -2:] = 300.0  # GPUs without a job drop too
    jobs = np.array([7] * 4 + [3] * 4 + [-1] * 4)
    phases = infer_phases(power, jobs)
    np.testing.assert_array_equal(phases, [COMM] * 4 + [COMPUTE] * 8)


def test_an_idle_gpus_dip_is_not_a_drop():
    rng = np.random.default_rng(4)
    power = 100.0 + rng.uniform(-5.0, 5.0, (4, 60))
    power[:, -2:] = 55.0  # under 60 % but less than 50 W down: idle noise
    assert np.all(infer_phases(power, np.zeros(4, dtype=int)) == COMPUTE)
    assert np.all(infer_phases(power, np.zeros(4, dtype=int), min_drop_w=20.0) == COMM)


def test_inference_edge_cases():
    assert infer_phases(np.empty((0, 10)), np.empty(0, dtype=int)).shape == (0,)
    assert np.all(infer_phases(np.empty((3, 0)), np.zeros(3, dtype=int)) == COMPUTE)
    power = trace(4)
    power[1, 10:20] = np.nan  # missing samples count as not low
    power[:, -2:] = 300.0
    assert np.all(infer_phases(power, np.zeros(4, dtype=int)) == COMM)
    with pytest.raises(ValueError, match="n_gpus"):
        infer_phases(np.zeros((3, 5)), np.zeros(4, dtype=int))
    with pytest.raises(ValueError, match="drop_fraction"):
        infer_phases(power, np.zeros(4, dtype=int), drop_fraction=1.5)


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_samples=st.integers(1, 40),
    q=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
)
def test_the_compute_level_is_numpys_lower_quantile_of_what_was_sampled(seed, n_samples, q):
    """Rows with gaps (NaN, inf: a sample missed) take their own k of their finite samples,
    as ``np.nanquantile(method="lower")`` does row by row; a row with none is 0."""
    rng = np.random.default_rng(seed)
    values = rng.uniform(0.0, 1200.0, (30, n_samples))
    values[rng.random(values.shape) < 0.3] = np.nan
    values[rng.random(values.shape) < 0.05] = np.inf
    values[0] = np.nan  # nothing finite
    got = _row_quantile(values, q)
    for row, level in zip(values, got, strict=True):
        finite = row[np.isfinite(row)]
        want = np.quantile(finite, q, method="lower") if len(finite) else 0.0
        assert level == want
