"""The GPU errors the agent handles. Backends map their own failures onto these.

Messages are written for the operator who reads the log: say what failed and
what to do about it.
"""

from __future__ import annotations


class GpuError(Exception):
    """Any failure to read or control a GPU."""


class GpuPermissionError(GpuError):
    """The caller may not change this setting (NVML_ERROR_NO_PERMISSION)."""


class GpuNotSupportedError(GpuError):
    """This GPU or driver does not offer the call (NVML_ERROR_NOT_SUPPORTED)."""


class GpuLostError(GpuError):
    """The GPU fell off the bus or stopped answering (NVML_ERROR_GPU_IS_LOST)."""


class GpuValueError(GpuError):
    """A value outside what the device accepts (NVML_ERROR_INVALID_ARGUMENT)."""


class GpuNotFoundError(GpuError):
    """No GPU at that index, or no GPU at all."""


class GpuLibraryError(GpuError):
    """The driver library could not be loaded or initialised."""
