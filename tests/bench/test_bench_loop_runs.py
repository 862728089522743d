"""The whole-loop benchmark runs `powerd agent` and `powerd controller` processes against a
real Mosquitto and passes every step on simulated GPUs; a real GPU's figures are in
bench/RESULTS.md ("The whole loop on a real GPU")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.brokers import Mosquitto

# the loop benchmark's steps in time: run apart from the other tests (pyproject.toml, markers)
pytestmark = pytest.mark.realtime


def test_the_loop_benchmark_passes_every_step_on_simulated_gpus(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    out = tmp_path / "loop.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_loop",
            *("--simulate", "2xH200", "--quick", "--broker", mosquitto.url, "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    report = json.loads(out.read_text())
    assert result.returncode == 0, (report["checks"], report["logs_tail"])
    assert report["gpus"] == "2xH200 (simulated)"
    assert len(report["checks"]) == 7 and all(report["checks"].values())
    steps = report["steps"]
    assert steps["1 agent alone"]["caps_w"] == [report["failsafe_cap_w"]] * 2
    assert steps["1 agent alone"]["mode"] == "failsafe"
    assert steps["2 controller starts"]["ack"] == "applied"
    held = steps["3 under load"]
    # safety by caps, the default: the controller's caps hold the node within its limit,
    # raised from the failsafe caps the agent started at (the node's limit holds both GPUs
    # above them)
    assert report["safety"] == "caps"
    assert sum(held["caps_w"]) <= report["limit_w"]
    assert min(held["caps_w"]) > report["failsafe_cap_w"]
    assert held["s_over_limit"] == 0 and held["max_1s_mean_draw_w"] <= report["limit_w"]
    assert held["max_draw_over_caps_w"] <= 0  # a simulated GPU never draws above its cap
    assert steps["4 communication"]["mean_draw_w_locked"] < held["max_1s_mean_draw_w"]
    killed = steps["5 controller killed"]
    assert killed["failsafe_after_s"] - 1.1 <= killed["failsafe_in_telemetry_after_s"] < 10
    assert steps["6 agent stopped"]["exit_status"] == 0
    assert report["put_back_errors"] == []
