"""Jobs: phase events (priority, phase and nodes per GPU) and phases inferred from power."""

from __future__ import annotations

import pytest

from policies import PHASE_CODES, PRIORITY_CODES
from powerd.controller.core import CycleCounters
from tests.controller.test_controller_core import (
    BANDS,
    CAP_MAX_W,
    COMM_CLOCK_MHZ,
    NODES,
    Bench,
    caps_w,
    make_bench,
    phase_payload,
)

COMPUTE_W, WAIT_W = 650.0, 150.0


@pytest.fixture
def bench() -> Bench:
    return make_bench()


def gpu_view(bench: Bench, node: str) -> tuple[str, str]:
    """(priority, phase) the policy sees for ``node``'s first GPU."""
    state, _ = bench.core.cluster_state(bench.clock.t, CycleCounters())
    g = bench.gpus(node).start
    priority = {v: k for k, v in PRIORITY_CODES.items()}[int(state.priority[g])]
    phase = {v: k for k, v in PHASE_CODES.items()}[int(state.phase[g])]
    return priority, phase


# --- phase events ----------------------------------------------------------------------


def test_startup_names_the_nodes_later_events_need_not(bench: Bench) -> None:
    event = bench.phase("llm", "startup", ["k1-n1", "k2-n1"], priority="high")
    assert event is not None and event.job == "llm"
    assert bench.core.job_of("k1-n1") == bench.core.job_of("k2-n1") == "llm"
    assert bench.core.job_of("k1-n2") is None
    assert gpu_view(bench, "k1-n1") == ("high", "startup")
    bench.phase("llm", "checkpoint", priority="high")  # no node list: the same nodes
    assert bench.core.jobs["llm"].nodes == ["k1-n1", "k2-n1"]
    assert gpu_view(bench, "k2-n1") == ("high", "checkpoint")
    assert gpu_view(bench, "k1-n2") == ("normal", "compute")  # no job: compute, normal


def test_every_gpu_of_a_node_gets_the_jobs_phase(bench: Bench) -> None:
    bench.phase("llm", "startup", ["k3-n1"], priority="low")
    bench.phase("llm", "eval", priority="low")
    state, _ = bench.core.cluster_state(bench.clock.t, CycleCounters())
    gpus = bench.gpus("k3-n1")
    assert list(state.phase[gpus.start : gpus.stop]) == [PHASE_CODES["eval"]] * 2
    assert list(state.priority[gpus.start : gpus.stop]) == [PRIORITY_CODES["low"]] * 2


def test_shutdown_forgets_the_job(bench: Bench) -> None:
    bench.phase("llm", "startup", ["k1-n1", "k1-n2"], priority="high")
    assert bench.phase("llm", "shutdown", priority="high") is not None
    assert "llm" not in bench.core.jobs
    assert bench.core.job_of("k1-n1") is None
    assert gpu_view(bench, "k1-n1") == ("normal", "compute")
    # after a shutdown the job is unknown: a phase without nodes is ignored
    assert bench.phase("llm", "compute") is None
    assert "llm" not in bench.core.jobs


def test_phase_of_an_unknown_job_without_nodes_is_ignored(bench: Bench) -> None:
    assert bench.phase("ghost", "checkpoint") is None
    assert bench.core.jobs == {}
    assert bench.core.rejected_total == 0  # valid, just not actionable


def test_a_job_that_starts_with_compute_and_a_node_list_is_known(bench: Bench) -> None:
    bench.phase("late", "compute", ["k2-n2"])
    assert bench.core.job_of("k2-n2") == "late"


def test_unknown_node_names_in_a_job_are_ignored(bench: Bench) -> None:
    bench.phase("llm", "startup", ["k1-n1", "nowhere-1", "k2-n2", "nowhere-2"])
    assert bench.core.jobs["llm"].nodes == ["k1-n1", "k2-n2"]
    bench.report_all(300.0)
    bench.cycle()  # and nothing breaks in a cycle


def test_a_new_node_list_moves_the_job(bench: Bench) -> None:
    bench.phase("llm", "startup", ["k1-n1", "k1-n2"], priority="high")
    bench.phase("llm", "compute", ["k2-n1"], priority="high")
    assert bench.core.job_of("k1-n1") is None and bench.core.job_of("k1-n2") is None
    assert bench.core.job_of("k2-n1") == "llm"
    assert gpu_view(bench, "k1-n1") == ("normal", "compute")
    assert gpu_view(bench, "k2-n1") == ("high", "compute")


def test_shutdown_of_one_job_leaves_a_node_another_job_took(bench: Bench) -> None:
    bench.phase("old", "startup", ["k1-n1"])
    bench.phase("new", "startup", ["k1-n1"])  # the node went to another job
    bench.phase("old", "shutdown")
    assert bench.core.job_of("k1-n1") == "new"


def test_the_last_event_sets_the_priority(bench: Bench) -> None:
    bench.phase("llm", "startup", ["k1-n1"], priority="high")
    bench.phase("llm", "compute")  # priority omitted: "normal" (docs/PROTOCOL.md)
    assert gpu_view(bench, "k1-n1") == ("normal", "compute")


def test_priority_decides_who_gives_watts_in_a_capped_rack(bench: Bench) -> None:
    bench.phase("vip", "startup", ["k1-n1"], priority="high")
    bench.phase("vip", "compute", priority="high")
    bench.phase("batch", "startup", ["k1-n2"], priority="low")
    bench.phase("batch", "compute", priority="low")
    bench.report_all(650.0)
    commands = dict(bench.cycle().commands)
    vip = caps_w(commands["k1-n1"])
    batch = caps_w(commands["k1-n2"])
    assert max(batch) < min(vip)
    assert vip == [CAP_MAX_W, CAP_MAX_W] or min(batch) == 200.0  # low first, down to cap_min


def test_bad_phase_payload_is_rejected_and_changes_no_job(bench: Bench) -> None:
    bench.phase("llm", "startup", ["k1-n1"])
    good = phase_payload("llm", "checkpoint", priority="low")
    for bad in (
        good.replace(b'"checkpoint"', b'"lunch"'),
        good.replace(b'"low"', b'"urgent"'),
        b'{"v":1}',
        good.replace(b'"job":"llm"', b'"job":"other"'),
    ):
        assert bench.core.on_phase("llm", bad) is None
    assert bench.core.jobs["llm"].phase == "startup"
    assert bench.core.rejected_total == 4


# --- inference -------------------------------------------------------------------------


def run(bench: Bench, seconds: int, job_w: float, other_w: float = 300.0, nodes=("k2-n1", "k2-n2")):
    """``seconds`` cycles, 1 s apart: the job's nodes want ``job_w``, everyone else ``other_w``.

    The agents apply and acknowledge every command; GPUs draw what they want up to their cap.
    """
    phases, results = [], []
    for _ in range(seconds):
        bench.clock.advance(1.0)
        for node in NODES:  # GPUs draw what they want, up to their caps
            want = job_w if node in nodes else other_w
            bench.report(node, [min(want, c) for c in bench.caps.get(node, [CAP_MAX_W] * 2)])
        result = bench.cycle()
        bench.apply(result)
        results.append(result)
        job = bench.core.jobs.get("quiet")
        phases.append(job.effective_phase if job else None)
    return phases, results


def start_quiet_job(bench: Bench, nodes=("k2-n1", "k2-n2")) -> None:
    bench.phase("quiet", "startup", list(nodes))
    bench.phase("quiet", "compute")


def test_a_quiet_job_waiting_together_is_inferred(bench: Bench) -> None:
    start_quiet_job(bench)
    phases, _ = run(bench, 20, COMPUTE_W)
    assert set(phases) == {"compute"}
    phases, results = run(bench, 8, WAIT_W)
    # a wait starts as communication and becomes a checkpoint once it has lasted 5 s
    assert phases == ["communication"] * 4 + ["checkpoint"] * 4
    assert bench.core.jobs["quiet"].phase == "compute"  # the announced phase is kept
    assert gpu_view(bench, "k2-n1") == ("normal", "checkpoint")
    # communication locked the job's SM clocks, the checkpoint unlocked them
    first = dict(results[0].commands)
    assert sorted(first) == ["k2-n1", "k2-n2"]
    assert all(g.max_sm_clock_mhz == COMM_CLOCK_MHZ for g in first["k2-n1"].gpus)
    phases, _ = run(bench, 2, COMPUTE_W)
    assert phases == ["compute", "compute"]
    assert bench.core.jobs["quiet"].inferred_phase is None


def test_one_slow_node_is_not_a_phase(bench: Bench) -> None:
    start_quiet_job(bench, nodes=("k2-n1", "k2-n2", "k3-n1"))
    run(bench, 20, COMPUTE_W, nodes=("k2-n1", "k2-n2", "k3-n1"))
    phases, _ = run(bench, 8, COMPUTE_W, nodes=("k2-n1", "k2-n2"))  # k3-n1 drops alone
    assert set(phases) == {"compute"}


def test_a_job_that_announces_its_waits_is_not_inferred(bench: Bench) -> None:
    start_quiet_job(bench)
    bench.phase("quiet", "communication")
    bench.phase("quiet", "compute")
    run(bench, 20, COMPUTE_W)
    phases, _ = run(bench, 8, WAIT_W)
    assert set(phases) == {"compute"}


def test_inference_can_be_turned_off() -> None:
    bench = make_bench(infer_phases=False)
    start_quiet_job(bench)
    run(bench, 20, COMPUTE_W)
    phases, _ = run(bench, 8, WAIT_W)
    assert set(phases) == {"compute"}


def test_an_announcement_overrides_an_inference(bench: Bench) -> None:
    start_quiet_job(bench)
    run(bench, 20, COMPUTE_W)
    run(bench, 2, WAIT_W)
    assert bench.core.jobs["quiet"].effective_phase == "communication"
    bench.phase("quiet", "eval")
    assert bench.core.jobs["quiet"].effective_phase == "eval"
    assert bench.core.jobs["quiet"].inferred_phase is None


def test_a_capped_job_is_not_inferred_to_be_waiting() -> None:
    """Caps the controller itself set push power down together: that is not a wait. (The
    bands cut rack k1 to its target, far below what the job draws; safety by caps keeps it
    within its 2,600 W limit, which takes only 25 W a GPU.)"""
    bench = make_bench(policy=BANDS)
    start_quiet_job(bench, nodes=("k1-n1",))
    # k1-n1 computes at 650 W while its rack-mate idles: rack k1 is under its threshold
    phases, _ = run(bench, 20, COMPUTE_W, other_w=100.0, nodes=("k1-n1",))
    assert set(phases) == {"compute"}
    # the rack-mate starts too: rack k1 caps both nodes to ~331 W, half the job's compute power
    for _ in range(15):
        bench.clock.advance(1.0)
        for node in NODES:
            power = COMPUTE_W if node in ("k1-n1", "k1-n2") else 100.0
            caps = bench.caps.get(node, [CAP_MAX_W, CAP_MAX_W])
            bench.report(node, [min(power, c) for c in caps])
        result = bench.cycle()
        bench.apply(result)
        assert bench.core.jobs["quiet"].effective_phase == "compute"
        for command in dict(result.commands).values():  # no clock lock for a "wait"
            assert all(g.max_sm_clock_mhz != COMM_CLOCK_MHZ for g in command.gpus)
    assert bench.caps["k1-n1"][0] < 0.6 * COMPUTE_W  # it really was capped that hard


def test_an_inferred_checkpoint_ends_when_compute_resumes_under_the_staged_cap() -> None:
    bench = make_bench(policy=BANDS)  # staged caps are the bands' (policies/capping.py, rule 2)
    start_quiet_job(bench)
    run(bench, 20, COMPUTE_W)
    phases, _ = run(bench, 8, WAIT_W)
    assert phases[-1] == "checkpoint"
    staged = bench.caps["k2-n1"][0]
    assert staged < COMPUTE_W  # a checkpoint's caps follow the GPUs down
    # compute resumes, held at first by the staged cap: the checkpoint is over at once
    bench.clock.advance(1.0)
    bench.report_all({n: (min(COMPUTE_W, staged) if n.startswith("k2") else 300.0) for n in NODES})
    bench.apply(bench.cycle())
    assert bench.core.jobs["quiet"].effective_phase == "compute"
    phases, _ = run(bench, 30, COMPUTE_W)
    assert set(phases) == {"compute"}
    # handed back, until the node's own uncapping threshold (it draws 2 x 650 W) stops it
    assert bench.caps["k2-n1"][0] >= COMPUTE_W - 1.0


def test_jobs_are_inferred_independently(bench: Bench) -> None:
    bench.phase("a", "startup", ["k2-n1"])
    bench.phase("a", "compute")
    bench.phase("b", "startup", ["k2-n2"])
    bench.phase("b", "compute")
    run(bench, 20, COMPUTE_W)
    for _ in range(2):
        bench.clock.advance(1.0)
        bench.report_all({"k2-n1": WAIT_W, "k2-n2": COMPUTE_W})
        bench.apply(bench.cycle())
    assert bench.core.jobs["a"].effective_phase == "communication"
    assert bench.core.jobs["b"].effective_phase == "compute"


def test_a_silent_node_is_not_a_wait() -> None:
    bench = make_bench(stale_after_s=5.0)
    start_quiet_job(bench)
    run(bench, 20, COMPUTE_W)
    for _ in range(10):  # the job's nodes fall silent: counted at failsafe, not "low"
        bench.clock.advance(1.0)
        for node in NODES:
            if not node.startswith("k2"):
                bench.report(node, 300.0)
        bench.apply(bench.cycle())
        assert bench.core.jobs["quiet"].effective_phase == "compute"
