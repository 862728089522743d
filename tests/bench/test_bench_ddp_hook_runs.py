"""The DDP hook benchmark runs and reports what it measures (how fast is for
bench/RESULTS.md): two gloo ranks with attach_ddp publishing (the other modes are plain
DDP, which the benchmark runs the same way)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO


def test_ddp_hook_benchmark_runs(tmp_path: Path):
    out = tmp_path / "ddp_hook.json"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "bench.bench_ddp_hook", "--layers", "2"),
            *("--steps", "5", "--warmup", "1", "--rounds", "1", "--mode", "attach_ddp"),
            *("--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["step_ms_mean"]) == {"attach_ddp"}
    assert all(ms > 0 for ms in report["step_ms_mean"].values())
