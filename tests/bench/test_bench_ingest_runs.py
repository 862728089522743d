"""The ingest benchmark runs and reports what it measures (how fast is for bench/RESULTS.md):
every format read to the same rows as the plain CSV. Its demo part is the capped-sample
tests' own (tests/planner/test_planner_censored_demo.py), not run again here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO


def test_ingest_benchmark_runs(tmp_path: Path):
    out = tmp_path / "ingest.json"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "bench.bench_ingest", "--no-demo"),
            *("--gpus", "2", "--seconds", "5", "--repeat", "1", "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    formats = json.loads(out.read_text())["formats"]
    assert set(formats) == {"nvidia-smi", "dcgm", "zeus", "plain csv"}
    assert {f["rows"] for f in formats.values()} == {2 * 5 * 10}  # 2 GPUs, 5 s at 10 Hz
