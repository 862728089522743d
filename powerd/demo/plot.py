"""The demo's PNG: site and row power against budget and limit over time, phases shaded, and
the site's measured ramp against the grid spec."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from policies import grid as grid_measure
from policies.tree import ROW, SITE
from powerd.demo.summary import RAMP_WINDOW_S, RunRecord, regular_series

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PHASE_COLOURS = {
    "startup": "#9ecae1",
    "communication": "#c994c7",
    "checkpoint": "#fdae6b",
}
JOB_COLOURS = ("tab:blue", "tab:green", "tab:olive", "tab:cyan")  # not the phases' colours
MAX_ROW_PANELS = 4
PANEL_HEIGHT_IN = 2.6
HEADROOM = 0.06  # of a panel's span, above its highest line and below its lowest
LOCKS_HEIGHT = 0.5  # the clock-lock panel, as a share of a power panel's height


def _spans(phases: list[tuple[float, str]], end_s: float) -> list[tuple[float, float, str]]:
    """(start, end, phase) of every phase in a job's log."""
    out = []
    for k, (at, phase) in enumerate(phases):
        until = phases[k + 1][0] if k + 1 < len(phases) else end_s
        if until > at:
            out.append((at, until, phase))
    return out


def locked_share_pct(trace: RunRecord, job: int) -> np.ndarray:
    """Per sample, the share of the job's GPUs whose clock is locked, in % (0 to 100):
    the mean over the job's GPUs, not a sum."""
    mine = trace.gpu_job == job
    if not mine.any():
        return np.zeros(len(trace.t))
    locked: np.ndarray = np.asarray(trace.gpu_locked[:, mine], dtype=float).mean(axis=1) * 100
    return locked


def plot_trace(trace: RunRecord, path: str | Path, title: str = "powerd demo") -> Path:
    """Write the PNG; return its path. Uses matplotlib's Agg backend (no display needed)."""
    path = Path(path)
    fig = trace_figure(trace, title)
    import matplotlib.pyplot as plt  # after trace_figure chose the Agg backend

    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def trace_figure(trace: RunRecord, title: str = "powerd demo") -> Figure:
    """The figure :func:`plot_trace` writes: site, ramp, rows, caps, then clock locks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t = trace.t
    end_s = float(t[-1]) if len(t) else trace.duration_s
    rows = [k for k in np.flatnonzero(trace.level == ROW)]
    row_panels = [int(r) for r in rows] if len(rows) <= MAX_ROW_PANELS else []
    n_panels = 1 + 1 + (len(row_panels) if row_panels else 1) + 1 + 1
    heights = [1.0] * (n_panels - 1) + [LOCKS_HEIGHT]
    fig, axes = plt.subplots(
        n_panels,
        1,
        figsize=(11, PANEL_HEIGHT_IN * sum(heights)),
        sharex=True,
        constrained_layout=True,
        gridspec_kw={"height_ratios": heights},
    )
    # the jobs on each row (by where their GPUs are), for shading
    gpu_row = _gpu_row(trace)

    def shade(ax: Axes, jobs: list[int]) -> None:
        for k in jobs:
            for start, stop, phase in _spans(trace.jobs[k].phases, end_s):
                colour = PHASE_COLOURS.get(phase)
                if colour:
                    ax.axvspan(start, stop, color=colour, alpha=0.35, lw=0)

    def power_panel(ax: Axes, node: int, label: str, jobs: list[int]) -> None:
        shade(ax, jobs)
        ax.plot(t, trace.node_power_w[:, node] / 1e3, color="black", lw=1.2, label="power")
        ax.axhline(trace.budget_w[node] / 1e3, color="tab:orange", ls="--", lw=1, label="budget")
        ax.axhline(
            trace.cap_threshold_w[node] / 1e3,
            color="tab:orange",
            ls=":",
            lw=0.8,
            label="capping threshold",
        )
        ax.axhline(trace.limit_w[node] / 1e3, color="tab:red", lw=1.2, label="limit")
        ax.set_ylabel("kW")
        ax.set_title(label, loc="left", fontsize=10)
        ax.grid(alpha=0.3)
        headroom(ax)

    all_jobs = list(range(len(trace.jobs)))
    power_panel(axes[0], SITE, f"site {trace.names[SITE]}", [])
    axes[0].legend(loc="upper left", fontsize=8, ncol=4)
    ramp_panel(axes[1], trace)
    locks = axes[-1]
    axes = axes[1:-1]
    if row_panels:
        for ax, row in zip(axes[1:], row_panels, strict=False):
            jobs = [k for k in all_jobs if np.any((trace.gpu_job == k) & (gpu_row == row))]
            names = ", ".join(f"{trace.jobs[k].name} ({trace.jobs[k].priority})" for k in jobs)
            power_panel(ax, row, f"row {trace.names[row]}" + (f": {names}" if names else ""), jobs)
    else:  # many rows: every row's power as a fraction of its budget
        ax = axes[1]
        for r in rows:
            ax.plot(t, trace.node_power_w[:, r] / trace.budget_w[r], lw=0.8)
        ax.axhline(1.0, color="tab:orange", ls="--", lw=1)
        ax.set_ylabel("power / budget")
        ax.set_title("rows", loc="left", fontsize=10)
        headroom(ax)
    caps_panel(axes[-1], trace)
    locks_panel(locks, trace)
    handles = [Patch(color=c, alpha=0.35, label=p) for p, c in PHASE_COLOURS.items()]
    fig.legend(handles=handles, loc="outside upper right", ncol=3, fontsize=8, title="job phase")
    fig.suptitle(title, x=0.01, ha="left")
    return fig


def caps_panel(ax: Axes, trace: RunRecord) -> None:
    """Each job's mean GPU power cap over time."""
    for k in range(len(trace.jobs)):
        mine = trace.gpu_job == k
        if not mine.any() or not len(trace.t):
            continue
        colour = JOB_COLOURS[k % len(JOB_COLOURS)]
        cap_w = trace.gpu_cap_w[:, mine].mean(axis=1)
        ax.plot(trace.t, cap_w, lw=1.2, color=colour, label=f"{trace.jobs[k].name}: cap")
    ax.set_ylabel("mean cap, W per GPU")
    ax.set_title("GPU power caps, by job", loc="left", fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(loc="upper right", fontsize=8, ncol=2)


def locks_panel(ax: Axes, trace: RunRecord) -> None:
    """Each job's share of GPUs with a locked clock over time, on its own 0-100 % axis
    (it shared the caps' panel on a 0-400 % axis, to keep it under the caps' lines)."""
    for k in range(len(trace.jobs)):
        if not (trace.gpu_job == k).any() or not len(trace.t):
            continue
        share = locked_share_pct(trace, k)
        colour = JOB_COLOURS[k % len(JOB_COLOURS)]
        label = f"{trace.jobs[k].name}: GPUs clock-locked"
        ax.fill_between(trace.t, 0, share, color=colour, alpha=0.25, step="post", lw=0)
        ax.step(trace.t, share, where="post", color=colour, lw=1.2, label=label)  # overlaps
    ax.set_ylim(0, 100)
    ax.set_yticks([0, 50, 100])
    ax.set_ylabel("clock-locked,\n% of GPUs")
    ax.set_title("GPU clock locks, by job", loc="left", fontsize=10)
    ax.set_xlabel("seconds since the jobs' clock started")
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(loc="upper right", fontsize=8, ncol=2)


def ramp_panel(ax: Axes, trace: RunRecord) -> None:
    """The site's measured ramp over the grid spec's window (policies.grid, on the samples
    put on a regular step), with the spec's limits: what the grid sees."""
    spec = trace.grid
    window_s = spec.window_s if spec is not None else RAMP_WINDOW_S
    site = trace.node_power_w[:, SITE] if len(trace.t) else np.zeros(0)
    series, step = regular_series(trace.t, site)
    if step > 0 and len(series) > 1:
        rate = grid_measure.ramp_rates(series, step, window_s)
        w = grid_measure.window_steps(step, window_s)
        at = trace.t[0] + step * np.arange(w, w + len(rate))
        ax.plot(at, rate / 1e3, color="black", lw=1.0, label=f"site ramp over {window_s:g} s")
    for sign, limit in (
        (1.0, spec.ramp_up_w_per_s if spec is not None else math.inf),
        (-1.0, spec.ramp_down_w_per_s if spec is not None else math.inf),
    ):
        if math.isfinite(limit):
            ax.axhline(sign * limit / 1e3, color="tab:red", lw=1.2)
    ax.axhline(0.0, color="grey", lw=0.6)
    ax.set_ylabel("kW/s")
    limits = "" if spec is None or not spec.limits_ramp else " against the grid spec's limits"
    ax.set_title(f"site ramp{limits}", loc="left", fontsize=10)
    ax.grid(alpha=0.3)
    headroom(ax)


def headroom(ax: Axes, share: float = HEADROOM) -> None:
    """The y axis from below the lowest line drawn to above the highest, limits and budgets
    included, by ``share`` of the span: a limit is never on the panel's edge, where the
    frame hides it (matplotlib rescales for a horizontal line only when it is outside the
    bounds so far, which the power's own margin can put it just inside)."""
    values = [np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines()]
    finite = np.concatenate([v[np.isfinite(v)] for v in values]) if values else np.zeros(0)
    if not len(finite):
        return
    lo, hi = float(finite.min()), float(finite.max())
    pad = share * (hi - lo) if hi > lo else max(abs(hi) * share, 1.0)
    ax.set_ylim(lo - pad, hi + pad)


def _gpu_row(trace: RunRecord) -> np.ndarray:
    """The tree index of each GPU's row (-1 where the trace does not say)."""
    return trace.gpu_row if trace.gpu_row is not None else np.full(len(trace.gpu_job), -1)
