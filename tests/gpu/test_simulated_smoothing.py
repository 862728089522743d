"""Hardware power smoothing on the simulated GPU: stored and read back like NVML, and its
effect on the draw (floor while a job runs, bounded ramps, hysteresis, caps still bite)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerd.gpu.base import SMOOTHING_MAX_PRESETS, SmoothingProfile, SmoothingRange
from powerd.gpu.errors import GpuLostError, GpuNotSupportedError, GpuPermissionError, GpuValueError
from powerd.gpu.models import GPU_MODELS, gpu_model
from powerd.gpu.simulated import (
    PHASE_PROFILES,
    SMOOTHING_FLOOR_MAX_PERCENT,
    SMOOTHING_FLOOR_MIN_PERCENT,
    SMOOTHING_PRESETS,
    SimulatedGpu,
    default_smoothing_preset,
)
from powerd.protocol import PHASES
from tests.support.clock import ManualClock

GB200 = gpu_model("GB200")
EPS = 1e-6


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def gpu(clock: ManualClock) -> SimulatedGpu:
    return SimulatedGpu("GB200", clock=clock)


def profile(**changes: Any) -> SmoothingProfile:
    values: dict[str, Any] = {
        "preset": 1,
        "enabled": True,
        "floor_percent": 50.0,
        "ramp_up_w_per_s": 100.0,
        "ramp_down_w_per_s": 50.0,
        "ramp_down_hysteresis_ms": 0.0,
    }
    return SmoothingProfile(**(values | changes))


def settle(gpu: SimulatedGpu, clock: ManualClock, seconds: float = 120.0) -> float:
    for _ in range(int(seconds)):
        clock.advance(1.0)
        gpu.power_w()
    return gpu.power_w()


# -- which models, what is stored ------------------------------------------------------------


def test_only_models_flagged_for_it_have_smoothing(clock: ManualClock) -> None:
    assert {k for k, m in GPU_MODELS.items() if m.has_power_smoothing} == {"GB200"}
    for key in GPU_MODELS:
        gpu = SimulatedGpu(key, clock=clock)
        assert gpu.supports_smoothing() == (key == "GB200")


@pytest.mark.parametrize("key", ["H100", "A100"])
def test_without_smoothing_every_call_says_so(key: str, clock: ManualClock) -> None:
    gpu = SimulatedGpu(key, clock=clock)
    assert gpu.smoothing() is None
    with pytest.raises(GpuNotSupportedError, match="Blackwell"):
        gpu.smoothing_range()
    with pytest.raises(GpuNotSupportedError, match="R570"):
        gpu.set_smoothing(profile())
    gpu.restore_defaults()  # nothing was changed, nothing to put back


def test_range_and_defaults(gpu: SimulatedGpu) -> None:
    assert gpu.smoothing_range() == SmoothingRange(
        SMOOTHING_FLOOR_MIN_PERCENT, SMOOTHING_FLOOR_MAX_PERCENT, SMOOTHING_PRESETS
    )
    assert gpu.smoothing() == default_smoothing_preset(0)
    assert gpu.smoothing(3) == default_smoothing_preset(3)
    with pytest.raises(GpuValueError, match="preset"):
        gpu.smoothing(SMOOTHING_PRESETS)


def test_set_reads_back_and_restore_puts_everything_back(gpu: SimulatedGpu) -> None:
    assert gpu.set_smoothing(profile()) == profile()
    assert gpu.smoothing() == profile()
    gpu.set_smoothing(profile(preset=4, floor_percent=10.0, enabled=False))
    assert gpu.smoothing(1) == profile(enabled=False)  # the switch is device-wide
    gpu.set_power_limit_w(800.0)
    gpu.restore_defaults()
    assert gpu.power_limit_w() == GB200.cap_default_w
    for preset in range(SMOOTHING_PRESETS):
        assert gpu.smoothing(preset) == default_smoothing_preset(preset)
    assert gpu.smoothing() == default_smoothing_preset(0)


def test_out_of_range_is_refused_and_changes_nothing(gpu: SimulatedGpu) -> None:
    with pytest.raises(GpuValueError, match="nothing written"):
        gpu.set_smoothing(profile(floor_percent=SMOOTHING_FLOOR_MAX_PERCENT + 1))
    assert gpu.smoothing() == default_smoothing_preset(0)
    gpu.restore_defaults()  # nothing was saved by a refused set
    assert gpu.smoothing() == default_smoothing_preset(0)


def test_errors_are_injected_and_a_lost_gpu_fails(gpu: SimulatedGpu) -> None:
    gpu.inject_error("set_smoothing", GpuPermissionError("not root"))
    with pytest.raises(GpuPermissionError):
        gpu.set_smoothing(profile())
    assert gpu.smoothing() == default_smoothing_preset(0)
    gpu.set_smoothing(profile())
    gpu.inject_error("restore_smoothing", GpuPermissionError("not root"))
    with pytest.raises(GpuPermissionError):
        gpu.restore_defaults()
    assert gpu.power_limit_w() == GB200.cap_default_w  # the cap was still put back
    gpu.restore_defaults()  # the saved state survived: second try works
    assert gpu.smoothing() == default_smoothing_preset(0)
    gpu.lose()
    for call in (gpu.smoothing, gpu.smoothing_range, gpu.restore_smoothing):
        with pytest.raises(GpuLostError):
            call()
    with pytest.raises(GpuLostError):
        gpu.set_smoothing(profile())


# -- effect on the draw ----------------------------------------------------------------------


def test_disabled_smoothing_changes_nothing(clock: ManualClock) -> None:
    plain, touched = SimulatedGpu("GB200", clock=clock), SimulatedGpu("GB200", clock=clock)
    touched.set_smoothing(profile(enabled=False))
    for phase in ("compute", "communication", "idle", "compute"):
        plain.set_phase(phase)
        touched.set_phase(phase)
        for _ in range(5):
            clock.advance(0.5)
            assert touched.power_w() == plain.power_w()


def test_floor_holds_while_a_job_runs_and_not_when_idle(
    gpu: SimulatedGpu, clock: ManualClock
) -> None:
    gpu.set_phase("communication")
    raw = settle(gpu, clock)
    floor_w = 0.5 * GB200.cap_max_w
    assert raw < floor_w  # a communication phase draws less than the floor
    gpu.set_smoothing(profile(floor_percent=50.0, ramp_up_w_per_s=1000.0))
    assert settle(gpu, clock, 5) == pytest.approx(floor_w)
    gpu.set_power_limit_w(600.0)  # the floor is a share of the cap: it follows it down
    assert gpu.power_w() <= 600.0
    assert 0.5 * 600.0 - EPS <= settle(gpu, clock, 30) <= 600.0
    gpu.set_phase("idle")  # no job: the floor lets go, at the ramp-down rate
    assert settle(gpu, clock, 60) == pytest.approx(GB200.idle_power_w, rel=0.02)


def test_ramps_bound_the_change_per_second_and_hysteresis_delays_the_fall(
    gpu: SimulatedGpu, clock: ManualClock
) -> None:
    gpu.set_phase("idle")
    settle(gpu, clock, 5)
    gpu.set_smoothing(profile(floor_percent=0.0, ramp_down_hysteresis_ms=3000.0))  # 100 up, 50 down
    start = gpu.power_w()
    gpu.set_phase("compute")
    assert gpu.power_w() == start  # no jump on a change of phase
    for second in (1, 2, 3):  # still far below what compute draws: ramping all along
        clock.advance(1.0)
        assert gpu.power_w() == pytest.approx(start + 100.0 * second)
    top = gpu.power_w()
    gpu.set_phase("idle")
    clock.advance(2.0)
    assert gpu.power_w() == top  # inside the 3 s hysteresis: no fall yet
    clock.advance(2.0)  # 1 s past the hysteresis
    assert gpu.power_w() == pytest.approx(top - 50.0)


def test_a_lower_cap_bites_at_once(gpu: SimulatedGpu, clock: ManualClock) -> None:
    gpu.set_smoothing(profile(ramp_down_w_per_s=1.0, ramp_down_hysteresis_ms=60_000.0))
    settle(gpu, clock, 5)
    gpu.set_power_limit_w(300.0)
    assert gpu.power_w() <= 300.0
    gpu.set_external_limit_w(250.0)
    assert gpu.power_w() <= 250.0


# -- properties ------------------------------------------------------------------------------

in_range_profiles = st.builds(
    SmoothingProfile,
    preset=st.integers(0, SMOOTHING_MAX_PRESETS - 1),
    enabled=st.booleans(),
    floor_percent=st.floats(SMOOTHING_FLOOR_MIN_PERCENT, SMOOTHING_FLOOR_MAX_PERCENT),
    ramp_up_w_per_s=st.floats(0.0, 5000.0),
    ramp_down_w_per_s=st.floats(0.0, 5000.0),
    ramp_down_hysteresis_ms=st.floats(0.0, 10_000.0),
)
any_profiles = st.builds(
    SmoothingProfile,
    preset=st.integers(0, SMOOTHING_MAX_PRESETS - 1),
    enabled=st.booleans(),
    floor_percent=st.floats(0.0, 100.0),
    ramp_up_w_per_s=st.floats(0.0, 5000.0),
    ramp_down_w_per_s=st.floats(0.0, 5000.0),
    ramp_down_hysteresis_ms=st.floats(0.0, 10_000.0),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("smooth"), any_profiles),
        st.tuples(st.just("wait"), st.floats(0.0, 20.0)),
        st.tuples(st.just("phase"), st.sampled_from(PHASES)),
        st.tuples(st.just("cap"), st.floats(GB200.cap_min_w, GB200.cap_max_w)),
        st.tuples(st.just("external"), st.one_of(st.none(), st.floats(200.0, 1200.0))),
        st.tuples(st.just("restore"), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(first=in_range_profiles, seed=st.integers(0, 3), ops=operations)
def test_smoothing_invariants_for_any_sequence(
    first: SmoothingProfile, seed: int, ops: list[tuple[str, Any]]
) -> None:
    """After any sequence: the profile is within the device's range, the draw never exceeds
    the enforced cap, and while a profile is on and the cap holds, the draw moves no
    faster than its ramps and, while a job runs, never falls below the floor."""
    clock = ManualClock()
    gpu = SimulatedGpu("GB200", clock=clock, seed=seed)
    device_range = gpu.smoothing_range()
    gpu.set_smoothing(first)
    last: tuple[float, float] | None = (clock.t, gpu.power_w())
    for op, arg in ops:
        if op == "smooth":
            before = gpu.smoothing()
            if device_range.contains(arg):
                assert gpu.set_smoothing(arg) == arg
            else:
                with pytest.raises(GpuValueError):
                    gpu.set_smoothing(arg)
                assert gpu.smoothing() == before
            last = None  # switching smoothing off lets the draw jump
        elif op == "wait":
            clock.advance(arg)
        elif op == "phase":
            gpu.set_phase(arg)  # no jump while smoothing is on: ``last`` stands
        elif op == "cap":
            gpu.set_power_limit_w(arg)
            last = None
        elif op == "external":
            gpu.set_external_limit_w(arg)
            last = None
        else:
            gpu.restore_defaults()
            last = None
        now = gpu.smoothing()
        assert now is not None and device_range.contains(now)
        power, cap = gpu.power_w(), gpu.enforced_cap_w()
        assert 0.0 <= power <= cap + EPS
        if now.enabled and last is not None:
            t0, p0 = last
            dt = clock.t - t0
            assert power - p0 <= now.ramp_up_w_per_s * dt + EPS
            assert p0 - power <= now.ramp_down_w_per_s * dt + EPS
            floor_w = now.floor_w(cap)
            assert floor_w <= cap
            if PHASE_PROFILES[gpu.phase].load > 0:
                assert power >= min(p0, floor_w) - EPS
        last = (clock.t, power)


@settings(max_examples=100, deadline=None)
@given(p=in_range_profiles, caps=st.lists(st.floats(GB200.cap_min_w, GB200.cap_max_w), max_size=5))
def test_steady_draw_in_a_job_is_the_floor_or_more_and_never_above_the_cap(
    p: SmoothingProfile, caps: list[float]
) -> None:
    clock = ManualClock()
    gpu = SimulatedGpu("GB200", clock=clock, phase="communication")
    fast: dict[str, Any] = {"ramp_up_w_per_s": 5e3, "ramp_down_w_per_s": 5e3}
    gpu.set_smoothing(dataclasses.replace(p, enabled=True, ramp_down_hysteresis_ms=0.0, **fast))
    for cap in caps:
        gpu.set_power_limit_w(cap)
        settle(gpu, clock, 3)
        power = gpu.power_w()
        floor_w = p.floor_w(gpu.enforced_cap_w())
        assert floor_w - EPS <= power <= gpu.enforced_cap_w() + EPS
