"""The busy-work benchmark runs on a modelled GPU and reports each filler's hold of each target
(the real GPU's figures are in bench/RESULTS.md, "The job's busy work on a real GPU")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def test_busy_work_benchmark_reports_every_variant_and_target(tmp_path: Path) -> None:
    out = tmp_path / "fill.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.bench_fill", "--fake", "--step-s", "0.6", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    variants = {"period_10ms", "period_50ms", "period_50ms_on_1s_average"}
    assert variants <= set(report) and report["machine"]
    assert report["period_10ms"]["period_s"] == 0.01  # the example's default, measured first
    for name in variants:
        rows = report[name]["targets"]
        assert [row["target_w"] for row in rows] == report["targets_w"]
        for row in rows:
            if row["target_w"] == 0:  # nothing to fill: the GPU at its own draw, no work
                assert row["share_at_end"] == 0 and row["seconds_to_within_5pct"] is None
            else:  # the modelled GPU follows its share at once: held near the target
                assert row["mean_w_second_half"] == pytest.approx(row["target_w"], rel=0.2)
