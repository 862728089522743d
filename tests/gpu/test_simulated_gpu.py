"""The simulated GPU behaves like NVML and like a GPU running a training job."""

from __future__ import annotations

import math

import pytest

from powerd.gpu import Gpu, GpuError, GpuLostError, GpuPermissionError, GpuValueError
from powerd.gpu.base import PowerReading
from powerd.gpu.simulated import (
    DEFAULT_WORKLOAD,
    MAX_GPUS,
    NOISE_LIMIT,
    NVML_METHODS,
    PHASE_PROFILES,
    TEMP_TAU_S,
    WORKLOAD_ALIASES,
    WORKLOAD_NAMES,
    SimulatedGpu,
    open_simulated,
    parse_spec,
)
from powerd.protocol import PHASES
from tests.support.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def gpu(clock: ManualClock) -> SimulatedGpu:
    return open_simulated("H100", clock=clock)[0]


# --- spec parsing -----------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "count", "key"),
    [("4xH100", 4, "H100"), ("8xGB200", 8, "GB200"), ("2xA100", 2, "A100"), ("H100", 1, "H100"),
     (" 2 x a40 ", 2, "A40"), ("64xV100", 64, "V100"), ("1xP100", 1, "P100")],
)  # fmt: skip
def test_a_spec_names_count_and_model(spec: str, count: int, key: str, clock: ManualClock) -> None:
    gpus = open_simulated(spec, clock=clock)
    assert len(gpus) == count
    assert [g.index for g in gpus] == list(range(count))
    assert {g.model.key for g in gpus} == {key}
    assert len({g.uuid for g in gpus}) == count
    assert all(g.uuid.startswith("GPU-") and len(g.uuid) == 40 for g in gpus)
    assert gpus[0].name == gpus[0].model.name
    assert all(isinstance(g, Gpu) for g in gpus)


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("0xH100", "count must be 1 to 64"),
        (f"{MAX_GPUS + 1}xH100", "count must be 1 to 64"),
        ("4xH999", "unknown model 'H999'"),
        ("", "expected COUNTxMODEL"),
        ("4x", "expected COUNTxMODEL"),
        ("-1xH100", "expected COUNTxMODEL"),
        ("4 H100", "expected COUNTxMODEL"),
        ("2.5xH100", "expected COUNTxMODEL"),
    ],
)
def test_a_bad_spec_says_what_is_wrong(spec: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as caught:
        parse_spec(spec)
    assert "H100" in str(caught.value) or "count" in str(caught.value)


def test_uuids_are_stable_and_differ_by_seed(clock: ManualClock) -> None:
    first = [g.uuid for g in open_simulated("2xH100", clock=clock, seed=1)]
    again = [g.uuid for g in open_simulated("2xH100", clock=clock, seed=1)]
    other = [g.uuid for g in open_simulated("2xH100", clock=clock, seed=2)]
    assert first == again
    assert not set(first) & set(other)


# --- NVML-like limits and read-back ----------------------------------------


def test_defaults_read_back(gpu: SimulatedGpu) -> None:
    limits = gpu.power_limit_range()
    assert (limits.min_w, limits.max_w, limits.default_w) == (200.0, 700.0, 700.0)
    clocks = gpu.sm_clock_range()
    assert (clocks.min_mhz, clocks.max_mhz) == (345, 1980)
    assert gpu.power_limit_w() == gpu.enforced_cap_w() == 700.0
    assert gpu.locked_max_sm_clock_mhz() is None
    assert gpu.power_reading() is PowerReading.SIMULATED
    assert gpu.phase == "compute" and gpu.workload == DEFAULT_WORKLOAD


def test_a_power_limit_reads_back_in_milliwatts(gpu: SimulatedGpu) -> None:
    gpu.set_power_limit_w(512.34567)
    assert gpu.power_limit_w() == 512.346
    assert gpu.enforced_cap_w() == 512.346
    gpu.set_power_limit_w(200)
    assert gpu.power_limit_w() == 200.0


@pytest.mark.parametrize("cap_w", [199.9, 700.1, 0.0, -5.0, 1e9, math.nan, math.inf])
def test_a_power_limit_out_of_range_raises_and_changes_nothing(
    gpu: SimulatedGpu, clock: ManualClock, cap_w: float
) -> None:
    gpu.set_power_limit_w(450.0)
    before = gpu.sample()
    with pytest.raises(GpuValueError, match="GPU 0"):
        gpu.set_power_limit_w(cap_w)
    assert gpu.sample() == before


@pytest.mark.parametrize("mhz", [344, 1981, 0, -1, 10_000, 1500.5, math.nan])
def test_a_clock_lock_out_of_range_raises_and_changes_nothing(
    gpu: SimulatedGpu, mhz: float
) -> None:
    gpu.lock_max_sm_clock_mhz(1500)
    before = gpu.sample()
    with pytest.raises(GpuValueError):
        gpu.lock_max_sm_clock_mhz(mhz)  # type: ignore[arg-type]
    assert gpu.sample() == before
    assert gpu.locked_max_sm_clock_mhz() == 1500


def test_clock_lock_bounds_are_accepted_and_read_back(gpu: SimulatedGpu) -> None:
    gpu.lock_max_sm_clock_mhz(345)
    assert gpu.locked_max_sm_clock_mhz() == 345
    gpu.lock_max_sm_clock_mhz(1980)
    assert gpu.locked_max_sm_clock_mhz() == 1980
    gpu.unlock_sm_clock()
    assert gpu.locked_max_sm_clock_mhz() is None


def test_restore_defaults_puts_back_the_default_limit_and_unlocks(gpu: SimulatedGpu) -> None:
    gpu.set_power_limit_w(300.0)
    gpu.lock_max_sm_clock_mhz(900)
    gpu.restore_defaults()
    assert gpu.power_limit_w() == 700.0
    assert gpu.locked_max_sm_clock_mhz() is None


def test_an_external_limit_lowers_the_enforced_cap(gpu: SimulatedGpu) -> None:
    gpu.set_power_limit_w(500.0)
    gpu.set_external_limit_w(350.0)
    assert gpu.power_limit_w() == 500.0
    assert gpu.enforced_cap_w() == 350.0
    assert gpu.power_w() <= 350.0
    assert gpu.external_limit_w == 350.0
    gpu.set_external_limit_w(650.0)  # above our limit: ours is the stricter
    assert gpu.enforced_cap_w() == 500.0
    gpu.set_external_limit_w(None)
    assert gpu.enforced_cap_w() == 500.0
    with pytest.raises(ValueError, match="idle power"):
        gpu.set_external_limit_w(10.0)
    with pytest.raises(ValueError):
        gpu.set_external_limit_w(math.nan)


# --- phases, caps, locks: power and throughput ------------------------------


def test_phases_draw_what_they_do(gpu: SimulatedGpu) -> None:
    power, util, clock_mhz = {}, {}, {}
    for phase in PHASES:
        gpu.set_phase(phase)
        assert gpu.phase == phase
        power[phase], util[phase], clock_mhz[phase] = (
            gpu.power_w(),
            gpu.util_pct(),
            gpu.sm_clock_mhz(),
        )
    assert power["compute"] > 0.85 * 700  # an LLM-like job draws ~90 % of the max limit
    assert power["compute"] > power["eval"] > power["communication"] > power["checkpoint"]
    assert power["checkpoint"] >= power["idle"] == power["shutdown"] == pytest.approx(70.0)
    assert power["startup"] < 0.2 * 700
    assert (
        util["compute"] > util["eval"] > util["communication"] > util["checkpoint"] > util["idle"]
    )
    assert clock_mhz["idle"] == 345 and clock_mhz["compute"] == 1980


def test_a_bad_phase_is_refused(gpu: SimulatedGpu) -> None:
    with pytest.raises(ValueError, match=r"unknown phase 'training'.*compute"):
        gpu.set_phase("training")
    assert gpu.phase == "compute"


def test_the_initial_phase_is_configurable(clock: ManualClock) -> None:
    gpus = open_simulated("2xA100", clock=clock, phase="idle")
    assert [g.phase for g in gpus] == ["idle", "idle"]
    assert gpus[0].power_w() == pytest.approx(55.0)
    with pytest.raises(ValueError, match="unknown phase"):
        open_simulated("H100", phase="lunch")


def test_throughput_is_relative_to_the_unconstrained_phase(gpu: SimulatedGpu) -> None:
    assert gpu.throughput_rel() == pytest.approx(1.0)
    for phase, profile in PHASE_PROFILES.items():
        gpu.set_phase(phase)
        if profile.progress:
            assert gpu.throughput_rel() == pytest.approx(1.0)
        else:
            assert gpu.throughput_rel() == 0.0


def test_a_lower_cap_lowers_power_and_throughput(gpu: SimulatedGpu) -> None:
    readings = []
    for cap in (700.0, 600.0, 500.0, 400.0, 300.0, 200.0):
        gpu.set_power_limit_w(cap)
        readings.append((gpu.power_w(), gpu.throughput_rel(), gpu.sm_clock_mhz()))
        assert readings[-1][0] <= cap
    powers, speeds, clocks = zip(*readings, strict=True)
    assert list(powers) == sorted(powers, reverse=True) and powers[-1] < 0.5 * powers[0]
    assert list(speeds) == sorted(speeds, reverse=True) and speeds[-1] < 0.5
    assert list(clocks) == sorted(clocks, reverse=True) and clocks[-1] < clocks[0]
    assert 0.8 < speeds[2] < 0.95  # 500 W of 700: a modest slowdown past the knee


def test_a_cap_above_a_light_phase_does_not_slow_it(gpu: SimulatedGpu) -> None:
    gpu.set_phase("communication")
    free = gpu.power_w()
    gpu.set_power_limit_w(300.0)
    assert gpu.power_w() == pytest.approx(free)


def test_a_clock_lock_lowers_power_and_throughput(gpu: SimulatedGpu) -> None:
    free_power = gpu.power_w()
    gpu.lock_max_sm_clock_mhz(1200)
    assert gpu.sm_clock_mhz() <= 1200
    assert gpu.power_w() < 0.7 * free_power
    assert 0.4 < gpu.throughput_rel() < 0.8
    assert gpu.demand_w() == pytest.approx(gpu.power_w())
    gpu.unlock_sm_clock()
    assert gpu.power_w() == pytest.approx(free_power)
    assert gpu.throughput_rel() == pytest.approx(1.0)


def test_workloads_are_named_and_change_the_draw(gpu: SimulatedGpu) -> None:
    assert DEFAULT_WORKLOAD in WORKLOAD_NAMES
    assert set(WORKLOAD_ALIASES) <= set(WORKLOAD_NAMES)
    assert len(WORKLOAD_NAMES) == 166 + len(WORKLOAD_ALIASES)
    heavy = gpu.power_w()
    gpu.set_workload("recsys-train")
    assert gpu.workload == "recsys-train"
    assert gpu.power_w() < 0.5 * heavy
    gpu.set_workload("a40/imagenet/resnet50/bs256/adadelta")
    assert gpu.power_w() > 0.6 * 700
    with pytest.raises(ValueError, match="unknown workload 'mystery'"):
        gpu.set_workload("mystery")
    assert gpu.workload == "a40/imagenet/resnet50/bs256/adadelta"
    with pytest.raises(ValueError, match="unknown workload"):
        open_simulated("H100", workload="mystery")


def test_curves_transfer_to_bigger_gpus(clock: ManualClock) -> None:
    for spec, cap_max in (("GB200", 1200.0), ("H100", 700.0), ("A100", 400.0)):
        g = open_simulated(spec, clock=clock)[0]
        assert g.power_w() / cap_max == pytest.approx(g.curve.demand_frac, rel=0.01)


# --- time: energy, temperature, noise -----------------------------------------


def test_energy_integrates_the_power_it_reports_exactly(
    gpu: SimulatedGpu, clock: ManualClock
) -> None:
    expected = gpu.energy_j()
    assert expected == 0.0
    for dt, change in [(10.0, None), (5.0, 400.0), (0.25, None), (100.0, 250.0), (3.0, None)]:
        if change is not None:
            gpu.set_power_limit_w(change)
        power = gpu.power_w()
        clock.advance(dt)
        expected += power * dt
        assert gpu.energy_j() == pytest.approx(expected, rel=1e-12)
    assert expected > 0


def test_energy_follows_phase_changes(gpu: SimulatedGpu, clock: ManualClock) -> None:
    clock.advance(60.0)
    busy = gpu.energy_j()
    gpu.set_phase("idle")
    idle_power = gpu.power_w()
    clock.advance(60.0)
    after = gpu.energy_j()
    assert busy is not None and after is not None and idle_power is not None
    assert after - busy == pytest.approx(idle_power * 60.0)
    assert idle_power * 60.0 < 0.2 * busy


def test_a_clock_going_backwards_adds_no_energy(gpu: SimulatedGpu, clock: ManualClock) -> None:
    clock.advance(10.0)
    energy = gpu.energy_j()
    clock.advance(-5.0)
    assert gpu.energy_j() == energy


def test_a_gpu_without_an_energy_counter_reports_none(clock: ManualClock) -> None:
    assert open_simulated("P100", clock=clock)[0].energy_j() is None


def test_power_noise_is_small_seeded_and_under_the_cap(clock: ManualClock) -> None:
    def series(seed: int) -> list[float]:
        g = open_simulated("H100", clock=clock, seed=seed)[0]
        g.set_power_limit_w(500.0)
        out = []
        for _ in range(50):
            clock.advance(1.0)
            out.append(g.power_w())
        return out

    nominal = open_simulated("H100", clock=clock)[0]
    nominal.set_power_limit_w(500.0)
    centre = nominal.power_w()  # before time moves: no noise yet
    a, b, c = series(7), series(7), series(8)
    assert a == b and a != c
    assert len(set(a)) > 10
    assert all(p <= 500.0 for p in a + c)
    assert all(abs(p / centre - 1) <= NOISE_LIMIT + 1e-12 for p in a + c)


def test_temperature_follows_power_with_a_lag(gpu: SimulatedGpu, clock: ManualClock) -> None:
    clock.advance(10 * TEMP_TAU_S)
    hot = gpu.temp_c()
    gpu.set_phase("idle")
    clock.advance(10 * TEMP_TAU_S)
    cold = gpu.temp_c()
    assert hot > cold + 30
    gpu.set_phase("compute")
    clock.advance(TEMP_TAU_S)
    after_tau = gpu.temp_c()
    # first order: one time constant covers 1 - 1/e of the step (noise: +-1.5 % of power)
    assert after_tau - cold == pytest.approx((1 - math.exp(-1)) * (hot - cold), rel=0.03)


# --- faults ---------------------------------------------------------------------


def test_an_injected_error_fails_the_next_call_only(gpu: SimulatedGpu) -> None:
    gpu.inject_error("set_power_limit_w", GpuPermissionError("not root"))
    with pytest.raises(GpuPermissionError, match="not root"):
        gpu.set_power_limit_w(400.0)
    assert gpu.power_limit_w() == 700.0
    gpu.set_power_limit_w(400.0)
    assert gpu.power_limit_w() == 400.0


def test_injected_errors_count_down_queue_and_clear(gpu: SimulatedGpu) -> None:
    gpu.inject_error("power_w", GpuError("flaky"), times=2)
    gpu.inject_error("power_w", GpuValueError("then this"))
    for exc in (GpuError, GpuError, GpuValueError):
        with pytest.raises(exc):
            gpu.sample()
    assert gpu.power_w() > 0
    gpu.inject_error("temp_c", GpuError("stuck"), times=None)
    for _ in range(5):
        with pytest.raises(GpuError, match="stuck"):
            gpu.temp_c()
    gpu.clear_errors()
    assert gpu.temp_c() > 0


def test_restore_defaults_fails_like_its_setter(gpu: SimulatedGpu) -> None:
    gpu.set_power_limit_w(300.0)
    gpu.inject_error("set_power_limit_w", GpuPermissionError("denied"))
    with pytest.raises(GpuPermissionError):
        gpu.restore_defaults()
    assert gpu.power_limit_w() == 300.0


def test_injection_is_checked(gpu: SimulatedGpu) -> None:
    with pytest.raises(ValueError, match="not a Gpu call"):
        gpu.inject_error("set_phase", GpuError("x"))
    with pytest.raises(TypeError):
        gpu.inject_error("power_w", RuntimeError("x"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="times"):
        gpu.inject_error("power_w", GpuError("x"), times=0)


def test_a_lost_gpu_fails_every_call(gpu: SimulatedGpu, clock: ManualClock) -> None:
    gpu.lose()
    assert gpu.lost
    for name in sorted(NVML_METHODS):
        args = {"set_power_limit_w": (400.0,), "lock_max_sm_clock_mhz": (1000,)}.get(name, ())
        with pytest.raises(GpuLostError, match="lost"):
            getattr(gpu, name)(*args)
    for call in (gpu.sample, gpu.restore_defaults):
        with pytest.raises(GpuLostError):
            call()
    assert gpu.throughput_rel() == 0.0
    gpu.set_phase("idle")  # the job's side still works
    gpu.clear_errors()
    with pytest.raises(GpuLostError):
        gpu.power_w()


def test_losing_one_gpu_leaves_the_others(clock: ManualClock) -> None:
    gpus = open_simulated("2xH100", clock=clock)
    gpus[0].lose()
    assert gpus[1].sample().power_w > 0
