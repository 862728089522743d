"""NvmlGpu SM clocks: supported range, lock and unlock, validation, fallbacks."""

from __future__ import annotations

import logging

import pynvml
import pytest

from powerd.gpu.base import ClockRange
from powerd.gpu.errors import GpuNotSupportedError, GpuPermissionError, GpuValueError
from powerd.gpu.models import gpu_model
from powerd.gpu.nvml import NvmlGpu, open_nvml
from tests.support.fakes.fake_pynvml import FakeNvml

LOCK = "nvmlDeviceSetGpuLockedClocks"


def open_fake(*keys: str) -> tuple[FakeNvml, list[NvmlGpu]]:
    fake = FakeNvml([gpu_model(k) for k in keys])
    return fake, open_nvml(fake)


@pytest.mark.parametrize("key", ["H100", "A100", "GB200"])
def test_range_is_lowest_clock_at_highest_memory_clock_to_max(key: str) -> None:
    _, (gpu,) = open_fake(key)
    model = gpu_model(key)
    # The fake lists lower graphics clocks at lower memory clocks: not the range wanted.
    assert gpu.sm_clock_range() == ClockRange(model.sm_clock_min_mhz, model.sm_clock_max_mhz)


def test_lock_reads_back_and_caps_the_clock() -> None:
    fake, (gpu,) = open_fake("H100")
    fake.set_demand(0, 650.0)
    assert gpu.locked_max_sm_clock_mhz() is None
    gpu.lock_max_sm_clock_mhz(1410)
    assert gpu.locked_max_sm_clock_mhz() == 1410
    assert fake.device(0).locked_clocks_mhz == (345, 1410)  # floor = lowest supported
    assert gpu.sm_clock_mhz() == 1410
    assert gpu.sample().max_sm_clock_mhz == 1410


def test_unlock_clears_the_lock() -> None:
    fake, (gpu,) = open_fake("H100")
    fake.set_demand(0, 650.0)
    gpu.lock_max_sm_clock_mhz(1000)
    gpu.unlock_sm_clock()
    assert gpu.locked_max_sm_clock_mhz() is None
    assert fake.device(0).locked_clocks_mhz is None
    assert gpu.sm_clock_mhz() == 1980


@pytest.mark.parametrize("max_mhz", [344, 0, 1981, 5000])
def test_out_of_range_lock_raises_value_error_and_keeps_the_old_lock(max_mhz: int) -> None:
    fake, (gpu,) = open_fake("H100")
    gpu.lock_max_sm_clock_mhz(1200)
    with pytest.raises(GpuValueError) as exc:
        gpu.lock_max_sm_clock_mhz(max_mhz)
    assert "345-1980 MHz" in str(exc.value) and "GPU 0" in str(exc.value)
    assert fake.calls_to(LOCK) == 1
    assert gpu.locked_max_sm_clock_mhz() == 1200
    assert fake.device(0).locked_clocks_mhz == (345, 1200)


@pytest.mark.parametrize("max_mhz", [1200.5, "1200", None])
def test_non_integer_lock_raises_value_error(max_mhz: object) -> None:
    fake, (gpu,) = open_fake("H100")
    with pytest.raises(GpuValueError, match="whole number"):
        gpu.lock_max_sm_clock_mhz(max_mhz)  # type: ignore[arg-type]
    assert fake.calls_to(LOCK) == 0


def test_lock_at_the_bounds_is_accepted() -> None:
    fake, (gpu,) = open_fake("A100")
    gpu.lock_max_sm_clock_mhz(210)
    assert fake.device(0).locked_clocks_mhz == (210, 210)
    gpu.lock_max_sm_clock_mhz(1410)
    assert fake.device(0).locked_clocks_mhz == (210, 1410)


def test_failed_lock_or_unlock_keeps_what_was_remembered() -> None:
    fake, (gpu,) = open_fake("H100")
    gpu.lock_max_sm_clock_mhz(1500)
    fake.require_root = True
    with pytest.raises(GpuPermissionError):
        gpu.lock_max_sm_clock_mhz(1000)
    assert gpu.locked_max_sm_clock_mhz() == 1500
    with pytest.raises(GpuPermissionError):
        gpu.unlock_sm_clock()
    assert gpu.locked_max_sm_clock_mhz() == 1500
    assert fake.device(0).locked_clocks_mhz == (345, 1500)


@pytest.mark.parametrize(
    "call", ["nvmlDeviceGetSupportedMemoryClocks", "nvmlDeviceGetSupportedGraphicsClocks"]
)
def test_unknown_supported_clocks_fall_back_to_a_zero_floor(
    call: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml([gpu_model("H100")])
    fake.inject(call, pynvml.NVML_ERROR_NOT_SUPPORTED, times=None)
    with caplog.at_level(logging.WARNING, logger="powerd.gpu.nvml"):
        (gpu,) = open_nvml(fake)
    assert gpu.sm_clock_range() == ClockRange(0, 1980)
    assert any("supported SM clocks unknown" in r.getMessage() for r in caplog.records)


def test_unknown_max_clock_makes_clock_control_unsupported_but_reads_work() -> None:
    fake = FakeNvml([gpu_model("H100")])
    fake.inject("nvmlDeviceGetMaxClockInfo", pynvml.NVML_ERROR_NOT_SUPPORTED)
    (gpu,) = open_nvml(fake)
    with pytest.raises(GpuNotSupportedError, match="nvmlDeviceGetMaxClockInfo"):
        gpu.sm_clock_range()
    with pytest.raises(GpuNotSupportedError):
        gpu.lock_max_sm_clock_mhz(1000)
    assert fake.calls_to(LOCK) == 0
    assert gpu.power_w() > 0
