"""The H200's and the H100's descriptions are what NVML reported on real ones
(bench/results/nvml_h200.json and nvml_h100_1.json, ``python -m bench.bench_nvml`` on
2026-11-25 and 2026-11-26, docs/HARDWARE.md), so the simulated and fake GPUs answer as
they did."""

from __future__ import annotations

import json
from typing import Any

import pytest

from powerd.gpu.errors import GpuNotSupportedError
from powerd.gpu.models import gpu_model
from powerd.gpu.nvml import open_nvml, shutdown_nvml
from tests.support.fakes.fake_pynvml import FakeNvml
from tests.support.paths import REPO

SEEN_IN = {"H200": "nvml_h200.json", "H100": "nvml_h100_1.json"}
NAMES = {"H200": "NVIDIA H200", "H100": "NVIDIA H100 80GB HBM3"}


def seen(key: str) -> dict[str, Any]:
    """What the real GPU's inventory said in its benchmark's JSON."""
    text = (REPO / "bench" / "results" / SEEN_IN[key]).read_text()
    inventory: dict[str, Any] = json.loads(text)["inventory"]
    return inventory


@pytest.mark.parametrize("key", sorted(SEEN_IN))
def test_the_model_is_what_the_real_gpu_reported(key: str):
    seen_here = seen(key)
    model = gpu_model(key)
    assert model.name == seen_here["name"] == NAMES[key]
    limits = seen_here["power_limit_range_w"]
    assert (model.cap_min_w, model.cap_max_w, model.cap_default_w) == (
        limits["min"],
        limits["max"],
        limits["default"],
    )
    clocks = seen_here["sm_clock_range_mhz"]
    assert (model.sm_clock_min_mhz, model.sm_clock_max_mhz) == (
        clocks["min_mhz"],
        clocks["max_mhz"],
    )
    assert model.has_instant_power == (seen_here["power_reading"] == "instant")
    assert model.has_power_smoothing is seen_here["supports_smoothing"]["value"] is False
    # cold idle: 79.9 W on the H200, 70.4 W on the H100, those runs
    assert abs(model.idle_power_w - seen_here["power_w"]) < 5


@pytest.mark.parametrize("key", sorted(SEEN_IN))
def test_a_fake_gpu_answers_as_the_real_one_did(key: str):
    seen_here = seen(key)
    fake = FakeNvml([gpu_model(key)])
    (gpu,) = open_nvml(fake)
    try:
        assert gpu.name == seen_here["name"]
        assert gpu.supports_smoothing() is False
        with pytest.raises(GpuNotSupportedError) as refused:
            gpu.smoothing_range()
        assert f"GpuNotSupportedError: {refused.value}" == seen_here["smoothing_range"]["error"]
        with pytest.raises(GpuNotSupportedError) as refused:
            gpu.module_power_limit_range()
        seen_error = seen_here["module_power_limit_range"]["error"]
        assert f"GpuNotSupportedError: {refused.value}" == seen_error
    finally:
        shutdown_nvml(fake)
