"""The load-step benchmark runs against the fake NVML and puts the limit back; a real GPU's
figures are in bench/RESULTS.md ("A load step under a power limit")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.bench_step import CAP_FRACTIONS


def test_the_step_benchmark_reports_every_cap_and_puts_the_limit_back(tmp_path: Path) -> None:
    out = tmp_path / "step.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_step",
            *("--fake", "H100", "--idle-s", "0.3", "--loaded-s", "0.4", "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    caps = [step["cap_w"] for step in report["steps"]]
    assert caps == [max(200, round(f * 700)) for f in CAP_FRACTIONS]
    for step in report["steps"]:
        assert step["enforced_cap_w"] == step["cap_w"]
        # the fake's limiter acts at once: never above the cap, and at it once loaded
        assert step["max_instant_w"] <= step["cap_w"] and step["last_above_1_05_cap_s"] is None
        assert step["mean_second_half_w"] == step["cap_w"] > step["idle_w"]
    assert report["put_back"]["power_limit_w"] == 700.0 and report["put_back"]["errors"] == []
