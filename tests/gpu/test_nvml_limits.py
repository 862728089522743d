"""NvmlGpu power limit setters: read-back, validation, out-of-band limiters, defaults."""

from __future__ import annotations

import math

import pytest

from powerd.gpu.errors import GpuPermissionError, GpuValueError
from powerd.gpu.models import gpu_model
from powerd.gpu.nvml import NvmlGpu, open_nvml
from tests.support.fakes.fake_pynvml import FakeNvml

SET = "nvmlDeviceSetPowerManagementLimit"


def open_fake(*keys: str) -> tuple[FakeNvml, list[NvmlGpu]]:
    fake = FakeNvml([gpu_model(k) for k in keys])
    return fake, open_nvml(fake)


@pytest.mark.parametrize("cap_w", [200.0, 437.5, 650, 700.0])
def test_set_cap_reads_back_as_limit_and_enforced(cap_w: float) -> None:
    fake, (gpu,) = open_fake("H100")
    gpu.set_power_limit_w(cap_w)
    assert gpu.power_limit_w() == pytest.approx(cap_w)
    assert gpu.enforced_cap_w() == pytest.approx(cap_w)
    assert fake.device(0).limit_mw == round(cap_w * 1000)  # NVML got integer mW


def test_cap_on_one_gpu_leaves_the_other_alone() -> None:
    fake, (h100, a100) = open_fake("H100", "A100")
    a100.set_power_limit_w(250.0)
    assert a100.enforced_cap_w() == 250.0
    assert h100.enforced_cap_w() == 700.0
    assert (fake.device(0).limit_mw, fake.device(1).limit_mw) == (700_000, 250_000)


def test_out_of_band_limiter_makes_enforced_lower_than_set() -> None:
    fake, (gpu,) = open_fake("H100")
    gpu.set_power_limit_w(500.0)
    fake.set_external_limit(0, 350_000)
    assert gpu.power_limit_w() == 500.0
    assert gpu.enforced_cap_w() == 350.0


def test_draw_is_held_under_the_cap() -> None:
    fake, (gpu,) = open_fake("H100")
    fake.set_demand(0, 680.0)
    assert gpu.power_w() == pytest.approx(680.0)
    gpu.set_power_limit_w(300.0)
    assert gpu.power_w() == pytest.approx(300.0)


@pytest.mark.parametrize("cap_w", [199.999, 0.0, -5.0, 700.5, 1200.0, math.nan, math.inf])
def test_out_of_range_cap_raises_value_error_and_changes_nothing(cap_w: float) -> None:
    fake, (gpu,) = open_fake("H100")
    gpu.set_power_limit_w(450.0)
    with pytest.raises(GpuValueError) as exc:
        gpu.set_power_limit_w(cap_w)
    message = str(exc.value)
    assert "GPU 0" in message and "200-700 W" in message
    assert fake.calls_to(SET) == 1  # only the valid set above reached NVML
    assert gpu.power_limit_w() == 450.0


@pytest.mark.parametrize("cap_w", ["450", None, True])
def test_non_numeric_cap_raises_value_error(cap_w: object) -> None:
    fake, (gpu,) = open_fake("H100")
    with pytest.raises(GpuValueError, match="number of watts"):
        gpu.set_power_limit_w(cap_w)  # type: ignore[arg-type]
    assert fake.calls_to(SET) == 0


def test_set_without_root_is_a_permission_error_and_changes_nothing() -> None:
    fake, (gpu,) = open_fake("H100")
    fake.require_root = True
    with pytest.raises(GpuPermissionError) as exc:
        gpu.set_power_limit_w(400.0)
    assert SET in str(exc.value)
    assert "run the agent as root (or grant CAP_SYS_ADMIN)" in str(exc.value)
    assert gpu.power_limit_w() == 700.0


def test_restore_defaults_puts_default_limit_back_and_unlocks() -> None:
    fake, (gpu,) = open_fake("A100")
    gpu.set_power_limit_w(150.0)
    gpu.lock_max_sm_clock_mhz(900)
    assert fake.device(0).locked_clocks_mhz is not None
    gpu.restore_defaults()
    assert gpu.power_limit_w() == 400.0
    assert gpu.enforced_cap_w() == 400.0
    assert gpu.locked_max_sm_clock_mhz() is None
    assert fake.device(0).locked_clocks_mhz is None


H200_ENFORCE_DELAY_S = 0.092  # the longest seen on an H200, driver 580 (docs/HARDWARE.md)


def test_a_new_limit_is_enforced_only_after_the_devices_delay_and_energy_follows() -> None:
    """As on a real H200: the limit set reads back at once, the enforced one ~0.1 s later,
    and the draw follows the enforced one."""
    fake = FakeNvml([gpu_model("H200")], enforce_delay_s=H200_ENFORCE_DELAY_S)
    (gpu,) = open_nvml(fake)
    fake.set_demand(0, 680.0)
    gpu.set_power_limit_w(300.0)
    assert (gpu.power_limit_w(), gpu.enforced_cap_w(), gpu.power_w()) == (300.0, 700.0, 680.0)
    before_j = gpu.energy_j()
    fake.advance(0.2)  # 0.092 s more at 680 W, then 0.108 s at 300 W
    assert (gpu.enforced_cap_w(), gpu.power_w()) == (300.0, 300.0)
    after_j = gpu.energy_j()
    assert before_j is not None and after_j is not None
    assert after_j - before_j == pytest.approx(0.092 * 680 + 0.108 * 300)


def test_a_sample_shows_the_limit_enforced_and_a_draw_within_it_while_a_new_one_waits() -> None:
    """Telemetry's cap is what holds the GPU as it draws: the old limit for a moment after
    a cut, so that the sample's power is never over its own cap (the controller doubts a
    node whose GPUs draw over their caps)."""
    fake = FakeNvml([gpu_model("H200")], enforce_delay_s=H200_ENFORCE_DELAY_S)
    (gpu,) = open_nvml(fake)
    fake.set_demand(0, 680.0)
    gpu.set_power_limit_w(450.0)
    sample = gpu.sample()
    assert (gpu.power_limit_w(), sample.cap_w, sample.power_w) == (450.0, 700.0, 680.0)
    fake.advance(0.1)
    sample = gpu.sample()
    assert (sample.cap_w, sample.power_w) == (450.0, 450.0)
