"""Planning input from a live cluster: how fast the tools' formats read, and how far the
capped-sample estimate lands from the truth.

    python -m bench.bench_ingest --json bench/results/ingest.json

Formats: writes ``--gpus`` GPUs sampled at ``--rate-hz`` for ``--seconds`` as nvidia-smi
(``--format=csv``, units in values), dcgm-exporter scrapes (a ``# scrape at`` line each)
and Zeus's ``PowerMonitor`` CSV, and times ``planner.profiles.read_profiles`` on each
against the same table as a plain CSV (best of ``--repeat``).

Capped samples: runs ``powerd demo --no-live --record --record-demand`` (``--demo-s``)
and sizes ``tree-3rows.toml`` with half the GPUs for each of the demo's jobs from the
simulator's demand (the truth), from the recording as drawn (``--capped-demand as-is``) and
estimated (the default); reports each level's demand at the sizing quantile against the
truth (docs/PLANNER.md, "Capped samples").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
from click.testing import CliRunner

from bench.common import machine, report
from planner.cli import main as powerplan
from planner.profiles import read_profiles

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = ROOT / "powerd" / "data" / "budgets" / "tree-3rows.toml"
MIX = '[[jobs]]\nworkload = "llm-high"\nshare = 0.5\n[[jobs]]\nworkload = "llm-low"\nshare = 0.5\n'
T0 = datetime(2024, 5, 14, 10, 0, tzinfo=UTC).timestamp()


def samples(gpus: int, rate_hz: float, seconds: float) -> tuple[np.ndarray, np.ndarray]:
    """(time_s per sample, power_w per sample and GPU): a training rhythm with noise."""
    t = T0 + np.arange(0, seconds, 1.0 / rate_hz)
    rng = np.random.default_rng(0)
    wave = 450.0 + 150.0 * (np.sin(2 * np.pi * t / 10.0) > -0.8)
    return t, wave[:, None] + rng.normal(0.0, 8.0, (len(t), gpus))


def write_formats(where: Path, gpus: int, rate_hz: float, seconds: float) -> dict[str, Path]:
    t, power = samples(gpus, rate_hz, seconds)
    stamps = [datetime.fromtimestamp(s, UTC).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3] for s in t]
    smi = ["timestamp, index, power.draw [W], power.limit [W], clocks.current.sm [MHz]"]
    for k, stamp in enumerate(stamps):
        smi += [f"{stamp}, {g}, {power[k, g]:.2f} W, 700.00 W, 1755 MHz" for g in range(gpus)]
    dcgm: list[str] = []
    for k, s in enumerate(t):
        dcgm.append(f"# scrape at {s:.3f}")
        dcgm += [
            f'DCGM_FI_DEV_POWER_USAGE{{gpu="{g}",UUID="GPU-{g}",Hostname="n1"}} {power[k, g]:.3f}'
            for g in range(gpus)
        ]
    zeus = [
        f"{s:.3f}," + ",".join(f"{w:.2f}" for w in row) for s, row in zip(t, power, strict=True)
    ]
    plain = pd.DataFrame(
        {
            "time_s": np.repeat(t, gpus),
            "node": "n1",
            "gpu": np.tile(np.arange(gpus), len(t)),
            "workload": "bench",
            "power_w": power.ravel().round(2),
        }
    )
    files = {
        "nvidia-smi": where / "n1.csv",
        "dcgm": where / "n1.prom",
        "zeus": where / "n1-zeus.csv",
        "plain csv": where / "n1-plain.csv",
    }
    files["nvidia-smi"].write_text("\n".join(smi) + "\n")
    files["dcgm"].write_text("\n".join(dcgm) + "\n")
    files["zeus"].write_text("\n".join(zeus) + "\n")
    plain.to_csv(files["plain csv"], index=False)
    return files


def time_formats(args: argparse.Namespace, where: Path) -> dict:
    files = write_formats(where, args.gpus, args.rate_hz, args.seconds)
    flags = {"nvidia-smi": "nvidia-smi", "dcgm": "dcgm", "zeus": f"zeus:{_gpus(args.gpus)}"}
    out: dict = {}
    for name, path in files.items():
        best_s, rows = float("inf"), 0
        for _ in range(args.repeat):
            started = time.perf_counter()
            table = read_profiles([path], input_format=flags.get(name), node="n1", workload="bench")
            best_s = min(best_s, time.perf_counter() - started)
            rows = len(table)
        out[name] = {
            "rows": rows,
            "mb": round(path.stat().st_size / 1e6, 1),
            "read_s": round(best_s, 2),
            "rows_per_s": round(rows / best_s),
        }
    return out


def _gpus(count: int) -> str:
    return ",".join(str(g) for g in range(count))


def size_levels(where: Path, profile: Path, *flags: str) -> dict[str, float]:
    """Each level's demand at the sizing quantile (W), by name; the site's as "site"."""
    mix = where / "mix.toml"
    mix.write_text(MIX)
    out = where / f"{profile.stem}-{'-'.join(flags) or 'default'}.toml"
    result = CliRunner().invoke(
        powerplan,
        [
            *("size", str(TOPOLOGY), str(profile), "--mix", str(mix), "-o", str(out)),
            *("--allow-over-limit", "--format", "json", *flags),
        ],
    )
    if result.exit_code != 0:
        raise SystemExit(result.output)
    doc = json.loads(result.stdout)
    return {
        "site" if n["level"] == "site" else n["name"]: float(n["demand_q_w"])
        for n in doc["nodes"]
        if n["level"] != "node"
    }


def capped_error(args: argparse.Namespace, where: Path) -> dict:
    recorded, truth = where / "telemetry.lp", where / "demand.csv"
    started = time.perf_counter()
    subprocess.run(
        [
            *(sys.executable, "-m", "powerd", "demo", "--no-live", "--duration-s"),
            *(str(args.demo_s), "--record", str(recorded), "--record-demand", str(truth)),
        ],
        check=True,
        capture_output=True,
        cwd=where,
    )
    demo_s = time.perf_counter() - started
    true_w = size_levels(where, truth)
    runs = {
        "as-is": size_levels(where, recorded, "--workload", "idle", "--capped-demand", "as-is"),
        "estimate": size_levels(where, recorded, "--workload", "idle"),
    }
    table = read_profiles([recorded], workload="idle")
    jobs = table[table["workload"].isin(["llm-high", "llm-low"])]
    capped = jobs["cap_w"] < jobs["cap_max_w"] - 1.0
    censored = capped & (jobs["power_w"] >= 0.9 * jobs["cap_w"])
    out: dict = {
        "demo_s": args.demo_s,
        "demo_wall_s": round(demo_s, 1),
        "job_samples": len(jobs),
        "capped_share": round(float(capped.mean()), 3),
        "censored_share": round(float(censored.mean()), 3),
        "site_truth_kw": round(true_w["site"] / 1e3, 1),
    }
    for mode, levels in runs.items():
        errors = {name: levels[name] / true_w[name] - 1.0 for name in true_w}
        out[mode] = {
            "site_kw": round(levels["site"] / 1e3, 1),
            "error_min_pct": round(100 * min(errors.values()), 1),
            "error_max_pct": round(100 * max(errors.values()), 1),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rate-hz", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--demo-s", type=float, default=40.0)
    parser.add_argument("--no-demo", action="store_true", help="Formats only.")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        where = Path(tmp)
        result: dict = {
            "machine": machine(),
            "command": " ".join(["python -m bench.bench_ingest", *sys.argv[1:]]),
            "formats": time_formats(args, where),
        }
        if not args.no_demo:
            result["capped"] = capped_error(args, where)
    report(result, args.json)


if __name__ == "__main__":
    main()
