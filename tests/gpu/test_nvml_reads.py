"""NvmlGpu reads: opening, identity, power (instant or average), energy, limits, sensors."""

from __future__ import annotations

import logging

import pynvml
import pytest

from powerd.gpu.base import PowerLimitRange, PowerReading
from powerd.gpu.errors import GpuLibraryError, GpuNotFoundError, GpuValueError
from powerd.gpu.models import gpu_model
from powerd.gpu.nvml import NvmlGpu, open_nvml, shutdown_nvml
from tests.support.fakes.fake_pynvml import FakeNvml

LOGGER = "powerd.gpu.nvml"


def open_fake(*keys: str, **kwargs: object) -> tuple[FakeNvml, list[NvmlGpu]]:
    fake = FakeNvml([gpu_model(k) for k in keys], **kwargs)  # type: ignore[arg-type]
    return fake, open_nvml(fake)


def test_open_nvml_opens_every_gpu_with_name_and_uuid() -> None:
    fake, gpus = open_fake("H100", "A100")
    assert fake.initialized
    assert [g.index for g in gpus] == [0, 1]
    assert [g.name for g in gpus] == ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]
    assert [g.uuid for g in gpus] == [fake.device(0).uuid, fake.device(1).uuid]


def test_open_nvml_opens_only_the_given_indices() -> None:
    fake = FakeNvml([gpu_model("H100"), gpu_model("A100"), gpu_model("V100")])
    gpus = open_nvml(fake, indices=[2, 0])
    assert [(g.index, g.name) for g in gpus] == [
        (2, "Tesla V100-PCIE-32GB"),
        (0, "NVIDIA H100 80GB HBM3"),
    ]


def test_names_and_uuids_as_bytes_are_decoded() -> None:
    fake, (gpu,) = open_fake("H100", names_as_bytes=True)
    assert fake.nvmlDeviceGetName(fake.nvmlDeviceGetHandleByIndex(0)) == b"NVIDIA H100 80GB HBM3"
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert isinstance(gpu.uuid, str) and gpu.uuid.startswith("GPU-")


@pytest.mark.parametrize("index", [2, 7, -1])
def test_unknown_index_raises_not_found_naming_index_and_count(index: int) -> None:
    fake = FakeNvml([gpu_model("H100"), gpu_model("H100")])
    with pytest.raises(GpuNotFoundError) as exc:
        open_nvml(fake, indices=[0, index])
    assert f"index {index}" in str(exc.value)
    assert "2 GPU" in str(exc.value)
    assert not fake.initialized  # NVML is shut down again when opening fails


def test_no_gpu_at_all_raises_not_found() -> None:
    fake = FakeNvml([])
    with pytest.raises(GpuNotFoundError, match="no GPU"):
        open_nvml(fake)
    assert not fake.initialized


def test_repeated_indices_are_rejected() -> None:
    fake = FakeNvml([gpu_model("H100"), gpu_model("H100")])
    with pytest.raises(GpuValueError, match="repeat"):
        open_nvml(fake, indices=[1, 1])


def test_shutdown_nvml_shuts_down_and_later_calls_are_library_errors() -> None:
    fake, (gpu,) = open_fake("H100")
    shutdown_nvml(fake)
    assert not fake.initialized
    with pytest.raises(GpuLibraryError, match="driver"):
        gpu.power_w()


def test_instant_power_where_the_model_has_it() -> None:
    fake, (h100,) = open_fake("H100")
    fake.set_demand(0, 612.5)
    assert h100.power_reading() is PowerReading.INSTANT
    assert h100.power_w() == pytest.approx(612.5)
    assert fake.calls_to("nvmlDeviceGetPowerUsage") == 0


def test_average_power_where_the_model_has_no_instant_field() -> None:
    fake, (a100,) = open_fake("A100")
    fake.set_demand(0, 321.0)
    assert a100.power_reading() is PowerReading.AVERAGE_1S
    before = fake.calls_to("nvmlDeviceGetFieldValues")
    assert a100.power_w() == pytest.approx(321.0)
    assert fake.calls_to("nvmlDeviceGetPowerUsage") == 1
    assert fake.calls_to("nvmlDeviceGetFieldValues") == before  # not probed again


@pytest.mark.parametrize(
    "value_type",
    [
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG,
        pynvml.NVML_VALUE_TYPE_DOUBLE,
    ],
)
def test_instant_power_reads_the_union_member_of_its_value_type(value_type: int) -> None:
    fake, (gpu,) = open_fake("H100", power_value_type=value_type)
    fake.set_demand(0, 455.0)
    assert gpu.power_w() == pytest.approx(455.0)


def test_the_power_source_is_logged_once_per_gpu(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _, gpus = open_fake("H100", "A100")
        for gpu in gpus:
            gpu.power_w()
            gpu.power_w()
    messages = [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and "power from" in r.getMessage()
    ]
    assert len(messages) == 2
    assert "GPU 0" in messages[0] and "NVML_FI_DEV_POWER_INSTANT" in messages[0]
    assert "GPU 1" in messages[1] and "nvmlDeviceGetPowerUsage" in messages[1]


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND]
)
def test_field_call_failing_at_open_falls_back_to_average(code: int) -> None:
    fake = FakeNvml([gpu_model("H100")])
    fake.inject("nvmlDeviceGetFieldValues", code)
    (gpu,) = open_nvml(fake)
    fake.set_demand(0, 400.0)
    assert gpu.power_reading() is PowerReading.AVERAGE_1S
    assert gpu.power_w() == pytest.approx(400.0)


def test_per_field_invalid_argument_at_open_falls_back_to_average() -> None:
    fake = FakeNvml([gpu_model("GB200")])
    fake.set_field_return(0, pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_ERROR_INVALID_ARGUMENT)
    (gpu,) = open_nvml(fake)
    assert gpu.power_reading() is PowerReading.AVERAGE_1S


def test_energy_in_joules() -> None:
    fake, (gpu,) = open_fake("H100", start_energy_mj=1_234_567)
    assert gpu.energy_j() == pytest.approx(1234.567)
    fake.set_demand(0, 500.0)
    fake.advance(10.0)
    assert gpu.energy_j() == pytest.approx(1234.567 + 5000.0)


def test_energy_is_none_without_a_counter_and_not_asked_again() -> None:
    fake, (p100,) = open_fake("P100")
    calls = fake.calls_to("nvmlDeviceGetTotalEnergyConsumption")
    assert p100.energy_j() is None
    assert p100.energy_j() is None
    assert fake.calls_to("nvmlDeviceGetTotalEnergyConsumption") == calls


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("H100", PowerLimitRange(200.0, 700.0, 700.0)),
        ("A100", PowerLimitRange(100.0, 400.0, 400.0)),
        ("GB200", PowerLimitRange(200.0, 1200.0, 1200.0)),
    ],
)
def test_limits_in_watts(key: str, expected: PowerLimitRange) -> None:
    _, (gpu,) = open_fake(key)
    assert gpu.power_limit_range() == expected
    assert gpu.power_limit_w() == expected.default_w
    assert gpu.enforced_cap_w() == expected.default_w


def test_sensors() -> None:
    fake, (gpu,) = open_fake("H100")
    fake.set_util(0, 37)
    fake.set_temperature(0, 61)
    assert gpu.util_pct() == 37.0
    assert gpu.temp_c() == 61.0
    assert gpu.sm_clock_mhz() == 345  # idle
    fake.set_demand(0, 650.0)
    assert gpu.sm_clock_mhz() == 1980


def test_sample_carries_every_reading() -> None:
    fake, (_, a100) = open_fake("H100", "A100")
    fake.set_demand(1, 300.0)
    fake.set_util(1, 88)
    fake.set_temperature(1, 55)
    fake.set_external_limit(1, 250_000)
    s = a100.sample()
    assert s.index == 1
    assert s.uuid == fake.device(1).uuid
    assert s.power_w == pytest.approx(250.0)
    assert s.power_reading is PowerReading.AVERAGE_1S
    assert s.energy_j == pytest.approx(0.0)
    assert s.cap_w == pytest.approx(250.0)
    assert s.sm_clock_mhz <= 1410
    assert s.max_sm_clock_mhz is None
    assert (s.util_pct, s.temp_c) == (88.0, 55.0)
