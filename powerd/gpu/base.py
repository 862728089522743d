"""One GPU, as the agent sees it, whatever drives it (NVML or the simulator).

Modelled on Zeus's ``zeus/device/gpu/common.py``: one abstract class, backends
that translate their own failures into the exception types of
``powerd.gpu.errors``, so the agent never sees a backend-specific error.

Units are in the names: watts (``_w``), joules (``_j``), MHz (``_mhz``),
watts per second (``_w_per_s``), milliseconds (``_ms``), percent (``_percent``).

Every control a backend changes is put back by ``restore_defaults``: caps and
clock locks to the device's defaults, hardware power smoothing and the
module-scope power limit to what they were before this backend first changed
them (the "save and restore every control touched" model of Zeus and GEOPM).
See ``docs/POWER_SMOOTHING.md``.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import logging
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

from powerd.gpu.errors import GpuError, GpuNotSupportedError, GpuPermissionError, GpuValueError

logger = logging.getLogger("powerd.gpu")

# NVML_POWER_SMOOTHING_MAX_NUM_PROFILES in nvml.h: preset profiles are numbered from 0.
SMOOTHING_MAX_PRESETS = 5
# NVML reads ramp rates back in mW/s and the hysteresis in ms; powerd assumes 32-bit
# unsigned fields (as NVML's other counters), so it never writes more than they can hold.
SMOOTHING_MAX_RAMP_W_PER_S = (2**32 - 1) / 1000
SMOOTHING_MAX_HYSTERESIS_MS = float(2**32 - 1)
# NVML stores power limits in mW: watts closer than this are the same setting.
POWER_LIMIT_RESOLUTION_W = 0.001


class PowerReading(enum.StrEnum):
    """What a power reading is: NVML offers two very different numbers."""

    INSTANT = "instant"  # NVML_FI_DEV_POWER_INSTANT through nvmlDeviceGetFieldValues
    AVERAGE_1S = "average_1s"  # nvmlDeviceGetPowerUsage on Ampere (not GA100) and newer
    SIMULATED = "simulated"


class PowerScope(enum.StrEnum):
    """What a power limit bounds: the GPU alone, or the whole module it sits on.

    NVML's ``NVML_POWER_SCOPE_GPU`` and ``NVML_POWER_SCOPE_MODULE`` (GB200: the GPU
    with its share of the module's other power); the agent's ``power_limit_scope``.
    """

    GPU = "gpu"
    MODULE = "module"


@dataclass(frozen=True, slots=True)
class PowerLimitRange:
    """The range the device accepts for its power management limit."""

    min_w: float
    max_w: float
    default_w: float

    def clamp(self, cap_w: float) -> float:
        return min(max(cap_w, self.min_w), self.max_w)

    def contains(self, cap_w: float) -> bool:
        return self.min_w <= cap_w <= self.max_w

    def check(self, value_w: float, what: str, where: str) -> None:
        """``GpuValueError`` naming ``what`` (and ``where``) when ``value_w`` is outside;
        the setter's check before anything is written."""
        if not self.contains(value_w):
            raise GpuValueError(
                f"{where}: {what} {value_w!r} W refused, nothing written: outside the range "
                f"{self.min_w:g}-{self.max_w:g} W (clamp with PowerLimitRange.clamp)"
            )


@dataclass(frozen=True, slots=True)
class ClockRange:
    """The SM clocks the device supports, in MHz."""

    min_mhz: int
    max_mhz: int

    def clamp(self, clock_mhz: float) -> int:
        return int(min(max(round(clock_mhz), self.min_mhz), self.max_mhz))


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of every sensor the telemetry carries."""

    index: int
    uuid: str
    power_w: float
    power_reading: PowerReading
    energy_j: float | None  # None where the device has no energy counter
    cap_w: float  # the limit the device enforces now, read back
    sm_clock_mhz: int
    max_sm_clock_mhz: int | None  # the lock this backend set, None when unlocked
    util_pct: float
    temp_c: float


def _finite_real(value: object) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


@dataclass(frozen=True, slots=True)
class SmoothingProfile:
    """A hardware power smoothing preset (Blackwell-class GPUs) and whether smoothing is on.

    ``floor_percent`` is the power floor as a percentage of the applied power
    ceiling (NVML's "% TMP floor"; powerd takes the ceiling to be the enforced
    power limit, so a floor is never above the cap); ``ramp_up_w_per_s`` and
    ``ramp_down_w_per_s`` bound how fast the draw may rise and fall;
    ``ramp_down_hysteresis_ms`` is how long the draw must want to fall before it
    starts ramping down. ``preset`` is the preset profile these values belong to
    (0 to ``SMOOTHING_MAX_PRESETS - 1``), ``enabled`` the device-wide switch.

    Construction validates what holds on any device (finite, non-negative, the
    floor a percentage) and raises ``GpuValueError`` otherwise; what one device
    accepts is ``SmoothingRange``.
    """

    preset: int
    enabled: bool
    floor_percent: float
    ramp_up_w_per_s: float
    ramp_down_w_per_s: float
    ramp_down_hysteresis_ms: float

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.preset, numbers.Integral) or isinstance(self.preset, bool):
            problems.append(f"preset must be a whole number, got {self.preset!r}")
        elif not 0 <= self.preset < SMOOTHING_MAX_PRESETS:
            problems.append(f"preset {self.preset} is outside 0-{SMOOTHING_MAX_PRESETS - 1}")
        if not isinstance(self.enabled, bool):
            problems.append(f"enabled must be True or False, got {self.enabled!r}")
        for name, value, top, unit in (
            ("floor_percent", self.floor_percent, 100.0, "%"),
            ("ramp_up_w_per_s", self.ramp_up_w_per_s, SMOOTHING_MAX_RAMP_W_PER_S, " W/s"),
            ("ramp_down_w_per_s", self.ramp_down_w_per_s, SMOOTHING_MAX_RAMP_W_PER_S, " W/s"),
            (
                "ramp_down_hysteresis_ms",
                self.ramp_down_hysteresis_ms,
                SMOOTHING_MAX_HYSTERESIS_MS,
                " ms",
            ),
        ):
            if not _finite_real(value):
                problems.append(f"{name} must be a finite number, got {value!r}")
            elif not 0 <= value <= top:
                problems.append(f"{name} {value:g}{unit} is outside 0-{top:g}{unit}")
        if problems:
            raise GpuValueError("invalid smoothing profile: " + "; ".join(problems))

    def floor_w(self, ceiling_w: float) -> float:
        """The power floor in watts under a power ceiling (the enforced cap): never above it."""
        return ceiling_w * self.floor_percent / 100.0

    def close_to(self, other: SmoothingProfile) -> bool:
        """Same preset and switch, values equal to what a device reads back (mW/s, whole ms)."""
        return (
            self.preset == other.preset
            and self.enabled == other.enabled
            and abs(self.floor_percent - other.floor_percent) <= 0.005
            and abs(self.ramp_up_w_per_s - other.ramp_up_w_per_s) <= 0.001
            and abs(self.ramp_down_w_per_s - other.ramp_down_w_per_s) <= 0.001
            and abs(self.ramp_down_hysteresis_ms - other.ramp_down_hysteresis_ms) <= 0.5
        )


@dataclass(frozen=True, slots=True)
class SmoothingRange:
    """What one device accepts for power smoothing (NVML: min/max % TMP floor, preset count)."""

    floor_min_percent: float
    floor_max_percent: float
    presets: int

    def problems(self, profile: SmoothingProfile) -> list[str]:
        """Why the device would refuse ``profile``; empty when it accepts it."""
        found = []
        if not 0 <= profile.preset < self.presets:
            found.append(
                f"preset {profile.preset} is outside the device's presets 0-{self.presets - 1}"
            )
        if not self.floor_min_percent <= profile.floor_percent <= self.floor_max_percent:
            found.append(
                f"floor {profile.floor_percent:g}% is outside the range the device accepts, "
                f"{self.floor_min_percent:g}-{self.floor_max_percent:g}%"
            )
        return found

    def contains(self, profile: SmoothingProfile) -> bool:
        return not self.problems(profile)

    def clamp(self, profile: SmoothingProfile) -> SmoothingProfile:
        """``profile`` with its floor brought into range (the preset is left as it is)."""
        floor = min(max(profile.floor_percent, self.floor_min_percent), self.floor_max_percent)
        return dataclasses.replace(profile, floor_percent=floor)


@dataclass(slots=True)
class _SmoothingSnapshot:
    """The smoothing state before this backend first changed it: what restore puts back."""

    original: SmoothingProfile  # the active preset and the switch, as they were
    presets: dict[int, SmoothingProfile]  # every preset written since, as it was


def attempt_all(*restores: Callable[[], None]) -> None:
    """Call every one of ``restores`` even if some fail; then raise the first ``GpuError``:
    putting controls back must not stop at the first that cannot be."""
    first: GpuError | None = None
    for restore in restores:
        try:
            restore()
        except GpuError as exc:
            first = first or exc
    if first is not None:
        raise first


class Gpu(abc.ABC):
    """A GPU that can be read and capped.

    Setters raise ``GpuValueError`` for values outside the device's ranges,
    exactly as NVML does: clamping is the caller's decision, not the backend's.

    Hardware power smoothing is optional: the default implementations say it is
    unsupported. A backend that has it overrides ``supports_smoothing``,
    ``smoothing_range``, ``smoothing`` and ``_write_smoothing``; ``set_smoothing``
    and ``restore_smoothing`` (validation, save, write, read-back) are shared.

    The module-scope power limit is optional in the same way: a backend that has it
    overrides ``supports_module_power_limit``, ``module_power_limit_range``,
    ``module_power_limit_w`` and ``_write_module_power_limit_w``;
    ``set_module_power_limit_w`` and ``restore_module_power_limit`` are shared.
    """

    index: int
    uuid: str
    name: str
    _smoothing_snapshot: _SmoothingSnapshot | None = None
    _module_limit_saved_w: float | None = None  # before this backend first changed it

    @abc.abstractmethod
    def power_limit_range(self) -> PowerLimitRange: ...

    @abc.abstractmethod
    def sm_clock_range(self) -> ClockRange: ...

    @abc.abstractmethod
    def power_reading(self) -> PowerReading:
        """Which kind of power reading ``power_w`` returns."""

    @abc.abstractmethod
    def power_w(self) -> float: ...

    @abc.abstractmethod
    def energy_j(self) -> float | None:
        """Total energy since the driver loaded; None if the device has no counter."""

    @abc.abstractmethod
    def power_limit_w(self) -> float:
        """The power management limit set on the device (what we control).

        It reads back at once; the device enforces it a little later (an H200 on driver
        580: up to 92 ms, docs/HARDWARE.md), and ``enforced_cap_w`` shows the old limit
        meanwhile.
        """

    @abc.abstractmethod
    def enforced_cap_w(self) -> float:
        """The limit actually enforced: the minimum over every limiter, out-of-band ones too."""

    @abc.abstractmethod
    def sm_clock_mhz(self) -> int: ...

    @abc.abstractmethod
    def locked_max_sm_clock_mhz(self) -> int | None:
        """The max SM clock lock this backend set, None when clocks are unlocked.

        NVML has no getter for locked clocks; backends remember what they set.
        """

    @abc.abstractmethod
    def util_pct(self) -> float: ...

    @abc.abstractmethod
    def temp_c(self) -> float: ...

    @abc.abstractmethod
    def set_power_limit_w(self, cap_w: float) -> None: ...

    @abc.abstractmethod
    def lock_max_sm_clock_mhz(self, max_mhz: int) -> None: ...

    @abc.abstractmethod
    def unlock_sm_clock(self) -> None: ...

    # -- hardware power smoothing (optional) ---------------------------------------------

    def _smoothing_unsupported(self) -> GpuNotSupportedError:
        return GpuNotSupportedError(
            f"GPU {self.index} ({self.name}) has no hardware power smoothing: it needs a "
            "Blackwell-class GPU (GB200, B200 or newer) and an NVIDIA driver of branch "
            "R570 or newer"
        )

    def supports_smoothing(self) -> bool:
        """Whether the device offers hardware power smoothing through this backend."""
        return False

    def smoothing_range(self) -> SmoothingRange:
        """The floors and presets the device accepts; ``GpuNotSupportedError`` without smoothing."""
        raise self._smoothing_unsupported()

    def smoothing(self, preset: int | None = None) -> SmoothingProfile | None:
        """The values of ``preset`` (None: the active one), read from the device.

        ``enabled`` is the device-wide switch. None where smoothing is unsupported.
        """
        return None

    def _write_smoothing(self, profile: SmoothingProfile, *, activate: bool = True) -> None:
        """Write ``profile``'s values into its preset; with ``activate``, also make that
        preset the active one and set the switch. Backends check nothing more than the
        device would: ``set_smoothing`` validated already."""
        raise self._smoothing_unsupported()

    def set_smoothing(self, profile: SmoothingProfile) -> SmoothingProfile:
        """Write ``profile`` into its preset, activate it, switch smoothing on or off.

        Refused with ``GpuValueError`` before anything is written when the device would
        not accept it (clamp with ``SmoothingRange.clamp``), ``GpuNotSupportedError``
        where the device has no smoothing. The state before the first change is saved
        and put back by ``restore_smoothing`` / ``restore_defaults``. Returns what the
        device reads back; ``GpuError`` if it did not take the preset or the switch.
        The writes are several calls: a failure part-way leaves some of them applied.
        """
        where = f"GPU {self.index} ({self.name})"
        if not isinstance(profile, SmoothingProfile):
            raise GpuValueError(f"{where}: set_smoothing takes a SmoothingProfile, got {profile!r}")
        if not self.supports_smoothing():
            raise self._smoothing_unsupported()
        problems = self.smoothing_range().problems(profile)
        if problems:
            raise GpuValueError(
                f"{where}: smoothing profile refused, nothing written: {'; '.join(problems)} "
                "(clamp with SmoothingRange.clamp)"
            )
        first_change = self._smoothing_snapshot is None
        self._save_smoothing(profile.preset)
        try:
            self._write_smoothing(profile, activate=True)
        except GpuPermissionError:
            # Refused at the first write (permission is the process's, not the call's):
            # nothing changed, so nothing is left to put back on exit.
            if first_change:
                self._smoothing_snapshot = None
            raise
        applied = self.smoothing()
        if applied is None or (applied.preset, applied.enabled) != (
            profile.preset,
            profile.enabled,
        ):
            raise GpuError(
                f"{where}: after activating smoothing preset {profile.preset} "
                f"(enabled={profile.enabled}) the device reads back {applied}"
            )
        if not applied.close_to(profile):
            logger.warning(
                "%s: smoothing preset %d reads back %s after writing %s",
                where,
                profile.preset,
                applied,
                profile,
            )
        return applied

    def _save_smoothing(self, preset: int) -> None:
        """Remember the state before the first change, and each preset before it is written."""
        if self._smoothing_snapshot is None:
            original = self.smoothing()
            if original is None:
                raise self._smoothing_unsupported()
            self._smoothing_snapshot = _SmoothingSnapshot(original, {original.preset: original})
        snapshot = self._smoothing_snapshot
        if preset not in snapshot.presets:
            before = self.smoothing(preset)
            if before is None:
                raise self._smoothing_unsupported()
            snapshot.presets[preset] = before

    def restore_smoothing(self) -> None:
        """Put power smoothing back as it was before this backend first changed it.

        Every preset written is restored, then the preset that was active is activated
        again with the switch as it was. Nothing happens if smoothing was never changed.
        """
        snapshot = self._smoothing_snapshot
        if snapshot is None:
            return
        for preset, values in sorted(snapshot.presets.items()):
            if preset != snapshot.original.preset:
                self._write_smoothing(values, activate=False)
        self._write_smoothing(snapshot.original, activate=True)
        self._smoothing_snapshot = None

    # -- module-scope power limit (optional) ---------------------------------------------

    def _module_limit_unsupported(self) -> GpuNotSupportedError:
        return GpuNotSupportedError(
            f"GPU {self.index} ({self.name}) has no module-scope power limit: it needs a "
            "device that has one (GB200) and a driver whose NVML offers "
            "NVML_POWER_SCOPE_MODULE; use the GPU power limit"
        )

    def _module_limit_not_taken(self, asked_w: float, read_w: float) -> GpuError:
        """The error for a module limit written that the device does not read back."""
        return GpuError(
            f"GPU {self.index} ({self.name}): module power limit {asked_w:g} W was written "
            f"but the device reads back {read_w:g} W"
        )

    def supports_module_power_limit(self) -> bool:
        """Whether the device has a module-scope power limit through this backend."""
        return False

    def module_power_limit_range(self) -> PowerLimitRange:
        """The module limits the device accepts and its default, in watts;
        ``GpuNotSupportedError`` without module scope."""
        raise self._module_limit_unsupported()

    def module_power_limit_w(self) -> float:
        """The module-scope power limit set now, read from the device, in watts."""
        raise self._module_limit_unsupported()

    def _write_module_power_limit_w(self, limit_w: float) -> None:
        """Write the module limit. Backends check nothing: ``set_module_power_limit_w``
        validated already and reads it back afterwards."""
        raise self._module_limit_unsupported()

    def set_module_power_limit_w(self, limit_w: float) -> float:
        """Set the module-scope power limit; returns what the device reads back.

        Refused with ``GpuValueError`` before anything is written outside
        ``module_power_limit_range`` (clamp with ``PowerLimitRange.clamp``), with
        ``GpuNotSupportedError`` where the device has no module scope. The limit before
        the first change is saved and put back by ``restore_module_power_limit`` /
        ``restore_defaults``. ``GpuError`` if the device does not read back the value.
        """
        where = f"GPU {self.index} ({self.name})"
        if not _finite_real(limit_w):
            raise GpuValueError(f"{where}: module power limit must be watts, got {limit_w!r}")
        if not self.supports_module_power_limit():
            raise self._module_limit_unsupported()
        self.module_power_limit_range().check(limit_w, "module power limit", where)
        if self._module_limit_saved_w is None:
            self._module_limit_saved_w = self.module_power_limit_w()
        return self._write_module_limit_checked(float(limit_w))

    def _write_module_limit_checked(self, limit_w: float) -> float:
        """Write the module limit and read it back: a write NVML refused may look like
        one it took (nvidia-ml-py drops the return code of the setter)."""
        self._write_module_power_limit_w(limit_w)
        read_w = self.module_power_limit_w()
        if abs(read_w - limit_w) > POWER_LIMIT_RESOLUTION_W:
            raise self._module_limit_not_taken(limit_w, read_w)
        return read_w

    def restore_module_power_limit(self) -> None:
        """Put the module limit back as it was before this backend first changed it.

        Nothing happens if it was never changed; written only where it differs. The
        saved value is kept if the write fails, so a later restore tries again.
        """
        saved_w = self._module_limit_saved_w
        if saved_w is None:
            return
        if abs(self.module_power_limit_w() - saved_w) > POWER_LIMIT_RESOLUTION_W:
            self._write_module_limit_checked(saved_w)
        self._module_limit_saved_w = None

    def restore_defaults(self) -> None:
        """Put back the device's default power limit, remove any clock lock, and put
        power smoothing and the module power limit back as they were before this
        backend changed them (if it did).

        All four are attempted even if one fails; the first failure is raised.
        """
        attempt_all(
            lambda: self.set_power_limit_w(self.power_limit_range().default_w),
            self.restore_module_power_limit,
            self.unlock_sm_clock,
            self.restore_smoothing,
        )

    def sample(self) -> GpuSample:
        return GpuSample(
            index=self.index,
            uuid=self.uuid,
            power_w=self.power_w(),
            power_reading=self.power_reading(),
            energy_j=self.energy_j(),
            cap_w=self.enforced_cap_w(),
            sm_clock_mhz=self.sm_clock_mhz(),
            max_sm_clock_mhz=self.locked_max_sm_clock_mhz(),
            util_pct=self.util_pct(),
            temp_c=self.temp_c(),
        )

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the backend holds for this GPU."""
