"""``powerd gpus --check``: try every control the agent uses on each GPU, then put it back.

Before a node is managed, an operator wants to know that the agent can do there what it
will be asked to: cap each GPU, lock its SM clock, apply a power smoothing profile (or be
refused cleanly), set a module-scope limit where the device has one; how long the device
takes to enforce a new cap (NVML reads it back at once, an H200 enforces it up to 92 ms later:
docs/HARDWARE.md); and how long the reads the agent makes every sample take.

Everything touched is put back as it was found, whatever fails (GEOPM's rule): the power
limit, the clock lock, smoothing and the module limit. ``GpuCheck.restored`` says whether
the GPU reads back as found afterwards.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from powerd.gpu.base import POWER_LIMIT_RESOLUTION_W, Gpu, SmoothingProfile, attempt_all
from powerd.gpu.errors import GpuError, GpuNotSupportedError

READ_RUNS = 50  # each read timed this many times
ENFORCE_TIMEOUT_S = 2.0  # a new cap not enforced after this is a failure
ENFORCE_POLL_S = 0.001
CLOCK_LOCK_SHARE = 0.6  # the check locks the SM clock at this share of its maximum
# the profile the check applies where the device has smoothing (clamped into its range)
CHECK_PROFILE = SmoothingProfile(
    preset=0,
    enabled=True,
    floor_percent=30.0,
    ramp_up_w_per_s=200.0,
    ramp_down_w_per_s=200.0,
    ramp_down_hysteresis_ms=500.0,
)


@dataclass
class ControlResult:
    """One control tried: ``ok`` True (worked and put back), False (failed), None (the
    device has no such control: not a failure)."""

    control: str
    ok: bool | None
    detail: str


@dataclass
class GpuCheck:
    index: int
    name: str
    reads_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    controls: list[ControlResult] = field(default_factory=list)
    enforce_ms: float | None = None  # how long the device took to enforce a new cap
    restored: bool = False
    restore_errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every control the agent needs worked, and the GPU is as it was found."""
        return self.restored and all(c.ok is not False for c in self.controls)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"ok": self.ok}


def timed_ms(read: Callable[[], object], runs: int = READ_RUNS) -> dict[str, float]:
    """Median, p99 and max of ``runs`` calls, in milliseconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        read()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return {
        "median_ms": round(statistics.median(times), 3),
        "p99_ms": round(times[min(len(times) - 1, int(0.99 * len(times)))], 3),
        "max_ms": round(times[-1], 3),
    }


def wait_enforced(
    gpu: Gpu,
    limit_w: float,
    timeout_s: float = ENFORCE_TIMEOUT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> float | None:
    """Milliseconds until the enforced limit reads ``limit_w`` (within NVML's resolution);
    None if it does not within ``timeout_s`` (another limiter may hold it lower)."""
    start = time.perf_counter()
    while True:
        if abs(gpu.enforced_cap_w() - limit_w) <= POWER_LIMIT_RESOLUTION_W + 1.0:
            return (time.perf_counter() - start) * 1e3
        if time.perf_counter() - start > timeout_s:
            return None
        sleep(ENFORCE_POLL_S)


def check_gpu(gpu: Gpu, sleep: Callable[[float], None] = time.sleep) -> GpuCheck:
    """Try each control on ``gpu`` and put everything back (module docstring)."""
    result = GpuCheck(gpu.index, getattr(gpu, "name", "?"))
    found_w = gpu.power_limit_w()
    try:
        result.reads_ms = {
            "power": timed_ms(gpu.power_w),
            "energy": timed_ms(gpu.energy_j),
            "enforced cap": timed_ms(gpu.enforced_cap_w),
            "one telemetry sample": timed_ms(gpu.sample),
        }
        result.controls.append(_check_cap(gpu, found_w, result, sleep))
        result.controls.append(_check_clock(gpu))
        result.controls.append(_check_smoothing(gpu))
        result.controls.append(_check_module_limit(gpu))
    finally:
        _put_back(gpu, found_w, result)
    return result


def _check_cap(
    gpu: Gpu, found_w: float, result: GpuCheck, sleep: Callable[[float], None]
) -> ControlResult:
    try:
        limits = gpu.power_limit_range()
        target_w = float(round(limits.min_w + 0.5 * (limits.max_w - limits.min_w)))
        gpu.set_power_limit_w(target_w)
        if abs(gpu.power_limit_w() - target_w) > POWER_LIMIT_RESOLUTION_W:
            return ControlResult(
                "cap", False, f"set {target_w:.0f} W, reads back {gpu.power_limit_w():.0f} W"
            )
        enforce_ms = wait_enforced(gpu, target_w, sleep=sleep)
        gpu.set_power_limit_w(found_w)
        back_ms = wait_enforced(gpu, found_w, sleep=sleep)
    except GpuError as exc:
        return ControlResult("cap", False, str(exc))
    if enforce_ms is None:
        return ControlResult(
            "cap",
            False,
            f"set {target_w:.0f} W, but the enforced limit did not read it within "
            f"{ENFORCE_TIMEOUT_S:g} s (another limiter?)",
        )
    result.enforce_ms = round(enforce_ms, 1)
    back = "" if back_ms is None else f", back to {found_w:.0f} W in {back_ms:.0f} ms"
    return ControlResult(
        "cap", True, f"{target_w:.0f} W set, enforced after {enforce_ms:.0f} ms{back}"
    )


def _check_clock(gpu: Gpu) -> ControlResult:
    try:
        clocks = gpu.sm_clock_range()
        lock_mhz = clocks.clamp(CLOCK_LOCK_SHARE * clocks.max_mhz)
        gpu.lock_max_sm_clock_mhz(lock_mhz)
        held = gpu.locked_max_sm_clock_mhz()
        gpu.unlock_sm_clock()
    except GpuNotSupportedError as exc:
        return ControlResult("clock lock", None, f"not supported: {exc}")
    except GpuError as exc:
        return ControlResult("clock lock", False, str(exc))
    if held != lock_mhz:
        return ControlResult("clock lock", False, f"locked at {lock_mhz} MHz, holds {held}")
    return ControlResult("clock lock", True, f"locked at {lock_mhz} MHz and unlocked")


def _check_smoothing(gpu: Gpu) -> ControlResult:
    try:
        if not gpu.supports_smoothing():
            gpu.smoothing_range()  # raises the message an operator can act on
            return ControlResult("power smoothing", None, "not supported")
        applied = gpu.set_smoothing(gpu.smoothing_range().clamp(CHECK_PROFILE))
        gpu.restore_smoothing()
    except GpuNotSupportedError as exc:
        return ControlResult("power smoothing", None, f"not supported: {exc}")
    except GpuError as exc:
        return ControlResult("power smoothing", False, str(exc))
    return ControlResult(
        "power smoothing",
        True,
        f"preset {applied.preset} at a {applied.floor_percent:g} % floor applied and restored",
    )


def _check_module_limit(gpu: Gpu) -> ControlResult:
    try:
        if not gpu.supports_module_power_limit():
            gpu.module_power_limit_range()  # raises the message an operator can act on
            return ControlResult("module power limit", None, "not supported")
        limits = gpu.module_power_limit_range()
        taken_w = gpu.set_module_power_limit_w(round(0.5 * (limits.min_w + limits.max_w)))
        gpu.restore_module_power_limit()
    except GpuNotSupportedError as exc:
        return ControlResult("module power limit", None, f"not supported: {exc}")
    except GpuError as exc:
        return ControlResult("module power limit", False, str(exc))
    return ControlResult("module power limit", True, f"{taken_w:.0f} W set and restored")


def _put_back(gpu: Gpu, found_w: float, result: GpuCheck) -> None:
    """Every control the check changed, as found (nothing is written that it did not
    change: a node without the rights to write would fail that too); what could not be
    put back is said."""

    def unlock() -> None:
        if gpu.locked_max_sm_clock_mhz() is not None:
            gpu.unlock_sm_clock()

    def cap_back() -> None:
        if abs(gpu.power_limit_w() - found_w) > POWER_LIMIT_RESOLUTION_W:
            gpu.set_power_limit_w(found_w)

    try:
        attempt_all(unlock, gpu.restore_smoothing, gpu.restore_module_power_limit, cap_back)
        result.restored = (
            abs(gpu.power_limit_w() - found_w) <= POWER_LIMIT_RESOLUTION_W
            and gpu.locked_max_sm_clock_mhz() is None
        )
    except GpuError as exc:
        result.restore_errors.append(str(exc))
        result.restored = False


def report_lines(checks: list[GpuCheck]) -> list[str]:
    """What an operator reads: per GPU, each control and the reads' times."""
    lines = []
    for check in checks:
        verdict = "ok" if check.ok else "NOT OK"
        lines.append(f"GPU {check.index} ({check.name}): {verdict}")
        for control in check.controls:
            mark = {True: "ok", False: "FAILED", None: "n/a"}[control.ok]
            lines.append(f"  {control.control:<20} {mark:<6} {control.detail}")
        reads = ", ".join(
            f"{name} {t['median_ms']:.3g} ms (p99 {t['p99_ms']:.3g})"
            for name, t in check.reads_ms.items()
        )
        lines.append(f"  {'reads':<20} {'':<6} {reads}")
        put_back = (
            "as found" if check.restored else "NOT as found: " + "; ".join(check.restore_errors)
        )
        lines.append(f"  {'put back':<20} {'':<6} {put_back}")
    return lines
