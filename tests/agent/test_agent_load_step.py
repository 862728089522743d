"""A load step passes a GPU's power limit for ~0.1 s (an H200: 911 W under its 700 W limit,
648 W under 476 W; bench/RESULTS.md, "A load step under a power limit"). The agent reports
what NVML reads, unclipped; the controller does not take one such sample for a lie
(tests/controller/test_controller_trust.py::test_a_load_step_over_the_cap_is_no_lie_unless_it_lasts)."""

from __future__ import annotations

import pytest

from powerd.gpu.models import gpu_model
from powerd.gpu.nvml import open_nvml
from tests.support.agent_core_harness import FAILSAFE_W, core_clock, core_following
from tests.support.fakes.fake_pynvml import FakeNvml

LAG_S = 0.1  # the H200's, about: its instant reading after a step, then the limit


def test_the_agent_reports_a_load_step_over_its_cap_as_the_device_reads_it() -> None:
    clock = core_clock()
    fake = FakeNvml([gpu_model("H200")], clock=clock.monotonic, limiter_lag_s=LAG_S)
    core = core_following(clock, open_nvml(fake))  # its failsafe cap: 500 W
    fake.set_demand(0, 911.0)
    (step,) = core.telemetry().gpus
    assert (step.cap_w, step.power_w) == (FAILSAFE_W, 911.0)
    clock.advance(LAG_S)
    (held,) = core.telemetry().gpus
    assert held.power_w == FAILSAFE_W


def test_the_fakes_limiter_lag_counts_in_energy_and_only_on_a_rise() -> None:
    fake = FakeNvml([gpu_model("H200")], limiter_lag_s=LAG_S)
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    fake.nvmlDeviceSetPowerManagementLimit(handle, 476_000)
    start_mj = fake.nvmlDeviceGetTotalEnergyConsumption(handle)
    fake.set_demand(0, 648.0)
    fake.advance(1.0)  # 0.1 s at 648 W, then 0.9 s at the 476 W limit
    used_j = (fake.nvmlDeviceGetTotalEnergyConsumption(handle) - start_mj) / 1000
    assert used_j == pytest.approx(0.1 * 648 + 0.9 * 476)
    fake.set_demand(0, 600.0)  # a fall: clipped at once
    assert fake.nvmlDeviceGetPowerUsage(handle) == 476_000
    assert FakeNvml([gpu_model("H200")]).limiter_lag_s == 0.0  # off unless asked for
