"""A GPU that changes one behaviour of another and hands it everything else.

``powerd.gpu.software_smoothing`` (smoothing carried out by the job) and
``powerd.gpu.module_scope`` (caps through the module-scope power limit) each
wrap a backend's GPU and override what they change; ``WrappedGpu`` forwards
the rest, restore included, so a wrapper never hides a control the backend
saves and puts back.
"""

from __future__ import annotations

from powerd.gpu.base import (
    ClockRange,
    Gpu,
    PowerLimitRange,
    PowerReading,
    SmoothingProfile,
    SmoothingRange,
)


class WrappedGpu(Gpu):
    """Every ``Gpu`` call forwarded to ``inner``; subclasses override what they change."""

    def __init__(self, gpu: Gpu) -> None:
        self.inner = gpu
        self.index = gpu.index
        self.uuid = gpu.uuid
        self.name = gpu.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    # -- reads ----------------------------------------------------------------------------

    def power_limit_range(self) -> PowerLimitRange:
        return self.inner.power_limit_range()

    def sm_clock_range(self) -> ClockRange:
        return self.inner.sm_clock_range()

    def power_reading(self) -> PowerReading:
        return self.inner.power_reading()

    def power_w(self) -> float:
        return self.inner.power_w()

    def energy_j(self) -> float | None:
        return self.inner.energy_j()

    def power_limit_w(self) -> float:
        return self.inner.power_limit_w()

    def enforced_cap_w(self) -> float:
        return self.inner.enforced_cap_w()

    def sm_clock_mhz(self) -> int:
        return self.inner.sm_clock_mhz()

    def locked_max_sm_clock_mhz(self) -> int | None:
        return self.inner.locked_max_sm_clock_mhz()

    def util_pct(self) -> float:
        return self.inner.util_pct()

    def temp_c(self) -> float:
        return self.inner.temp_c()

    # -- controls -------------------------------------------------------------------------

    def set_power_limit_w(self, cap_w: float) -> None:
        self.inner.set_power_limit_w(cap_w)

    def lock_max_sm_clock_mhz(self, max_mhz: int) -> None:
        self.inner.lock_max_sm_clock_mhz(max_mhz)

    def unlock_sm_clock(self) -> None:
        self.inner.unlock_sm_clock()

    def supports_smoothing(self) -> bool:
        return self.inner.supports_smoothing()

    def smoothing_range(self) -> SmoothingRange:
        return self.inner.smoothing_range()

    def smoothing(self, preset: int | None = None) -> SmoothingProfile | None:
        return self.inner.smoothing(preset)

    def set_smoothing(self, profile: SmoothingProfile) -> SmoothingProfile:
        return self.inner.set_smoothing(profile)

    def restore_smoothing(self) -> None:
        self.inner.restore_smoothing()

    def supports_module_power_limit(self) -> bool:
        return self.inner.supports_module_power_limit()

    def module_power_limit_range(self) -> PowerLimitRange:
        return self.inner.module_power_limit_range()

    def module_power_limit_w(self) -> float:
        return self.inner.module_power_limit_w()

    def set_module_power_limit_w(self, limit_w: float) -> float:
        return self.inner.set_module_power_limit_w(limit_w)

    def restore_module_power_limit(self) -> None:
        self.inner.restore_module_power_limit()

    def restore_defaults(self) -> None:
        """The wrapped GPU's own restore: every control its backend saved."""
        self.inner.restore_defaults()

    def close(self) -> None:
        self.inner.close()
