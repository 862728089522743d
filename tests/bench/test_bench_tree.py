"""The tree-of-controllers benchmark runs end to end and reports what it measures (tiny sizes;
how fast is for bench/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_tree_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "tree.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_tree",
            *("--leaves", "12", "--reps", "3", "--startup-shape", "3,2,2"),
            *("--racks-per-row", "2", "--push-every-s", "1", "--period-s", "1"),
            *("--leaf-warmup-s", "3", "--leaf-window-s", "3"),
            *("--site-rows", "2", "--site-warmup-s", "4", "--site-window-s", "4"),
            "--grid-smoothing",
            *("--keep-dir", str(tmp_path / "kept")),
            *("--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["command"].startswith("python -m bench.bench_tree")

    (coord,) = report["coordinator"]
    assert coord["leaves"] == 12 and 0 < coord["leaves_heard"] <= 12
    for key in ("period_ms", "period_encode_sign_ms", "ingest_all_summaries_ms"):
        assert set(coord[key]) == {"p50", "p99", "max", "mean", "count"}
        assert coord[key]["p50"] > 0
    assert coord["startup_s"]["build_core"] > 0
    assert report["coordinator_startup_shape"]["leaves"] == 3

    leaf = report["leaf"]
    assert leaf["scope"] == "row01" and leaf["nodes"] == 2 * 18 and leaf["cycles"] > 0
    assert leaf["controller_us_per_message"] > 0 and leaf["bare_us_per_message"] > 0
    assert set(leaf["cpu_share_of_one_core"]) == {"controller", "fleet", "mosquitto"}
    assert len(leaf["epochs"]) == 1

    (site,) = report["site"]
    assert site["rows"] == 2 and [r["scope"] for r in site["leaves"]] == ["row01", "row02"]
    assert all(r["cycles"] > 0 for r in site["leaves"])
    assert site["epochs_per_scope_max"] == 1
    assert site["coordinator"]["periods_in_window"] > 0  # grants seen on the broker
    assert site["summaries_per_s"] > 0
    assert site["summaries_with_grant_share"] > 0  # the leaves hold the coordinator's grants
    assert {"leaf controllers", "fleets", "coordinator", "mosquitto"} <= set(
        site["cpu_cores_by_role"]
    )
    for key in ("reaction_s", "reaction_from_visible_s"):
        assert set(site[key]) == {"p50", "p99", "max", "count"}
    # every leaf asked its GB200s for their share of the site's grid spec, and they took it
    assert site["grid_smoothing"] is True
    assert site["smoothing"]["gpus"] == 2 * 2 * 18 * 4
    assert site["smoothing"]["on_at_end"] == site["smoothing"]["gpus"]
    assert site["smoothing"]["all_s_worst_fleet"] is not None
    assert site["gpu_power_w_per_s"]["up_max_sum_of_fleets"] >= 0
    kept = tmp_path / "kept" / "site2-grid"  # --keep-dir: the run's files stay for reading
    assert (kept / "leaf-row01.log").exists() and (kept / "fleet-row02.json").exists()
