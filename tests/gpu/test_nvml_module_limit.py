"""NvmlGpu module-scope power limits (GB200) against the fake pynvml: set, read back,
restore, refuse; and the fake's v2 setter, which drops NVML's return code as pynvml does."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pynvml
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerd.gpu import nvml as nvml_backend
from powerd.gpu.base import PowerLimitRange
from powerd.gpu.errors import GpuError, GpuNotSupportedError, GpuValueError
from powerd.gpu.models import gpu_model
from powerd.gpu.nvml import NvmlGpu, open_nvml
from tests.support.fakes.fake_pynvml import FakeNvml, ModuleLimit

SETTER = "nvmlDeviceSetPowerManagementLimit_v2"
MODULE = pynvml.NVML_POWER_SCOPE_MODULE
ROOT_HINT = "run the agent as root (or grant CAP_SYS_ADMIN)"


def open_fake(*keys: str) -> tuple[FakeNvml, list[NvmlGpu]]:
    fake = FakeNvml([gpu_model(k) for k in keys])
    return fake, open_nvml(fake)


def module_of(fake: FakeNvml, index: int = 0) -> ModuleLimit:
    module = fake.device(index).module
    assert module is not None
    return module


# -- support ---------------------------------------------------------------------------------


def test_gb200_has_a_module_limit_and_hopper_ampere_do_not() -> None:
    _, (gb200, h100, a100) = open_fake("GB200", "H100", "A100")
    assert gb200.supports_module_power_limit()
    assert not h100.supports_module_power_limit()
    assert not a100.supports_module_power_limit()


def test_support_is_asked_once() -> None:
    fake, (gb200, h100) = open_fake("GB200", "H100")
    before = fake.calls_to("nvmlDeviceGetFieldValues")
    for _ in range(3):
        assert gb200.supports_module_power_limit()
        assert not h100.supports_module_power_limit()
    assert fake.calls_to("nvmlDeviceGetFieldValues") == before + 2


def test_range_and_limit_come_from_the_module_scope_fields() -> None:
    fake, (gpu,) = open_fake("GB200")
    module = module_of(fake)
    module.min_mw, module.max_mw, module.default_mw, module.current_mw = (
        500_000,
        1_600_000,
        1_450_500,
        1_300_250,
    )
    assert gpu.module_power_limit_range() == PowerLimitRange(500.0, 1600.0, 1450.5)
    assert gpu.module_power_limit_w() == 1300.25
    # the GPU's own limit is another thing
    assert gpu.power_limit_range() == PowerLimitRange(200.0, 1200.0, 1200.0)


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT]
)
def test_a_field_that_fails_means_no_module_limit(code: int) -> None:
    """Drivers without module scope answer NOT_SUPPORTED per field, old ones INVALID_ARGUMENT."""
    fake = FakeNvml([gpu_model("GB200")])
    fake.set_field_return(0, pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT, code)
    (gpu,) = open_nvml(fake)
    assert not gpu.supports_module_power_limit()
    with pytest.raises(GpuNotSupportedError, match="GB200"):
        gpu.set_module_power_limit_w(1000.0)
    assert fake.calls_to(SETTER) == 0


def test_a_fake_device_without_module_scope_answers_not_supported_per_field() -> None:
    fake = FakeNvml([gpu_model("H100")])
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    (field,) = fake.nvmlDeviceGetFieldValues(
        handle, [(pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT, MODULE)]
    )
    assert field.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


# -- set, read back, restore -----------------------------------------------------------------


def test_set_writes_mw_at_module_scope_and_reads_back() -> None:
    fake, (gpu,) = open_fake("GB200")
    assert gpu.set_module_power_limit_w(850.5) == 850.5
    assert module_of(fake).current_mw == 850_500
    assert gpu.module_power_limit_w() == 850.5
    assert fake.device(0).limit_mw == 1_200_000  # the GPU's own limit untouched
    assert fake.calls_to(SETTER) == 1


def test_restore_defaults_puts_back_the_module_limit_as_it_was() -> None:
    fake, (gpu,) = open_fake("GB200")
    module_of(fake).current_mw = 1_300_000  # an operator's limit, before powerd
    gpu.set_module_power_limit_w(900.0)
    gpu.set_module_power_limit_w(700.0)
    gpu.restore_defaults()
    assert module_of(fake).current_mw == 1_300_000
    assert fake.device(0).limit_mw == 1_200_000
    calls = fake.calls_to(SETTER)
    gpu.restore_defaults()  # nothing left to put back
    assert fake.calls_to(SETTER) == calls


def test_restore_without_a_change_writes_no_module_limit() -> None:
    fake, (gb200, h100) = open_fake("GB200", "H100")
    gb200.restore_defaults()
    h100.restore_defaults()
    assert fake.calls_to(SETTER) == 0


def test_a_failed_restore_keeps_the_saved_limit_for_a_retry() -> None:
    fake, (gpu,) = open_fake("GB200")
    gpu.set_module_power_limit_w(700.0)
    fake.inject(SETTER, pynvml.NVML_ERROR_UNKNOWN)  # dropped by pynvml: the read-back sees it
    with pytest.raises(GpuError, match="not taken"):
        gpu.restore_defaults()
    assert fake.device(0).limit_mw == 1_200_000  # the other restores were attempted
    gpu.restore_defaults()
    assert module_of(fake).current_mw == 1_350_000


# -- refused ---------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["H100", "A100"])
def test_gpu_without_module_scope_refuses_cleanly(key: str) -> None:
    fake, (gpu,) = open_fake(key)
    for call in (
        lambda: gpu.set_module_power_limit_w(500.0),
        gpu.module_power_limit_range,
        gpu.module_power_limit_w,
    ):
        with pytest.raises(GpuNotSupportedError) as exc:
            call()
        assert "module-scope power limit" in str(exc.value)
        assert "GB200" in str(exc.value)
    assert fake.calls_to(SETTER) == 0


def test_old_nvidia_ml_py_says_to_install_a_newer_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_backend, "_HAS_MODULE_LIMIT_BINDINGS", False)
    fake, (gpu,) = open_fake("GB200")
    assert not gpu.supports_module_power_limit()
    with pytest.raises(GpuNotSupportedError, match="install a newer nvidia-ml-py"):
        gpu.set_module_power_limit_w(1000.0)
    assert fake.calls_to(SETTER) == 0


def test_a_driver_without_the_v2_setter_is_not_supported() -> None:
    fake, (gpu,) = open_fake("GB200")
    fake.inject(SETTER, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # raised by pynvml itself
    with pytest.raises(GpuNotSupportedError) as exc:
        gpu.set_module_power_limit_w(1000.0)
    assert SETTER in str(exc.value) and "NVML_POWER_SCOPE_MODULE" in str(exc.value)
    assert module_of(fake).current_mw == 1_350_000


@pytest.mark.parametrize("limit_w", [399.999, 1350.001, 0.0, -5.0, math.nan, math.inf])
def test_out_of_range_is_refused_before_anything_is_written(limit_w: float) -> None:
    fake, (gpu,) = open_fake("GB200")
    with pytest.raises(GpuValueError, match=r"nothing written|must be watts"):
        gpu.set_module_power_limit_w(limit_w)
    assert fake.calls_to(SETTER) == 0
    assert module_of(fake).current_mw == 1_350_000


@pytest.mark.parametrize("limit", [True, "900", None])
def test_a_limit_must_be_a_number(limit: Any) -> None:
    fake, (gpu,) = open_fake("GB200")
    with pytest.raises(GpuValueError, match="must be watts"):
        gpu.set_module_power_limit_w(limit)
    assert fake.calls_to(SETTER) == 0


def test_non_root_is_refused_with_nothing_changed() -> None:
    """pynvml drops NO_PERMISSION: the read-back is what says the write did not take."""
    fake, (gpu,) = open_fake("GB200")
    fake.require_root = True
    with pytest.raises(GpuError) as exc:
        gpu.set_module_power_limit_w(900.0)
    assert ROOT_HINT in str(exc.value)
    assert module_of(fake).current_mw == 1_350_000
    assert fake.device(0).limit_mw == 1_200_000
    assert fake.calls_to(SETTER) == 1


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
        pynvml.NVML_ERROR_UNKNOWN,
    ],
)
def test_a_silently_dropped_write_is_caught_by_the_read_back(code: int) -> None:
    fake, (gpu,) = open_fake("GB200")
    fake.inject(SETTER, code)
    with pytest.raises(GpuError) as exc:
        gpu.set_module_power_limit_w(900.0)
    message = str(exc.value)
    assert "900 W not taken" in message and "reads back 1350 W" in message
    assert "drops NVML's return code" in message
    assert "branch" in message and ROOT_HINT in message
    assert module_of(fake).current_mw == 1_350_000


def test_nonsense_range_fields_are_an_error() -> None:
    fake, (gpu,) = open_fake("GB200")
    module_of(fake).min_mw = 2_000_000  # above the max
    with pytest.raises(GpuError, match="nonsense"):
        gpu.module_power_limit_range()


ERROR_CODES = [
    pynvml.NVML_ERROR_GPU_IS_LOST,
    pynvml.NVML_ERROR_UNKNOWN,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_UNINITIALIZED,
]
MODULE_METHODS: list[Callable[[NvmlGpu], Any]] = [
    NvmlGpu.module_power_limit_range,
    NvmlGpu.module_power_limit_w,
    lambda g: g.set_module_power_limit_w(900.0),
    NvmlGpu.restore_module_power_limit,
]


@pytest.mark.parametrize("method", MODULE_METHODS)
@pytest.mark.parametrize("code", ERROR_CODES)
def test_no_raw_nvml_error_escapes(method: Callable[[NvmlGpu], Any], code: int) -> None:
    fake, (gpu,) = open_fake("GB200")
    assert gpu.supports_module_power_limit()
    gpu.set_module_power_limit_w(1000.0)  # something for restore to do
    fake.inject("nvmlDeviceGetFieldValues", code, times=None)
    with pytest.raises(GpuError):
        method(gpu)


# -- the fake's v2 setter: pynvml's signature, the return code dropped ------------------------


def test_fake_v2_setter_returns_success_whatever_the_driver_said() -> None:
    fake, _ = open_fake("GB200", "H100")
    gb200, h100 = (fake.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    fake.require_root = True
    assert fake.nvmlDeviceSetPowerManagementLimit_v2(gb200, MODULE, 900_000) == 0
    fake.require_root = False
    for refused in (
        lambda: fake.nvmlDeviceSetPowerManagementLimit_v2(gb200, MODULE, 399_999),  # range
        lambda: fake.nvmlDeviceSetPowerManagementLimit_v2(h100, MODULE, 600_000),  # no module
        lambda: fake.nvmlDeviceSetPowerManagementLimit_v2(gb200, MODULE, 900_000, version=1),
        lambda: fake.nvmlDeviceSetPowerManagementLimit_v2(gb200, 7, 900_000),  # bad scope
    ):
        assert refused() == pynvml.NVML_SUCCESS
    assert module_of(fake).current_mw == 1_350_000
    assert fake.device(1).module is None and fake.device(1).limit_mw == 700_000
    fake.nvmlDeviceSetPowerManagementLimit_v2(gb200, MODULE, 900_000)
    assert module_of(fake).current_mw == 900_000


def test_fake_v2_setter_at_gpu_scope_sets_the_gpu_limit() -> None:
    fake, _ = open_fake("H100")
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    fake.nvmlDeviceSetPowerManagementLimit_v2(handle, pynvml.NVML_POWER_SCOPE_GPU, 450_000)
    assert fake.device(0).limit_mw == 450_000
    fake.nvmlDeviceSetPowerManagementLimit_v2(handle, pynvml.NVML_POWER_SCOPE_GPU, 900_000)
    assert fake.device(0).limit_mw == 450_000  # out of range: dropped


def test_fake_v2_setter_raises_only_what_pynvml_raises() -> None:
    fake, _ = open_fake("GB200")
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(TypeError):  # c_uint(float), as in pynvml
        fake.nvmlDeviceSetPowerManagementLimit_v2(handle, MODULE, 900.5)  # type: ignore[arg-type]
    fake.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError) as exc:
        fake.nvmlDeviceSetPowerManagementLimit_v2(handle, MODULE, 900_000)
    assert exc.value.value == pynvml.NVML_ERROR_UNINITIALIZED


# -- property --------------------------------------------------------------------------------


@st.composite
def module_ranges(draw: st.DrawFn) -> tuple[int, int, int, int]:
    """A module's (min, max, default, current) limits, in mW."""
    low = draw(st.integers(1, 3_000_000))
    high = draw(st.integers(low, 4_000_000))
    default = draw(st.integers(low, high))
    current = draw(st.integers(low, high))
    return low, high, default, current


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    limits=module_ranges(),
    asks_w=st.lists(st.floats(-100.0, 5000.0, allow_nan=False), min_size=1, max_size=6),
    restore=st.booleans(),
)
def test_after_any_set_the_module_stays_in_range_and_restores(
    limits: tuple[int, int, int, int], asks_w: list[float], restore: bool
) -> None:
    fake = FakeNvml([gpu_model("GB200")])
    module = module_of(fake)
    module.min_mw, module.max_mw, module.default_mw, module.current_mw = limits
    original_mw = module.current_mw
    (gpu,) = open_nvml(fake)
    for ask_w in asks_w:
        writes = fake.calls_to(SETTER)
        if module.min_mw / 1000 <= ask_w <= module.max_mw / 1000:
            assert gpu.set_module_power_limit_w(ask_w) == pytest.approx(ask_w, abs=0.001)
            assert module.current_mw == round(ask_w * 1000)
        else:
            with pytest.raises(GpuValueError):
                gpu.set_module_power_limit_w(ask_w)
            assert fake.calls_to(SETTER) == writes
        assert module.min_mw <= module.current_mw <= module.max_mw
    if restore:
        gpu.restore_defaults()
        assert module.current_mw == original_mw
