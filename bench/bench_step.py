"""How far and how long a GPU's draw passes its power limit when a load starts under it.

    sudo python -m bench.bench_step --json step.json      # a real GPU: NVML and PyTorch
    python -m bench.bench_step --fake H100                 # the test suite's fake NVML

For each cap (the device's maximum, then 80, 68, 50 and 35 % of it), the GPU idles 1.5 s
under the cap (so it is enforced, docs/HARDWARE.md: up to 92 ms), then a bf16 matmul loop
starts (bench_nvml's) and the draw is read every 5 ms for 1.5 s. Reported per cap: the
highest instant, how long the instants stay above 1.05 x the cap after the start, the
highest 100 ms mean, and the mean of the loaded second half. The controller's plausibility
rule rests on it (``POWER_OVER_CAP_FOR_S``, docs/CONTROLLER.md). Every limit and clock
goes back as found.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.bench_nvml import (
    RATE_WINDOW_S,
    Load,
    Opened,
    Trace,
    make_load,
    open_fake,
    open_real,
    put_back_as_found,
    sample_for,
)
from bench.common import machine, report
from powerd.gpu import Gpu

CAP_FRACTIONS = (1.0, 0.8, 0.68, 0.5, 0.35)
IDLE_S = 1.5
LOADED_S = 1.5
OVER_RATIO = 1.05  # "above the cap": 5 % over it, beyond the reading's noise


def one_step(
    gpu: Gpu, load: Load, cap_w: float, every_s: float, idle_s: float, loaded_s: float
) -> dict[str, Any]:
    """Idle under ``cap_w``, then the load starts; what the draw did."""
    gpu.set_power_limit_w(cap_w)
    trace = Trace()
    sample_for(gpu, trace, idle_s, every_s)
    idle_w = statistics.fmean(w for _, w, _ in trace.samples[-20:])
    t_start = time.monotonic() - trace.t0
    load.start()
    try:
        sample_for(gpu, trace, loaded_s, every_s)
    finally:
        load.stop()
    loaded = [(t - t_start, w) for t, w, _ in trace.samples if t >= t_start]
    over = [t for t, w in loaded if w > OVER_RATIO * cap_w]
    means = [
        statistics.fmean(w for tt, w in loaded if t <= tt < t + RATE_WINDOW_S)
        for t, _ in loaded
        if t + RATE_WINDOW_S <= loaded[-1][0]
    ]
    return {
        "cap_w": cap_w,
        "enforced_cap_w": trace.enforced_w[-1],
        "idle_w": round(idle_w, 1),
        "max_instant_w": round(max(w for _, w in loaded), 1),
        "max_over_cap_pct": round(100 * (max(w for _, w in loaded) / cap_w - 1), 1),
        "last_above_1_05_cap_s": round(over[-1], 3) if over else None,
        "max_100ms_mean_w": round(max(means), 1) if means else None,
        "mean_second_half_w": round(statistics.fmean(w for t, w in loaded if t >= loaded_s / 2), 1),
        "samples": len(loaded),
    }


def run(
    opened: Opened, index: int, every_s: float, idle_s: float, loaded_s: float
) -> dict[str, Any]:
    gpu = opened.gpus[0]
    limits = gpu.power_limit_range()
    steps: list[dict[str, Any]] = []
    with put_back_as_found(gpu) as restored:
        for fraction in CAP_FRACTIONS:
            cap_w = max(limits.min_w, round(fraction * limits.max_w))
            load = make_load(opened, gpu, index)
            if isinstance(load, str):
                return {"skipped": load, "put_back": restored}
            steps.append(one_step(gpu, load, cap_w, every_s, idle_s, loaded_s))
    return {"steps": steps, "put_back": restored}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", type=int, default=0, help="the GPU's NVML index (0)")
    parser.add_argument("--fake", metavar="MODEL", help="the test suite's fake NVML (H100)")
    parser.add_argument("--sample-period-s", type=float, default=0.005, help="5 ms")
    parser.add_argument("--idle-s", type=float, default=IDLE_S, help="idle under each cap (1.5)")
    parser.add_argument("--loaded-s", type=float, default=LOADED_S, help="loaded (1.5)")
    parser.add_argument("--json", type=Path, help="write the result here too")
    args = parser.parse_args(argv)
    opener: Callable[[], Opened] = (
        (lambda: open_fake(args.fake)) if args.fake else (lambda: open_real(args.index))
    )
    opened = opener()
    try:
        result = {
            "command": "python -m bench.bench_step "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": machine(),
            "gpu": opened.gpus[0].name,
            "driver": opened.driver,
            **run(opened, args.index, args.sample_period_s, args.idle_s, args.loaded_s),
        }
    finally:
        opened.close()
    report(result, args.json)
    return 0 if not result["put_back"].get("errors") else 1


if __name__ == "__main__":
    raise SystemExit(main())
