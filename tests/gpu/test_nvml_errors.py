"""NVML errors become the project's exception types, with messages an operator can act on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml
import pytest

from powerd.gpu.errors import (
    GpuError,
    GpuLibraryError,
    GpuLostError,
    GpuNotSupportedError,
    GpuPermissionError,
    GpuValueError,
)
from powerd.gpu.models import gpu_model
from powerd.gpu.nvml import NvmlGpu, open_nvml, shutdown_nvml
from tests.support.fakes.fake_pynvml import FakeNvml

H100_WHERE = "GPU 0 (NVIDIA H100 80GB HBM3)"
ROOT_HINT = "run the agent as root (or grant CAP_SYS_ADMIN)"
DRIVER_HINT = "NVIDIA driver installed and loaded"
NVML_DEVICE_CALLS = sorted(n for n in dir(FakeNvml) if n.startswith("nvmlDevice"))
ALL_NVML_CODES = sorted(
    {getattr(pynvml, n) for n in dir(pynvml) if n.startswith("NVML_ERROR_")} | {12345}
)


def open_fake(*keys: str) -> tuple[FakeNvml, list[NvmlGpu]]:
    fake = FakeNvml([gpu_model(k) for k in keys])
    return fake, open_nvml(fake)


@pytest.mark.parametrize(
    ("code", "exc_type", "fragments"),
    [
        (pynvml.NVML_ERROR_NO_PERMISSION, GpuPermissionError, [H100_WHERE, ROOT_HINT]),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, GpuNotSupportedError, [H100_WHERE, "not supported"]),
        (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, GpuNotSupportedError, [H100_WHERE, "driver"]),
        (
            pynvml.NVML_ERROR_GPU_IS_LOST,
            GpuLostError,
            [H100_WHERE, "fell off the bus", "nvidia-smi", "dmesg", "needs attention"],
        ),
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, GpuValueError, [H100_WHERE, "Invalid Argument"]),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, GpuLibraryError, [DRIVER_HINT, "Not Found"]),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, GpuLibraryError, [DRIVER_HINT, "Driver Not Loaded"]),
        (pynvml.NVML_ERROR_UNINITIALIZED, GpuLibraryError, [DRIVER_HINT, "shut down"]),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, GpuLibraryError, [DRIVER_HINT, "mismatch"]),
        (pynvml.NVML_ERROR_TIMEOUT, GpuError, [H100_WHERE, "Timeout"]),
        (pynvml.NVML_ERROR_UNKNOWN, GpuError, [H100_WHERE, "Unknown Error"]),
        (12345, GpuError, [H100_WHERE, "12345"]),
    ],
)
def test_each_nvml_error_maps_to_its_exception_with_a_useful_message(
    code: int, exc_type: type[GpuError], fragments: list[str]
) -> None:
    fake, (gpu,) = open_fake("H100")
    fake.inject("nvmlDeviceGetEnforcedPowerLimit", code)
    with pytest.raises(GpuError) as exc:
        gpu.enforced_cap_w()
    assert type(exc.value) is exc_type
    message = str(exc.value)
    assert "nvmlDeviceGetEnforcedPowerLimit" in message
    for fragment in fragments:
        assert fragment in message
    assert isinstance(exc.value.__cause__, pynvml.NVMLError)
    assert exc.value.__cause__.value == code


def test_permission_error_on_clock_lock_names_the_call_and_the_fix() -> None:
    fake, (gpu,) = open_fake("H100")
    fake.require_root = True
    with pytest.raises(GpuPermissionError) as exc:
        gpu.lock_max_sm_clock_mhz(1200)
    assert "nvmlDeviceSetGpuLockedClocks" in str(exc.value)
    assert ROOT_HINT in str(exc.value)


def test_nvml_rejecting_a_value_is_a_value_error() -> None:
    fake, (gpu,) = open_fake("H100")
    fake.inject("nvmlDeviceSetPowerManagementLimit", pynvml.NVML_ERROR_INVALID_ARGUMENT)
    with pytest.raises(GpuValueError, match="nvmlDeviceSetPowerManagementLimit"):
        gpu.set_power_limit_w(500.0)


def test_lost_gpu_fails_every_read_on_that_gpu_only() -> None:
    fake, (h100, a100) = open_fake("H100", "A100")
    fake.lose_gpu(1)
    for read in (a100.power_w, a100.energy_j, a100.enforced_cap_w, a100.temp_c, a100.sample):
        with pytest.raises(GpuLostError, match=r"GPU 1 \(NVIDIA A100-SXM4-80GB\)"):
            read()
    assert h100.enforced_cap_w() == 700.0


@pytest.mark.parametrize(
    ("code", "exc_type"),
    [
        (pynvml.NVML_ERROR_GPU_IS_LOST, GpuLostError),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, GpuNotSupportedError),
    ],
)
def test_instant_power_per_field_failure_after_open_is_mapped(
    code: int, exc_type: type[GpuError]
) -> None:
    fake, (gpu,) = open_fake("H100")
    fake.set_field_return(0, pynvml.NVML_FI_DEV_POWER_INSTANT, code)
    with pytest.raises(exc_type, match="NVML_FI_DEV_POWER_INSTANT"):
        gpu.power_w()


# -- open and shutdown --------------------------------------------------------------------


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED]
)
def test_nvml_init_failure_asks_whether_the_driver_is_loaded(code: int) -> None:
    fake = FakeNvml([gpu_model("H100")])
    fake.inject("nvmlInit", code)
    with pytest.raises(GpuLibraryError) as exc:
        open_nvml(fake)
    assert "nvmlInit" in str(exc.value) and DRIVER_HINT in str(exc.value)
    assert not fake.initialized


def test_gpu_lost_while_opening_is_reported_and_nvml_shut_down() -> None:
    fake = FakeNvml([gpu_model("H100"), gpu_model("H100")])
    fake.lose_gpu(1)
    with pytest.raises(GpuLostError, match="GPU 1"):
        open_nvml(fake)
    assert not fake.initialized


def test_error_while_probing_at_open_is_mapped() -> None:
    fake = FakeNvml([gpu_model("H100")])
    fake.inject("nvmlDeviceGetUUID", pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(GpuPermissionError, match="nvmlDeviceGetUUID"):
        open_nvml(fake)
    assert not fake.initialized


def test_gpu_lost_during_the_power_probe_is_not_taken_for_no_instant_power() -> None:
    fake = FakeNvml([gpu_model("H100")])
    fake.inject("nvmlDeviceGetFieldValues", pynvml.NVML_ERROR_GPU_IS_LOST, device=0)
    with pytest.raises(GpuLostError):
        open_nvml(fake)


def test_shutdown_without_init_is_a_library_error() -> None:
    with pytest.raises(GpuLibraryError, match="nvmlShutdown"):
        shutdown_nvml(FakeNvml([gpu_model("H100")]))


# -- no raw NVMLError escapes ---------------------------------------------------------------

PUBLIC_METHODS: list[tuple[str, Callable[[NvmlGpu], Any], bool]] = [
    # (name, call, whether it reaches NVML after open)
    ("power_limit_range", lambda g: g.power_limit_range(), True),
    ("sm_clock_range", lambda g: g.sm_clock_range(), False),
    ("power_reading", lambda g: g.power_reading(), False),
    ("power_w", lambda g: g.power_w(), True),
    ("energy_j", lambda g: g.energy_j(), True),
    ("power_limit_w", lambda g: g.power_limit_w(), True),
    ("enforced_cap_w", lambda g: g.enforced_cap_w(), True),
    ("sm_clock_mhz", lambda g: g.sm_clock_mhz(), True),
    ("locked_max_sm_clock_mhz", lambda g: g.locked_max_sm_clock_mhz(), False),
    ("util_pct", lambda g: g.util_pct(), True),
    ("temp_c", lambda g: g.temp_c(), True),
    ("set_power_limit_w", lambda g: g.set_power_limit_w(450.0), True),
    ("lock_max_sm_clock_mhz", lambda g: g.lock_max_sm_clock_mhz(1200), True),
    ("unlock_sm_clock", lambda g: g.unlock_sm_clock(), True),
    ("restore_defaults", lambda g: g.restore_defaults(), True),
    ("sample", lambda g: g.sample(), True),
    ("close", lambda g: g.close(), False),
]

REPRESENTATIVE_CODES = [
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_GPU_IS_LOST,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
    pynvml.NVML_ERROR_UNINITIALIZED,
    pynvml.NVML_ERROR_TIMEOUT,
    pynvml.NVML_ERROR_UNKNOWN,
]


@pytest.mark.parametrize("code", REPRESENTATIVE_CODES)
@pytest.mark.parametrize(
    ("method", "reaches_nvml"),
    [(call, reaches) for _, call, reaches in PUBLIC_METHODS],
    ids=[name for name, _, _ in PUBLIC_METHODS],
)
def test_no_raw_nvml_error_escapes_a_public_method(
    method: Callable[[NvmlGpu], Any], reaches_nvml: bool, code: int
) -> None:
    fake, (gpu,) = open_fake("H100")
    for call in NVML_DEVICE_CALLS:
        fake.inject(call, code, times=None, device=0)
    if reaches_nvml:
        with pytest.raises(GpuError) as exc:
            method(gpu)
        assert not isinstance(exc.value, pynvml.NVMLError)
    else:
        method(gpu)  # answered from what was probed at open: must not raise


@pytest.mark.parametrize("code", ALL_NVML_CODES)
def test_every_nvml_error_code_becomes_a_gpu_error(code: int) -> None:
    fake, (_, a100) = open_fake("H100", "A100")
    fake.inject("nvmlDeviceGetPowerUsage", code, device=1)
    with pytest.raises(GpuError) as exc:
        a100.power_w()
    assert not isinstance(exc.value, pynvml.NVMLError)
    assert "nvmlDeviceGetPowerUsage" in str(exc.value)
    assert "GPU 1 (NVIDIA A100-SXM4-80GB)" in str(exc.value)
