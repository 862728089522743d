"""A simulated GPU locked at a clock slows down and draws as its model's clock table says
(powerd.gpu.workload_model.table_operating_point), the cap still binds, and a model without a
table keeps the parametric response."""

from __future__ import annotations

import pytest

from powerd.gpu.clock_table import shipped_clock_table, shipped_table
from powerd.gpu.simulated import SimulatedGpu
from powerd.gpu.workload_model import operating_point
from tests.support.clock import ManualClock


def gpu(model: str, **kwargs: object) -> SimulatedGpu:
    return SimulatedGpu(model, clock=ManualClock(), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "lock_mhz"),
    [
        ("A100", 1290),
        ("A100", 1050),
        ("A100", 1410),
        ("H100", 1811),
        ("H100", 1500),
        ("GB200", 1887),
    ],
)
def test_a_locked_gpu_slows_and_draws_as_its_table_says(model: str, lock_mhz: int) -> None:
    g = gpu(model)
    free_w = g.demand_w()
    g.lock_max_sm_clock_mhz(lock_mhz)
    table = shipped_clock_table(model)
    assert table is not None
    time_rel, power_rel = table.at(lock_mhz)
    assert g.throughput_rel() == pytest.approx(min(1.0, 1.0 / time_rel))
    assert g.demand_w() == pytest.approx(free_w * min(1.0, power_rel))  # noise-free draw
    assert g.power_w() == pytest.approx(free_w * min(1.0, power_rel), rel=0.016)  # with noise
    assert g.sm_clock_mhz() == lock_mhz


def test_energy_per_unit_of_work_at_the_recommended_clock_is_the_tables() -> None:
    g = gpu("A100")
    free_w = g.demand_w()
    g.lock_max_sm_clock_mhz(1290)  # the least energy within 5 % on GPT-3 175B
    energy_rel = (g.demand_w() / free_w) / g.throughput_rel()
    assert energy_rel == pytest.approx(1 - 0.0970, abs=5e-4)  # 9.7 % saved


def test_a_table_given_to_the_gpu_is_the_one_it_follows() -> None:
    bloom = shipped_table("a100-bloom")
    g, default = gpu("A100", clock_table=bloom), gpu("A100")
    for each in (g, default):
        each.lock_max_sm_clock_mhz(1200)
    assert g.throughput_rel() == pytest.approx(1 / bloom.at(1200)[0])
    assert g.throughput_rel() != pytest.approx(default.throughput_rel(), rel=1e-3)


def test_without_a_table_the_parametric_model_answers() -> None:
    g = gpu("A100", clock_table=None)
    g.lock_max_sm_clock_mhz(1050)
    point = operating_point(g.curve, g.device, g.model.cap_max_w, 1050, 1.0)
    assert g.throughput_rel() == pytest.approx(point.speed)
    assert g.demand_w() == pytest.approx(point.power_w)
    table = shipped_table("a100-gpt3-175b")
    assert g.throughput_rel() != pytest.approx(1 / table.at(1050)[0], rel=1e-2)


def test_a_cap_below_the_locked_draw_still_binds() -> None:
    g = gpu("H100")
    g.lock_max_sm_clock_mhz(1811)
    locked_w, locked_speed = g.demand_w(), g.throughput_rel()
    g.set_power_limit_w(300.0)
    assert g.power_w() <= 300.0 < locked_w
    assert g.throughput_rel() < locked_speed
    g.set_power_limit_w(700.0)
    assert g.throughput_rel() == pytest.approx(locked_speed)


def test_below_the_table_a_lock_costs_time_and_saves_no_more_energy() -> None:
    g = gpu("A100")
    free_w = g.demand_w()
    g.lock_max_sm_clock_mhz(855)  # the table's lowest row
    lowest = (g.demand_w() / free_w) / g.throughput_rel()
    speed_855 = g.throughput_rel()
    g.lock_max_sm_clock_mhz(600)
    assert g.throughput_rel() == pytest.approx(speed_855 * 600 / 855)
    assert (g.demand_w() / free_w) / g.throughput_rel() == pytest.approx(lowest)


def test_a_lock_in_communication_scales_the_power_above_idle() -> None:
    g = gpu("H100")
    g.set_phase("communication")
    free_w = g.demand_w()
    g.lock_max_sm_clock_mhz(1201)  # the table's lowest row: power_rel ~0.5 at full load
    idle_w = g.model.idle_power_w
    assert idle_w < g.demand_w() < free_w
    full = gpu("H100")
    full_free_w = full.demand_w()
    full.lock_max_sm_clock_mhz(1201)
    share = (full.demand_w() - idle_w) / (full_free_w - idle_w)
    assert (g.demand_w() - idle_w) / (free_w - idle_w) == pytest.approx(share)
