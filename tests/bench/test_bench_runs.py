"""The benchmarks run and report what they measure (how fast is for bench/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_agent_benchmark_runs(tmp_path: Path):
    out = tmp_path / "agent.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.bench_agent", "--seconds", "2", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    for run in ("at_1hz", "at_20hz"):
        assert report[run]["samples"] > 0
        assert report[run]["rss_mb"] > 0
        assert report[run]["cpu_ms_per_sample"] >= 0
    assert report["command"].startswith("python -m bench.bench_agent")
