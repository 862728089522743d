"""The rule of ``powerd.jobhook.torch_ddp`` (``CommIntervals``) on a manual clock, the GPU
marks' order, ``attach_ddp``'s argument checks, and that ``import powerd.jobhook`` leaves
torch unimported. The hook in a real DDP job: ``test_torch_ddp.py``."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from powerd.jobhook import PhaseReporter, attach_ddp
from powerd.jobhook.torch_ddp import MIN_COMM_FLOOR_S, CommIntervals, _GpuMarks


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def intervals(min_comm_s: float = 1.0, keepalive_s: float = 60.0):
    clock = Clock()
    said: list[tuple[float, str]] = []
    rule = CommIntervals(
        lambda phase: said.append((clock.t, phase)), min_comm_s, keepalive_s, clock
    )
    return rule, clock, said


def backward(rule: CommIntervals, clock: Clock, buckets: int, exposed_s: float, tick_s: float):
    """One backward: every bucket launched (the last one exposed), then the all-reduce takes
    ``exposed_s`` after it, the watcher checking every ``tick_s``; then all complete."""
    for index in range(buckets):
        rule.launched()
        if index == buckets - 1:
            rule.exposed(clock.t)
    end = clock.t + exposed_s
    while clock.t + tick_s < end:
        clock.t += tick_s
        rule.check(clock.t)
    clock.t = end
    rule.check(clock.t)
    for _ in range(buckets):
        rule.done(clock.t)


def test_a_fast_loop_announces_compute_once_then_only_to_stay_live():
    rule, clock, said = intervals()
    for _ in range(3000):  # 100 steps a second for 30 s, 5 buckets, 5 ms exposed each
        backward(rule, clock, 5, 0.005, 0.001)
        clock.t += 0.005
    assert said == [(0.0, "compute")]
    while clock.t < 61.0:
        backward(rule, clock, 5, 0.005, 0.001)
        clock.t += 0.005
    assert [phase for _, phase in said] == ["compute", "compute"]  # the keep-alive
    assert said[1][0] == pytest.approx(60.0, abs=0.02)


def test_a_long_exposed_all_reduce_is_communication_from_min_comm_s_to_its_end():
    rule, clock, said = intervals(min_comm_s=1.0)
    backward(rule, clock, 3, 0.01, 0.01)
    clock.t = 5.0
    backward(rule, clock, 3, 2.5, 0.25)  # a straggler: 2.5 s in the all-reduce
    assert said == [(0.0, "compute"), (6.0, "communication"), (7.5, "compute")]


def test_buckets_that_complete_during_the_backward_are_compute():
    rule, clock, said = intervals(min_comm_s=1.0)
    for _ in range(3):  # each bucket's all-reduce done before the next bucket is ready
        rule.launched()
        clock.t += 2.0
        rule.check(clock.t)
        rule.done(clock.t)
    rule.launched()
    rule.exposed(clock.t)  # the last bucket: short
    rule.done(clock.t + 0.1)
    assert said == [(0.0, "compute")]


def test_the_watcher_thread_announces_communication_on_its_own():
    seen = threading.Event()
    said: list[str] = []

    def announce(phase: str) -> None:
        said.append(phase)
        if phase == "communication":
            seen.set()

    rule = CommIntervals(announce, min_comm_s=MIN_COMM_FLOOR_S)
    rule.start()
    try:
        rule.launched()
        rule.exposed(rule.clock())  # and no completion: the watcher has to see it
        assert seen.wait(10.0)
        rule.done(rule.clock())
        assert said == ["compute", "communication", "compute"]
    finally:
        rule.close()
    rule.launched()
    rule.exposed(rule.clock() - 5.0)
    rule.check(rule.clock())
    rule.done(rule.clock())
    assert said == ["compute", "communication", "compute"]  # nothing after close


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 4),  # buckets
            st.floats(0.0, 3.0),  # exposed all-reduce, s
            st.floats(0.0, 2.0),  # compute until the next backward's last bucket, s
        ),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([0.5, 1.0, 2.0]),
)
def test_announcements_alternate_and_never_outpace_two_per_min_comm_s(steps, min_comm_s):
    rule, clock, said = intervals(min_comm_s=min_comm_s, keepalive_s=1e9)
    for buckets, exposed_s, compute_s in steps:
        backward(rule, clock, buckets, exposed_s, 0.01)
        clock.t += compute_s
    phases = [phase for _, phase in said]
    assert phases[0] == "compute"
    assert phases[1:] == ["communication", "compute"] * ((len(phases) - 1) // 2)
    # every all-reduce exposed for min_comm_s (and a tick) was announced, no other
    waits = sum(1 for _, exposed_s, _ in steps if exposed_s >= min_comm_s + 0.01)
    short = sum(1 for _, exposed_s, _ in steps if exposed_s < min_comm_s - 0.01)
    assert waits <= phases.count("communication") <= len(steps) - short
    comms = [t for t, phase in said if phase == "communication"]
    assert all(b - a >= min_comm_s - 1e-9 for a, b in itertools.pairwise(comms))


class GpuEvent:
    """Stands in for a recorded ``torch.cuda.Event``: reached when the test says so."""

    def __init__(self) -> None:
        self.waited = threading.Event()
        self.reached = threading.Event()

    def synchronize(self) -> None:
        self.waited.set()
        assert self.reached.wait(10.0)


def test_gpu_marks_count_when_the_gpu_reaches_them_in_their_order():
    said: list[str] = []
    changed = threading.Condition()
    clock = Clock()

    def announce(phase: str) -> None:
        with changed:
            said.append(phase)
            changed.notify_all()

    rule = CommIntervals(announce, min_comm_s=1.0, clock=clock)
    marks = _GpuMarks(rule, clock)
    exposed, done = GpuEvent(), GpuEvent()
    try:
        marks.put("launched", None)
        marks.put("exposed", exposed)
        marks.put("done", done)
        with changed:
            assert changed.wait_for(lambda: said == ["compute"], 10.0)
        assert exposed.waited.wait(10.0)
        clock.t = 3.0
        exposed.reached.set()  # the GPU finished the backward at 3 s
        assert done.waited.wait(10.0)  # so the exposed mark was taken, in order
        clock.t = 4.5
        assert rule.check(clock.t) is None
        assert said == ["compute", "communication"]  # the all-reduce is still on the GPU
        done.reached.set()
        with changed:
            assert changed.wait_for(lambda: said[-1] == "compute", 10.0)
        assert said == ["compute", "communication", "compute"]
    finally:
        exposed.reached.set()
        done.reached.set()
        marks.close()


def test_attach_ddp_and_the_rule_refuse_what_they_cannot_use():
    reporter = PhaseReporter(None, job="j")
    with pytest.raises(ValueError, match="DistributedDataParallel model, not Linear"):
        attach_ddp(torch.nn.Linear(2, 2), reporter)
    with pytest.raises(ValueError, match=r"min_comm_s must be at least 0\.5 s"):
        CommIntervals(lambda phase: None, min_comm_s=0.1)
    with pytest.raises(ValueError, match="keepalive_s must be a finite number"):
        CommIntervals(lambda phase: None, keepalive_s=float("inf"))
    assert reporter.current_phase is None  # nothing announced


def test_importing_the_job_hook_imports_no_torch():
    code = "import sys, powerd.jobhook; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
