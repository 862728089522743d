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
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
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
        )
    }
    out["s_above_limit_max"] = max(level["s_above_limit_max"] for level in info["levels"])
    out["throughput_lost_site"] = info["throughput_lost_site"]
    out["throughput_lost_per_job"] = [job["throughput_lost"] for job in info["jobs"]]
    if "smoothing" in info:
        out["smoothing"] = info["smoothing"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", type=Path, default=SITE)
    parser.add_argument("--gpu", default="GB200")
    parser.add_argument("--run-s", type=float, default=3600.0)
    parser.add_argument("--comm-s", type=float, default=0.5)
    parser.add_argument("--checkpoints", type=int, default=2)
    parser.add_argument("--step-s", type=float, default=0.5)
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
    }
    report(result, args.json)


if __name__ == "__main__":
    main()
