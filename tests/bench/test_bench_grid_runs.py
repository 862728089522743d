"""The grid benchmark runs and reports what it measures (how fast is for bench/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO


def test_grid_benchmark_runs(tmp_path: Path):
    out = tmp_path / "grid.json"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "bench.bench_grid"),
            *("--topology", str(REPO / "powerd" / "data" / "budgets" / "demo.toml")),
            *("--gpu", "H100", "--run-s", "60", "--checkpoints", "1"),
            *("--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert set(runs) == {"without", "with_smoothing"}
    assert runs["without"]["floor_source"] != "burnt by smoothing"
    assert runs["with_smoothing"]["floor_source"] == "burnt by smoothing"
    assert runs["with_smoothing"]["smoothing"]["site_gpus"] == 256
    for run in runs.values():
        assert run["wall_s"] > 0 and run["peak_rss_mib"] > 0
    # smoothing keeps the falls within the spec the unsmoothed replay breaks
    assert runs["without"]["s_outside_ramp_down"] > 0
    assert runs["with_smoothing"]["s_outside_ramp_down"] == 0
    assert report["command"].startswith("python -m bench.bench_grid")
    assert report["machine"]
