"""The policy benchmark runs and reports what it measures (how fast is for bench/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("safety", [["--safety", "bands"], []], ids=["bands", "caps"])
def test_policy_benchmark_runs(tmp_path: Path, safety: list[str]):
    out = tmp_path / "policy.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_policy",
            *("--rows", "2", "--racks", "3", "--servers", "2", "--gpus", "4", "--runs", "3"),
            *("--json", str(out)),
            *safety,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["tree"]["n_gpus"] == 2 * 3 * 2 * 4
    assert set(report["scenarios"]) == {
        "realistic",
        "worst_all_racks_over",
        "worst_half_uncapping",
        "steady_one_rack_pushed",
    }
    for scenario in report["scenarios"].values():
        assert scenario["runs"] == 3
        assert 0 < scenario["min_ms"] <= scenario["median_ms"] <= scenario["p95_ms"]
    # the scenarios do what they say (under the bands: safety by caps moves no cap for
    # a node drawing over its threshold; it holds every level by the caps in force)
    if safety == ["--safety", "bands"]:
        assert report["scenarios"]["worst_all_racks_over"]["nodes_capping"] >= 2 * 3
    assert report["scenarios"]["worst_half_uncapping"]["gpus_uncapped"] > 0
    assert report["command"].startswith("python -m bench.bench_policy")
    assert report["machine"]
