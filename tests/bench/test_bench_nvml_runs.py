"""The NVML benchmark runs against the fake NVML and reports what it measures; the real GPU's
figures are in bench/RESULTS.md ("NVML on a real GPU")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def run_bench(tmp_path: Path, model: str) -> dict[str, Any]:
    out, trace = tmp_path / "nvml.json", tmp_path / "trace.csv"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_nvml",
            *("--fake", model, "--runs", "20", "--segment-s", "0.3"),
            *("--json", str(out), "--trace", str(trace)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(out.read_text())
    header, *rows = [r for r in trace.read_text().splitlines() if not r.startswith("#")]
    assert header == "t_s,power_w,sm_clock_mhz,enforced_limit_w" and len(rows) > 100
    return report


@pytest.mark.parametrize("model", ["H100", "GB200"])
def test_nvml_benchmark_drives_the_agent_core_and_puts_everything_back(
    tmp_path: Path, model: str
) -> None:
    report = run_bench(tmp_path, model)
    found = report["agent"]["before"]
    limits = report["inventory"]["power_limit_range_w"]
    agent = report["agent"]
    assert (
        agent["start (failsafe cap)"]["power_limit_w"]
        == agent["start (failsafe cap)"]["failsafe_cap_w"]
    )
    assert agent["mode after a signed heartbeat"] == "controlled"
    signed = agent["signed command"]
    (ack_gpu,) = signed["ack_gpus"]
    # the cut counts in the ack at once, though the fake enforces it 92 ms later, as an H200
    assert ack_gpu["cap_w"] == signed["asked"]["cap_w"] == signed["nvml_reads"]["power_limit_w"]
    assert ack_gpu["max_sm_clock_mhz"] == signed["asked"]["max_sm_clock_mhz"]
    if model == "GB200":  # hardware smoothing: applied and read back
        assert signed["ack"] == "applied" and ack_gpu["smoothing"]["floor_percent"] == 30.0
    else:  # refused cleanly, the cap and clock applied all the same
        assert signed["ack"] == "partial" and ack_gpu["smoothing"] is None
        assert "power smoothing not supported" in signed["ack_errors"][0]
    unsigned = agent["unsigned command"]
    assert (
        unsigned["ack"] == "rejected"
        and unsigned["nvml_reads"]["power_limit_w"] == (signed["asked"]["cap_w"])
    )
    for after in (agent["exit (on_exit = restore)"], report["put_back"]):
        assert after["power_limit_w"] == limits["default"] == found["power_limit_w"]
        assert after["locked_max_sm_clock_mhz"] is None
        assert after.get("smoothing") == found.get("smoothing")
    assert report["put_back"]["errors"] == []
    lags = [row["enforced_shows_it_after_ms"] for row in report["enforced_limit_lag"]]
    assert all(lag is not None and 80 <= lag < 1000 for lag in lags)


def test_nvml_benchmark_under_load_sees_the_caps_bite(tmp_path: Path) -> None:
    load = run_bench(tmp_path, "H100")["under_load"]
    segments = load["segments"]
    assert segments["uncapped"]["mean_w_last_third"] == pytest.approx(700.0)
    for name in ("cap 80 % of max", "cap 50 % of max"):
        seg = segments[name]
        assert seg["mean_w_last_third"] == pytest.approx(seg["cap_w"])
        assert seg["seconds_until_enforced_limit_reads_it"] >= 0.09
    assert segments["cap given back"]["seconds_to_90pct_of_uncapped"] is not None
    assert segments["load stopped"]["mean_w_last_third"] < 0.2 * 700.0
    assert load["energy_integrated_from_power_j"] == pytest.approx(
        load["energy_counter_j"], rel=0.1
    )
