"""How a training workload's speed and power respond to a power cap and a clock lock.

A pure model (no I/O), calibrated on the Zeus power-limit sweeps by
``powerd.gpu.calibrate`` and driven by the simulated GPU backend.

The model
---------
Powers are fractions of the GPU's maximum power limit (``cap_max_w``) and the
clock is a fraction ``s`` of its maximum SM clock, so a curve fitted on an A40
transfers to an H100 or a GB200 by scaling with the target's ``cap_max_w``.

One unit of work (an epoch, a step) takes, unconstrained, ``t_min``. A share
``beta`` of that time is SM work that scales with the clock; the rest (host,
input pipeline, memory or launch bound) does not::

    time(s) = t_min * (beta / s + 1 - beta)                      (1)

While the SMs work at clock ``s`` the GPU draws (CMOS: dynamic power grows
with frequency and voltage, static power does not)::

    P_busy(s) = p_static + p_dyn * s ** alpha                    (2)

and during the part that does not scale it draws ``p_wait``. The average power
over a unit of work, what a 1 s power reading or Zeus's ``average_power`` sees,
is the time-weighted mean::

    P_avg = (beta / s * P_busy(s) + (1 - beta) * P_wait) / (beta / s + 1 - beta)   (3)

The power governor acts at millisecond scale on the SM work: it runs the
highest clock that keeps ``P_busy`` within the cap ``c`` and within the clock
lock ``s_lock = lock_mhz / max_clock_mhz``::

    s = clip(((c - p_static) / p_dyn) ** (1 / alpha), s_min, s_lock)   (4)

``s_min`` is the GPU's lowest SM clock. When even ``P_busy(s_min)`` exceeds
the cap, the GPU idles part of the time, drawing its idle power ``p_idle``
(``GpuModel.idle_power_w``) in between, so that the busy power averages
exactly the cap; ``s`` in (1) and (3) is then the effective speed::

    d = (c - p_idle) / (P_busy(s_min) - p_idle),   s = d * s_min      (5)

The non-scaling part draws ``min(p_wait, c)`` and is not slowed (a
simplification: it only matters for caps far below those of the GPUs the
curves come from). So the power never exceeds a cap at or above idle power,
unlike a real A40 at its 100 W floor (see ``tests/gpu/test_simulated_calibration.py``).

Workload phases that use the GPU less than full training (evaluation,
communication, checkpoints) are modelled by a ``load`` in [0, 1] that blends
every power of the curve with the idle power: ``p -> p_idle + load * (p - p_idle)``.
``load = 1`` is the fitted curve; ``load = 0`` draws idle power.

Relative speed is ``time(1) / time(s)`` = ``1 / (beta / s + 1 - beta)``:
1.0 unconstrained, lower under a cap or a lock.

Clock locks from a measured table
---------------------------------
Where the GPU model has a measured clock table (``powerd.gpu.clock_table``: A100
from the Perseus sweeps of GPT-3 175B, H100 and GB200 scaled from it),
``table_operating_point`` takes a clock lock's effect from the table, not from
(1)-(2): at lock ``f``, with ``(time_rel, power_rel)`` the table's values there,
the work takes ``time_rel`` times as long as unconstrained, and the power above
idle is scaled so that at full load the average power is exactly ``power_rel``
times the unconstrained one (``P_free``: (3) with no cap and no lock)::

    speed_lock = 1 / time_rel
    P_lock = p_idle + (P_free(load) - p_idle) * k                                 (6)
    k = (power_rel * P_free(1) - p_idle) / (P_free(1) - p_idle)

The cap still acts through (4)-(5), computed without the lock; each limit holds
on its own, so the GPU runs at the lower speed and the lower power of the two
points (a lock at or above the table's top clock changes nothing). Below the
table's lowest clock nothing was measured: the time grows as ``1 / clock`` from
there and the power falls in proportion, so the energy per unit of work stays at
the lowest row's (assumed; a lock there only costs time).

Why the table and not a fit of (1)-(2) to it: the measured step time is nearly
flat down to ~95 % of the maximum clock and then scales, which (1) with one
``beta`` cannot follow. Fitted to the GPT-3 175B table, (1)-(3) err by up to
2.4 % in time and 5.4 % in power, and would put the least energy within a 5 %
slowdown at 1335 MHz saving 7.4 %, where the measurement says 1290 MHz saving
9.7 %: the simulator would disagree with the table on the very clock the
controller picks from it. The Zeus power-limit sweeps say nothing about clock
locks, so the cap response keeps its calibration and the lock response gets the
measurement.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from powerd.gpu.clock_table import ClockTable
from powerd.gpu.models import GpuModel


@dataclass(frozen=True, slots=True)
class WorkloadCurve:
    """One workload's response to caps and clocks; powers are fractions of ``cap_max_w``."""

    p_static: float  # power while the SMs work, independent of clock (leakage, memory, board)
    p_dyn: float  # clock-dependent power at the maximum clock
    alpha: float  # exponent of the dynamic power in the clock, (2)
    beta: float  # share of the unconstrained time that scales with the SM clock, (1)
    p_wait: float  # power during the share that does not scale
    t_min_s: float  # time per unit of work unconstrained, seconds on the source GPU

    def __post_init__(self) -> None:
        for field in self.__dataclass_fields__:
            value = getattr(self, field)
            if not math.isfinite(value):
                raise ValueError(f"WorkloadCurve.{field} must be finite, got {value!r}")
        if self.p_static < 0 or self.p_dyn < 0 or self.p_wait < 0:
            raise ValueError("WorkloadCurve powers must be >= 0")
        if self.alpha <= 0:
            raise ValueError(f"WorkloadCurve.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"WorkloadCurve.beta must be within [0, 1], got {self.beta}")
        if self.t_min_s <= 0:
            raise ValueError(f"WorkloadCurve.t_min_s must be > 0, got {self.t_min_s}")

    @property
    def busy_frac(self) -> float:
        """Power while the SMs work at the maximum clock, fraction of ``cap_max_w``."""
        return self.p_static + self.p_dyn

    @property
    def demand_frac(self) -> float:
        """Average power unconstrained, (3) at ``s = 1``, fraction of ``cap_max_w``."""
        return self.beta * self.busy_frac + (1.0 - self.beta) * self.p_wait

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkloadCurve:
        return cls(**{name: float(data[name]) for name in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class Device:
    """What the model needs to know of the GPU a curve runs on."""

    cap_max_w: float
    idle_w: float
    clock_min_mhz: float
    clock_max_mhz: float

    def __post_init__(self) -> None:
        if not (0 < self.idle_w < self.cap_max_w):
            raise ValueError("Device needs 0 < idle_w < cap_max_w")
        if not (0 < self.clock_min_mhz <= self.clock_max_mhz):
            raise ValueError("Device needs 0 < clock_min_mhz <= clock_max_mhz")

    @classmethod
    def of(cls, model: GpuModel) -> Device:
        return cls(
            model.cap_max_w, model.idle_power_w, model.sm_clock_min_mhz, model.sm_clock_max_mhz
        )

    @property
    def s_min(self) -> float:
        return self.clock_min_mhz / self.clock_max_mhz

    @property
    def p_idle(self) -> float:
        return self.idle_w / self.cap_max_w


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """Where a workload runs under a cap and a lock."""

    clock_mhz: float  # the SM clock while the SMs work
    duty: float  # share of SM time not spent idling to meet the cap (1.0 normally)
    speed: float  # relative speed: 1.0 unconstrained
    power_w: float  # average power, (3)
    time_s: float  # time per unit of work, (1)


def _points(
    curve: WorkloadCurve,
    device: Device,
    cap_w: ArrayLike | None,
    lock_mhz: float | None,
    load: float,
) -> tuple[NDArray[np.float64], ...]:
    """(clock fraction, duty, time / t_min, average power fraction) for each cap.

    ``cap_w=None`` is no cap, ``lock_mhz=None`` no clock lock.
    """
    cap_frac = _cap_frac(device, cap_w)
    lock_frac = _lock_frac(device, lock_mhz)
    load = _check_load(load)
    p_idle, s_min = device.p_idle, device.s_min
    c = np.asarray(cap_frac, dtype=np.float64)
    s_hi = min(max(lock_frac, s_min), 1.0)

    def blend(p: float) -> float:
        return p_idle + load * (p - p_idle)

    p_static = blend(curve.p_static)
    p_dyn = load * curve.p_dyn
    p_wait = np.minimum(blend(curve.p_wait), c)
    if p_dyn > 0:
        with np.errstate(over="ignore", divide="ignore"):  # a tiny p_dyn: no cap binds
            s_cap = np.power(np.maximum(c - p_static, 0.0) / p_dyn, 1.0 / curve.alpha)
        s = np.clip(s_cap, s_min, s_hi)
    else:
        s = np.full_like(c, s_hi)
    p_busy = p_static + p_dyn * s**curve.alpha
    over = p_busy > c
    # Below the lowest clock: idle part of the time so the busy power averages the cap.
    span = np.where(over, p_busy - p_idle, 1.0)
    duty = np.where(over, np.clip((c - p_idle) / np.where(span > 0, span, 1.0), 0.0, 1.0), 1.0)
    p_busy = np.where(over, c, p_busy)
    s_eff = duty * s
    beta = curve.beta
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(s_eff > 0, beta / s_eff, np.inf) if beta > 0 else np.zeros_like(c)
        tau = scaled + (1.0 - beta)
        power = np.where(np.isfinite(tau), (scaled * p_busy + (1.0 - beta) * p_wait) / tau, p_busy)
    # A mean of values within the cap is within it, up to rounding: make that exact.
    return s, duty, tau, np.minimum(power, c)


def _cap_frac(device: Device, cap_w: ArrayLike | None) -> NDArray[np.float64]:
    if cap_w is None:
        return np.array(np.inf)
    return np.asarray(cap_w, dtype=np.float64) / device.cap_max_w


def _watts(
    power_frac: NDArray[np.float64], device: Device, cap_w: ArrayLike | None
) -> NDArray[np.float64]:
    """Fractions to watts, exactly within the cap despite the round trip through fractions."""
    watts = power_frac * device.cap_max_w
    return watts if cap_w is None else np.minimum(watts, np.asarray(cap_w, dtype=np.float64))


def _lock_frac(device: Device, lock_mhz: float | None) -> float:
    return 1.0 if lock_mhz is None else float(lock_mhz) / device.clock_max_mhz


def _check_load(load: float) -> float:
    if not 0.0 <= load <= 1.0:
        raise ValueError(f"load must be within [0, 1], got {load}")
    return float(load)


def operating_point(
    curve: WorkloadCurve,
    device: Device,
    cap_w: float | None = None,
    lock_mhz: float | None = None,
    load: float = 1.0,
) -> OperatingPoint:
    """Clock, speed, power and time of ``curve`` on ``device`` under a cap and a lock.

    ``cap_w=None`` is no cap, ``lock_mhz=None`` no clock lock.
    """
    s, duty, tau, power = _points(curve, device, cap_w, lock_mhz, load)
    tau_f = float(tau)
    return OperatingPoint(
        clock_mhz=float(s) * device.clock_max_mhz,
        duty=float(duty),
        speed=0.0 if not math.isfinite(tau_f) else 1.0 / tau_f,
        power_w=_watts(power, device, cap_w).item(),
        time_s=curve.t_min_s * tau_f,
    )


def relative_speed(
    curve: WorkloadCurve,
    device: Device,
    cap_w: float | None = None,
    lock_mhz: float | None = None,
    load: float = 1.0,
) -> float:
    """Throughput relative to the same workload unconstrained (1.0)."""
    return operating_point(curve, device, cap_w, lock_mhz, load).speed


def power_w(
    curve: WorkloadCurve,
    device: Device,
    cap_w: float | None = None,
    lock_mhz: float | None = None,
    load: float = 1.0,
) -> float:
    """Average power drawn under the cap and the lock; never above ``cap_w``."""
    return operating_point(curve, device, cap_w, lock_mhz, load).power_w


def time_per_unit_s(
    curve: WorkloadCurve,
    device: Device,
    cap_w: float | None = None,
    lock_mhz: float | None = None,
    load: float = 1.0,
) -> float:
    """Time per unit of work (per epoch for the Zeus curves), seconds."""
    return operating_point(curve, device, cap_w, lock_mhz, load).time_s


def predict(
    curve: WorkloadCurve,
    device: Device,
    caps_w: ArrayLike,
    lock_mhz: float | None = None,
    load: float = 1.0,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Time per unit of work (s) and average power (W) at each cap of ``caps_w``."""
    _, _, tau, power = _points(curve, device, caps_w, lock_mhz, load)
    return curve.t_min_s * tau, _watts(power, device, caps_w)


def table_operating_point(
    curve: WorkloadCurve,
    device: Device,
    table: ClockTable | None,
    cap_w: float | None = None,
    lock_mhz: float | None = None,
    load: float = 1.0,
) -> OperatingPoint:
    """``operating_point`` with a clock lock's effect from a measured table, (6) in the
    module doc; with no table or no lock, ``operating_point`` itself."""
    if table is None or lock_mhz is None:
        return operating_point(curve, device, cap_w, lock_mhz, load)
    capped = operating_point(curve, device, cap_w, None, load)
    free = operating_point(curve, device, None, None, load)
    time_rel, power_rel = lock_response(table, lock_mhz)
    lock_speed = free.speed / time_rel
    lock_power_w = device.idle_w + (free.power_w - device.idle_w) * _above_idle_share(
        curve, device, power_rel
    )
    speed = min(capped.speed, lock_speed)
    return OperatingPoint(
        clock_mhz=min(capped.clock_mhz, float(lock_mhz)),
        duty=capped.duty if capped.speed <= lock_speed else 1.0,
        speed=speed,
        power_w=min(capped.power_w, lock_power_w),
        time_s=curve.t_min_s / speed if speed > 0 else math.inf,
    )


def lock_response(table: ClockTable, lock_mhz: float) -> tuple[float, float]:
    """(time_rel, power_rel) of a lock: the table's, and below its lowest clock the time
    growing as 1 / clock and the power falling with it (assumed, module doc)."""
    lowest = float(table.clock_mhz[0])
    if lock_mhz >= lowest:
        return table.at(lock_mhz)
    time_rel, power_rel = table.at(lowest)
    ratio = max(float(lock_mhz), 1.0) / lowest
    return time_rel / ratio, power_rel * ratio


def _above_idle_share(curve: WorkloadCurve, device: Device, power_rel: float) -> float:
    """``k`` of (6): the share of the power above idle left at the lock."""
    full_w = curve.demand_frac * device.cap_max_w  # (3) unconstrained at full load
    if full_w <= device.idle_w:
        return power_rel
    return max(0.0, (power_rel * full_w - device.idle_w) / (full_w - device.idle_w))


def locked_power_share(
    curve: WorkloadCurve, device: Device, table: ClockTable | None, lock_mhz: float
) -> float:
    """The share of its unlocked draw a GPU running ``curve`` draws under a clock lock
    (at most 1): the measured ``table``'s ``power_rel`` where there is one, else (3) at the
    lock over (3) unlocked."""
    if table is not None:
        return min(1.0, lock_response(table, lock_mhz)[1])
    free_w = operating_point(curve, device).power_w
    locked_w = operating_point(curve, device, None, lock_mhz).power_w
    return min(1.0, locked_w / free_w) if free_w > 0 else 1.0
