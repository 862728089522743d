"""Software power smoothing through the agent (agent.software_smoothing): a GPU without the
hardware takes the controller's profile, reports it as software in telemetry, and every sample
says what its job must hold (FillRequest)."""

from __future__ import annotations

import msgspec
import pytest

from powerd.gpu.simulated import open_simulated
from powerd.gpu.software_smoothing import with_software_smoothing
from powerd.protocol import FillRequest, GpuCommand, GpuSmoothing, decode, encode
from tests.support.agent_core_harness import (
    NODE,
    command,
    core_clock,
    core_following,
)

PROFILE = GpuSmoothing(
    preset=0,
    enabled=True,
    floor_percent=50.0,
    ramp_up_w_per_s=80.0,
    ramp_down_w_per_s=70.0,
    ramp_down_hysteresis_ms=1000.0,
)


def mixed_node():
    """Two H100s (software) and two GB200s (hardware) on one node, following a leader."""
    clock = core_clock()
    sims = open_simulated("2xH100", clock=clock.monotonic) + [
        g for g in open_simulated("4xGB200", clock=clock.monotonic)[2:]
    ]
    return core_following(clock, with_software_smoothing(sims)), sims, clock


def test_a_gpu_without_hardware_takes_the_profile_in_software():
    core, sims, _ = mixed_node()
    states = [g.smoothing for g in core.telemetry().gpus]
    assert [s.mechanism if s else "none" for s in states] == [
        "software",
        "software",
        None,  # hardware: the field is left out
        None,
    ]
    assert all(s is not None and not s.enabled for s in states)
    assert core.fill is None  # nothing to ask of the job yet
    ack = core.on_command(
        command(1, 1, *(GpuCommand(index=i, cap_w=600.0, smoothing=PROFILE) for i in range(4)))
    )
    assert ack.result == "applied", ack.errors
    assert [g.smoothing for g in ack.gpus] == [PROFILE] * 4
    # the hardware GPUs hold it themselves; the H100s only through their job
    assert all(s.smoothing().enabled for s in sims[2:])
    telemetry = core.telemetry()
    assert [g.smoothing.enabled for g in telemetry.gpus] == [True] * 4
    fill = core.fill
    assert isinstance(fill, FillRequest) and fill.seq == telemetry.seq
    assert [f.index for f in fill.gpus] == [0, 1]  # only the software GPUs
    for f, g in zip(fill.gpus, telemetry.gpus, strict=False):
        assert f.power_w == g.power_w
        assert f.floor_w == pytest.approx(0.5 * g.cap_w)  # half the cap, never above it
        assert f.cap_w == g.cap_w
        assert f.ramp_up_w_per_s == 80.0
        assert f.ramp_down_w_per_s == 70.0 and f.hysteresis_s == 1.0
    assert decode(FillRequest, encode(fill), NODE) == fill


def test_switching_it_off_stops_the_requests():
    core, _, _ = mixed_node()
    core.on_command(command(1, 1, GpuCommand(index=0, smoothing=PROFILE)))
    core.telemetry()
    assert core.fill is not None
    off = msgspec.structs.replace(PROFILE, enabled=False)
    core.on_command(command(1, 2, GpuCommand(index=0, smoothing=off)))
    core.telemetry()
    assert core.fill is None


def test_without_the_option_an_h100_refuses_smoothing_as_before():
    clock = core_clock()
    core = core_following(clock, open_simulated("1xH100", clock=clock.monotonic))
    ack = core.on_command(command(1, 1, GpuCommand(index=0, smoothing=PROFILE)))
    assert ack.result == "partial" and "not supported" in ack.errors[0].message
    assert core.telemetry().gpus[0].smoothing is None and core.fill is None
