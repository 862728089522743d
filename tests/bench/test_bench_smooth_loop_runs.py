"""The smoothing-loop benchmark's plumbing on simulated GPUs against a real Mosquitto: with
grid smoothing on, the agent's fill requests reach the job's FillFollower; the real GPU's
figures are in bench/RESULTS.md ("Software smoothing, the whole loop, on an H200")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.brokers import Mosquitto

# the smoothing loop's pacing: run apart from the other tests (pyproject.toml, markers)
pytestmark = pytest.mark.realtime


def test_the_smoothing_loop_reaches_the_job_on_simulated_gpus(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    out = tmp_path / "smooth.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_smooth_loop",
            *("--simulate", "1xH200", "--only", "on", "--quick", "--checkpoint-s", "1.5"),
            *("--broker", mosquitto.url, "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    assert "off" not in report
    on = report["on"]
    assert on["fill_requests"] >= 10  # the agent samples at 10 Hz for the job's ~5 s
    low, high = on["fill_targets_seen_w"]
    assert low == 0.0  # stopping: filled down to nothing
    # up to the cap the controller set: under safety by caps, the default, the node's 560 W
    # limit (bench_loop.LIMIT_W_PER_GPU; under the bands it would be its 500 W budget)
    assert 300.0 <= high <= 560.0
    assert on["agent_log_warnings"] == [] and report["put_back_errors"] == []
    # the checkpoint ran, and the job waited for its GPUs to fill back up after it (on
    # simulated GPUs the draw is the agent's, so there is little or nothing to fill)
    assert report["checkpoint_s"] == 1.5 and report["rise_first"] is True
    assert 0.0 <= on["rise_first_s"] < 30.0
