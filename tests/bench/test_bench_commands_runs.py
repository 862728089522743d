"""The closed-loop command count runs end to end and counts what it says it does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.fleet_sites import small_site


def run_commands_bench(tmp_path: Path, *args: str) -> dict[str, Any]:
    """``python -m bench.bench_commands`` on a 72-node site; its JSON report."""
    budgets = tmp_path / "site.toml"
    budgets.write_text(small_site(racks=4))
    out = tmp_path / "commands.json"
    argv = [sys.executable, "-m", "bench.bench_commands", "--budgets", str(budgets), *args]
    result = subprocess.run(
        [*argv, "--json", str(out)], capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def test_command_benchmark_runs_and_counts_every_command_once(tmp_path: Path) -> None:
    report = run_commands_bench(
        tmp_path, "--seconds", "20", "--compute-s", "4", "--communication-s", "2"
    )
    rows = report["per_second"]
    assert report["nodes"] == 72 and len(rows) == 20
    totals = report["totals"]
    assert totals["first"] == 72  # every node's first command of the epoch, once
    assert totals["commands"] == sum(r["commands"] for r in rows) > 72
    kinds = ("first", "cut", "raise", "small raise", "other")
    assert all(r["commands"] == sum(r[k] for k in kinds) for r in rows)
    # the jobs' communication phases: their agents lock the clocks under the policy
    assert report["clock_locks_by_announcement"] > 0
    assert {p for r in rows for p in r["phases"]} >= {"compute", "communication"}


def test_a_blind_controller_sees_stale_nodes_in_spells(tmp_path: Path) -> None:
    """``--withhold-share``: after 90 s, half the nodes unheard 8 s in every 16."""
    report = run_commands_bench(tmp_path, "--seconds", "110", "--withhold-share", "0.5")
    rows = report["per_second"]
    assert all(r["stale_nodes"] == 0 for r in rows[:90])
    stale = [r["stale_nodes"] for r in rows[90:]]
    assert 0 < max(stale) <= 36 and min(stale) == 0  # half of 72 at most; spells end


def test_lost_samples_and_late_acks(tmp_path: Path) -> None:
    """``--lose-share`` loses samples at random (nodes go stale now and then), and
    ``--ack-delay-s`` keeps the commands in flight that long; without it none is."""
    prompt = run_commands_bench(tmp_path, "--seconds", "12", "--push-every-s", "0")
    assert all(r["in_flight"] == 0 for r in prompt["per_second"])
    late = run_commands_bench(
        tmp_path, "--seconds", "20", "--lose-share", "0.8", "--ack-delay-s", "2"
    )
    rows = late["per_second"]
    assert late["lose_share"] == 0.8 and late["ack_delay_s"] == 2
    # the first period's commands (to the nodes heard) unanswered at the next, answered after
    assert rows[1]["in_flight"] == rows[0]["commands"] > 0
    assert rows[2]["in_flight"] == rows[1]["commands"]
    assert 0 < max(r["stale_nodes"] for r in rows) < 72


def test_under_safety_by_caps_the_site_is_commanded_once_and_then_left_alone(
    tmp_path: Path,
) -> None:
    """``--safety caps`` (the default): every node's first command, then only the pushed racks'
    raises and their loans: no cut after the start with the jobs' GPUs below their caps."""
    report = run_commands_bench(
        tmp_path,
        "--seconds",
        "20",
        "--compute-s",
        "4",
        "--communication-s",
        "2",
        "--safety",
        "caps",
    )
    totals = report["totals"]
    assert totals["first"] == 72
    assert totals["commands"] - totals["first"] < 72  # not a command a node a second
    assert all(r["cut"] == 0 for r in report["per_second"][2:])
