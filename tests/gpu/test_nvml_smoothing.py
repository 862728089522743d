"""NvmlGpu hardware power smoothing against the fake pynvml: set, read back, restore, refuse."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any

import pynvml
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerd.gpu import nvml as nvml_backend
from powerd.gpu.base import SMOOTHING_MAX_PRESETS, SmoothingProfile, SmoothingRange
from powerd.gpu.errors import (
    GpuError,
    GpuNotSupportedError,
    GpuPermissionError,
    GpuValueError,
)
from powerd.gpu.models import gpu_model
from powerd.gpu.nvml import NvmlGpu, open_nvml
from powerd.gpu.simulated import SMOOTHING_FLOOR_MAX_PERCENT, default_smoothing_preset
from tests.support.fakes.fake_pynvml import FakeNvml

ROOT_HINT = "run the agent as root (or grant CAP_SYS_ADMIN)"
SMOOTHING_SETTERS = (
    "nvmlDevicePowerSmoothingUpdatePresetProfileParam",
    "nvmlDevicePowerSmoothingActivatePresetProfile",
    "nvmlDevicePowerSmoothingSetState",
)
DEFAULT = default_smoothing_preset(0)
DEFAULT_PARAMS = [
    DEFAULT.floor_percent,
    DEFAULT.ramp_up_w_per_s,
    DEFAULT.ramp_down_w_per_s,
    DEFAULT.ramp_down_hysteresis_ms,
]


def open_fake(*keys: str) -> tuple[FakeNvml, list[NvmlGpu]]:
    fake = FakeNvml([gpu_model(k) for k in keys])
    return fake, open_nvml(fake)


def profile(**changes: Any) -> SmoothingProfile:
    values: dict[str, Any] = {
        "preset": 2,
        "enabled": True,
        "floor_percent": 40.0,
        "ramp_up_w_per_s": 250.5,
        "ramp_down_w_per_s": 100.0,
        "ramp_down_hysteresis_ms": 1500.0,
    }
    return SmoothingProfile(**(values | changes))


def setter_calls(fake: FakeNvml) -> int:
    return sum(fake.calls_to(call) for call in SMOOTHING_SETTERS)


def read_field(fake: FakeNvml, index: int, field_id: int, scope: int = 0) -> Any:
    handle = fake.nvmlDeviceGetHandleByIndex(index)
    (value,) = fake.nvmlDeviceGetFieldValues(handle, [(field_id, scope)])
    assert value.nvmlReturn == pynvml.NVML_SUCCESS
    return value


# -- support ---------------------------------------------------------------------------------


def test_gb200_supports_smoothing_and_hopper_ampere_do_not() -> None:
    _, (gb200, h100, a100) = open_fake("GB200", "H100", "A100")
    assert gb200.supports_smoothing()
    assert not h100.supports_smoothing()
    assert not a100.supports_smoothing()
    assert h100.smoothing() is None
    assert gb200.smoothing() == DEFAULT


def test_support_is_asked_once() -> None:
    fake, (gpu,) = open_fake("H100")
    before = fake.calls_to("nvmlDeviceGetFieldValues")
    for _ in range(3):
        assert not gpu.supports_smoothing()
    assert fake.calls_to("nvmlDeviceGetFieldValues") == before + 1


def test_range_comes_from_the_device_fields() -> None:
    fake, (gpu,) = open_fake("GB200")
    fake.device(0).smoothing_floor_range = (10.0, 75.0)
    del fake.device(0).smoothing_presets[3:]
    assert gpu.smoothing_range() == SmoothingRange(10.0, 75.0, 3)


# -- set and read back -----------------------------------------------------------------------


def test_set_writes_nvml_units_and_reads_back() -> None:
    fake, (gpu,) = open_fake("GB200")
    wanted = profile()
    applied = gpu.set_smoothing(wanted)
    assert applied == wanted
    assert gpu.smoothing() == wanted
    dev = fake.device(0)
    assert (dev.smoothing_enabled, dev.smoothing_active) == (True, 2)
    assert dev.smoothing_presets[2] == [40.0, 250.5, 100.0, 1500.0]  # W/s and ms as written
    assert dev.smoothing_presets[0] == DEFAULT_PARAMS  # other presets untouched
    # NVML reads the ramp rates back in mW/s: powerd converted them.
    up = read_field(fake, 0, pynvml.NVML_FI_PWR_SMOOTHING_PROFILE_RAMP_UP_RATE, 2)
    assert up.value.uiVal == 250_500
    assert fake.calls_to("nvmlDevicePowerSmoothingUpdatePresetProfileParam") == 4
    assert fake.calls_to("nvmlDevicePowerSmoothingActivatePresetProfile") == 1
    assert fake.calls_to("nvmlDevicePowerSmoothingSetState") == 1


def test_reading_another_preset_leaves_the_active_one() -> None:
    _, (gpu,) = open_fake("GB200")
    gpu.set_smoothing(profile(preset=1, floor_percent=30.0))
    assert gpu.smoothing(0) == dataclasses.replace(DEFAULT, enabled=True)  # the switch is global
    assert gpu.smoothing(1) == profile(preset=1, floor_percent=30.0)
    assert gpu.smoothing() == profile(preset=1, floor_percent=30.0)
    with pytest.raises(GpuValueError, match="preset"):
        gpu.smoothing(SMOOTHING_MAX_PRESETS)


def test_disable_keeps_the_values_and_turns_the_switch_off() -> None:
    fake, (gpu,) = open_fake("GB200")
    gpu.set_smoothing(profile())
    off = gpu.set_smoothing(profile(enabled=False))
    assert not off.enabled and off.floor_percent == 40.0
    assert not fake.device(0).smoothing_enabled


def test_floor_follows_the_cap_and_never_exceeds_it() -> None:
    fake, (gpu,) = open_fake("GB200")
    fake.set_demand(0, 200.0)  # a job in a communication phase
    gpu.set_smoothing(profile(floor_percent=40.0))
    assert gpu.power_w() == pytest.approx(480.0)  # 40 % of the 1200 W ceiling
    gpu.set_power_limit_w(400.0)
    assert gpu.power_w() == pytest.approx(200.0)  # 40 % of 400 W is below the demand
    fake.set_demand(0, 150.0)  # above idle: still a job
    assert gpu.power_w() == pytest.approx(160.0)
    ceiling = read_field(fake, 0, pynvml.NVML_FI_PWR_SMOOTHING_APPLIED_TMP_CEIL).value.dVal
    floor = read_field(fake, 0, pynvml.NVML_FI_PWR_SMOOTHING_APPLIED_TMP_FLOOR).value.dVal
    assert (ceiling, floor) == (pytest.approx(400.0), pytest.approx(160.0))
    fake.set_demand(0, gpu_model("GB200").idle_power_w)  # no job: no floor
    assert gpu.power_w() == pytest.approx(gpu_model("GB200").idle_power_w)


def test_a_device_that_ignores_the_switch_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, (gpu,) = open_fake("GB200")
    monkeypatch.setattr(fake, "nvmlDevicePowerSmoothingSetState", lambda handle, state: None)
    with pytest.raises(GpuError, match="reads back"):
        gpu.set_smoothing(profile())


def test_a_read_back_that_differs_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake, (gpu,) = open_fake("GB200")
    real = fake.nvmlDevicePowerSmoothingUpdatePresetProfileParam

    def whole_percent(handle: Any, ref: Any) -> None:  # a device that rounds the floor
        ref._obj.value = round(ref._obj.value) if ref._obj.paramId == 0 else ref._obj.value
        real(handle, ref)

    monkeypatch.setattr(fake, "nvmlDevicePowerSmoothingUpdatePresetProfileParam", whole_percent)
    with caplog.at_level(logging.WARNING, logger="powerd.gpu"):
        applied = gpu.set_smoothing(profile(floor_percent=40.4))
    assert applied.floor_percent == 40.0
    assert "reads back" in caplog.text


# -- refused before NVML is called -----------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"floor_percent": SMOOTHING_FLOOR_MAX_PERCENT + 0.5},  # within 0-100, above the device's
        {"preset": 3},  # this device has three presets
    ],
)
def test_out_of_device_range_is_refused_before_nvml(changes: dict[str, Any]) -> None:
    fake, (gpu,) = open_fake("GB200")
    del fake.device(0).smoothing_presets[3:]
    with pytest.raises(GpuValueError, match="nothing written") as exc:
        gpu.set_smoothing(profile(**changes))
    assert "GPU 0 (NVIDIA GB200)" in str(exc.value)
    assert setter_calls(fake) == 0
    assert gpu.smoothing() == DEFAULT


@pytest.mark.parametrize(
    "changes",
    [
        {"floor_percent": 100.5},
        {"floor_percent": -1.0},
        {"floor_percent": math.nan},
        {"ramp_up_w_per_s": -0.1},
        {"ramp_down_w_per_s": math.inf},
        {"ramp_down_w_per_s": 5e6},  # more mW/s than NVML's 32-bit field holds
        {"ramp_down_hysteresis_ms": -5.0},
        {"preset": SMOOTHING_MAX_PRESETS},
        {"preset": True},
        {"preset": 1.0},
        {"enabled": 1},
        {"floor_percent": "40"},
    ],
)
def test_invalid_profiles_cannot_be_built(changes: dict[str, Any]) -> None:
    with pytest.raises(GpuValueError, match="invalid smoothing profile"):
        profile(**changes)


def test_set_takes_only_a_profile() -> None:
    fake, (gpu,) = open_fake("GB200")
    with pytest.raises(GpuValueError, match="SmoothingProfile"):
        gpu.set_smoothing({"floor_percent": 40})  # type: ignore[arg-type]
    assert setter_calls(fake) == 0


def test_clamped_floor_is_accepted() -> None:
    _, (gpu,) = open_fake("GB200")
    clamped = gpu.smoothing_range().clamp(profile(floor_percent=99.0))
    assert clamped.floor_percent == SMOOTHING_FLOOR_MAX_PERCENT
    assert gpu.set_smoothing(clamped).floor_percent == SMOOTHING_FLOOR_MAX_PERCENT


def test_nvml_refusing_a_value_is_a_value_error() -> None:
    fake, (gpu,) = open_fake("GB200")
    fake.inject(
        "nvmlDevicePowerSmoothingUpdatePresetProfileParam", pynvml.NVML_ERROR_INVALID_ARGUMENT
    )
    with pytest.raises(GpuValueError, match="nvmlDevicePowerSmoothingUpdatePresetProfileParam"):
        gpu.set_smoothing(profile())


# -- unsupported, no permission --------------------------------------------------------------


@pytest.mark.parametrize("key", ["H100", "A100"])
def test_pre_blackwell_gpu_refuses_cleanly(key: str) -> None:
    fake, (gpu,) = open_fake(key)
    with pytest.raises(GpuNotSupportedError) as exc:
        gpu.set_smoothing(profile())
    message = str(exc.value)
    assert "GPU 0" in message and "Blackwell" in message and "R570" in message
    with pytest.raises(GpuNotSupportedError, match="Blackwell"):
        gpu.smoothing_range()
    assert setter_calls(fake) == 0
    gpu.restore_defaults()  # nothing to put back: no smoothing call
    assert setter_calls(fake) == 0


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND]
)
def test_driver_without_the_call_says_what_is_needed(code: int) -> None:
    fake, (gpu,) = open_fake("GB200")
    fake.inject("nvmlDevicePowerSmoothingSetState", code)
    with pytest.raises(GpuNotSupportedError) as exc:
        gpu.set_smoothing(profile())
    message = str(exc.value)
    assert "nvmlDevicePowerSmoothingSetState" in message
    assert "Blackwell" in message and "R570" in message


def test_not_supported_field_names_the_feature() -> None:
    fake, (gpu,) = open_fake("GB200")
    fake.set_field_return(
        0, pynvml.NVML_FI_PWR_SMOOTHING_PROFILE_RAMP_UP_RATE, pynvml.NVML_ERROR_NOT_SUPPORTED
    )
    with pytest.raises(GpuNotSupportedError) as exc:
        gpu.smoothing()
    assert "NVML_FI_PWR_SMOOTHING_PROFILE_RAMP_UP_RATE, preset 0" in str(exc.value)
    assert "R570" in str(exc.value)


def test_old_nvidia_ml_py_is_reported_as_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_backend, "_HAS_SMOOTHING_BINDINGS", False)
    fake, (gpu,) = open_fake("GB200")
    assert not gpu.supports_smoothing()
    assert gpu.smoothing() is None
    with pytest.raises(GpuNotSupportedError, match=r"nvidia-ml-py 12\.570"):
        gpu.set_smoothing(profile())
    assert setter_calls(fake) == 0


def test_non_root_is_a_permission_error_and_changes_nothing() -> None:
    fake, (gpu,) = open_fake("GB200")
    fake.require_root = True
    with pytest.raises(GpuPermissionError) as exc:
        gpu.set_smoothing(profile())
    assert ROOT_HINT in str(exc.value)
    assert "nvmlDevicePowerSmoothingUpdatePresetProfileParam" in str(exc.value)
    assert gpu.smoothing() == DEFAULT  # reads still work
    assert fake.device(0).smoothing_presets[2] == DEFAULT_PARAMS
    calls = setter_calls(fake)
    with pytest.raises(GpuPermissionError):  # the cap cannot be put back either
        gpu.restore_defaults()
    assert setter_calls(fake) == calls  # but nothing changed, so no smoothing write is tried


def test_struct_version_mismatch_asks_for_matching_bindings() -> None:
    fake, (gpu,) = open_fake("GB200")
    fake.inject("nvmlDevicePowerSmoothingActivatePresetProfile", 25)  # ARGUMENT_VERSION_MISMATCH
    with pytest.raises(GpuError, match="nvidia-ml-py release that matches the driver"):
        gpu.set_smoothing(profile())


@pytest.mark.parametrize(
    ("mangle", "fragment"),
    [
        (lambda dev: setattr(dev, "smoothing_active", 9), "active preset 9"),
        (lambda dev: setattr(dev, "smoothing_floor_range", (50.0, 10.0)), "floor setting"),
    ],
)
def test_nonsense_fields_point_at_a_field_id_mismatch(
    mangle: Callable[[Any], None], fragment: str
) -> None:
    fake, (gpu,) = open_fake("GB200")
    mangle(fake.device(0))
    with pytest.raises(GpuError, match="field ids differ between NVML headers") as exc:
        gpu.smoothing() if "active" in fragment else gpu.smoothing_range()
    assert fragment in str(exc.value)


# -- save and restore ------------------------------------------------------------------------


def test_restore_defaults_puts_back_every_preset_written_and_the_switch() -> None:
    fake, (gpu,) = open_fake("GB200")
    dev = fake.device(0)
    # The operator left preset 1 active, on, with a 20 % floor before the agent started.
    dev.smoothing_presets[1] = [20.0, 500.0, 400.0, 250.0]
    dev.smoothing_active, dev.smoothing_enabled = 1, True
    before = [list(p) for p in dev.smoothing_presets]
    gpu.set_power_limit_w(900.0)
    gpu.set_smoothing(profile(preset=1, floor_percent=60.0))
    gpu.set_smoothing(profile(preset=3, enabled=False))
    gpu.restore_defaults()
    assert dev.smoothing_presets == before
    assert (dev.smoothing_active, dev.smoothing_enabled) == (1, True)
    assert gpu.power_limit_w() == 1200.0
    calls = setter_calls(fake)
    gpu.restore_defaults()  # restored once: nothing left to put back
    assert setter_calls(fake) == calls


def test_restore_smoothing_without_a_change_calls_nothing() -> None:
    fake, (gpu,) = open_fake("GB200")
    gpu.restore_smoothing()
    gpu.restore_defaults()
    assert setter_calls(fake) == 0


def test_restore_attempts_everything_and_raises_the_first_failure() -> None:
    fake, (gpu,) = open_fake("GB200")
    gpu.set_power_limit_w(800.0)
    gpu.set_smoothing(profile())
    fake.inject("nvmlDevicePowerSmoothingSetState", pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(GpuPermissionError, match="nvmlDevicePowerSmoothingSetState"):
        gpu.restore_defaults()
    assert gpu.power_limit_w() == 1200.0  # the cap was still put back
    gpu.restore_defaults()  # the saved state survives a failed restore: try again
    assert not fake.device(0).smoothing_enabled
    assert fake.device(0).smoothing_presets[2] == DEFAULT_PARAMS


# -- the fake models the calls' constraints --------------------------------------------------


def test_fake_wants_a_reference_and_checks_the_version() -> None:
    fake = FakeNvml([gpu_model("GB200")])
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    state = pynvml.c_nvmlPowerSmoothingState_v1_t()
    state.state = 1
    with pytest.raises(TypeError, match="byref"):
        fake.nvmlDevicePowerSmoothingSetState(handle, state)  # by value: C would get garbage
    fake.nvmlDevicePowerSmoothingSetState(handle, ctypes.pointer(state))
    assert fake.device(0).smoothing_enabled
    state.version = 0x2000008
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        fake.nvmlDevicePowerSmoothingSetState(handle, ctypes.byref(state))
    state.version, state.state = pynvml.nvmlPowerSmoothingState_v1, 2
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDevicePowerSmoothingSetState(handle, ctypes.byref(state))
    chosen = pynvml.c_nvmlPowerSmoothingProfile_v1_t()
    chosen.profileId = SMOOTHING_MAX_PRESETS
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDevicePowerSmoothingActivatePresetProfile(handle, ctypes.byref(chosen))
    assert fake.device(0).smoothing_active == 0


@pytest.mark.parametrize(
    ("param", "value"),
    [(0, 95.0), (0, -1.0), (1, -5.0), (2, math.nan), (3, -1.0), (4, 10.0), (7, 1.0)],
)
def test_fake_refuses_bad_parameters_and_changes_nothing(param: int, value: float) -> None:
    fake = FakeNvml([gpu_model("GB200")])
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    struct = pynvml.c_nvmlPowerSmoothingProfile_v1_t()
    struct.profileId, struct.paramId, struct.value = 0, param, value
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDevicePowerSmoothingUpdatePresetProfileParam(handle, ctypes.byref(struct))
    assert fake.device(0).smoothing_presets[0] == DEFAULT_PARAMS


def test_fake_without_smoothing_says_not_supported() -> None:
    fake = FakeNvml([gpu_model("H100")])
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    struct = pynvml.c_nvmlPowerSmoothingProfile_v1_t()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDevicePowerSmoothingActivatePresetProfile(handle, ctypes.byref(struct))
    (field,) = fake.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_PWR_SMOOTHING_ENABLED])
    assert field.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


# -- no raw NVMLError escapes ----------------------------------------------------------------

SMOOTHING_METHODS: list[tuple[str, Callable[[NvmlGpu], Any]]] = [
    ("supports_smoothing", lambda g: g.supports_smoothing()),
    ("smoothing_range", lambda g: g.smoothing_range()),
    ("smoothing", lambda g: g.smoothing()),
    ("set_smoothing", lambda g: g.set_smoothing(profile())),
    ("restore_smoothing", lambda g: g.restore_smoothing()),
]


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_UNKNOWN,
        25,  # ARGUMENT_VERSION_MISMATCH
    ],
)
@pytest.mark.parametrize("key", ["GB200", "H100"])
@pytest.mark.parametrize(
    "method", [call for _, call in SMOOTHING_METHODS], ids=[n for n, _ in SMOOTHING_METHODS]
)
def test_no_raw_nvml_error_escapes(method: Callable[[NvmlGpu], Any], key: str, code: int) -> None:
    fake, (gpu,) = open_fake(key)
    if key == "GB200":
        gpu.set_smoothing(profile(preset=1))  # something to restore
    for call in sorted(n for n in dir(FakeNvml) if n.startswith("nvmlDevice")):
        fake.inject(call, code, times=None, device=0)
    try:
        method(gpu)
    except GpuError as exc:
        assert not isinstance(exc, pynvml.NVMLError)


# -- properties ------------------------------------------------------------------------------

profiles = st.builds(
    SmoothingProfile,
    preset=st.integers(0, SMOOTHING_MAX_PRESETS - 1),
    enabled=st.booleans(),
    floor_percent=st.floats(0.0, 100.0),
    ramp_up_w_per_s=st.floats(0.0, 1e5),
    ramp_down_w_per_s=st.floats(0.0, 1e5),
    ramp_down_hysteresis_ms=st.floats(0.0, 1e6),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    presets=st.integers(1, SMOOTHING_MAX_PRESETS),
    floor_range=st.tuples(st.floats(0.0, 50.0), st.floats(50.0, 100.0)),
    steps=st.lists(st.tuples(profiles, st.floats(200.0, 1200.0)), min_size=1, max_size=6),
    demand_w=st.floats(0.0, 1500.0),
)
def test_after_any_set_the_device_stays_in_range_and_floors_under_caps(
    presets: int,
    floor_range: tuple[float, float],
    steps: list[tuple[SmoothingProfile, float]],
    demand_w: float,
) -> None:
    fake, (gpu,) = open_fake("GB200")
    dev = fake.device(0)
    del dev.smoothing_presets[presets:]
    dev.smoothing_floor_range = floor_range
    for params in dev.smoothing_presets:  # a device starts within its own range
        params[0] = floor_range[0]
    fake.set_demand(0, demand_w)
    device_range = gpu.smoothing_range()
    for wanted, cap_w in steps:
        gpu.set_power_limit_w(cap_w)
        before, calls = gpu.smoothing(), setter_calls(fake)
        if device_range.contains(wanted):
            assert gpu.set_smoothing(wanted).close_to(wanted)
        else:
            with pytest.raises(GpuValueError):
                gpu.set_smoothing(wanted)
            assert setter_calls(fake) == calls  # refused before NVML
            assert gpu.smoothing() == before
        now = gpu.smoothing()
        assert now is not None and device_range.contains(now)
        ceiling = read_field(fake, 0, pynvml.NVML_FI_PWR_SMOOTHING_APPLIED_TMP_CEIL).value.dVal
        floor = read_field(fake, 0, pynvml.NVML_FI_PWR_SMOOTHING_APPLIED_TMP_FLOOR).value.dVal
        assert 0.0 <= floor <= ceiling == pytest.approx(gpu.enforced_cap_w())
        assert gpu.power_w() <= gpu.enforced_cap_w() + 1e-3
