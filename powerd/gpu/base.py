"""One GPU, as the agent sees it, whatever drives it (NVML or the simulator).

Modelled on Zeus's ``zeus/device/gpu/common.py``: one abstract class, backends
that translate their own failures into the exception types of
``powerd.gpu.errors``, so the agent never sees a backend-specific error.

Units are in the names: watts (``_w``), joules (``_j``), MHz (``_mhz``).
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass

from powerd.gpu.errors import GpuError


class PowerReading(enum.StrEnum):
    """What a power reading is: NVML offers two very different numbers."""

    INSTANT = "instant"  # NVML_FI_DEV_POWER_INSTANT through nvmlDeviceGetFieldValues
    AVERAGE_1S = "average_1s"  # nvmlDeviceGetPowerUsage on Ampere (not GA100) and newer
    SIMULATED = "simulated"


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


class Gpu(abc.ABC):
    """A GPU that can be read and capped.

    Setters raise ``GpuValueError`` for values outside the device's ranges,
    exactly as NVML does: clamping is the caller's decision, not the backend's.
    """

    index: int
    uuid: str
    name: str

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
        """The power management limit set on the device (what we control)."""

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

    def restore_defaults(self) -> None:
        """Put back the device's default power limit and remove any clock lock.

        Both are attempted even if the first fails; the first failure is raised.
        """
        first: GpuError | None = None
        for restore in (
            lambda: self.set_power_limit_w(self.power_limit_range().default_w),
            self.unlock_sm_clock,
        ):
            try:
                restore()
            except GpuError as exc:
                first = first or exc
        if first is not None:
            raise first

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
