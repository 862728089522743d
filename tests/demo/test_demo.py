"""`powerd demo` end to end: embedded broker, controller, 64 agents, two jobs; and its CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import powerd.demo
from powerd.cli import main
from tests.support.demo_process import DemoRun

# the demo's measured site ramps: run apart from the other tests (pyproject.toml, markers)
pytestmark = pytest.mark.realtime

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def demo_run(shortest_demo: DemoRun) -> tuple[subprocess.CompletedProcess, Path]:
    """The suite's one shortest run (tests/conftest.py), shared by the tests below."""
    return shortest_demo.result, shortest_demo.where


def test_demo_exits_zero_and_writes_its_summary_and_plot(demo_run):
    result, where = demo_run
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no rack, row, node or the site went over its limit" in result.stdout
    assert "llm-high (high): communication" in result.stdout  # the event log, without --live
    png = (where / "power.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 10_000
    assert not (where / "demo-power.png").exists()  # --plot was honoured


def test_demo_summary_shows_capping_within_limits(demo_run):
    result, where = demo_run
    assert result.returncode == 0, result.stdout + result.stderr
    s = json.loads((where / "summary.json").read_text())
    assert s["exit_code"] == 0 and s["limit_violated"] is False
    assert s["over_limit_s"]["any"] == 0 and s["limit_violations"] == []
    assert all(0 < f <= 1 for f in s["peak_fraction_of_limit"].values())
    # tight budgets: the controller had to take watts somewhere
    assert s["capping"]["gpus_cut"] > 0 and s["capping"]["cycles_capping"] > 0
    # safety by caps, the demo's default: GPUs held at their caps are raised above the
    # failsafe cap the agents start at, where the limits have room (the bands cut below it)
    assert s["capping"]["max_cap_w"] > 500
    assert s["energy_site_wh"] > s["energy_gpu_wh"] > 0
    assert 0 < s["throughput_rel"] <= 1
    for job in s["jobs"].values():
        assert 0 < job["throughput_rel"] <= 1 and job["gpus"] == 128
    assert {"startup", "compute", "communication", "checkpoint", "shutdown"} <= set(
        s["phases_seen"]
    )
    # clock locks follow communication (with a controller cycle or so of lag)
    assert s["clock_locks"]["communication_locked_share"] > 0.25
    c = s["commands"]
    # every command is acknowledged, replaced by a newer one before its ack (whose late
    # ack is ignored), overdue (resent) or still in flight at the end
    accounted = c["acked"] + c["superseded"] + c["acks_missing"] + c["pending_at_end"]
    assert c["sent"] > 0 and accounted >= 0.98 * c["sent"] and c["acked"] >= 0.5 * c["sent"]
    assert s["peak_site_ramp_up_w_per_s"] > 0 and s["site_ramp_limit_w_per_s"] == 20_000
    # the site's ramp limit holds on the sum of caps (slack: commands land a little apart)
    assert 0 < s["peak_site_cap_ramp_up_w_per_s"] <= 1.5 * s["site_ramp_limit_w_per_s"]
    assert s["duration_s"] == 20 and s["wall_s"] < 40
    assert s["samples"] > 150 and s["cycles"] > 30


def test_demo_records_what_the_controller_records(demo_run):
    """--record: the controller's points, every measurement, each line valid line protocol."""
    from powerd.telemetry_schema import MEASUREMENTS, iter_lines

    result, where = demo_run
    assert result.returncode == 0, result.stderr
    points = list(iter_lines((where / "telemetry.lp").read_text()))
    summary = json.loads((where / "summary.json").read_text())
    assert summary["recorded"] == {
        "written": len(points),
        "buffered": 0,
        "dropped": 0,
        "write_errors": 0,
    }
    assert {p.measurement for p in points} == {m.name for m in MEASUREMENTS}
    assert {p.tags["cluster"] for p in points} == {"demo"}
    assert f"{len(points):,} points recorded to" in result.stdout


def test_demo_refuses_a_bad_record_url():
    result = CliRunner().invoke(
        main, ["demo", "--duration-s", "20", "--no-live", "--record", "influx1+http://h:1?org=x"]
    )
    assert result.exit_code == 1 and "takes db" in result.output


@pytest.mark.parametrize("duration", ["1", "19.5", "4000"])
def test_demo_refuses_a_duration_out_of_range(duration):
    result = subprocess.run(
        [sys.executable, "-m", "powerd", "demo", "--duration-s", duration],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "at least 20 s" in result.stderr


def test_a_limit_violation_makes_the_demo_exit_one(tmp_path, monkeypatch):
    """The exit code comes from the summary: a canned run with one rack over its limit."""
    from powerd.demo.summary import summarize

    run = _canned_run()
    rack = run.trace.names.index("row1-k2")
    run.trace.node_power_w[5:8, rack] = run.trace.limit_w[rack] + 100.0
    run.summary = summarize(run.trace)

    async def canned_run_demo(options, on_tick=None):
        return run

    monkeypatch.setattr(powerd.demo, "run_demo", canned_run_demo)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "s.json"
    result = CliRunner().invoke(
        main, ["demo", "--duration-s", "20", "--no-live", "--summary-json", str(out)]
    )
    assert result.exit_code == 1, result.output
    assert "LIMIT VIOLATED" in result.output and "row1-k2" in result.output
    s = json.loads(out.read_text())
    assert s["limit_violated"] is True and s["exit_code"] == 1
    assert s["limit_violations"][0]["name"] == "row1-k2"
    assert s["over_limit_s"]["rack"] == pytest.approx(0.3)
    assert (tmp_path / "demo-power.png").read_bytes().startswith(PNG_MAGIC)  # the default


def _canned_run():
    """A small DemoRun built by hand on the demo's topology (no broker, no agents)."""
    import numpy as np

    from policies.tree import PHASE_CODES
    from powerd.demo.runner import DemoRun, default_budgets_path
    from powerd.demo.summary import JobRecord, RunRecord, summarize
    from powerd.topology import load_budgets

    top = load_budgets(default_budgets_path())
    tree = top.tree
    n, g = 30, top.n_gpus
    power = np.full(g, 450.0)
    node_power = tree.node_sum(power) + tree.overhead_below_w
    trace = RunRecord(
        names=top.names,
        level=np.asarray(tree.level, dtype=int),
        limit_w=tree.limit_w,
        budget_w=tree.budget_w,
        cap_threshold_w=tree.cap_threshold_w,
        gpu_job=np.repeat([0, 1], g // 2),
        overhead_total_w=float(tree.overhead_below_w[0]),
        site_ramp_limit_w_per_s=float(tree.ramp_w_per_s[0]),
        t=np.arange(n) * 0.1,
        node_power_w=np.tile(node_power, (n, 1)),
        gpu_cap_w=np.full((n, g), 480.0),
        gpu_locked=np.zeros((n, g), dtype=bool),
        gpu_phase=np.full((n, g), PHASE_CODES["compute"], dtype=np.int8),
        gpu_throughput=np.full((n, g), 0.8),
        gpu_energy_j=np.arange(n) * 0.1 * 450.0 * g,
        cycle_t=np.zeros(0),
        cycle_capping=np.zeros((0, top.n_nodes), dtype=bool),
        cycle_cut=np.zeros((0, g), dtype=bool),
        jobs=[
            JobRecord("a", "high", 32, 128, [(0.0, "compute")]),
            JobRecord("b", "low", 32, 128, [(0.0, "compute")]),
        ],
        duration_s=3.0,
        gpu_row=np.asarray(tree.gpu_ancestor[1], dtype=int),
    )
    return DemoRun(top, trace, summarize(trace), setup_s=0.5, wall_s=4.0)


def test_the_short_demo_run_reports_the_grid(demo_run):
    """The real run (demo.toml has a [site.grid]): every grid field is in its JSON."""
    result, where = demo_run
    assert result.returncode == 0, result.stdout + result.stderr
    g = json.loads((where / "summary.json").read_text())["grid"]
    assert g["spec"].startswith("ramp +20 kW/s, -20 kW/s over 1 s")
    for key in (
        "ramp_up_max_w_per_s",
        "ramp_up_p99_w_per_s",
        "ramp_down_max_w_per_s",
        "ramp_down_p99_w_per_s",
        "oscillation_share",
        "oscillation_band_seen_hz",
        "peak_to_peak_max_w",
        "s_outside_ramp_up",
        "s_outside_ramp_down",
        "s_outside_oscillation",
        "breaches",
    ):
        assert key in g, key
    assert g["ramp_up_max_w_per_s"] > 0 and math.isclose(g["step_s"], 0.1, rel_tol=0.2)
    assert "grid spec" in result.stdout
    if g["breaches"]:
        assert "outside the grid spec:" in result.stdout
