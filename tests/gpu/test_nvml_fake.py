"""The fake pynvml behaves like NVML in the ways the backend tests rely on."""

from __future__ import annotations

import pynvml
import pytest

from powerd.gpu.models import gpu_model
from tests.support.fakes.fake_pynvml import MEMORY_CLOCKS_MHZ, FakeNvml


@pytest.fixture
def fake() -> FakeNvml:
    f = FakeNvml([gpu_model("H100"), gpu_model("A100"), gpu_model("P100")])
    f.nvmlInit()
    return f


def test_calls_before_init_raise_uninitialized() -> None:
    f = FakeNvml([gpu_model("H100")])
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        f.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        f.nvmlShutdown()


def test_init_is_reference_counted_and_shutdown_uninitializes(fake: FakeNvml) -> None:
    h = fake.nvmlDeviceGetHandleByIndex(0)
    fake.nvmlInit()
    fake.nvmlShutdown()
    assert fake.nvmlDeviceGetPowerManagementLimit(h) == 700_000
    fake.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError) as exc:
        fake.nvmlDeviceGetPowerManagementLimit(h)
    assert exc.value.value == pynvml.NVML_ERROR_UNINITIALIZED


def test_errors_are_the_real_pynvml_classes(fake: FakeNvml) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(3)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(-1)


def test_constants_and_structures_come_from_the_real_module(fake: FakeNvml) -> None:
    assert fake.NVML_CLOCK_SM == pynvml.NVML_CLOCK_SM
    assert fake.NVMLError is pynvml.NVMLError
    assert fake.c_nvmlFieldValue_t is pynvml.c_nvmlFieldValue_t
    assert fake.as_module() is fake
    with pytest.raises(AttributeError, match="does not implement"):
        fake.nvmlDeviceGetFanSpeed  # noqa: B018


def test_set_limit_feeds_limit_and_enforced_getters(fake: FakeNvml) -> None:
    h = fake.nvmlDeviceGetHandleByIndex(0)
    fake.nvmlDeviceSetPowerManagementLimit(h, 450_000)
    assert fake.nvmlDeviceGetPowerManagementLimit(h) == 450_000
    assert fake.nvmlDeviceGetEnforcedPowerLimit(h) == 450_000
    assert fake.nvmlDeviceGetPowerManagementDefaultLimit(h) == 700_000


def test_external_limiter_makes_enforced_the_minimum(fake: FakeNvml) -> None:
    h = fake.nvmlDeviceGetHandleByIndex(0)
    fake.nvmlDeviceSetPowerManagementLimit(h, 500_000)
    fake.set_external_limit(0, 350_000)
    assert fake.nvmlDeviceGetPowerManagementLimit(h) == 500_000
    assert fake.nvmlDeviceGetEnforcedPowerLimit(h) == 350_000
    fake.set_external_limit(0, 600_000)
    assert fake.nvmlDeviceGetEnforcedPowerLimit(h) == 500_000


@pytest.mark.parametrize("limit_mw", [199_999, 700_001, 0])
def test_out_of_range_limit_is_invalid_argument_and_changes_nothing(
    fake: FakeNvml, limit_mw: int
) -> None:
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetPowerManagementLimitConstraints(h) == [200_000, 700_000]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceSetPowerManagementLimit(h, limit_mw)
    assert fake.nvmlDeviceGetPowerManagementLimit(h) == 700_000


def test_float_limit_is_rejected_like_ctypes(fake: FakeNvml) -> None:
    h = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(TypeError):
        fake.nvmlDeviceSetPowerManagementLimit(h, 450_000.0)  # type: ignore[arg-type]


def test_require_root_makes_every_setter_refuse(fake: FakeNvml) -> None:
    h = fake.nvmlDeviceGetHandleByIndex(0)
    fake.require_root = True
    with pytest.raises(pynvml.NVMLError_NoPermission):
        fake.nvmlDeviceSetPowerManagementLimit(h, 450_000)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        fake.nvmlDeviceSetGpuLockedClocks(h, 345, 1500)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        fake.nvmlDeviceResetGpuLockedClocks(h)
    assert fake.nvmlDeviceGetPowerManagementLimit(h) == 700_000  # reads still work


@pytest.mark.parametrize(("lo", "hi"), [(1500, 1400), (300, 1500), (345, 1995)])
def test_bad_clock_lock_is_invalid_argument(fake: FakeNvml, lo: int, hi: int) -> None:
    h = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceSetGpuLockedClocks(h, lo, hi)
    assert fake.device(0).locked_clocks_mhz is None


def test_clock_lock_caps_the_sm_clock_and_reset_removes_it(fake: FakeNvml) -> None:
    h = fake.nvmlDeviceGetHandleByIndex(0)
    fake.set_demand(0, 650.0)
    assert fake.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980
    fake.nvmlDeviceSetGpuLockedClocks(h, 345, 1200)
    assert fake.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1200
    fake.nvmlDeviceResetGpuLockedClocks(h)
    assert fake.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980


def test_supported_clocks_floor_depends_on_memory_clock(fake: FakeNvml) -> None:
    h = fake.nvmlDeviceGetHandleByIndex(0)
    mem = fake.nvmlDeviceGetSupportedMemoryClocks(h)
    assert mem == list(MEMORY_CLOCKS_MHZ)
    assert min(fake.nvmlDeviceGetSupportedGraphicsClocks(h, max(mem))) == 345
    assert min(fake.nvmlDeviceGetSupportedGraphicsClocks(h, min(mem))) < 345
    assert fake.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980


def test_instant_power_field_per_model(fake: FakeNvml) -> None:
    fake.set_demand(0, 512.0)
    h100, a100 = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    (field,) = fake.nvmlDeviceGetFieldValues(h100, [pynvml.NVML_FI_DEV_POWER_INSTANT])
    assert field.nvmlReturn == pynvml.NVML_SUCCESS
    assert field.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert field.value.uiVal == 512_000
    # No instant power: the call succeeds, the field says NOT_SUPPORTED.
    (field,) = fake.nvmlDeviceGetFieldValues(a100, [pynvml.NVML_FI_DEV_POWER_INSTANT])
    assert field.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_draw_follows_demand_clipped_by_enforced_limit(fake: FakeNvml) -> None:
    h = fake.nvmlDeviceGetHandleByIndex(0)
    fake.set_demand(0, 650.0)
    assert fake.nvmlDeviceGetPowerUsage(h) == 650_000
    fake.nvmlDeviceSetPowerManagementLimit(h, 400_000)
    assert fake.nvmlDeviceGetPowerUsage(h) == 400_000
    assert fake.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) < 1980
    fake.set_external_limit(0, 300_000)
    assert fake.nvmlDeviceGetPowerUsage(h) == 300_000


def test_energy_integrates_draw_over_advanced_time(fake: FakeNvml) -> None:
    h = fake.nvmlDeviceGetHandleByIndex(0)
    start = fake.nvmlDeviceGetTotalEnergyConsumption(h)
    fake.set_demand(0, 500.0)
    fake.advance(2.0)
    fake.set_demand(0, 100.0)
    fake.advance(1.0)
    assert fake.nvmlDeviceGetTotalEnergyConsumption(h) - start == 1_100_000  # mJ


def test_energy_follows_an_injected_clock() -> None:
    now = [100.0]
    f = FakeNvml([gpu_model("H100")], clock=lambda: now[0])
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)
    f.set_demand(0, 300.0)
    now[0] += 4.0
    assert f.nvmlDeviceGetTotalEnergyConsumption(h) == 1_200_000


def test_no_energy_counter_is_not_supported(fake: FakeNvml) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetTotalEnergyConsumption(fake.nvmlDeviceGetHandleByIndex(2))


def test_injection_fires_the_given_number_of_times_on_the_given_device(fake: FakeNvml) -> None:
    h0, h1 = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    fake.inject("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_TIMEOUT, times=2, device=1)
    assert fake.nvmlDeviceGetPowerUsage(h0) > 0
    for _ in range(2):
        with pytest.raises(pynvml.NVMLError_Timeout):
            fake.nvmlDeviceGetPowerUsage(h1)
    assert fake.nvmlDeviceGetPowerUsage(h1) > 0
    fake.inject("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_UNKNOWN, times=None)
    for h in (h0, h1, h0):
        with pytest.raises(pynvml.NVMLError_Unknown):
            fake.nvmlDeviceGetPowerUsage(h)
    fake.clear_injections()
    assert fake.nvmlDeviceGetPowerUsage(h0) > 0


def test_lost_gpu_fails_every_call_on_its_handle(fake: FakeNvml) -> None:
    h0, h1 = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    fake.inject("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_GPU_IS_LOST, device=1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetTemperature(h1, pynvml.NVML_TEMPERATURE_GPU)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetPowerManagementLimit(h1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetHandleByIndex(1)
    assert fake.nvmlDeviceGetPowerManagementLimit(h0) == 700_000


def test_calls_are_logged_with_their_device(fake: FakeNvml) -> None:
    h1 = fake.nvmlDeviceGetHandleByIndex(1)
    fake.nvmlDeviceGetPowerUsage(h1)
    assert fake.calls_to("nvmlDeviceGetPowerUsage", device=1) == 1
    assert fake.calls_to("nvmlDeviceGetPowerUsage", device=0) == 0
