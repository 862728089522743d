"""SoftwareSmoothing: a GPU without hardware smoothing takes a profile all the same, reads it
back and restores it like hardware does, and says what its job must hold (fill_target)."""

from __future__ import annotations

import pytest

from powerd.gpu.base import SmoothingProfile
from powerd.gpu.simulated import SimulatedGpu, open_simulated
from powerd.gpu.software_smoothing import (
    SOFTWARE_FLOOR_RANGE,
    FillTarget,
    SoftwareSmoothing,
    with_software_smoothing,
)
from tests.support.clock import ManualClock

PROFILE = SmoothingProfile(
    preset=0,
    enabled=True,
    floor_percent=40.0,
    ramp_up_w_per_s=80.0,
    ramp_down_w_per_s=70.0,
    ramp_down_hysteresis_ms=1000.0,
)


def wrapped() -> tuple[SoftwareSmoothing, SimulatedGpu]:
    inner = SimulatedGpu("H100", clock=ManualClock(0.0).monotonic)
    return SoftwareSmoothing(inner), inner


def test_it_takes_reads_back_and_restores_a_profile_like_hardware():
    gpu, _ = wrapped()
    assert gpu.supports_smoothing() and gpu.smoothing_range() == SOFTWARE_FLOOR_RANGE
    before = gpu.smoothing()
    assert before is not None and not before.enabled
    assert gpu.fill_target(600.0, 700.0) is None  # off: nothing for the job to do
    assert gpu.set_smoothing(PROFILE) == PROFILE
    assert gpu.smoothing() == PROFILE
    gpu.restore_defaults()  # as the agent does on exit with on_exit = "restore"
    assert gpu.smoothing() == before
    assert gpu.fill_target(600.0, 700.0) is None


def test_the_fill_target_carries_the_draw_the_profile_and_a_floor_under_the_cap():
    gpu, _ = wrapped()
    gpu.set_smoothing(PROFILE)
    assert gpu.fill_target(612.5, 500.0) == FillTarget(
        power_w=612.5,
        cap_w=500.0,
        floor_w=200.0,
        ramp_up_w_per_s=80.0,
        ramp_down_w_per_s=70.0,
        hysteresis_s=1.0,
    )
    full = SmoothingProfile(0, True, 100.0, 0.0, 0.0, 0.0)
    gpu.set_smoothing(full)
    target = gpu.fill_target(-1.0, 300.0)
    assert target is not None and target.floor_w == 300.0 and target.power_w == 0.0
    gpu.set_smoothing(SmoothingProfile(0, True, 0.0, 0.0, 0.0, 0.0))  # limits nothing
    assert gpu.fill_target(600.0, 700.0) is None


def test_everything_else_is_the_gpus_own():
    gpu, inner = wrapped()
    gpu.set_power_limit_w(400.0)
    assert inner.power_limit_w() == gpu.power_limit_w() == 400.0
    gpu.lock_max_sm_clock_mhz(1200)
    assert inner.locked_max_sm_clock_mhz() == gpu.locked_max_sm_clock_mhz() == 1200
    assert (gpu.index, gpu.uuid, gpu.name) == (inner.index, inner.uuid, inner.name)
    assert gpu.sample().cap_w == inner.enforced_cap_w()
    gpu.restore_defaults()
    assert inner.power_limit_w() == 700.0 and inner.locked_max_sm_clock_mhz() is None


def test_only_gpus_without_hardware_are_wrapped():
    gpus = open_simulated("2xH100") + open_simulated("2xGB200")
    out = with_software_smoothing(gpus)
    assert [type(g).__name__ for g in out] == [
        "SoftwareSmoothing",
        "SoftwareSmoothing",
        "SimulatedGpu",
        "SimulatedGpu",
    ]
    with pytest.raises(ValueError, match="hardware power smoothing"):
        SoftwareSmoothing(gpus[2])


def test_the_simulated_gpu_draws_at_least_the_fill_and_counts_its_energy():
    clock = ManualClock(0.0)
    gpu = SimulatedGpu("H100", clock=clock.monotonic, phase="communication")
    natural = gpu.power_w()
    gpu.set_fill_w(natural + 200.0)
    assert gpu.power_w() == pytest.approx(natural + 200.0, rel=0.02)
    clock.advance(2.0)
    assert gpu.fill_energy_j() == pytest.approx(2.0 * 200.0, rel=0.05)
    gpu.set_fill_w(5000.0)  # never above the cap
    assert gpu.power_w() <= gpu.enforced_cap_w()
    gpu.set_fill_w(None)
    clock.advance(1.0)
    spent = gpu.fill_energy_j()
    clock.advance(1.0)
    assert gpu.fill_energy_j() == spent  # no fill, no cost
    with pytest.raises(ValueError):
        gpu.set_fill_w(float("nan"))
