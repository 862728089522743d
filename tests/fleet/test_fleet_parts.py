"""The fleet simulator's parts on their own: its jobs (``powerd.fleet.jobs``) and its GPUs'
power smoothing (``powerd.fleet.smoothing``), which ramps a node's GPUs together by the one
ramp rule, as the simulated GPU ramps one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.smoothing import ramp_toward
from powerd.fleet.jobs import STARTUP_S, Job, priority_of, split_into_jobs
from powerd.fleet.smoothing import FleetSmoothing
from powerd.protocol import GpuSmoothing


def test_jobs_take_whole_racks_in_turn_with_priorities_in_turn() -> None:
    node_racks = [(0, 7), (1, 7), (2, 8), (3, 9), (5, 9)]
    jobs = split_into_jobs(2, node_racks, "p")
    assert [(j.name, j.nodes, j.priority) for j in jobs] == [
        ("p-job000", [0, 1, 3, 5], "high"),
        ("p-job001", [2], "normal"),
    ]
    assert [j.priority for j in split_into_jobs(9, node_racks, "p", "low")] == ["low"] * 3
    assert split_into_jobs(0, node_racks, "p") == []
    with pytest.raises(ValueError, match="priority"):
        priority_of("urgent")


def test_a_job_starts_up_then_alternates_compute_and_communication() -> None:
    job = Job("j", [0], "high")
    seen = [(job.advance(t, 20.0, 3.0), job.phase) for t in (1.0, 3.0, 23.0, 26.0)]
    assert seen == [(STARTUP_S, "startup"), (20.0, "compute"), (3.0, "communication"),
                    (20.0, "compute")]  # fmt: skip
    assert job.next_at == 46.0


def profile(up: float, down: float, floor: float = 40.0, on: bool = True) -> GpuSmoothing:
    return GpuSmoothing(
        preset=1,
        enabled=on,
        floor_percent=floor,
        ramp_up_w_per_s=up,
        ramp_down_w_per_s=down,
        ramp_down_hysteresis_ms=500.0,
    )


def test_a_gpu_without_smoothing_refuses_a_profile() -> None:
    smoothing = FleetSmoothing([False, True])
    errors: list[str] = []
    assert not smoothing.set(0, 0, "H100", profile(10.0, 10.0), errors)
    assert "not supported" in errors[0] and smoothing.on == 0
    assert not smoothing.set(1, 1, "GB200", profile(10.0, 10.0), errors)
    active = smoothing.active(1)
    assert smoothing.on == 1 and active is not None and active.enabled
    smoothing.set(1, 1, "GB200", profile(10.0, 10.0, on=False), errors)
    assert smoothing.on == 0 and len(errors) == 1


@settings(max_examples=50, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.floats(0.0, 1000.0), st.floats(100.0, 1000.0), st.floats(0.1, 2.0)),
        min_size=1,
        max_size=20,
    ),
    mixed=st.booleans(),
)
def test_a_nodes_gpus_ramp_as_each_would_alone(
    steps: list[tuple[float, float, float]], mixed: bool
) -> None:
    """Three GPUs on two nodes (two ramped alike, one on other ramps or off), moved in one
    call: the fleet's draw is the rule's for each GPU stepped on its own."""
    smoothing = FleetSmoothing([True, True, True])
    for g, wire in enumerate([profile(50.0, 20.0), profile(50.0, 20.0), profile(5.0, 80.0)]):
        smoothing.set(g, g, "GB200", wire if mixed or g < 2 else profile(1, 1, on=False), [])
    drawn = [500.0, 500.0, 500.0]
    alone = [(500.0, 0.0)] * 3
    for natural_w, cap_w, dt_s in steps:
        now = [natural_w, natural_w * 0.5, natural_w]
        caps = [cap_w] * 3
        now = [min(w, cap_w) for w in now]
        nodes = [now[:2], now[2:]]  # GPUs 0-1 on one node, GPU 2 on the next
        smoothing.ramp([0, 2], nodes, caps, drawn, dt_s)
        want = nodes[0] + nodes[1]
        for g in range(3):
            ramps = smoothing.ramps[g]
            if ramps is None:
                alone[g] = (now[g], 0.0)
                continue
            target = max(now[g], cap_w * ramps.floor_fraction)
            w, f = ramp_toward(
                np.array(alone[g][0]), np.array(target), np.array(cap_w), ramps, dt_s,
                np.array(alone[g][1]),
            )  # fmt: skip
            alone[g] = (float(w), float(f))
        assert want == [w for w, _ in alone]
        drawn = want
