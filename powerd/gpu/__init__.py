"""GPU backends: one abstract interface, an NVML implementation and a simulator."""

from powerd.gpu.base import (
    ClockRange,
    Gpu,
    GpuSample,
    PowerLimitRange,
    PowerReading,
    PowerScope,
)
from powerd.gpu.errors import (
    GpuError,
    GpuLibraryError,
    GpuLostError,
    GpuNotFoundError,
    GpuNotSupportedError,
    GpuPermissionError,
    GpuValueError,
)

__all__ = [
    "ClockRange",
    "Gpu",
    "GpuError",
    "GpuLibraryError",
    "GpuLostError",
    "GpuNotFoundError",
    "GpuNotSupportedError",
    "GpuPermissionError",
    "GpuSample",
    "GpuValueError",
    "PowerLimitRange",
    "PowerReading",
    "PowerScope",
]
