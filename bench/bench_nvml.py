"""The NVML backend and the agent's core against a real GPU: reads, writes, restores, timings.

    python -m bench.bench_nvml --json nvml.json --trace nvml_trace.csv      # a real GPU
    python -m bench.bench_nvml --fake H100 --json nvml.json                 # tests' fake NVML

What it does, on GPU ``--index`` (0), through ``powerd.gpu.nvml`` and ``powerd.agent.core``
exactly as the agent does:

1. **Inventory**: driver, nvidia-ml-py, name, which power reading (instant or 1 s average),
   energy counter, power-limit range, SM clock range, whether the device has hardware power
   smoothing and a module-scope power limit, and the message powerd gives where it has not.
2. **Read latency**: each read the agent makes per telemetry sample, timed N times.
3. **The agent's core**: an ``AgentCore`` with a freshly generated controller key applies its
   failsafe cap at start, follows a signed heartbeat, applies a signed command (a cap, a clock
   lock and a smoothing profile), refuses an unsigned one without touching the GPU, and
   restores the defaults on exit (``on_exit = restore``); each step is read back from NVML.
4. **Under load** (only where PyTorch sees CUDA): a bf16 matmul loop runs while the power is
   sampled as fast as NVML answers; the cap is set to 80 % and 50 % of the maximum, given
   back, the SM clock is locked and unlocked, the load stops. Reports mean power and matmul
   throughput per segment, how long a cap takes to bite, and the fastest rise and fall of
   the draw (W/s over 100 ms): the hardware ramps the grid limits of issue 14 are about.

Whatever happens, every control touched is put back as it was found (cap, clock lock,
smoothing): the ``finally`` of ``main``. A write NVML refuses is recorded, not raised.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import itertools
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from bench.common import machine, report
from powerd.agent.config import FailsafeConfig
from powerd.agent.controls import smoothing_wire
from powerd.agent.core import AgentCore
from powerd.gpu import Gpu, GpuError
from powerd.gpu.check import CHECK_PROFILE, timed_ms, wait_enforced
from powerd.protocol import (
    Command,
    GpuAck,
    GpuCommand,
    Heartbeat,
    Topics,
    encode,
)
from powerd.signing import Signer, Verifier

NODE = "bench-nvml"
TOPICS = Topics("default")
RATE_WINDOW_S = 0.1  # ramps are measured over this window (the 100 ms of a fast grid limit)


# --- opening the GPU: the real NVML, or the test suite's fake ----------------------------


@dataclass
class Opened:
    gpus: list[Gpu]
    driver: str
    close: Callable[[], None]
    nvml: Any  # the pynvml module, or the fake standing in for it
    handle: Any  # the GPU's handle in it, for the raw calls timed beside the backend's
    # the fake's workload: set_demand(index, watts); None on a real GPU (PyTorch loads it)
    set_demand: Callable[[int, float], None] | None = None


def open_real(index: int) -> Opened:
    import pynvml

    from powerd.gpu.nvml import open_nvml, shutdown_nvml

    gpus = open_nvml(indices=[index])
    driver = pynvml.nvmlSystemGetDriverVersion()
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    return Opened(list(gpus), str(driver), shutdown_nvml, pynvml, handle)


def open_fake(model_key: str) -> Opened:
    """The test suite's stateful fake pynvml (a repository checkout only)."""
    from powerd.gpu.models import gpu_model
    from powerd.gpu.nvml import open_nvml
    from tests.support.fakes.fake_pynvml import FakeNvml

    # enforcing a new limit takes as long as the longest seen on the H200 (RESULTS.md)
    fake = FakeNvml([gpu_model(model_key)], clock=time.monotonic, enforce_delay_s=0.092)
    gpus = open_nvml(fake)
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    return Opened(
        list(gpus), f"fake NVML ({model_key})", fake.nvmlShutdown, fake, handle, fake.set_demand
    )


# --- 1. inventory -----------------------------------------------------------------------


def attempt(fn: Callable[[], Any]) -> dict[str, Any]:
    """``{"value": ...}`` or ``{"error": "<type>: <powerd's message>"}``."""
    try:
        value = fn()
    except GpuError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return {"value": value}


def inventory(gpu: Gpu, driver: str) -> dict[str, Any]:
    limits = gpu.power_limit_range()
    clocks = attempt(lambda: gpu.sm_clock_range())
    try:
        ml_py = importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        ml_py = "unknown"
    return {
        "name": getattr(gpu, "name", "?"),
        "uuid": getattr(gpu, "uuid", "?"),
        "driver": driver,
        "nvidia_ml_py": ml_py,
        "power_reading": str(gpu.power_reading()),
        "power_w": gpu.power_w(),
        "energy_j": gpu.energy_j(),
        "power_limit_range_w": {
            "min": limits.min_w,
            "max": limits.max_w,
            "default": limits.default_w,
        },
        "power_limit_w": gpu.power_limit_w(),
        "enforced_cap_w": gpu.enforced_cap_w(),
        "sm_clock_range_mhz": clocks.get("value", clocks),
        "sm_clock_mhz": gpu.sm_clock_mhz(),
        "temp_c": gpu.temp_c(),
        "util_pct": gpu.util_pct(),
        "supports_smoothing": attempt(gpu.supports_smoothing),
        "smoothing_range": attempt(gpu.smoothing_range),
        "supports_module_power_limit": attempt(gpu.supports_module_power_limit),
        "module_power_limit_range": attempt(lambda: _limit_range(gpu)),
    }


def _limit_range(gpu: Gpu) -> dict[str, float]:
    limits = gpu.module_power_limit_range()
    return {"min": limits.min_w, "max": limits.max_w, "default": limits.default_w}


# --- 2. read latency --------------------------------------------------------------------


def latency_us(fn: Callable[[], object], runs: int) -> dict[str, float]:
    """``powerd.gpu.check.timed_ms``, in microseconds."""
    timed = timed_ms(fn, runs)
    return {"runs": runs} | {
        key.replace("_ms", "_us"): round(value * 1e3, 1) for key, value in timed.items()
    }


def read_latency(gpu: Gpu, runs: int) -> dict[str, Any]:
    return {
        "power_w": latency_us(gpu.power_w, runs),
        "energy_j": latency_us(gpu.energy_j, runs),
        "enforced_cap_w": latency_us(gpu.enforced_cap_w, runs),
        "sm_clock_mhz": latency_us(gpu.sm_clock_mhz, runs),
        "sample (everything telemetry reads)": latency_us(gpu.sample, runs),
    }


def raw_read_latency(nvml: Any, handle: Any, runs: int) -> dict[str, Any]:
    """NVML's own calls, timed: which read is slow, and whether a field read is faster."""
    import pynvml

    energy, instant = pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, pynvml.NVML_FI_DEV_POWER_INSTANT
    calls: dict[str, Callable[[], object]] = {
        "nvmlDeviceGetTotalEnergyConsumption": lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(
            handle
        ),
        "nvmlDeviceGetPowerUsage (1 s average)": lambda: nvml.nvmlDeviceGetPowerUsage(handle),
        "nvmlDeviceGetFieldValues(ENERGY)": lambda: nvml.nvmlDeviceGetFieldValues(handle, [energy]),
        "nvmlDeviceGetFieldValues(POWER_INSTANT, ENERGY)": lambda: nvml.nvmlDeviceGetFieldValues(
            handle, [instant, energy]
        ),
    }
    result: dict[str, Any] = {}
    for name, call in calls.items():
        try:
            answer: Any = call()
        except pynvml.NVMLError as exc:
            result[name] = {"error": str(exc)}
            continue
        timing: dict[str, Any] = latency_us(call, runs)
        if isinstance(answer, list | tuple) or hasattr(answer, "__len__"):
            timing["per_field_return"] = [int(f.nvmlReturn) for f in answer]
        result[name] = timing
    return result


def enforced_lag(gpu: Gpu, targets_w: list[float], timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """For each cap set in turn: how long until ``nvmlDeviceGetEnforcedPowerLimit`` shows it
    (``nvmlDeviceGetPowerManagementLimit`` shows it at once)."""
    rows = []
    for target_w in targets_w:
        gpu.set_power_limit_w(target_w)
        limit_w = gpu.power_limit_w()
        lag_ms = wait_enforced(gpu, target_w, timeout_s)
        rows.append(
            {
                "set_w": target_w,
                "power_management_limit_w_at_once": limit_w,
                "enforced_shows_it_after_ms": None if lag_ms is None else round(lag_ms, 2),
            }
        )
    return rows


# --- 3. the agent's core ----------------------------------------------------------------


def settings(gpu: Gpu) -> dict[str, Any]:
    """What NVML says the GPU holds now (its smoothing profile too, where it has one)."""
    held: dict[str, Any] = {
        "power_limit_w": gpu.power_limit_w(),
        "enforced_cap_w": gpu.enforced_cap_w(),
        "locked_max_sm_clock_mhz": gpu.locked_max_sm_clock_mhz(),
        "sm_clock_mhz": gpu.sm_clock_mhz(),
    }
    if gpu.supports_smoothing():
        held["smoothing"] = attempt(gpu.smoothing)
    return held


def agent_steps(gpu: Gpu) -> dict[str, Any]:
    """Start (failsafe), follow a signed leader, apply a signed command, refuse an unsigned
    one, restore on exit; NVML read back after each."""
    signer = Signer.generate()
    core = AgentCore(
        NODE,
        [gpu],
        FailsafeConfig(fraction=0.8),
        failsafe_after_s=10.0,
        verifier=Verifier([signer.trusted()]),
    )
    limits = gpu.power_limit_range()
    clocks = gpu.sm_clock_range()
    steps: dict[str, Any] = {"before": settings(gpu)}
    start = time.perf_counter()
    core.start()
    steps["start (failsafe cap)"] = settings(gpu) | {
        "failsafe_cap_w": core.failsafe_caps_w[gpu.index],
        "took_ms": round((time.perf_counter() - start) * 1e3, 2),
    }
    beat = Heartbeat(v=1, epoch=1, ts=time.time(), controller="bench", state="leader")
    core.on_heartbeat(signer.sign(TOPICS.heartbeat, encode(beat)))
    steps["mode after a signed heartbeat"] = core.mode
    cap_w = round(limits.min_w + 0.5 * (limits.max_w - limits.min_w))
    lock_mhz = clocks.clamp(0.6 * clocks.max_mhz)
    wanted = GpuCommand(
        index=gpu.index,
        cap_w=cap_w,
        max_sm_clock_mhz=lock_mhz,
        smoothing=smoothing_wire(CHECK_PROFILE),
    )
    start = time.perf_counter()
    ack = core.on_command(command_payload(1, wanted, signer))
    took_ms = (time.perf_counter() - start) * 1e3
    steps["signed command"] = {
        "asked": {
            "cap_w": cap_w,
            "max_sm_clock_mhz": lock_mhz,
            "smoothing floor %": CHECK_PROFILE.floor_percent,
        },
        "ack": ack.result,
        "ack_gpus": [_ack_gpu(g) for g in ack.gpus],
        "ack_errors": [e.message for e in ack.errors],
        "took_ms": round(took_ms, 2),
        "nvml_reads": settings(gpu),
    }
    forged = GpuCommand(index=gpu.index, cap_w=limits.min_w)
    unsigned = core.on_command(command_payload(2, forged, signer=None))
    steps["unsigned command"] = {
        "ack": unsigned.result,
        "ack_errors": [e.message for e in unsigned.errors],
        "nvml_reads": settings(gpu),
    }
    time.sleep(0.2)  # the cut enforced first (~0.1 s on an H200), so the raise shows its own lag
    steps["0.2 s later"] = settings(gpu)
    raise_to = GpuCommand(index=gpu.index, cap_w=limits.max_w)
    raised = core.on_command(command_payload(3, raise_to, signer))
    steps["signed command raising the cap to the maximum"] = {
        "ack": raised.result,
        "ack_gpus": [_ack_gpu(g) for g in raised.gpus],
        "nvml_reads": settings(gpu),
        "telemetry_cap_w": [g.cap_w for g in core.telemetry().gpus],
    }
    start = time.perf_counter()
    core.stop("restore")
    steps["exit (on_exit = restore)"] = settings(gpu) | {
        "took_ms": round((time.perf_counter() - start) * 1e3, 2)
    }
    return steps


def command_payload(seq: int, gpu: GpuCommand, signer: Signer | None) -> bytes:
    """A command of epoch 1 for the bench's node, signed by ``signer`` (None: unsigned)."""
    body = encode(Command(v=1, epoch=1, seq=seq, ts=time.time(), ttl_s=30.0, gpus=[gpu]))
    return body if signer is None else signer.sign(TOPICS.command(NODE), body)


def _ack_gpu(ack: GpuAck) -> dict[str, Any]:
    smoothing = None if ack.smoothing is None else msgspec.structs.asdict(ack.smoothing)
    return {
        "cap_w": ack.cap_w,
        "max_sm_clock_mhz": ack.max_sm_clock_mhz,
        "clamped": ack.clamped,
        "smoothing": smoothing,
    }


# --- 4. under load ----------------------------------------------------------------------


class MatmulLoad:
    """A bf16 matmul loop on the GPU in a thread; counts matmuls done, by time."""

    def __init__(self, device_index: int, size: int = 8192, batch: int = 10) -> None:
        import torch  # type: ignore[import-not-found, unused-ignore]

        self._torch = torch
        self._device = torch.device(f"cuda:{device_index}")
        self._a = torch.randn(size, size, device=self._device, dtype=torch.bfloat16)
        self._b = torch.randn(size, size, device=self._device, dtype=torch.bfloat16)
        self._batch = batch
        self.flop_per_matmul = 2 * size**3
        self.done: list[tuple[float, int]] = []  # (monotonic time, matmuls done so far)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        count = 0
        while not self._stop.is_set():
            for _ in range(self._batch):
                self._a @ self._b  # the work is the point
            self._torch.cuda.synchronize(self._device)
            count += self._batch
            self.done.append((time.monotonic(), count))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def tflops_between(self, t0: float, t1: float) -> float | None:
        """Matmul throughput between two monotonic times (None: too few batches inside)."""
        inside = [(t, n) for t, n in self.done if t0 <= t <= t1]
        if len(inside) < 2:
            return None
        (ta, na), (tb, nb) = inside[0], inside[-1]
        return (nb - na) * self.flop_per_matmul / (tb - ta) / 1e12


class DemandLoad:
    """The fake NVML's stand-in for a load: it demands ``demand_w`` while running."""

    def __init__(
        self, set_demand: Callable[[int, float], None], index: int, demand_w: float, idle_w: float
    ) -> None:
        self._set = set_demand
        self._index = index
        self._demand_w = demand_w
        self._idle_w = idle_w

    def start(self) -> None:
        self._set(self._index, self._demand_w)

    def stop(self) -> None:
        self._set(self._index, self._idle_w)

    def tflops_between(self, t0: float, t1: float) -> float | None:
        return None  # no work is done


Load = MatmulLoad | DemandLoad


@dataclass
class Trace:
    t0: float = field(default_factory=time.monotonic)
    samples: list[tuple[float, float, int]] = field(default_factory=list)  # t, W, MHz
    enforced_w: list[float] = field(default_factory=list)  # beside each sample
    marks: list[tuple[float, str]] = field(default_factory=list)

    def mark(self, what: str) -> None:
        self.marks.append((time.monotonic() - self.t0, what))


def sample_for(gpu: Gpu, trace: Trace, seconds: float, every_s: float) -> None:
    end = time.monotonic() + seconds
    while (now := time.monotonic()) < end:
        trace.samples.append((now - trace.t0, gpu.power_w(), gpu.sm_clock_mhz()))
        trace.enforced_w.append(gpu.enforced_cap_w())
        time.sleep(max(0.0, every_s - (time.monotonic() - now)))


def window_rates_w_per_s(samples: list[tuple[float, float, int]], since_s: float) -> list[float]:
    """Power change over each ``RATE_WINDOW_S`` window ending at or after ``since_s``, per
    second (a window may begin before ``since_s``)."""
    rates: list[float] = []
    j = 0
    for t, watts, _ in samples:
        while samples[j][0] < t - RATE_WINDOW_S:
            j += 1
        if t >= since_s and t - samples[j][0] >= 0.9 * RATE_WINDOW_S:
            rates.append((watts - samples[j][1]) / (t - samples[j][0]))
    return rates


def segment(
    gpu: Gpu, trace: Trace, load: Load, name: str, seconds: float, every_s: float
) -> dict[str, Any]:
    first = len(trace.samples)
    t_start = time.monotonic()
    trace.mark(name)
    sample_for(gpu, trace, seconds, every_s)
    samples = trace.samples[first:]
    enforced = list(zip(samples, trace.enforced_w[first:], strict=True))
    tail = [w for t, w, _ in samples if t >= samples[-1][0] - seconds / 3]  # the last third
    # the rates ending in this segment, windows reaching back before its action included
    reach = first
    while reach > 0 and trace.samples[reach - 1][0] >= samples[0][0] - RATE_WINDOW_S:
        reach -= 1
    rates = window_rates_w_per_s(trace.samples[reach:], since_s=samples[0][0])
    return {
        "seconds": seconds,
        "samples": len(samples),
        "mean_w_last_third": round(statistics.fmean(tail), 1),
        "sm_clock_mhz_last": samples[-1][2],
        "max_rise_w_per_s": round(max([0.0, *rates])),
        "max_fall_w_per_s": round(-min([0.0, *rates])),
        "tflops_last_third": _round(
            load.tflops_between(time.monotonic() - seconds / 3, time.monotonic())
        ),
        "start_s": round(t_start - trace.t0, 3),
        "_samples": samples,
        "_enforced": enforced,
    }


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def integrate_j(samples: list[tuple[float, float, int]]) -> float:
    """Energy of the sampled power, trapezoids."""
    return sum(
        (t1 - t0) * (w0 + w1) / 2 for (t0, w0, _), (t1, w1, _) in itertools.pairwise(samples)
    )


def below(limit_w: float) -> Callable[[float], bool]:
    return lambda watts: watts <= limit_w


def time_to(
    samples: list[tuple[float, float, int]], t0: float, done: Callable[[float], bool]
) -> float | None:
    """Seconds from ``t0`` to the first sample after which the 100 ms mean satisfies ``done``."""
    for i, (t, _, _) in enumerate(samples):
        window = [w for tt, w, _ in samples[i:] if tt <= t + RATE_WINDOW_S]
        if t >= t0 and window and done(statistics.fmean(window)):
            return round(t - t0, 3)
    return None


def under_load(
    gpu: Gpu, load: Load, every_s: float, segment_s: float
) -> tuple[dict[str, Any], Trace]:
    limits = gpu.power_limit_range()
    clocks = gpu.sm_clock_range()
    trace = Trace()
    plan: list[tuple[str, float, Callable[[], None]]] = [
        ("warm-up, uncapped", 2 * segment_s, lambda: None),
        ("uncapped", segment_s, lambda: None),
        ("cap 80 % of max", segment_s, lambda: gpu.set_power_limit_w(round(0.8 * limits.max_w))),
        (
            "cap 50 % of max",
            segment_s,
            lambda: gpu.set_power_limit_w(max(limits.min_w, round(0.5 * limits.max_w))),
        ),
        ("cap given back", segment_s, lambda: gpu.set_power_limit_w(limits.default_w)),
        (
            "SM clock locked at 60 % of max",
            segment_s,
            lambda: gpu.lock_max_sm_clock_mhz(clocks.clamp(0.6 * clocks.max_mhz)),
        ),
        ("clock unlocked", segment_s, gpu.unlock_sm_clock),
        ("load stopped", segment_s, load.stop),
    ]
    result: dict[str, Any] = {"segments": {}}
    energy_start_j = gpu.energy_j()
    load.start()
    try:
        for name, seconds, action in plan:
            t_action = time.monotonic() - trace.t0
            try:
                action()
                error = None
            except GpuError as exc:
                error = f"{type(exc).__name__}: {exc}"
            seg = segment(gpu, trace, load, name, seconds, every_s)
            seg["action_error"] = error
            seg["action_at_s"] = round(t_action, 3)
            result["segments"][name] = seg
    finally:
        load.stop()  # at once if a step failed; a no-op after "load stopped"
    energy_end_j = gpu.energy_j()
    if energy_start_j is not None and energy_end_j is not None:
        result["energy_counter_j"] = round(energy_end_j - energy_start_j, 1)
        result["energy_integrated_from_power_j"] = round(integrate_j(trace.samples), 1)
    segs = result["segments"]
    for name, cap_fraction in (("cap 80 % of max", 0.8), ("cap 50 % of max", 0.5)):
        seg = segs[name]
        cap_w = max(limits.min_w, round(cap_fraction * limits.max_w))
        seg["cap_w"] = cap_w
        seg["seconds_to_within_2pct_of_cap"] = time_to(
            seg["_samples"], seg["action_at_s"], below(1.02 * cap_w)
        )
        shown = [s[0] for s, e in seg["_enforced"] if abs(e - cap_w) <= 1.0]
        seg["seconds_until_enforced_limit_reads_it"] = (
            round(max(0.0, shown[0] - seg["action_at_s"]), 3) if shown else None
        )
    back = segs["cap given back"]
    target = segs["uncapped"]["mean_w_last_third"]
    back["seconds_to_90pct_of_uncapped"] = time_to(
        back["_samples"], back["action_at_s"], lambda w: w >= 0.9 * target
    )
    stopped = segs["load stopped"]
    idle_w = stopped["mean_w_last_third"]
    stopped["seconds_to_within_10pct_of_idle"] = time_to(
        stopped["_samples"], stopped["action_at_s"], lambda w: w <= 1.1 * idle_w
    )
    for seg in segs.values():
        seg.pop("_samples")
        seg.pop("_enforced")
    result["sample_period_s"] = round(
        (trace.samples[-1][0] - trace.samples[0][0]) / max(1, len(trace.samples) - 1), 4
    )
    return result, trace


def make_load(opened: Opened, gpu: Gpu, index: int) -> Load | str:
    """A load for the GPU, or why there is none: the fake's demand (its max power limit),
    or a PyTorch matmul loop on a real GPU."""
    if opened.set_demand is not None:
        return DemandLoad(
            opened.set_demand, gpu.index, gpu.power_limit_range().max_w, gpu.power_w()
        )
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available() or torch.cuda.device_count() <= index:
        return "PyTorch sees no CUDA device at this index"
    return MatmulLoad(index)


# --- the run ----------------------------------------------------------------------------


@contextlib.contextmanager
def put_back_as_found(gpu: Gpu) -> Iterator[dict[str, Any]]:
    """Whatever happens inside, the cap, the clock lock and smoothing go back as found."""
    found_limit_w = gpu.power_limit_w()
    restored: dict[str, Any] = {}
    try:
        yield restored
    finally:
        errors = []
        for what, undo in (
            ("clock", gpu.unlock_sm_clock),
            ("smoothing", gpu.restore_smoothing),
            ("module limit", gpu.restore_module_power_limit),
            ("cap", lambda: gpu.set_power_limit_w(found_limit_w)),
        ):
            try:
                undo()
            except GpuError as exc:
                errors.append(f"{what}: {exc}")
        restored.update(settings(gpu) | {"found_power_limit_w": found_limit_w, "errors": errors})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", type=int, default=0, help="the GPU's NVML index (0)")
    parser.add_argument("--fake", metavar="MODEL", help="the test suite's fake NVML (H100, GB200)")
    parser.add_argument("--runs", type=int, default=500, help="reads timed per call (500)")
    parser.add_argument("--no-load", action="store_true", help="skip the part under load")
    parser.add_argument(
        "--sample-period-s", type=float, default=0.005, help="power sampling (5 ms)"
    )
    parser.add_argument(
        "--segment-s", type=float, default=3.0, help="each step under load (3 s; warm-up 2x)"
    )
    parser.add_argument("--json", type=Path, help="write the result here too")
    parser.add_argument("--trace", type=Path, help="write the power samples under load (CSV)")
    args = parser.parse_args(argv)

    opened = open_fake(args.fake) if args.fake else open_real(args.index)
    gpu = opened.gpus[0]
    result: dict[str, Any] = {
        "command": "python -m bench.bench_nvml " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
    }
    try:
        with put_back_as_found(gpu) as restored:
            result["inventory"] = inventory(gpu, opened.driver)
            result["read_latency"] = read_latency(gpu, args.runs)
            result["raw_read_latency"] = raw_read_latency(opened.nvml, opened.handle, args.runs)
            limits = gpu.power_limit_range()
            result["enforced_limit_lag"] = enforced_lag(
                gpu,
                [
                    round(0.8 * limits.max_w),
                    max(limits.min_w, round(0.5 * limits.max_w)),
                    limits.default_w,
                    round(0.9 * limits.max_w),
                    limits.default_w,
                ],
            )
            result["agent"] = agent_steps(gpu)
            load = "--no-load" if args.no_load else make_load(opened, gpu, args.index)
            if not isinstance(load, str):
                result["under_load"], trace = under_load(
                    gpu, load, args.sample_period_s, args.segment_s
                )
                if args.trace:
                    rows = ["t_s,power_w,sm_clock_mhz,enforced_limit_w"] + [
                        f"{t:.4f},{w:.1f},{mhz},{e:.0f}"
                        for (t, w, mhz), e in zip(trace.samples, trace.enforced_w, strict=True)
                    ]
                    rows += [f"# {t:.3f} {what}" for t, what in trace.marks]
                    args.trace.write_text("\n".join(rows) + "\n")
            else:
                result["under_load"] = {"skipped": load}
        result["put_back"] = restored
    finally:
        opened.close()
    report(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
