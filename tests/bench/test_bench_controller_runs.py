"""The controller benchmark runs and reports what it measures (how fast is for bench/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path


def test_controller_benchmark_runs(tmp_path: Path):
    out = tmp_path / "controller.json"
    budgets = resources.files("powerd.data").joinpath("budgets/demo.toml")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_controller",
            *("--budgets", str(budgets), "--cycles", "3", "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["gpus"] == 256
    assert report["nodes"] == 64
    assert report["gpus_in_announced_phases_last_cycle"] == 0  # no jobs
    assert report["gpu_points_last_cycle"] == 256  # every GPU recorded (fine_every_s 0)
    assert report["tree_points_last_cycle"] == report["tree_nodes"] + 1  # + the decision point
    assert report["job_held_points_last_cycle"] > 0  # the failsafe start holds every GPU
    assert set(report["median_ms"]) == {
        "ingest", "cycle", "job_causes", "sign", "records", "gpu_records",
    }  # fmt: skip
    # signing takes time only in cycles that send commands (rounded, may be 0.0 ms here)
    assert all(v > 0 for k, v in report["median_ms"].items() if k != "sign")
    assert report["median_ms"]["sign"] >= 0
    assert report["command"].startswith("python -m bench.bench_controller")


def test_controller_benchmark_runs_with_smoothing_states(tmp_path: Path):
    out = tmp_path / "controller-smoothing.json"
    budgets = resources.files("powerd.data").joinpath("budgets/demo.toml")
    result = subprocess.run(
        [
            *(sys.executable, "-m", "bench.bench_controller", "--smoothing", "--jobs", "2"),
            *("--budgets", str(budgets), "--cycles", "3", "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["smoothing"] is True and report["gpus"] == 256
    assert report["jobs"] == 2 and report["gpus_in_announced_phases_last_cycle"] == 256
    assert report["median_ms"]["ingest"] > 0
