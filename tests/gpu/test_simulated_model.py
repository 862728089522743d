"""The workload model's equations: speed, power and time under caps, locks and loads."""

from __future__ import annotations

import math

import numpy as np
import pytest

from powerd.gpu.models import gpu_model
from powerd.gpu.workload_model import (
    Device,
    WorkloadCurve,
    operating_point,
    power_w,
    predict,
    relative_speed,
    time_per_unit_s,
)

CURVE = WorkloadCurve(p_static=0.3, p_dyn=0.6, alpha=3.0, beta=0.8, p_wait=0.35, t_min_s=100.0)
DEVICE = Device(cap_max_w=1000.0, idle_w=100.0, clock_min_mhz=200, clock_max_mhz=2000)


def test_unconstrained_runs_at_full_speed_and_draws_its_demand() -> None:
    point = operating_point(CURVE, DEVICE)
    assert point.speed == pytest.approx(1.0)
    assert point.time_s == pytest.approx(100.0)
    assert point.clock_mhz == pytest.approx(2000.0)
    assert point.duty == 1.0
    # (3) at s = 1: 0.8 * 0.9 + 0.2 * 0.35 of 1000 W
    assert point.power_w == pytest.approx(1000.0 * (0.8 * 0.9 + 0.2 * 0.35))
    assert point.power_w == pytest.approx(CURVE.demand_frac * DEVICE.cap_max_w)


def test_a_binding_cap_follows_the_equations() -> None:
    cap_w = 600.0
    s = ((0.6 - 0.3) / 0.6) ** (1 / 3)  # (4)
    tau = 0.8 / s + 0.2  # (1)
    expected_power = (0.8 / s * 0.6 + 0.2 * 0.35) / tau  # (3), busy power at the cap
    point = operating_point(CURVE, DEVICE, cap_w)
    assert point.clock_mhz == pytest.approx(2000.0 * s)
    assert point.time_s == pytest.approx(100.0 * tau)
    assert point.speed == pytest.approx(1 / tau)
    assert point.power_w == pytest.approx(1000.0 * expected_power)
    assert relative_speed(CURVE, DEVICE, cap_w) == pytest.approx(1 / tau)
    assert power_w(CURVE, DEVICE, cap_w) == pytest.approx(point.power_w)
    assert time_per_unit_s(CURVE, DEVICE, cap_w) == pytest.approx(point.time_s)


def test_a_cap_above_the_demand_changes_nothing() -> None:
    free = operating_point(CURVE, DEVICE)
    assert operating_point(CURVE, DEVICE, 950.0) == free  # busy power 900 W < 950 W


def test_speed_and_power_grow_with_the_cap_and_power_stays_under_it() -> None:
    caps = np.linspace(110.0, 1000.0, 200)
    times, powers = predict(CURVE, DEVICE, caps)
    assert np.all(np.diff(times) <= 1e-9)  # more cap never slows down
    assert np.all(np.diff(powers) >= -1e-9)
    assert np.all(powers <= caps + 1e-9)
    assert times[0] > 3 * times[-1]  # and the low end really is slow


def test_below_the_lowest_clock_the_gpu_duty_cycles_to_hold_the_cap() -> None:
    busy_at_min = 0.3 + 0.6 * 0.1**3  # P_busy(s_min), fraction
    cap_w = 200.0  # below 1000 * busy_at_min
    point = operating_point(CURVE, DEVICE, cap_w)
    duty = (0.2 - 0.1) / (busy_at_min - 0.1)
    assert point.clock_mhz == pytest.approx(200.0)
    assert point.duty == pytest.approx(duty)
    assert point.speed == pytest.approx(1 / (0.8 / (duty * 0.1) + 0.2))
    assert point.power_w == pytest.approx(200.0)  # busy at the cap, waiting at 0.35 > cap: clipped


def test_a_clock_lock_lowers_speed_and_power() -> None:
    free = operating_point(CURVE, DEVICE)
    locked = operating_point(CURVE, DEVICE, lock_mhz=1000)
    s = 0.5
    assert locked.clock_mhz == pytest.approx(1000.0)
    assert locked.speed == pytest.approx(1 / (0.8 / s + 0.2))
    busy = 0.3 + 0.6 * s**3
    tau = 0.8 / s + 0.2
    assert locked.power_w == pytest.approx(1000 * (0.8 / s * busy + 0.2 * 0.35) / tau)
    assert locked.speed < free.speed and locked.power_w < free.power_w
    assert operating_point(CURVE, DEVICE, lock_mhz=2000) == free


def test_the_stricter_of_cap_and_lock_wins() -> None:
    by_cap = operating_point(CURVE, DEVICE, 600.0)
    assert operating_point(CURVE, DEVICE, 600.0, lock_mhz=1999) == by_cap
    by_lock = operating_point(CURVE, DEVICE, lock_mhz=800)
    assert operating_point(CURVE, DEVICE, 600.0, lock_mhz=800) == by_lock


def test_load_blends_the_curve_with_idle_power() -> None:
    assert power_w(CURVE, DEVICE, load=0.0) == pytest.approx(100.0)
    full = power_w(CURVE, DEVICE, load=1.0)
    half = power_w(CURVE, DEVICE, load=0.5)
    assert half == pytest.approx(100.0 + 0.5 * (full - 100.0))
    # a lighter phase is slowed less by the same cap
    assert relative_speed(CURVE, DEVICE, 500.0, load=0.6) > relative_speed(CURVE, DEVICE, 500.0)
    with pytest.raises(ValueError, match="load"):
        power_w(CURVE, DEVICE, load=1.5)


def test_a_curve_transfers_by_scaling_with_the_max_limit() -> None:
    big = Device(cap_max_w=3000.0, idle_w=300.0, clock_min_mhz=200, clock_max_mhz=2000)
    for frac in (0.25, 0.5, 0.8, 1.0):
        small_point = operating_point(CURVE, DEVICE, frac * 1000.0)
        big_point = operating_point(CURVE, big, frac * 3000.0)
        assert big_point.speed == pytest.approx(small_point.speed)
        assert big_point.power_w == pytest.approx(3 * small_point.power_w)


def test_a_workload_that_does_not_scale_with_the_clock_ignores_caps() -> None:
    flat = WorkloadCurve(p_static=0.2, p_dyn=0.0, alpha=2.0, beta=0.0, p_wait=0.2, t_min_s=5.0)
    for cap in (300.0, 600.0, 1000.0):
        point = operating_point(flat, DEVICE, cap)
        assert point.speed == 1.0 and point.time_s == 5.0
        assert point.power_w == pytest.approx(200.0)


@pytest.mark.parametrize(
    "changes",
    [
        {"beta": 1.2},
        {"beta": -0.1},
        {"alpha": 0.0},
        {"p_dyn": -0.1},
        {"t_min_s": 0.0},
        {"p_static": math.nan},
        {"p_wait": math.inf},
    ],
)
def test_a_curve_rejects_unphysical_parameters(changes: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="WorkloadCurve"):
        WorkloadCurve(**(CURVE.to_dict() | changes))


def test_a_curve_round_trips_through_a_dict() -> None:
    assert WorkloadCurve.from_dict(CURVE.to_dict()) == CURVE


def test_a_device_comes_from_a_gpu_model() -> None:
    device = Device.of(gpu_model("H100"))
    assert device.cap_max_w == 700.0
    assert device.p_idle == pytest.approx(70.0 / 700.0)
    assert device.s_min == pytest.approx(345 / 1980)
    with pytest.raises(ValueError):
        Device(cap_max_w=100.0, idle_w=200.0, clock_min_mhz=100, clock_max_mhz=1000)
