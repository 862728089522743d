"""The demo's live view fits the terminal (80x24 included) without cutting a column or its
legend; the event log writes a line per record."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
from rich.cells import cell_len
from rich.console import Console

from policies.tree import SITE
from powerd.demo.runner import LiveState, default_budgets_path
from powerd.demo.scenario import TrainingJob, default_jobs
from powerd.demo.view import EventLog, LiveView, layout_for, legend_entries
from powerd.gpu.simulated import SimulatedGpu
from powerd.jobhook import PhaseReporter
from powerd.topology import Topology, load_budgets


def job(top: Topology, k: int) -> TrainingJob:
    """The demo's k-th job on its GPUs, in communication; its reporter publishes nothing."""
    plan = default_jobs(top, 40.0)[k]
    gpus = [SimulatedGpu("H100", i) for node in plan.nodes for i in top.server_gpus(node)]
    reporter = PhaseReporter(None, plan.name, plan.nodes, priority=plan.priority)
    running = TrainingJob(plan, gpus, reporter, t0=0.0)
    running.phases.append((1.0, "communication"))
    return running


def live_state(t0: float = 0.0) -> LiveState:
    """The demo topology mid-run: every GPU at 450 W under a 480 W cap, a few locked,
    row1 and its racks capping now, eight events."""
    top = load_budgets(default_budgets_path())
    tree = top.tree
    n = top.n_gpus
    capping = np.full(top.n_nodes, -np.inf)
    capping[[top.node_index(name) for name in ("demo", "row1", "row1-k1")]] = 0.0
    locked = np.zeros(n, dtype=bool)
    locked[:40] = True
    return LiveState(
        topology=top,
        duration_s=40.0,
        t0=t0,
        node_power_w=tree.node_sum(np.full(n, 450.0)) + tree.overhead_below_w,
        gpu_cap_w=np.full(n, 480.0),
        gpu_locked=locked,
        jobs=[job(top, 0), job(top, 1)],
        events=[f"{k:5.1f} s  llm-high (high): compute" for k in range(8)],
        last_capping_s=capping,
    )


def rendered(state: LiveState, width: int, height: int) -> list[str]:
    console = Console(width=width, height=height, record=True, color_system=None)
    console.print(LiveView().render(state))
    return console.export_text().splitlines()


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40)])
def test_the_live_view_fits_the_terminal_with_every_column_and_legend_entry_whole(
    width: int, height: int
):
    state = live_state()
    lines = rendered(state, width, height)
    assert len(lines) <= height
    assert all(cell_len(line) <= width for line in lines), max(map(cell_len, lines))
    text = "\n".join(lines)
    assert "…" not in text
    layout = layout_for(width)
    header = next(line for line in lines if " budget " in line)
    for column in layout.columns:
        assert column.header in header, column.header
    tree = state.topology.tree
    threshold = float(tree.cap_threshold_w[SITE] / tree.budget_w[SITE])
    for entry in legend_entries(threshold):
        assert any(entry in line for line in lines), entry  # whole, on one line
    for name in ("demo", " row1", "  row2-k4"):
        assert any(line.startswith(name + " ") for line in lines), name
    assert sum("llm-high" in line for line in lines) >= 5  # the job column, row1 and racks
    assert "40/256" in text  # the clock-locked column
    assert "98 % of budget" in text  # demo.toml's capping threshold


def test_an_80_column_view_abbreviates_its_columns_and_keeps_them_all():
    narrow, wide = layout_for(80), layout_for(200)
    assert narrow.width <= 80 < wide.width
    assert len(narrow.columns) == len(wide.columns)  # abbreviated, none dropped
    assert not narrow.job_phase and wide.job_phase


def test_a_short_terminal_drops_events_before_the_legend():
    state = live_state()
    tall = rendered(state, 80, 40)
    short = rendered(state, 80, 22)
    assert len(short) <= 22
    assert sum("s  llm-high (high): compute" in line for line in tall) == 6
    assert sum("s  llm-high (high): compute" in line for line in short) < 6
    assert short[-1] == tall[-1]  # the legend's last entry, in both


def test_the_event_log_writes_each_status_line_whole_into_a_narrow_pipe():
    out = io.StringIO()
    log = EventLog(Console(file=out, width=80, color_system=None))
    state = live_state(t0=time.monotonic() - 6.0)  # past the first status line (5 s)
    log(state)
    lines = out.getvalue().splitlines()
    assert lines[:8] == state.events
    status = lines[8:]
    assert len(status) == 1 and " site " in status[0] and status[0].endswith("GPUs locked")
    assert cell_len(status[0]) > 80  # longer than the console, still one line
