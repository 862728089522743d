"""The H200's description is what NVML reported on a real one (bench/results/nvml_h200.json,
``python -m bench.bench_nvml`` on 2026-11-25, docs/HARDWARE.md), so the simulated and fake
H200s answer as it did."""

from __future__ import annotations

import json

import pytest

from powerd.gpu.errors import GpuNotSupportedError
from powerd.gpu.models import gpu_model
from powerd.gpu.nvml import open_nvml, shutdown_nvml
from tests.support.fakes.fake_pynvml import FakeNvml
from tests.support.paths import REPO

SEEN = json.loads((REPO / "bench" / "results" / "nvml_h200.json").read_text())["inventory"]


def test_the_h200_model_is_what_the_real_h200_reported():
    seen = SEEN
    model = gpu_model("h200")
    assert model.name == seen["name"] == "NVIDIA H200"
    limits = seen["power_limit_range_w"]
    assert (model.cap_min_w, model.cap_max_w, model.cap_default_w) == (
        limits["min"],
        limits["max"],
        limits["default"],
    )
    clocks = seen["sm_clock_range_mhz"]
    assert (model.sm_clock_min_mhz, model.sm_clock_max_mhz) == (
        clocks["min_mhz"],
        clocks["max_mhz"],
    )
    assert model.has_instant_power == (seen["power_reading"] == "instant")
    assert model.has_power_smoothing is seen["supports_smoothing"]["value"] is False
    assert abs(model.idle_power_w - seen["power_w"]) < 5  # cold idle, 79.9 W that run


def test_a_fake_h200_answers_as_the_real_one_did():
    fake = FakeNvml([gpu_model("H200")])
    (gpu,) = open_nvml(fake)
    try:
        assert gpu.name == SEEN["name"]
        assert gpu.supports_smoothing() is False
        with pytest.raises(GpuNotSupportedError) as refused:
            gpu.smoothing_range()
        assert f"GpuNotSupportedError: {refused.value}" == SEEN["smoothing_range"]["error"]
    finally:
        shutdown_nvml(fake)
