"""Descriptions of GPU models: the ranges a device accepts and how it idles.

Used by the simulated backend and by the test suite's fake of the pynvml API,
so that both behave like the real device. Figures from ``docs/DOMAIN.md``
(NVML limits seen: H100 SXM 200–700 W, A100 SXM 100–400 W, GB200 1200 W
TDP), ``docs/HARDWARE.md`` (the H200, measured by this project) and vendor
data sheets for clocks; where a figure is assumed it says so.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str  # short name used in specs: "H100" in "4xH100"
    name: str  # what nvmlDeviceGetName reports
    cap_min_w: float
    cap_max_w: float
    cap_default_w: float
    sm_clock_min_mhz: int
    sm_clock_max_mhz: int
    idle_power_w: float
    has_instant_power: bool  # NVML_FI_DEV_POWER_INSTANT answers (Hopper and newer)
    has_energy_counter: bool  # nvmlDeviceGetTotalEnergyConsumption (Volta and newer)
    # Hardware power smoothing through NVML (nvmlDevicePowerSmoothing*): Blackwell and
    # newer with a driver of branch R570 or newer (docs/POWER_SMOOTHING.md).
    has_power_smoothing: bool = False


# sm_clock_max_mhz also carries the measured clock tables (powerd/data/clocks/) from one model
# to another, at the same fraction of it: A100 SXM 1410 MHz and H100 SXM 1980 MHz are the data
# sheets' maximum boost clocks; the GB200's 2062 MHz is assumed.
GPU_MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel("H100", "NVIDIA H100 80GB HBM3", 200.0, 700.0, 700.0, 345, 1980, 70.0, True, True),
        # H200: what NVML reported on one (docs/HARDWARE.md, 2026-11-25): 200-700 W, default
        # 700 W, 345-1980 MHz, 79 W idle when cold, instantaneous power, no smoothing.
        GpuModel("H200", "NVIDIA H200", 200.0, 700.0, 700.0, 345, 1980, 79.0, True, True),
        GpuModel(
            "A100", "NVIDIA A100-SXM4-80GB", 100.0, 400.0, 400.0, 210, 1410, 55.0, False, True
        ),
        # GB200: 1200 W TDP per GPU (Meta, docs/DOMAIN.md); the 200 W floor is assumed.
        GpuModel(
            "GB200", "NVIDIA GB200", 200.0, 1200.0, 1200.0, 300, 2062, 120.0, True, True, True
        ),
        # The three GPUs of the Zeus sweeps in tests/data/zeus-power-limit/.
        GpuModel("A40", "NVIDIA A40", 100.0, 300.0, 300.0, 210, 1740, 30.0, False, True),
        GpuModel("V100", "Tesla V100-PCIE-32GB", 100.0, 250.0, 250.0, 135, 1380, 25.0, False, True),
        GpuModel(
            "P100", "Tesla P100-PCIE-16GB", 125.0, 250.0, 250.0, 544, 1328, 25.0, False, False
        ),
    )
}


def gpu_model(key: str) -> GpuModel:
    """Look a model up by its short name, case-insensitively."""
    for known, model in GPU_MODELS.items():
        if known.lower() == key.lower():
            return model
    raise KeyError(f"unknown GPU model {key!r}; known: {', '.join(GPU_MODELS)}")
