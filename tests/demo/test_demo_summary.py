"""The demo's summary on handmade traces: what counts as over a budget or a limit, ramps,
energy, throughput, capping and clock locks, and the exit code."""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.tree import PHASE_CODES, RACK, ROW, SITE
from powerd.demo.runner import _AccountedGpu, phase_account
from powerd.demo.scenario import LOW_COMPUTE_EXTRA_S, MIN_DURATION_S, JobPlan, default_jobs
from powerd.demo.summary import (
    EXIT_LIMIT_VIOLATED,
    EXIT_OK,
    JobRecord,
    PhaseAccount,
    RunRecord,
    sample_durations,
    summarize,
)
from powerd.topology import load_budgets
from tests.support.clock import ManualClock

COMPUTE = PHASE_CODES["compute"]
COMM = PHASE_CODES["communication"]


def make_trace(node_power_w, t=None, **overrides) -> RunRecord:
    """A site, one row, one rack; two GPUs, one job. Budget/limit: site 100/120 W, row 90/110,
    rack 80/100. One sample a second unless ``t`` says otherwise."""
    power = np.asarray(node_power_w, dtype=float)
    n = len(power)
    t = np.arange(n, dtype=float) if t is None else np.asarray(t, dtype=float)
    fields = dict(
        names=("site", "row", "rack"),
        level=np.array([SITE, ROW, RACK]),
        limit_w=np.array([120.0, 110.0, 100.0]),
        budget_w=np.array([100.0, 90.0, 80.0]),
        cap_threshold_w=np.array([98.0, 88.2, 78.4]),
        gpu_job=np.array([0, 0]),
        overhead_total_w=10.0,
        site_ramp_limit_w_per_s=50.0,
        t=t,
        node_power_w=power,
        gpu_cap_w=np.full((n, 2), 500.0),
        gpu_locked=np.zeros((n, 2), dtype=bool),
        gpu_phase=np.full((n, 2), COMPUTE, dtype=np.int8),
        gpu_throughput=np.ones((n, 2)),
        gpu_energy_j=np.linspace(0.0, 7200.0, n),
        cycle_t=np.zeros(0),
        cycle_capping=np.zeros((0, 3), dtype=bool),
        cycle_cut=np.zeros((0, 2), dtype=bool),
        jobs=[JobRecord("job", "high", 1, 2, [(0.0, "startup"), (1.0, "compute")])],
        duration_s=float(n),
    )
    fields.update(overrides)
    return RunRecord(**fields)


def flat(n: int, site: float, row: float, rack: float) -> list[list[float]]:
    return [[site, row, rack]] * n


def test_within_every_budget_nothing_is_over_and_the_exit_code_is_zero():
    s = summarize(make_trace(flat(5, 90, 80, 70)))
    assert s.over_budget_s == {"site": 0, "row": 0, "rack": 0, "any": 0}
    assert s.over_limit_s["any"] == 0
    assert not s.limit_violated and s.exit_code == EXIT_OK == 0
    assert s.peak_fraction_of_budget == pytest.approx(
        {"site": 0.9, "row": 80 / 90, "rack": 70 / 80}
    )


def test_seconds_over_budget_and_limit_are_counted_per_level_and_once_for_any():
    # one sample a second; samples 1-2 the rack is over its budget (80), sample 2 the row
    # is over its budget (90) too; sample 3 the rack is over its limit (100)
    power = [[90, 80, 70], [95, 85, 85], [99, 95, 85], [99, 89, 101], [90, 80, 70]]
    s = summarize(make_trace(power))
    assert s.over_budget_s == {"site": 0.0, "row": 1.0, "rack": 3.0, "any": 3.0}
    assert s.over_limit_s == {"site": 0.0, "row": 0.0, "rack": 1.0, "any": 1.0}
    assert s.limit_violated and s.exit_code == EXIT_LIMIT_VIOLATED == 1
    [v] = s.limit_violations
    assert v["name"] == "rack" and v["level"] == "rack"
    assert v["peak_w"] == 101 and v["limit_w"] == 100
    assert v["seconds"] == 1.0 and v["first_at_s"] == 3.0
    assert s.to_dict()["limit_violated"] is True and s.to_dict()["exit_code"] == 1


def test_uneven_sampling_weights_each_sample_by_the_time_to_the_next():
    t = [0.0, 0.1, 0.6, 0.7]  # the over-limit sample at 0.1 stands for 0.5 s
    power = [[90, 80, 70], [90, 80, 105], [90, 80, 70], [90, 80, 70]]
    s = summarize(make_trace(power, t=t))
    assert s.over_limit_s["rack"] == pytest.approx(0.5)
    np.testing.assert_allclose(sample_durations(np.array(t)), [0.1, 0.5, 0.1, 0.1])


def test_exactly_at_the_limit_is_not_over_it():
    s = summarize(make_trace(flat(3, 120, 110, 100)))
    assert s.over_limit_s["any"] == 0 and s.exit_code == 0
    assert s.over_budget_s["any"] == 3.0  # but every budget is exceeded
    assert s.peak_fraction_of_limit == pytest.approx({"site": 1.0, "row": 1.0, "rack": 1.0})


def test_site_ramp_is_the_largest_rise_and_fall_over_one_second():
    t = np.arange(0.0, 3.01, 0.25)
    site = np.where(t < 1.0, 50.0, 80.0)  # +30 W between 0.75 s and 1.0 s
    site[t >= 2.5] = 40.0  # -40 W
    power = np.column_stack([site, np.full(len(t), 50.0), np.full(len(t), 40.0)])
    s = summarize(make_trace(power, t=t))
    assert s.peak_site_ramp_up_w_per_s == pytest.approx(30.0)
    assert s.peak_site_ramp_down_w_per_s == pytest.approx(40.0)
    short = summarize(make_trace(power[:2], t=t[:2]))  # shorter than the window
    assert short.peak_site_ramp_up_w_per_s == short.peak_site_ramp_down_w_per_s == 0.0


def test_cap_ramp_is_the_largest_rise_of_the_sum_of_caps():
    caps = np.array([[500.0, 500.0], [500.0, 500.0], [520.0, 530.0], [300.0, 300.0]])
    s = summarize(make_trace(flat(4, 90, 80, 70), gpu_cap_w=caps))
    assert s.peak_site_cap_ramp_up_w_per_s == pytest.approx(50.0)
    assert s.site_ramp_limit_w_per_s == 50.0


def test_energy_is_the_gpu_counters_plus_every_overhead_over_the_run():
    s = summarize(make_trace(flat(5, 90, 80, 70)))  # 4 s, counters 0 -> 7200 J, 10 W overhead
    assert s.energy_gpu_wh == pytest.approx(2.0)
    assert s.energy_site_wh == pytest.approx(2.0 + 10 * 4 / 3600)


def test_throughput_counts_only_progress_phases_per_job_and_overall():
    n = 4
    phase = np.full((n, 2), COMPUTE, dtype=np.int8)
    phase[2:] = COMM  # waiting: no progress capped or not, so left out
    thr = np.array([[0.8, 0.6], [0.8, 0.6], [0.0, 0.0], [0.0, 0.0]])
    jobs = [
        JobRecord("a", "high", 1, 1, [(0.0, "compute"), (2.0, "communication")]),
        JobRecord("b", "low", 1, 1, [(0.0, "compute"), (2.0, "communication")]),
    ]
    trace = make_trace(
        flat(n, 90, 80, 70),
        gpu_phase=phase,
        gpu_throughput=thr,
        gpu_job=np.array([0, 1]),
        jobs=jobs,
    )
    s = summarize(trace)
    assert s.jobs["a"]["throughput_rel"] == pytest.approx(0.8)
    assert s.jobs["b"]["throughput_rel"] == pytest.approx(0.6)
    assert s.throughput_rel == pytest.approx(0.7)
    assert s.jobs["a"]["progress_gpu_s"] == pytest.approx(2.0)
    assert s.phases_seen == ["compute", "communication"]


def test_no_progress_at_all_gives_no_throughput():
    phase = np.full((3, 2), COMM, dtype=np.int8)
    s = summarize(make_trace(flat(3, 90, 80, 70), gpu_phase=phase))
    assert s.throughput_rel is None and s.jobs["job"]["throughput_rel"] is None


def test_capping_and_clock_locks_are_counted():
    n = 4
    capping = np.array([[False, False, False], [True, False, True], [False, False, True]])
    cut = np.array([[False, False], [True, False], [True, False]])
    phase = np.full((n, 2), COMM, dtype=np.int8)
    locked = np.zeros((n, 2), dtype=bool)
    locked[:2, :] = True  # two of four comm samples locked, both GPUs
    locked[3, 0] = True
    phase[3, 0] = COMPUTE  # locked outside communication: 1 GPU-s
    caps = np.full((n, 2), 600.0)
    caps[2, 0] = 450.0
    s = summarize(
        make_trace(
            flat(n, 90, 80, 70),
            cycle_t=np.array([0.5, 1.5, 2.5]),
            cycle_capping=capping,
            cycle_cut=cut,
            gpu_phase=phase,
            gpu_locked=locked,
            gpu_cap_w=caps,
        )
    )
    c = s.capping
    assert c["cycles_capping"] == 2
    assert c["cycles_capping_by_level"] == {"site": 1, "row": 0, "rack": 2}
    assert c["nodes_capping"] == {"site": ["site"], "row": [], "rack": ["rack"]}
    assert c["gpus_cut"] == 1 and c["gpu_cuts"] == 2
    assert c["min_cap_w"] == 450 and c["max_cap_w"] == 600
    lk = s.clock_locks
    assert lk["gpu_s"] == 5.0
    assert lk["communication_gpu_s"] == 7.0
    assert lk["communication_locked_share"] == pytest.approx(4 / 7)
    assert lk["outside_communication_gpu_s"] == 1.0


def test_locked_compute_and_its_throughput_cost_are_sampled():
    """A lock that outlives the wait: GPU 0 stays locked for the first compute sample after
    communication (and runs at 0.8); GPU 1's lock ends with the wait. One sample a second."""
    phase = np.array([[COMM, COMM], [COMPUTE, COMPUTE], [COMPUTE, COMPUTE], [COMM, COMM]])
    locked = np.array([[True, True], [True, False], [False, False], [True, True]])
    speed = np.where(locked & (phase == COMPUTE), 0.8, 1.0)
    s = summarize(
        make_trace(
            flat(4, 90, 80, 70),
            gpu_phase=phase.astype(np.int8),
            gpu_locked=locked,
            gpu_throughput=speed,
        )
    )
    lk = s.clock_locks
    assert lk["progress_gpu_s"] == 1.0
    assert lk["outside_communication_gpu_s"] == 1.0
    # 4 progress GPU-s, one of them at 0.8: 5 % of the throughput, all of it the lock's
    assert lk["progress_throughput_lost"] == pytest.approx(0.05)
    assert s.throughput_lost_by_cause["clock lock"] == pytest.approx(0.05)
    # nothing booked exactly: no exact figures, no energy by phase
    assert lk["exact_progress_gpu_s"] is None and lk["communication_energy_wh"] is None


def test_exact_locks_and_energy_in_communication_come_from_the_phase_account():
    account = PhaseAccount(
        locked_gpu_s={"communication": 30.0, "compute": 0.25, "eval": 0.5, "checkpoint": 2.0},
        energy_j={"communication": 7200.0, "compute": 36_000.0},
    )
    lk = summarize(make_trace(flat(3, 90, 80, 70), phase_account=account)).clock_locks
    assert lk["exact_progress_gpu_s"] == 0.75
    assert lk["exact_outside_communication_gpu_s"] == 2.75
    assert lk["communication_energy_wh"] == 2.0


def test_summary_is_json_serialisable():
    s = summarize(make_trace(flat(3, 90, 80, 70)))
    data = json.loads(json.dumps(s.to_dict()))
    for key in (
        "over_budget_s",
        "over_limit_s",
        "peak_site_ramp_up_w_per_s",
        "energy_site_wh",
        "throughput_rel",
        "commands",
        "capping",
        "clock_locks",
        "phases_seen",
        "exit_code",
    ):
        assert key in data


def test_an_empty_trace_summarises_to_zeros():
    trace = make_trace(np.zeros((0, 3)), gpu_energy_j=np.zeros(0))
    s = summarize(trace)
    assert s.samples == 0 and s.over_limit_s["any"] == 0 and s.energy_site_wh == 0
    assert s.exit_code == 0


# --- the jobs' script -------------------------------------------------------------


def test_a_job_plan_goes_through_every_phase_in_order():
    plan = JobPlan("j", "high", ("n1",), 1.0, 2.0, 3.0, 1.5, 8.0, 3.0, 25.0)
    timeline = plan.timeline()
    phases = [p for _, p in timeline]
    assert phases[0] == "startup" and phases[1] == "compute" and phases[-1] == "shutdown"
    assert phases.count("checkpoint") == 1 and "communication" in phases
    times = [at for at, _ in timeline]
    assert times == sorted(times) and len(set(times)) == len(times)  # no two at once
    assert times[-1] == 25.0
    k = phases.index("checkpoint")
    assert timeline[k][0] >= 8.0 and phases[k - 1] == "communication"
    for (at, phase), (nxt, _) in itertools.pairwise(timeline):
        if phase == "communication":
            assert nxt - at == pytest.approx(1.5)


def test_the_default_jobs_split_the_demo_site_and_fit_the_shortest_run():
    top = load_budgets("powerd/data/budgets/demo.toml")
    high, low = default_jobs(top, MIN_DURATION_S)
    assert (high.priority, low.priority) == ("high", "low")
    assert set(high.nodes) | set(low.nodes) == set(top.servers)
    assert not set(high.nodes) & set(low.nodes)
    for plan in (high, low):
        phases = {p for _, p in plan.timeline()}
        assert {"startup", "compute", "communication", "checkpoint", "shutdown"} <= phases
        assert plan.timeline()[-1][0] < MIN_DURATION_S
    with pytest.raises(ValueError, match="at least"):
        default_jobs(top, MIN_DURATION_S - 1)


def test_the_jobs_rhythm_is_the_one_asked_for_and_a_step_too_long_is_refused():
    """--compute-s and --comm-s: each step computes that long (the low-priority job half a
    second longer, so the two drift) and then waits on communication that long."""
    top = load_budgets("powerd/data/budgets/demo.toml")
    high, low = default_jobs(top, 120.0, staged_starts=True, compute_s=9.5, comm_s=0.5)
    for plan, compute_s in ((high, 9.5), (low, 10.0)):
        timeline = plan.timeline()
        steps = [
            (nxt - at, phase)
            for (at, phase), (nxt, _) in itertools.pairwise(timeline)
            if phase in ("compute", "communication")
        ]
        waits = [d for d, p in steps if p == "communication"]
        assert len(waits) >= 9 and waits == pytest.approx([0.5] * len(waits))
        # every compute but the one cut short by the checkpoint, and the last before the stop
        computes = [d for d, p in steps if p == "compute"]
        assert computes.count(pytest.approx(compute_s)) >= len(computes) - 2
        assert {"startup", "checkpoint", "shutdown"} <= {p for _, p in timeline}
    with pytest.raises(ValueError, match="needs a run of at least 42 s"):
        default_jobs(top, 40.0, compute_s=9.5, comm_s=0.5)  # a 10.5 s step: 42 s at least
    for compute_s, comm_s in ((0.4, 1.5), (3.0, 0.05), (3.0, float("nan")), (601.0, 1.0)):
        with pytest.raises(ValueError, match="must be"):
            default_jobs(top, 3600.0, compute_s=compute_s, comm_s=comm_s)


@settings(max_examples=200, deadline=None)
@given(
    st.floats(0.5, 600.0),
    st.floats(0.1, 60.0),
    st.floats(0.5, 600.0),
    st.booleans(),
    st.floats(0.0, 1.0),
)
def test_a_checkpoint_is_taken_by_both_jobs_or_refused(
    compute_s, comm_s, checkpoint_s, staged, stretch
):
    """Whatever the rhythm, the run and where the step boundaries fall: default_jobs either
    gives both jobs the checkpoint asked for or refuses, and the run the refusal names
    fits it."""
    top = load_budgets("powerd/data/budgets/demo.toml")
    least_s = 4 * (compute_s + LOW_COMPUTE_EXTRA_S + comm_s)  # check_rhythm's
    duration_s = max(least_s, MIN_DURATION_S) * (1.0 + 2.0 * stretch)
    if duration_s > 3600:
        return
    try:
        plans = default_jobs(top, duration_s, staged, compute_s, comm_s, checkpoint_s)
    except ValueError as exc:
        (enough_s,) = re.findall(r"a run of (\d+) s always fits it", str(exc))
        duration_s = max(float(enough_s), duration_s)
        plans = default_jobs(top, duration_s, staged, compute_s, comm_s, checkpoint_s)
    for plan in plans:
        timeline = plan.timeline()
        (k,) = [i for i, (_, phase) in enumerate(timeline) if phase == "checkpoint"]
        assert timeline[k + 1][0] - timeline[k][0] == pytest.approx(checkpoint_s)


def test_the_checkpoint_lasts_what_was_asked_in_both_jobs():
    """--checkpoint-s: each job checkpoints once, that long, then computes again."""
    top = load_budgets("powerd/data/budgets/demo.toml")
    plans = default_jobs(top, 300.0, compute_s=9.5, comm_s=0.5, checkpoint_s=30.0)
    for plan in plans:
        timeline = plan.timeline()
        (k,) = [i for i, (_, phase) in enumerate(timeline) if phase == "checkpoint"]
        assert timeline[k + 1][0] - timeline[k][0] == pytest.approx(30.0)
        assert timeline[k + 1][1] == "compute" and 135.0 <= timeline[k][0] <= 165.0
    with pytest.raises(ValueError, match="140 s does not fit in llm-high in a 280 s run"):
        default_jobs(top, 280.0, checkpoint_s=140.0)
    for checkpoint_s in (0.4, 601.0, float("nan")):
        with pytest.raises(ValueError, match=r"a checkpoint must take 0\.5 to 600 s"):
            default_jobs(top, 3600.0, checkpoint_s=checkpoint_s)


def test_throughput_lost_is_split_by_the_cause_the_cycles_recorded():
    """Four samples, two GPUs at half speed in the last three: before the first cycle the
    cause is the failsafe start; after the cycle at 1.5 s GPU 0's cap was cut (capping) and
    GPU 1's clock is locked at sample 3. The causes add up to 1 - throughput."""
    from policies.causes import CAPPING, FAILSAFE

    speed = np.array([[1.0, 1.0], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    locked = np.zeros((4, 2), dtype=bool)
    locked[3, 1] = True
    trace = make_trace(
        flat(4, 90, 80, 70),
        gpu_throughput=speed,
        gpu_locked=locked,
        cycle_t=np.array([1.5]),
        cycle_capping=np.zeros((1, 3), dtype=bool),
        cycle_cut=np.array([[True, False]]),
        cycle_cause=np.array([[CAPPING, FAILSAFE]], dtype=np.int8),
    )
    s = summarize(trace)
    lost = s.jobs["job"]["throughput_lost_by_cause"]
    # 8 GPU-s of progress, 3 lost: sample 1 both GPUs failsafe (1.0), samples 2-3 GPU 0
    # capping (1.0), GPU 1 failsafe at 2 (0.5) and clock lock at 3 (0.5)
    assert lost["failsafe start"] == pytest.approx(1.5 / 8)
    assert lost["capping"] == pytest.approx(1.0 / 8)
    assert lost["clock lock"] == pytest.approx(0.5 / 8)
    assert sum(lost.values()) == pytest.approx(1.0 - s.jobs["job"]["throughput_rel"])
    assert s.throughput_lost_by_cause == pytest.approx(lost)
    assert s.jobs["job"]["held_share"] == pytest.approx(6 / 8)
    # the printed summary names what held the job, by cause, largest first; not the share
    # of its GPU-time held at all ("100 %" under the demo's budgets: nothing to act on)
    from powerd.demo.view import held_line

    assert held_line(s) == (
        "job lost 37.5% of its throughput: failsafe start 18.8%, capping 12.5%, clock lock 6.2%"
    )


def test_the_outcome_names_the_causes_of_lost_throughput_and_a_cap_ramp_over_its_limit():
    from powerd.demo.report import cap_ramp_breach_line, lost_line

    speed = np.array([[1.0, 1.0], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    caps = np.array([[400.0, 400.0], [400.0, 400.0], [430.0, 430.0], [430.0, 430.0]])
    s = summarize(make_trace(flat(4, 90, 80, 70), gpu_throughput=speed, gpu_cap_w=caps))
    assert lost_line(s) == "throughput lost 37.5% of uncapped: failsafe start 37.5%"
    assert s.peak_site_cap_ramp_up_w_per_s == pytest.approx(60.0)  # the limit: 50 W/s
    line = cap_ramp_breach_line(s)
    assert line is not None and "+0.1 kW/s" in line and "0.05 kW/s ramp limit" in line
    # a warning, as the grid spec's breaches: the verdict says so, the exit code stays 0
    assert s.warnings == ["ramp limit"] and s.verdict == "ok, with warnings"
    assert s.exit_code == 0
    calm = summarize(make_trace(flat(4, 90, 80, 70)))
    assert cap_ramp_breach_line(calm) is None and calm.verdict == "ok"


def test_a_simulated_gpu_books_its_locks_and_energy_by_phase_exactly():
    """The demo's GPUs book at every phase change, lock and unlock: 0.02 s locked in compute
    is 0.02 s, where a sample would count its whole step or nothing."""
    clock = ManualClock(10.0)
    gpu = _AccountedGpu("H100", 0, clock=clock, phase="communication")
    gpu.lock_max_sm_clock_mhz(1100)
    clock.advance(1.5)
    gpu.set_phase("compute")
    clock.advance(0.02)
    gpu.unlock_sm_clock()
    clock.advance(2.0)
    gpu.set_phase("checkpoint")
    account = phase_account([gpu])
    assert account.locked_gpu_s == pytest.approx({"communication": 1.5, "compute": 0.02})
    assert account.energy_j["communication"] > 0 and account.energy_j["compute"] > 0
    assert sum(account.energy_j.values()) == pytest.approx(gpu.energy_j())
    gpu.start_account()  # the recording starts: nothing before it counts
    assert phase_account([gpu]).locked_gpu_s == {}
