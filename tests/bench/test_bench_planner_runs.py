"""The planner benchmark runs and reports what it measures (how fast is for bench/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

ROOT = REPO


def test_planner_benchmark_runs(tmp_path: Path):
    out = tmp_path / "planner.json"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "bench.bench_planner"),
            *("--topology", str(ROOT / "powerd" / "data" / "budgets" / "demo.toml")),
            *("--workloads", "3", "--profiled-gpus", "4", "--profile-s", "300"),
            *("--samples", "2000", "--whatif-s", "5", "--report", "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["topology"]["n_gpus"] == 256
    assert report["profiles"] == {
        "workloads": 3,
        "gpus_per_workload": 4,
        "duration_s": 300,
        "samples": 3 * 4 * 300,
    }
    assert report["jobs"] == 6
    assert report["size"]["wall_s"] > 0 and report["size"]["peak_rss_mib"] > 0
    assert report["size"]["output_bytes"] > 0
    assert set(report["result"]["failsafe_cap_w"]) == {"H100"}
    assert report["whatif"]["cycles"] == 5
    assert report["report"]["wall_s"] > 0
    assert "report.md" in report["report"]["files"] and "capping.png" in report["report"]["files"]
    assert report["command"].startswith("python -m bench.bench_planner")
    assert report["machine"]
