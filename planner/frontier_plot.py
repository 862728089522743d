"""``powerplan frontier --plot``: energy burnt against work lost, one curve per storage size."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from planner.frontier import SiteFrontier, Units
from planner.plots import DPI, _pyplot

if TYPE_CHECKING:
    from matplotlib.figure import Figure

X_LABEL = "energy burnt, kWh a day (floor + storage conversion losses)"
Y_LABEL = "work lost, GPU-hours a day (demand energy not served)"


def plot_frontier(frontiers: Sequence[SiteFrontier], units: Units, path: Path) -> None:
    """``frontier_figure`` written to ``path`` (PNG)."""
    fig = frontier_figure(frontiers, units)
    fig.savefig(path, dpi=DPI)
    _pyplot().close(fig)


def frontier_figure(frontiers: Sequence[SiteFrontier], units: Units) -> Figure:
    """Each storage size's frontier (its points joined: the frontier is piecewise linear
    between them), its knee marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for f in frontiers:
        s = f.sizing
        label = (
            "no storage"
            if s.kj_per_rack <= 0 or s.kw_per_rack <= 0
            else f"{s.kj_per_rack:g} kJ, {s.kw_per_rack:g} kW per rack"
        )
        loss_j = f.conversion_loss_j
        x = [units.kwh_per_day(p.floor_j + loss_j) for p in f.points]
        y = [units.gpu_hours_per_day(p.lost_j) for p in f.points]
        (line,) = ax.plot(x, y, marker="o", markersize=3, label=label)
        ax.plot(
            [units.kwh_per_day(f.knee.floor_j + loss_j)],
            [units.gpu_hours_per_day(f.knee.lost_j)],
            marker="D",
            color=line.get_color(),
            linestyle="none",
        )
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(Y_LABEL)
    ax.set_title("The cheapest ways to meet the grid's ramp limits (diamond: the knee)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(title="rack storage")
    fig.tight_layout()
    return cast("Figure", fig)
