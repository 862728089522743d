"""Grid smoothing at site scale: two synchronised jobs replayed through `powerplan whatif`.

    python -m bench.bench_grid --json bench/results/grid.json

Writes a synchronous job's profile with ``powerplan rhythm`` (start, a
``--comm-s`` wait every 10 s, ``--checkpoints`` checkpoints, stop), runs two
such jobs on 95 % of the GPUs of ``--topology`` (default: the shipped 150 MW
site) together, without and with ``--smoothing``, each in its own process
(``python -m planner.cli whatif ... --format json``), and reports per run the
wall time and peak memory of the command, and what it measured: site ramps
against the grid spec, seconds outside it and above any limit, the energy
smoothing burnt (by phase) and the throughput lost.

Rack energy storage (``powerplan whatif --storage-kj-per-rack``): the same case
is replayed once more, in this process, and storage of each size in
``--storage-kj-per-rack`` at ``--storage-kw-per-rack`` is dispatched over that
one replayed site series (``planner.whatif_storage.storage_report``, what the command
runs; the dispatch is cheap, the replay is not). A search then finds the least
size, at that power, whose grid draw is 0 s outside the spec with at most
``--storage-target-share`` of the jobs' energy burnt and lost in conversion.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.bench_planner import run_child
from bench.common import machine, report

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "powerd" / "data" / "budgets" / "site-150mw.toml"
MIX = '[[jobs]]\nworkload = "rhythm"\nshare = 0.95\ncount = 2\n'


def summary(info: dict) -> dict:
    grid = info["grid"]
    out = {
        key: grid.get(key)
        for key in (
            "ramp_up_max_w_per_s",
            "ramp_down_max_w_per_s",
            "ramp_up_limit_w_per_s",
            "ramp_down_limit_w_per_s",
            "s_outside_ramp_up",
            "s_outside_ramp_down",
            "s_outside_oscillation",
            "oscillation_band_rms_max_w",
            "floor_source",
            "floor_energy_kwh",
            "floor_energy_share_of_jobs",
            "floor_least_kwh",
            "floor_least_share_of_jobs",
            "floor_ready_kwh",
            "floor_ready_share_of_jobs",
            "floor_ratio_to_causal",
            "lost_work_kwh",
            "lost_least_kwh",
            "lost_ratio_to_bound",
            "lost_at_floors_kwh",
            "lost_ratio_at_floors",
        )
    }
    out["s_above_limit_max"] = max(level["s_above_limit_max"] for level in info["levels"])
    out["throughput_lost_site"] = info["throughput_lost_site"]
    out["throughput_lost_per_job"] = [job["throughput_lost"] for job in info["jobs"]]
    if "smoothing" in info:
        out["smoothing"] = info["smoothing"]
    return out


STORAGE_KEYS = (
    "burnt_kwh",
    "burnt_share_of_jobs",
    "conversion_loss_kwh",
    "conversion_loss_share_of_jobs",
    "burnt_and_losses_share_of_jobs",
    "held_back_kwh",
    "held_back_share_of_jobs",
    "charge_min_share",
    "charge_max_share",
)
STORAGE_GRID_KEYS = (
    "ramp_up_max_w_per_s",
    "ramp_down_max_w_per_s",
    "s_outside_ramp_up",
    "s_outside_ramp_down",
    "s_outside_oscillation",
    "oscillation_band_rms_max_w",
)


def storage_summary(report: dict) -> dict:
    """One storage size: its grid draw against the spec and where the energy went."""
    out = {key: report[key] for key in ("kj_per_rack", "kw_per_rack", *STORAGE_KEYS)}
    out |= {key: report["grid"][key] for key in STORAGE_GRID_KEYS}
    return out


def meets(summary: dict, target_share: float) -> bool:
    """0 s outside every limit of the spec, and burnt + lost within the target share."""
    outside = sum(summary[key] for key in STORAGE_GRID_KEYS if key.startswith("s_outside"))
    return outside == 0 and summary["burnt_and_losses_share_of_jobs"] <= target_share


def least_meeting(
    size: Callable[[float], dict], sizes_kj: list[float], target_share: float, tolerance_kj: float
) -> dict | None:
    """The least kJ per rack that meets the target: the least size of ``sizes_kj`` that
    does, narrowed by bisection against the largest below it that does not (to
    ``tolerance_kj``); None when none does. ``size(kj)`` is the summary of one size."""
    tried = {kj: size(kj) for kj in sorted(sizes_kj)}
    good = [kj for kj, summary in tried.items() if meets(summary, target_share)]
    if not good:
        return None
    high = good[0]
    low = max((kj for kj in tried if kj < high), default=0.0)
    while high - low > tolerance_kj:
        mid = (low + high) / 2
        if meets(size(mid), target_share):
            high = mid
        else:
            low = mid
    return {"kj_per_rack": high, "not_met_at_kj_per_rack": low, **size(high)}


def storage_runs(args: argparse.Namespace, profile: Path, mix: Path, duration_s: float) -> dict:
    """The case replayed once here, then each storage size dispatched over its site series."""
    from planner.commands.size import load_inputs
    from planner.whatif import WhatifSettings, replay
    from planner.whatif_storage import StorageSizing, storage_report

    inputs = load_inputs(args.topology, (profile,), mix, args.step_s, (), None)
    settings = WhatifSettings(duration_s=duration_s, synchronised=True)
    start = time.perf_counter()
    result = replay(inputs.top, inputs.placement, inputs.traces, settings)
    replay_s = time.perf_counter() - start
    dispatch_s: list[float] = []

    def size(kj: float) -> dict:
        start = time.perf_counter()
        report = storage_report(inputs.top, result, StorageSizing(kj, args.storage_kw_per_rack))
        dispatch_s.append(time.perf_counter() - start)
        return storage_summary(report)

    sizes = [size(kj) for kj in args.storage_kj_per_rack]
    least = least_meeting(size, args.storage_kj_per_rack, args.storage_target_share, 0.5)
    first = storage_report(inputs.top, result, StorageSizing(0.0, 0.0))
    return {
        "replay_wall_s": replay_s,
        "dispatch_wall_s_mean": sum(dispatch_s) / len(dispatch_s),
        "racks": first["racks"],
        "kw_per_rack": args.storage_kw_per_rack,
        "round_trip_efficiency": first["round_trip_efficiency"],
        "horizon_s": first["horizon_s"],
        "margin": first["margin"],
        "least_floor_without_storage_share_of_jobs": first[
            "least_floor_without_storage_share_of_jobs"
        ],
        "target": {
            "s_outside": 0,
            "burnt_and_losses_share_of_jobs_at_most": args.storage_target_share,
        },
        "sizes": sizes,
        "least_meeting_target": least,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", type=Path, default=SITE)
    parser.add_argument("--gpu", default="GB200")
    parser.add_argument("--run-s", type=float, default=3600.0)
    parser.add_argument("--comm-s", type=float, default=0.5)
    parser.add_argument("--checkpoints", type=int, default=2)
    parser.add_argument("--step-s", type=float, default=0.5)
    parser.add_argument(
        "--storage-kj-per-rack",
        type=lambda text: [float(x) for x in text.split(",")],
        default=[0.0, 5.0, 10.0, 20.0, 30.0, 50.0, 100.0, 300.0, 1000.0],
        help="comma-separated storage sizes to dispatch (kJ per rack)",
    )
    parser.add_argument("--storage-kw-per-rack", type=float, default=52.0)
    parser.add_argument("--storage-target-share", type=float, default=0.03)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="powerd-bench-grid-") as tmp:
        work = Path(tmp)
        profile, mix = work / "rhythm.csv", work / "mix.toml"
        run_child(
            [
                *(sys.executable, "-m", "planner.cli", "rhythm", str(profile)),
                *("--gpu", args.gpu, "--run-s", str(args.run_s), "--comm-s", str(args.comm_s)),
                *("--checkpoints", str(args.checkpoints), "--step-s", str(args.step_s)),
            ]
        )
        mix.write_text(MIX, encoding="utf-8")
        duration_s = 10 + 20 + args.run_s + 120  # the rhythm's idle, startup, run and tail
        runs = {}
        for name, extra in (("without", []), ("with_smoothing", ["--smoothing"])):
            wall_s, peak_mib, out = run_child(
                [
                    *(sys.executable, "-m", "planner.cli", "whatif", str(args.topology)),
                    *(str(profile), "--mix", str(mix), "--step-s", str(args.step_s)),
                    *("--duration-s", str(duration_s), "--synchronised", *extra),
                    *("--format", "json"),
                ]
            )
            runs[name] = {"wall_s": wall_s, "peak_rss_mib": peak_mib, **summary(json.loads(out))}
        storage = storage_runs(args, profile, mix, duration_s)
    result = {
        "command": "python -m bench.bench_grid " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "topology": str(
            args.topology.relative_to(ROOT) if args.topology.is_relative_to(ROOT) else args.topology
        ),
        "rhythm": {
            "gpu": args.gpu,
            "run_s": args.run_s,
            "comm_s": args.comm_s,
            "period_s": 10.0,
            "checkpoints": args.checkpoints,
            "step_s": args.step_s,
            "duration_s": duration_s,
        },
        "runs": runs,
        "storage": storage,
    }
    report(result, args.json)


if __name__ == "__main__":
    main()
