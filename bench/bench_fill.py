"""The job's busy work on a real GPU: examples/fill_during_waits.py's DutyCycleFiller.

    python -m bench.bench_fill --json fill.json          # GPU 0, PyTorch with CUDA, NVML

Software power smoothing (docs/POWER_SMOOTHING.md) has the job hold a GPU up to a
target power during its waits with a matmul run for a share of every 10 ms. This runs
the example's filler alone (no broker, no agent) on GPU ``--index`` for a sequence of
targets, in three ways (``VARIANTS``): as the example does (NVML's instantaneous power,
where the GPU has it, every 10 ms), at the 50 ms period it had first, and on
``nvmlDeviceGetPowerUsage`` (a 1 s average on Ampere and newer). Per target: how long
the draw took to come within 5 % of it, and its mean and spread over the step's second
half. ``--fake`` runs the same on a modelled GPU (what the test runs).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.common import machine, report

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fill_during_waits.py"
TARGETS_W = (250.0, 400.0, 600.0, 0.0, 400.0)
WITHIN = 0.05  # "settled": the draw within 5 % of the target


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fill_during_waits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_targets(
    filler: Any, read_w: Callable[[], float], step_s: float, every_s: float
) -> list[dict[str, Any]]:
    """Each target for ``step_s``, the filler stepping in a thread; the draw sampled."""
    stop = threading.Event()

    def keep_busy() -> None:
        while not stop.is_set():
            filler.step()

    thread = threading.Thread(target=keep_busy, daemon=True)
    thread.start()
    rows = []
    try:
        for target_w in TARGETS_W:
            filler.set_target(target_w)
            start = time.monotonic()
            samples: list[tuple[float, float]] = []
            while (now := time.monotonic()) < start + step_s:
                samples.append((now - start, read_w()))
                time.sleep(every_s)
            tail = [w for t, w in samples if t >= step_s / 2]
            settled = next(
                (t for t, w in samples if target_w > 0 and abs(w - target_w) <= WITHIN * target_w),
                None,
            )
            rows.append(
                {
                    "target_w": target_w,
                    "seconds_to_within_5pct": None if settled is None else round(settled, 3),
                    "mean_w_second_half": round(statistics.fmean(tail), 1),
                    "stdev_w_second_half": round(statistics.pstdev(tail), 1),
                    "share_at_end": round(filler.share, 3),
                }
            )
    finally:
        stop.set()
        thread.join()
    return rows


# (name, the power the filler reads, its period in s), each at the example's own gain (per
# new reading, so the same at any period): the example's defaults (10 ms), its first period
# (50 ms), and that on NVML's 1 s average power. (Until 2026-11-26 the filler moved its share
# on every period, not on every new reading, with gains of 0.0004 at 10 ms and 0.002 at
# 50 ms: bench/RESULTS.md.)
VARIANTS: tuple[tuple[str, str, float], ...] = (
    ("period_10ms", "example", 0.01),
    ("period_50ms", "example", 0.05),
    ("period_50ms_on_1s_average", "average_1s", 0.05),
)


def real_gpu(index: int, reading: str, period_s: float) -> tuple[Any, Callable[[], float]]:
    """The example's filler on GPU ``index``, driven by the ``reading`` power; the
    benchmark samples the draw with the example's own reader (instantaneous where the GPU
    has it: ``nvml_power``)."""
    import pynvml

    fill = example()
    sample_w = fill.nvml_power(index)  # initialises NVML
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def average_w() -> float:
        return float(pynvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0

    drive = sample_w if reading == "example" else average_w
    filler = fill.DutyCycleFiller(fill.cuda_kernel(index), drive, period_s=period_s)
    return filler, sample_w


class _ModelledGpu:
    """A GPU whose draw is its idle power plus the busy share of the last period of its
    full-load extra (the tests' model, in real time): the benchmark's --fake. Read as NVML
    reads it, refreshed every ``REFRESH_S``."""

    REFRESH_S = 0.1

    def __init__(self, idle_w: float = 100.0, full_w: float = 650.0, period_s: float = 0.05):
        self.idle_w, self.full_w, self.period_s = idle_w, full_w, period_s
        self.share = 0.0
        self._read_at = -math.inf
        self._reading_w = idle_w

    def run(self, seconds: float) -> None:
        time.sleep(seconds)
        self.share = min(1.0, seconds / self.period_s)

    def rest(self, seconds: float) -> None:
        time.sleep(seconds)
        if seconds >= self.period_s:
            self.share = 0.0

    def power_w(self) -> float:
        now = time.monotonic()
        if now - self._read_at >= self.REFRESH_S:
            self._read_at = now
            self._reading_w = self.idle_w + self.share * (self.full_w - self.idle_w)
        return self._reading_w


def fake_gpu(period_s: float) -> tuple[Any, Callable[[], float]]:
    gpu = _ModelledGpu(period_s=period_s)
    filler = example().DutyCycleFiller(gpu.run, gpu.power_w, sleep=gpu.rest, period_s=period_s)
    return filler, gpu.power_w


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--step-s", type=float, default=4.0, help="each target (4 s)")
    parser.add_argument("--sample-period-s", type=float, default=0.01)
    parser.add_argument("--fake", action="store_true", help="the tests' modelled GPU")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {
        "command": "python -m bench.bench_fill " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "targets_w": list(TARGETS_W),
    }
    for name, reading, period_s in VARIANTS:
        made = fake_gpu(period_s) if args.fake else real_gpu(args.index, reading, period_s)
        filler, read_w = made
        result[name] = {
            "reading": reading,
            "period_s": period_s,
            "gain_per_w": filler.gain_per_w,
            "targets": run_targets(filler, read_w, args.step_s, args.sample_period_s),
        }
    report(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
