"""The planner's plots show every point they draw: no marker cut by the frame, no empty axis."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from planner.caps import recommend
from planner.commands.caps import ZEUS_WORKLOAD_COLS
from planner.mix import Placement, load_mix, place
from planner.plots import (
    HEADROOM,
    NO_CAPPING,
    budget_vs_demand_figure,
    capping_figure,
    caps_figure,
    plotted_y,
)
from planner.profiles import read_profiles
from planner.report import ReportSettings, budget_vs_demand
from planner.sizing import WorkloadTrace, traces_from_profiles
from planner.sweep import load_sweeps
from planner.whatif import WhatifResult, WhatifSettings, replay
from powerd.topology import Topology, load_budgets
from tests.planner.test_planner_report import A40, DEMO, write_inputs

KW_COLUMNS = ("limit_w", "budget_w", "demand_q_w", "demand_p50_w")


Placed = tuple[Topology, Placement, dict[str, WorkloadTrace]]


@pytest.fixture(scope="module")
def placed(tmp_path_factory: pytest.TempPathFactory) -> Placed:
    profiles, mix = write_inputs(tmp_path_factory.mktemp("plots-inputs"))
    top = load_budgets(DEMO)
    placement = place(top, load_mix(mix))
    traces = traces_from_profiles(read_profiles([profiles]), 1.0)
    return top, placement, traces


@pytest.fixture(scope="module")
def nodes(placed: Placed) -> pd.DataFrame:
    top, placement, traces = placed
    return budget_vs_demand(top, placement, traces, ReportSettings(samples=2000))


@pytest.fixture(scope="module")
def whatif(placed: Placed) -> WhatifResult:
    top, placement, traces = placed
    return replay(top, placement, traces, WhatifSettings(duration_s=30.0))


def markers_inside(fig: Figure, ax: Axes) -> list[str]:
    """Markers that reach past the top or bottom of the axes' frame, in pixels."""
    fig.canvas.draw()
    frame = ax.get_window_extent()
    out = []
    for line in ax.get_lines():
        if line.get_marker() in (None, "None", "", " "):
            continue
        half_px = line.get_markersize() * fig.dpi / 72 / 2
        points = np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float)
        for _, y_px in ax.transData.transform(points):
            if y_px + half_px > frame.y1 + 0.5 or y_px - half_px < frame.y0 - 0.5:
                out.append(
                    f"{line.get_label()} at {y_px:.0f} px, frame {frame.y0:.0f}-{frame.y1:.0f}"
                )
    return out


def test_budget_vs_demand_axes_hold_every_limit_budget_and_demand(nodes: pd.DataFrame):
    # the shipped demo: row1's demand passes its limit, the site's is just under it
    assert (nodes["demand_q_w"] > nodes["limit_w"]).any()
    fig = budget_vs_demand_figure(nodes)
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["site", "row", "rack"]
    for ax in axes:
        level = nodes[nodes["level"] == ax.get_title()]
        values_kw = level[list(KW_COLUMNS)].to_numpy(dtype=float).ravel() * 1e-3
        np.testing.assert_allclose(np.sort(plotted_y(ax)), np.sort(values_kw))
        bottom, top = ax.get_ylim()
        span = top - bottom
        assert bottom <= 0.0 and top >= values_kw.max() + 0.9 * HEADROOM * (values_kw.max())
        assert top - values_kw.max() >= 0.05 * span, ax.get_title()
        assert not markers_inside(fig, ax), markers_inside(fig, ax)
        # the limit is drawn over the demand: a demand next to it cannot hide it
        zorder = {line.get_label(): line.get_zorder() for line in ax.get_lines()}
        assert zorder["limit"] > zorder["demand, quantile"]


def test_capping_axes_hold_every_bar(whatif: WhatifResult):
    levels = whatif.levels
    assert (levels["capping_share_max"] > 0).any()  # this replay caps
    fig = capping_figure(levels)
    share, depth = fig.axes
    for ax, values in (
        (share, levels[["capping_share_mean", "capping_share_max"]].to_numpy().ravel() * 100),
        (depth, levels["cut_max_w"].to_numpy() * 1e-3),
    ):
        bottom, top = ax.get_ylim()
        assert bottom == 0.0 and top >= values.max() * (1 + 0.9 * HEADROOM)
        assert NO_CAPPING not in [t.get_text() for t in ax.texts]


def test_capping_without_capping_says_so_on_a_sensible_axis(whatif: WhatifResult):
    levels = whatif.levels.copy()
    for column in ("capping_share_mean", "capping_share_max", "cut_max_w"):
        levels[column] = 0.0
    fig = capping_figure(levels)
    share, depth = fig.axes
    assert share.get_ylim() == (0.0, 100.0)
    assert depth.get_ylim() == (0.0, 1.0)
    for ax in (share, depth):
        assert [t.get_text() for t in ax.texts] == [NO_CAPPING]
    assert share.get_legend() is None  # nothing to tell apart


def test_cap_curve_markers_are_inside_the_frame():
    columns = ZEUS_WORKLOAD_COLS.split(",")
    result = recommend(load_sweeps([A40], workload_cols=columns), 150.0)
    fig = caps_figure(result)
    for ax in fig.axes:
        values = plotted_y(ax)
        bottom, top = ax.get_ylim()
        assert bottom < values.min() and top > values.max()
        assert not markers_inside(fig, ax), markers_inside(fig, ax)
