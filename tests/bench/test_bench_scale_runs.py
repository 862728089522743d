"""The scale benchmark runs end to end and reports what it measures (one row, briefly)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_scale_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_scale",
            "--nodes",
            "1296",
            "--warmup-s",
            "3",
            "--window-s",
            "5",
            "--push-every-s",
            "1",
            "--jobs",
            "2",
            "--site-limit-mw",
            "12",
            "--site-limit-after-s",
            "1",
            "--site-limit-for-s",
            "3",  # 2 s under a full CI's load once held no cycle of the controller's
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["command"].startswith("python -m bench.bench_scale")
    (run,) = report["results"]
    assert run["nodes"] == 1296 and run["cycles"] > 0
    assert run["controller_us_per_message"] > 0 and run["bare_us_per_message"] > 0
    assert run["ratio_to_bare"] > 0
    assert set(run["cpu_share_of_one_core"]) == {"controller", "fleet", "mosquitto"}
    assert len(run["epochs"]) == 1
    for key in ("heartbeat_gap_s", "reaction_s", "reaction_from_visible_s"):
        assert set(run[key]) == {"p50", "p99", "max", "count"}
    assert run["heartbeat_gap_s"]["count"] > 0
    # the fleet's GB200s report their smoothing state; without grid_smoothing none is asked
    assert run["grid_smoothing"] is False
    assert run["jobs"] == 2 and run["phase_events"] >= 2  # each job's startup, at least
    assert run["smoothing"]["gpus"] == 1296 * 4 and run["smoothing"]["on_at_end"] == 0
    assert set(run["gpu_power_w_per_s"]) == {"up_max", "down_max", "up_max_at_s", "down_max_at_s"}
    # an operator's site limit, signed, taken by the controller over the broker, and how
    # the site's draw (the fleet's own) went under it
    limit = run["site_limit"]
    assert limit["limit_w"] == 12e6 and limit["power_before_w"] is not None, (
        limit,
        result.stderr[-2000:],
    )
    assert limit["power_before_w"] > limit["limit_w"]
    assert limit["limit_in_force_cycles"] > 0
    # the fastest fall is measured (not judged: a 2 s limit under a push a second may see
    # the site rise; tests/controller/test_controller_site_limit.py judges the glide)
    assert limit["fall_max_w_per_s"] is not None and limit["glide_s"] > 0


def test_scale_benchmark_hostile_runs(tmp_path: Path) -> None:
    """``--hostile``: one login's retained 2 MB telemetry message and 100,000-host lists at
    20 a second during the window's first two thirds; gaps and stale nodes, during and after."""
    out = tmp_path / "hostile.json"
    result = subprocess.run(
        [
            sys.executable, "-m", "bench.bench_scale", "--nodes", "1296", "--no-bare",
            "--warmup-s", "3", "--window-s", "6", "--push-every-s", "1",
            "--hostile", "retained-2mb,hostlist-flood", "--json", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = json.loads(out.read_text())["results"]
    hostile = run["hostile"]
    assert hostile["attacks"] == ["retained-2mb", "hostlist-flood"]
    for part in ("during", "after"):
        assert hostile[part]["cycles"] > 0
        assert {"heartbeat_gap_max_s", "heartbeats_late", "stale_nodes_max"} <= set(hostile[part])
    assert hostile["during"]["inputs_refused"] > 0  # the flood was seen, and refused
    assert len(run["epochs"]) == 1
