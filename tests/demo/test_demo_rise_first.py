"""The demo's job, after a long wait its GPUs fell through, fills back up before it
computes, and counts the time it waited (``TrainingJob._rise_first``)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from powerd.demo.scenario import TrainingJob
from powerd.jobhook import FillFollower
from powerd.protocol import FillRequest, GpuFill

NODE = "n1"


def _request(power_w: float) -> FillRequest:
    gpu = GpuFill(
        index=0,
        power_w=power_w,
        cap_w=700.0,
        floor_w=0.0,
        ramp_up_w_per_s=1000.0,
        ramp_down_w_per_s=1000.0,
        hysteresis_s=0.01,
    )
    return FillRequest(v=1, node=NODE, ts=0.0, seq=0, gpus=[gpu])


def test_compute_waits_for_the_fill_after_a_wait_it_fell_through():
    """An H100 works at 475 W (1000 W/s each way, a 10 ms window: 10 W a window); its job
    waits 0.2 s unannounced, its target falls some 190 W: compute would step that much at
    once. The job fills back up first, some 0.19 s at 1000 W/s, and counts it as compute
    waiting (taken as nothing to fill, it computed with the target still 190 W short)."""
    fill = FillFollower("mqtt://127.0.0.1:1", [NODE], lambda node, targets: None)
    fill.take(NODE, _request(475.0))
    fill.waiting()
    time.sleep(0.2)
    fill.take(NODE, _request(0.0))
    assert fill.must_rise_first()
    job = SimpleNamespace(
        fill=fill,
        phase="communication",
        clock=time.monotonic,
        t0=time.monotonic(),
        plan=SimpleNamespace(name="llm"),
        rise_first_s=0.0,
        rise_first_spans=[],
    )
    asyncio.run(TrainingJob._rise_first(job))
    assert fill.targets(NODE)[0] >= 475.0 - 1.0
    assert 0.1 < job.rise_first_s < 5.0 and len(job.rise_first_spans) == 1
    fill.close()


def test_a_wait_told_late_ends_when_it_was_due_to():
    """The job tells its follower how long a wait has left from when it was due: told 50 ms
    late (a loaded machine), the follower's plan still ends when compute is due to resume,
    not 50 ms after it (then the plan, 3.5 W short at 70 W/s, made compute fill back up
    first). A phase with no expected length stays unannounced; one already over, too."""
    now = [100.05]
    job = SimpleNamespace(
        clock=lambda: now[0],
        t0=90.0,
        plan=SimpleNamespace(comm_s=1.5, checkpoint_s=3.0),
    )
    job._expected_s = lambda phase: TrainingJob._expected_s(job, phase)
    assert TrainingJob._left_s(job, 10.0, "communication") == pytest.approx(1.45)
    assert TrainingJob._left_s(job, 10.0, "checkpoint") == pytest.approx(2.95)
    assert TrainingJob._left_s(job, 10.0, "compute") is None
    now[0] = 112.0
    assert TrainingJob._left_s(job, 10.0, "communication") == 0.0
