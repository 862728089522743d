"""Planner cost: ``powerplan size`` for the 83K-GPU site from profiles of 20+ workloads.

The default is the shipped ``site-150mw.toml`` (16 rows × 72 racks × 18
nodes × 4 GB200 = 82,944 GPUs) and 20 synthetic training workloads, each
profiled on 8 GPUs for an hour at 1 s (576,000 samples, written as Parquet):
per workload an iteration period of 2-20 s, compute at 850-1050 W for 60-90 %
of it and exposed communication at 350-550 W for the rest (the GPUs of a job
in step), a 10-30 s checkpoint at ~300 W every 5-15 min, and 2 % noise per
GPU. The mix runs each workload as two jobs (40 jobs, 95 % of the GPUs).

What is timed is the command a capacity engineer runs, in its own process
(``python -m planner.cli size ...``): reading the profiles, placing the jobs,
the Monte Carlo sizing of every rack, row and the site, the failsafe caps,
writing the budgets file and loading it back. Peak memory is that process's
maximum resident set (``getrusage(RUSAGE_CHILDREN).ru_maxrss``). With
``--whatif-s N`` it also times ``powerplan whatif`` over N control cycles; with
``--report`` also ``powerplan report`` on the sized file (its replay is
``--whatif-s`` long, or left out).

    python -m bench.bench_planner [--json bench/results/planner.json] [--workloads 20 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from bench.common import machine, report

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "powerd" / "data" / "budgets" / "site-150mw.toml"


def synthetic_profiles(
    workloads: int, gpus: int, duration_s: int, seed: int = 0, gpus_per_node: int = 4
) -> pd.DataFrame:
    """Per-GPU power of synchronous training jobs (the planner's profile table)."""
    rng = np.random.default_rng(seed)
    t = np.arange(duration_s, dtype=float)
    frames = []
    for w in range(workloads):
        period_s = rng.uniform(2.0, 20.0)
        compute_share = rng.uniform(0.6, 0.9)
        compute_w, comm_w = rng.uniform(850.0, 1050.0), rng.uniform(350.0, 550.0)
        ckpt_every_s, ckpt_len_s = rng.uniform(300.0, 900.0), rng.uniform(10.0, 30.0)
        computing = ((t + rng.uniform(0, period_s)) % period_s) < compute_share * period_s
        checkpoint = (t % ckpt_every_s) < ckpt_len_s
        power = np.where(computing, compute_w, comm_w)
        power = np.where(checkpoint, 300.0, power)
        phase = np.where(checkpoint, "checkpoint", np.where(computing, "compute", "communication"))
        for g in range(gpus):
            frames.append(
                pd.DataFrame(
                    {
                        "time_s": 1.7e9 + t,
                        "node": f"w{w:02d}-n{g // gpus_per_node}",
                        "gpu": g % gpus_per_node,
                        "workload": f"w{w:02d}",
                        "power_w": power * rng.normal(1.0, 0.02, len(t)),
                        "phase": phase,
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)


def mix_toml(workloads: int, jobs_per_workload: int, share: float) -> str:
    each = share / workloads
    priorities = ("low", "normal", "normal", "high")
    return "\n".join(
        f'[[jobs]]\nworkload = "w{w:02d}"\nshare = {each!r}\ncount = {jobs_per_workload}\n'
        f'priority = "{priorities[w % len(priorities)]}"\n'
        for w in range(workloads)
    )


def run_child(argv: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB) and stdout of one child process."""
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode})")
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0  # KiB on Linux
    return wall_s, peak_mib, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", type=Path, default=SITE)
    parser.add_argument("--workloads", type=int, default=20)
    parser.add_argument("--jobs-per-workload", type=int, default=2)
    parser.add_argument("--share", type=float, default=0.95, help="of the GPUs the jobs take")
    parser.add_argument("--profiled-gpus", type=int, default=8)
    parser.add_argument("--profile-s", type=int, default=3600)
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--whatif-s", type=int, default=0, help="also replay this many cycles")
    parser.add_argument("--report", action="store_true", help="also time powerplan report")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from powerd.topology import load_budgets

    top = load_budgets(args.topology)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        profiles = synthetic_profiles(args.workloads, args.profiled_gpus, args.profile_s)
        profiles.to_parquet(work / "profiles.parquet", index=False)
        (work / "mix.toml").write_text(
            mix_toml(args.workloads, args.jobs_per_workload, args.share), encoding="utf-8"
        )
        out = work / "budgets.toml"
        size_argv = [
            *(sys.executable, "-m", "planner.cli", "size", str(args.topology)),
            str(work / "profiles.parquet"),
            *("--mix", str(work / "mix.toml"), "-o", str(out)),
            *("--samples", str(args.samples), "--format", "json"),
            "--allow-over-limit",  # timed whatever the plan's verdict (it is in the JSON)
        ]
        size_s, size_mib, stdout = run_child(size_argv)
        sized = json.loads(stdout)
        out_bytes = out.stat().st_size
        load_start = time.perf_counter()
        load_budgets(out)
        load_s = time.perf_counter() - load_start
        whatif = None
        if args.whatif_s:
            whatif_argv = [
                *(sys.executable, "-m", "planner.cli", "whatif", str(out)),
                str(work / "profiles.parquet"),
                *("--mix", str(work / "mix.toml"), "--duration-s", str(args.whatif_s)),
                *("--format", "json"),
            ]
            whatif_s, whatif_mib, stdout = run_child(whatif_argv)
            replayed = json.loads(stdout)
            whatif = {
                "cycles": args.whatif_s,
                "wall_s": round(whatif_s, 2),
                "peak_rss_mib_max_so_far": round(whatif_mib, 1),
                "throughput_lost_site": replayed["throughput_lost_site"],
                "levels": replayed["levels"],
            }
        reported = None
        if args.report:
            report_argv = [
                *(sys.executable, "-m", "planner.cli", "report", str(out)),
                str(work / "profiles.parquet"),
                *("--mix", str(work / "mix.toml"), "-o", str(work / "report")),
                *("--samples", str(args.samples), "--whatif-s", str(args.whatif_s)),
            ]
            report_s, report_mib, _ = run_child(report_argv)
            reported = {
                "wall_s": round(report_s, 2),
                "peak_rss_mib_max_so_far": round(report_mib, 1),
                "whatif_s": args.whatif_s,
                "files": sorted(p.name for p in (work / "report").iterdir()),
            }

    nodes = sized["nodes"]
    site = next(n for n in nodes if n["level"] == "site")
    racks = [n for n in nodes if n["level"] == "rack"]
    rows = [n for n in nodes if n["level"] == "row"]
    result = {
        "benchmark": "planner: powerplan size",
        "command": "python -m bench.bench_planner " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "topology": {
            "file": os.path.relpath(args.topology, ROOT),
            "n_gpus": top.n_gpus,
            "nodes": len(top.servers),
            "racks": len(top.racks),
            "rows": len(top.rows),
        },
        "profiles": {
            "workloads": args.workloads,
            "gpus_per_workload": args.profiled_gpus,
            "duration_s": args.profile_s,
            "samples": len(profiles),
        },
        "jobs": len(sized["jobs"]),
        "size": {
            "wall_s": round(size_s, 2),
            "peak_rss_mib": round(size_mib, 1),
            "samples_per_node": sized["samples_per_node"],
            "output_bytes": out_bytes,
            "output_load_s": round(load_s, 3),
        },
        "result": {
            "failsafe_cap_w": sized["failsafe_cap_w"],
            "site_budget_w": site["budget_w"],
            "site_demand_q_w": site["demand_q_w"],
            "row_budget_w": [min(r["budget_w"] for r in rows), max(r["budget_w"] for r in rows)],
            "rack_budget_w": [min(r["budget_w"] for r in racks), max(r["budget_w"] for r in racks)],
            "racks_bound_by_limit": sum(r["bound"] == "limit" for r in racks),
            "rack_tail_models": pd.Series([r["tail_model"] for r in racks])
            .value_counts()
            .to_dict(),
            "rack_capping_s_per_day_max": max(r["capping_s_per_day"] for r in racks),
            "rack_over_limit_s_per_day_max": max(r["over_limit_s_per_day"] for r in racks),
            "site_capping_s_per_day": site["capping_s_per_day"],
        },
        "targets": {"wall_s": 60, "peak_rss_mib": 4096},
    }
    if whatif is not None:
        result["whatif"] = whatif
    if reported is not None:
        result["report"] = reported
    report(result, args.json)


if __name__ == "__main__":
    main()
