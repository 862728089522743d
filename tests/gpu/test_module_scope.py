"""ModuleScopeCap: a GPU's cap applied as its module-scope power limit (GB200), on the fake
pynvml; with_module_scope leaves GPUs without one on their GPU limit and says why."""

from __future__ import annotations

import logging

import pynvml
import pytest

from powerd.gpu.base import PowerLimitRange
from powerd.gpu.errors import GpuError, GpuNotSupportedError, GpuValueError
from powerd.gpu.models import gpu_model
from powerd.gpu.module_scope import ModuleScopeCap, with_module_scope
from powerd.gpu.nvml import open_nvml
from tests.gpu.test_nvml_module_limit import module_of, open_fake
from tests.support.fakes.fake_pynvml import FakeNvml

SETTER = "nvmlDeviceSetPowerManagementLimit_v2"
# The fake GB200 (illustrative figures): GPU 200-1200 W, default 1200 W; module
# 400-1350 W, default 1350 W; the rest of the module's allowance is 150 W.
ALLOWANCE_W = 150.0


def test_the_cap_becomes_the_module_limit_plus_the_rest_of_the_module() -> None:
    fake, (gpu,) = open_fake("GB200")
    capped = ModuleScopeCap(gpu)
    assert capped.allowance_w == ALLOWANCE_W
    capped.set_power_limit_w(700.0)
    assert module_of(fake).current_mw == 850_000
    assert fake.device(0).limit_mw == 1_200_000  # the GPU's own limit left at its default
    assert capped.power_limit_w() == 700.0
    assert capped.enforced_cap_w() == 700.0


def test_the_range_is_the_caps_the_module_limit_can_enforce() -> None:
    fake, (gpu,) = open_fake("GB200")
    capped = ModuleScopeCap(gpu)
    # module 400 W less 150 W is 250 W, above the GPU's 200 W floor
    assert capped.power_limit_range() == PowerLimitRange(250.0, 1200.0, 1200.0)
    module_of(fake).max_mw = 1_000_000
    assert capped.power_limit_range().max_w == 850.0


def test_a_gpu_limit_left_lowered_is_put_back_at_its_default() -> None:
    fake, (gpu,) = open_fake("GB200")
    gpu.set_power_limit_w(500.0)  # left by an agent that ran with power_limit_scope = "gpu"
    capped = ModuleScopeCap(gpu)
    assert capped.enforced_cap_w() == 500.0  # the lower of the two, as read back
    capped.set_power_limit_w(900.0)
    assert (module_of(fake).current_mw, fake.device(0).limit_mw) == (1_050_000, 1_200_000)
    assert capped.enforced_cap_w() == 900.0


def test_an_unchanged_cap_writes_nothing() -> None:
    fake, (gpu,) = open_fake("GB200")
    capped = ModuleScopeCap(gpu)
    capped.set_power_limit_w(700.0)
    calls = (fake.calls_to(SETTER), fake.calls_to("nvmlDeviceSetPowerManagementLimit"))
    capped.set_power_limit_w(700.0)
    assert (fake.calls_to(SETTER), fake.calls_to("nvmlDeviceSetPowerManagementLimit")) == calls


@pytest.mark.parametrize("cap_w", [249.0, 1201.0, float("nan")])
def test_a_cap_outside_the_range_is_refused_before_writing(cap_w: float) -> None:
    fake, (gpu,) = open_fake("GB200")
    capped = ModuleScopeCap(gpu)
    with pytest.raises(GpuValueError, match=r"clamp with PowerLimitRange\.clamp"):
        capped.set_power_limit_w(cap_w)
    assert fake.calls_to(SETTER) == 0
    assert module_of(fake).current_mw == 1_350_000


def test_a_module_limit_not_taken_holds_the_cap_on_the_gpu_limit() -> None:
    fake, (gpu,) = open_fake("GB200")
    capped = ModuleScopeCap(gpu)
    fake.inject(SETTER, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)  # dropped by pynvml
    with pytest.raises(GpuError) as exc:
        capped.set_power_limit_w(700.0)
    assert "850 W not taken" in str(exc.value)
    assert "held by the GPU power limit instead" in str(exc.value)
    assert fake.device(0).limit_mw == 700_000
    assert capped.enforced_cap_w() == 700.0  # the cap holds all the same
    capped.set_power_limit_w(700.0)  # the module takes it next time: the GPU limit goes back
    assert (module_of(fake).current_mw, fake.device(0).limit_mw) == (850_000, 1_200_000)


def test_restore_puts_back_the_module_limit_and_the_gpu_default() -> None:
    fake, (gpu,) = open_fake("GB200")
    module_of(fake).current_mw = 1_300_000  # an operator's, before the agent
    capped = ModuleScopeCap(gpu)
    capped.set_power_limit_w(600.0)
    gpu.lock_max_sm_clock_mhz(1500)
    capped.restore_defaults()
    assert module_of(fake).current_mw == 1_300_000
    assert fake.device(0).limit_mw == 1_200_000
    assert fake.device(0).locked_clocks_mhz is None


def test_smoothing_and_readings_are_the_gpus_own() -> None:
    fake, (gpu,) = open_fake("GB200")
    capped = ModuleScopeCap(gpu)
    fake.set_demand(0, 800.0)
    assert capped.supports_smoothing() and capped.smoothing() == gpu.smoothing()
    assert capped.power_w() == gpu.power_w() == 800.0
    assert capped.sample().cap_w == 1200.0


def test_a_gpu_without_module_scope_cannot_be_wrapped() -> None:
    _, (gpu,) = open_fake("H100")
    with pytest.raises(GpuNotSupportedError, match="module-scope power limit"):
        ModuleScopeCap(gpu)


def test_ranges_that_leave_no_cap_are_refused() -> None:
    """Only a device reporting a default outside its own range gets here."""
    fake, (gpu,) = open_fake("GB200")
    module_of(fake).default_mw = 100_000  # below the module's 400 W minimum
    with pytest.raises(GpuError, match="leave no cap"):
        ModuleScopeCap(gpu)


def test_with_module_scope_wraps_those_that_have_it_and_says_why_not_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, gpus = open_fake("GB200", "H100", "GB200")
    with caplog.at_level(logging.INFO, logger="powerd.gpu"):
        wrapped = with_module_scope(gpus)
    assert [type(g).__name__ for g in wrapped] == ["ModuleScopeCap", "NvmlGpu", "ModuleScopeCap"]
    assert wrapped[1] is gpus[1]
    why = [r for r in caplog.records if "stay on the GPU power limit" in r.getMessage()]
    assert len(why) == 1
    assert why[0].levelno == logging.WARNING
    assert "gpu 1" in why[0].getMessage() and "GB200" in why[0].getMessage()


def test_software_smoothing_on_a_module_limit_restores_the_module_limit_it_found() -> None:
    """Both wrappers on one GPU (a module limit, no hardware smoothing): restore puts the
    module limit back as it was found, not at its default, and the software profile too."""
    from powerd.gpu.base import SmoothingProfile
    from powerd.gpu.software_smoothing import SoftwareSmoothing

    fake = FakeNvml([gpu_model("GB200")])
    fake.device(0).smoothing_presets = []  # this one has no hardware smoothing
    module_of(fake).current_mw = 1_000_000  # found below its 1,350 W default
    (gpu,) = open_nvml(fake)
    wrapped = SoftwareSmoothing(ModuleScopeCap(gpu))
    wrapped.set_power_limit_w(700.0)
    wrapped.set_smoothing(SmoothingProfile(1, True, 50.0, 100.0, 100.0, 1000.0))
    assert module_of(fake).current_mw == 850_000
    wrapped.restore_defaults()
    assert module_of(fake).current_mw == 1_000_000
    profile = wrapped.smoothing()
    assert profile is not None and (profile.preset, profile.enabled) == (0, False)
