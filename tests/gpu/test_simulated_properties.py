"""Properties of the simulator and its model, for any sequence of operations."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from powerd.gpu import GpuValueError
from powerd.gpu.models import GPU_MODELS, gpu_model
from powerd.gpu.simulated import AMBIENT_C, TEMP_RISE_AT_MAX_C, WORKLOAD_NAMES, SimulatedGpu
from powerd.gpu.workload_model import Device, WorkloadCurve, operating_point
from powerd.protocol import PHASES

MAX_W = max(m.cap_max_w for m in GPU_MODELS.values())
MAX_MHZ = max(m.sm_clock_max_mhz for m in GPU_MODELS.values())

operations = st.lists(
    st.one_of(
        st.tuples(st.just("cap"), st.floats(0.0, 1.2 * MAX_W, allow_nan=False)),
        st.tuples(st.just("lock"), st.integers(0, MAX_MHZ + 100)),
        st.tuples(st.just("unlock"), st.none()),
        st.tuples(st.just("phase"), st.sampled_from(PHASES)),
        st.tuples(st.just("workload"), st.sampled_from(WORKLOAD_NAMES)),
        st.tuples(st.just("external"), st.one_of(st.none(), st.floats(0.1, 1.0, allow_nan=False))),
        st.tuples(st.just("wait"), st.floats(0.0, 300.0, allow_nan=False)),
        st.tuples(st.just("restore"), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(sorted(GPU_MODELS)), seed=st.integers(0, 3), ops=operations)
def test_power_never_exceeds_the_enforced_cap(key: str, seed: int, ops: list[Any]) -> None:
    model = gpu_model(key)
    now = [0.0]
    gpu = SimulatedGpu(model, clock=lambda: now[0], seed=seed)
    energy = 0.0
    for op, arg in ops:
        if op == "cap":
            if model.cap_min_w <= arg <= model.cap_max_w:
                gpu.set_power_limit_w(arg)
                assert abs(gpu.power_limit_w() - arg) <= 5e-4
            else:
                before = gpu.power_limit_w()
                try:
                    gpu.set_power_limit_w(arg)
                except GpuValueError:
                    assert gpu.power_limit_w() == before
                else:  # only within half a milliwatt of a bound, as NVML rounds to mW
                    assert min(abs(arg - model.cap_min_w), abs(arg - model.cap_max_w)) < 5e-4
        elif op == "lock":
            if model.sm_clock_min_mhz <= arg <= model.sm_clock_max_mhz:
                gpu.lock_max_sm_clock_mhz(arg)
            else:
                try:
                    gpu.lock_max_sm_clock_mhz(arg)
                except GpuValueError:
                    pass
                else:
                    raise AssertionError(f"lock {arg} MHz accepted on {key}")
        elif op == "unlock":
            gpu.unlock_sm_clock()
        elif op == "phase":
            gpu.set_phase(arg)
        elif op == "workload":
            gpu.set_workload(arg)
        elif op == "external":  # a fraction of the span from idle power to 1.2 x max
            span = 1.2 * model.cap_max_w - model.idle_power_w
            gpu.set_external_limit_w(None if arg is None else model.idle_power_w + arg * span)
        elif op == "wait":
            now[0] += arg
        elif op == "restore":
            gpu.restore_defaults()

        sample = gpu.sample()
        assert 0.0 <= sample.power_w <= sample.cap_w  # +0: never above the enforced cap
        assert model.cap_min_w <= gpu.power_limit_w() <= model.cap_max_w
        assert sample.cap_w <= gpu.power_limit_w()
        assert model.sm_clock_min_mhz <= sample.sm_clock_mhz <= model.sm_clock_max_mhz
        lock = sample.max_sm_clock_mhz
        assert lock is None or sample.sm_clock_mhz <= lock
        assert 0.0 <= sample.util_pct <= 100.0
        assert 0.0 <= gpu.throughput_rel() <= 1.0
        assert AMBIENT_C <= sample.temp_c <= AMBIENT_C + TEMP_RISE_AT_MAX_C + 1e-9
        if model.has_energy_counter:
            assert sample.energy_j is not None and sample.energy_j >= energy
            energy = sample.energy_j
        else:
            assert sample.energy_j is None


curves = st.builds(
    WorkloadCurve,
    p_static=st.floats(0.0, 1.0),
    p_dyn=st.floats(0.0, 1.5),
    alpha=st.floats(1.0, 4.0),
    beta=st.floats(0.0, 1.0),
    p_wait=st.floats(0.0, 1.3),
    t_min_s=st.floats(1e-3, 1e5),
)


@settings(max_examples=500, deadline=None)
@given(
    curve=curves,
    key=st.sampled_from(sorted(GPU_MODELS)),
    cap_frac=st.floats(0.0, 1.0),
    lock_frac=st.floats(0.0, 1.0),
    load=st.floats(0.0, 1.0),
)
def test_the_model_holds_any_cap_at_or_above_idle(
    curve: WorkloadCurve, key: str, cap_frac: float, lock_frac: float, load: float
) -> None:
    model = gpu_model(key)
    device = Device.of(model)
    cap_w = model.idle_power_w + cap_frac * (model.cap_max_w - model.idle_power_w)
    lock = model.sm_clock_min_mhz + lock_frac * (model.sm_clock_max_mhz - model.sm_clock_min_mhz)
    point = operating_point(curve, device, cap_w, lock, load)
    assert point.power_w <= cap_w
    assert 0.0 <= point.speed <= 1.0 + 1e-12
    assert model.sm_clock_min_mhz - 1e-9 <= point.clock_mhz <= lock + 1e-9
    assert 0.0 <= point.duty <= 1.0
    if point.speed > 0:
        assert math.isclose(point.time_s * point.speed, curve.t_min_s, rel_tol=1e-9)
    # more room never makes it slower
    looser = operating_point(curve, device, cap_w * 1.1, None, load)
    assert looser.speed >= point.speed - 1e-12
