"""The planner's PNG plots (matplotlib, no display): cap curves, power distributions, budgets.

Each function draws one figure from a result the planner already computed and
writes it to ``path``; none of them computes anything a table does not show.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from planner.caps import CapsResult
    from planner.sizing import WorkloadTrace

DPI = 110
MAX_LABELLED = 8  # more lines than this: no legend entry per line
EXCERPT_S = 600.0  # the power-over-time panel shows this much of each trace
HEADROOM = 0.08  # of an axis' span, beyond its highest (and lowest) point: no marker cut
NO_CAPPING = "no capping in this replay"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=DPI)
    _pyplot().close(fig)


def plotted_y(ax: Axes) -> np.ndarray:
    """Every y value the axes draws: its lines' and markers' points (axhline included),
    both ends of its bars."""
    values = [np.asarray(line.get_ydata(), dtype=float).ravel() for line in ax.get_lines()]
    for patch in ax.patches:
        y0, height = patch.get_y(), patch.get_height()  # type: ignore[attr-defined]
        values.append(np.array([y0, y0 + height], dtype=float))
    y = np.concatenate(values) if values else np.zeros(0)
    return y[np.isfinite(y)]


def fit_y(ax: Axes, bottom: float | None = None) -> None:
    """Y limits that hold everything the axes draws, :data:`HEADROOM` beyond its extremes
    so no marker is cut by the frame; ``bottom``: a floor to keep in view (0 for bars).

    Matplotlib's own margins are a share of the data's span, and ``set_ylim(bottom=0)``
    after plotting keeps a top computed for a narrower span: markers at the top (the
    highest demand, a limit) came out half cut."""
    y = plotted_y(ax)
    if bottom is not None:
        y = np.append(y, bottom)
    if not len(y):
        return
    lo, hi = float(y.min()), float(y.max())
    span = hi - lo or abs(hi) or 1.0
    below = 0.0 if bottom is not None and lo >= bottom else HEADROOM * span
    ax.set_ylim(lo - below, hi + HEADROOM * span)


def plot_caps(result: CapsResult, path: Path) -> None:
    """Throughput per provisioned W (relative to the max cap) against the cap, per GPU."""
    _save(caps_figure(result), path)


def caps_figure(result: CapsResult) -> Figure:
    """The figure :func:`plot_caps` writes."""
    plt = _pyplot()
    gpus = sorted(result.curves["gpu"].unique())
    fig, axes = plt.subplots(
        1, len(gpus), figsize=(5 * len(gpus), 4), squeeze=False, constrained_layout=True
    )
    best = result.per_workload.set_index(["gpu", "workload"])
    for ax, gpu in zip(axes[0], gpus, strict=True):
        curves = result.curves[result.curves["gpu"] == gpu]
        names = sorted(curves["workload"].unique())
        for name in names:
            c = curves[curves["workload"] == name]
            row = best.loc[(gpu, name)]
            ref = row["thr_per_mw_max_cap"]
            label = name if len(names) <= MAX_LABELLED else None
            (line,) = ax.plot(c["cap_w"], c["thr_per_mw"] / ref, lw=0.8, alpha=0.5, label=label)
            ax.plot(row["cap_w"], row["thr_per_mw"] / ref, "o", ms=3, color=line.get_color())
        mc = result.mix_curves[result.mix_curves["gpu"] == gpu]
        if len(mc):
            ref = mc["thr_per_mw"].iat[-1]
            ax.plot(mc["cap_w"], mc["thr_per_mw"] / ref, "k-", lw=2.5, label="mix")
            m = result.mix[result.mix["gpu"] == gpu].iloc[0]
            ax.plot(m["cap_w"], m["thr_per_mw"] / ref, "k*", ms=14, label=f"mix: {m['cap_w']:g} W")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_title(f"{gpu} ({len(names)} workloads), overhead {result.overhead_w:g} W")
        ax.set_xlabel("power cap, W")
        ax.set_ylabel("throughput per provisioned W / same at max cap")
        fit_y(ax)
        ax.legend(fontsize=7)
    return cast("Figure", fig)


def plot_power_distributions(
    table: pd.DataFrame, traces: dict[str, WorkloadTrace], path: Path, excerpt_s: float = EXCERPT_S
) -> None:
    """Left: per workload, the distribution (CDF) of per-GPU power samples. Right: each
    workload's job trace (mean per-GPU power, what sizing scales by a job's GPUs) over
    its first ``excerpt_s`` seconds: the synchronised swings a job's GPUs make together."""
    _save(power_distributions_figure(table, traces, excerpt_s), path)


def power_distributions_figure(
    table: pd.DataFrame, traces: dict[str, WorkloadTrace], excerpt_s: float = EXCERPT_S
) -> Figure:
    """The figure :func:`plot_power_distributions` writes."""
    plt = _pyplot()
    fig, (cdf, over_time) = plt.subplots(1, 2, figsize=(12, 4.2), constrained_layout=True)
    names = sorted(table["workload"].unique())
    for name in names:
        power = np.sort(table.loc[table["workload"] == name, "power_w"].to_numpy(dtype=float))
        share = np.arange(1, len(power) + 1) / len(power)
        label = name if len(names) <= MAX_LABELLED else None
        (line,) = cdf.plot(power, share, lw=1.2, label=label)
        trace = traces.get(name)
        if trace is not None:
            n = max(1, min(len(trace.power_w), int(excerpt_s / trace.step_s)))
            t = np.arange(n) * trace.step_s
            over_time.plot(t, trace.power_w[:n], lw=1.0, color=line.get_color(), label=label)
    cdf.set_xlabel("GPU power, W")
    cdf.set_ylabel("share of samples at or below")
    cdf.set_title(f"per-GPU power, {len(names)} workloads")
    cdf.grid(alpha=0.3)
    over_time.set_xlabel("seconds from the profile's start")
    over_time.set_ylabel("mean GPU power of the job, W")
    over_time.set_title("job traces (all GPUs of a job together)")
    over_time.grid(alpha=0.3)
    fit_y(over_time, bottom=0.0)
    if len(names) <= MAX_LABELLED:
        cdf.legend(fontsize=7)
    return cast("Figure", fig)


def plot_budget_vs_demand(nodes: pd.DataFrame, path: Path) -> None:
    """One panel per level (site, rows, racks): limit, budget and demand per tree node.

    ``nodes`` has ``name``, ``level``, ``limit_w``, ``budget_w`` and
    ``demand_p50_w``, ``demand_q_w`` (the sized quantile). Nodes are ordered
    by demand_q / budget, tightest on the right, so a level's worst case is
    where the eye ends.
    """
    _save(budget_vs_demand_figure(nodes), path)


def budget_vs_demand_figure(nodes: pd.DataFrame) -> Figure:
    """The figure :func:`plot_budget_vs_demand` writes."""
    plt = _pyplot()
    levels = [lv for lv in ("site", "row", "rack") if (nodes["level"] == lv).any()]
    fig, axes = plt.subplots(
        1, len(levels), figsize=(5 * len(levels), 4.2), squeeze=False, constrained_layout=True
    )
    for ax, level in zip(axes[0], levels, strict=True):
        lv = nodes[nodes["level"] == level]
        lv = lv.assign(tight=lv["demand_q_w"] / lv["budget_w"]).sort_values("tight")
        x = np.arange(len(lv))
        kw = 1e-3 if lv["limit_w"].max() < 2e6 else 1e-6
        unit = "kW" if kw == 1e-3 else "MW"
        few = len(lv) <= 40  # few nodes: one marker each, no lines between unrelated nodes
        # the limit last and on top, wider than the other markers: where the demand
        # passes the limit, the demand's marker would otherwise hide it
        series = (
            ("budget_w", "budget", "tab:blue", "s", 1.5, 8, 2),
            ("demand_q_w", "demand, quantile", "tab:red", "v", 1.2, 8, 2),
            ("demand_p50_w", "demand, median", "tab:orange", "o", 1.0, 8, 2),
            ("limit_w", "limit", "black", "_", 1.5, 18, 4),
        )
        for column, label, color, marker, lw, size, zorder in series:
            if few:
                ax.plot(
                    x,
                    lv[column] * kw,
                    ls="none",
                    marker=marker,
                    ms=size,
                    mew=2 if marker == "_" else 1,
                    color=color,
                    label=label,
                    zorder=zorder,
                )
            else:
                ax.plot(x, lv[column] * kw, lw=lw, color=color, label=label, zorder=zorder)
        if few:
            ax.set_xticks(x, lv["name"], rotation=60, ha="right", fontsize=7)
        else:
            ax.set_xlabel(f"{len(lv)} {level}s, by demand / budget")
        ax.set_ylabel(unit)
        fit_y(ax, bottom=0.0)
        ax.set_title(level)
        ax.grid(alpha=0.3)
    # one legend for every panel, outside them: inside, it hid nodes' markers
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncol=len(labels), fontsize=8)
    return cast("Figure", fig)


def plot_capping(levels: pd.DataFrame, path: Path) -> None:
    """From a whatif replay (its ``levels`` table): per level, how often its nodes capped
    (mean and worst node) and the deepest cut a node of the level made; says so when
    nothing capped."""
    _save(capping_figure(levels), path)


def capping_figure(levels: pd.DataFrame) -> Figure:
    """The figure :func:`plot_capping` writes."""
    plt = _pyplot()
    fig, (share, depth) = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    names = levels["level"].astype(str).tolist()
    x = np.arange(len(names))
    share.bar(x - 0.2, levels["capping_share_mean"] * 100, 0.4, label="mean node", color="tab:red")
    share.bar(x + 0.2, levels["capping_share_max"] * 100, 0.4, label="worst node", color="darkred")
    share.set_xticks(x, names)
    share.set_ylabel("% of steps capping")
    share.set_title("how often capping bites")
    depth.bar(x, levels["cut_max_w"] * 1e-3, color="tab:purple")
    depth.set_xticks(x, names)
    depth.set_ylabel("kW, largest cut one node made")
    depth.set_title("how deep")
    capped = bool((levels["capping_share_max"] > 0).any() or (levels["cut_max_w"] > 0).any())
    for ax, empty_top in ((share, 100.0), (depth, 1.0)):
        ax.grid(alpha=0.3, axis="y")
        if capped:
            fit_y(ax, bottom=0.0)
        else:  # a 0 to 100 % (0 to 1 kW) axis and the reason it is empty, not ±0.04
            ax.set_ylim(0.0, empty_top)
            ax.text(0.5, 0.5, NO_CAPPING, transform=ax.transAxes, ha="center", va="center")
    if capped:
        share.legend(fontsize=7)
    return cast("Figure", fig)


def plot_evaluation(
    table: pd.DataFrame,
    site_power_w: dict[str, np.ndarray],
    step_s: float,
    site_w: float,
    path: Path,
) -> None:
    """From ``powerplan evaluate``: left, each strategy's throughput per MW of the site's
    feed (its gain over TDP provisioning written on the bar); right, each strategy's
    measured site power over the replay, against the feed."""
    _save(evaluation_figure(table, site_power_w, step_s, site_w), path)


def evaluation_figure(
    table: pd.DataFrame, site_power_w: dict[str, np.ndarray], step_s: float, site_w: float
) -> Figure:
    """The figure :func:`plot_evaluation` writes."""
    plt = _pyplot()
    fig, (bars, power) = plt.subplots(1, 2, figsize=(12, 4.2), constrained_layout=True)
    keys = table["strategy"].astype(str).tolist()
    x = np.arange(len(keys))
    colors = [f"C{k}" for k in range(len(keys))]
    bars.bar(x, table["throughput_per_mw"], color=colors)
    for k, (value, gain) in enumerate(
        zip(table["throughput_per_mw"], table["gain_vs_tdp_pct"], strict=True)
    ):
        bars.text(k, value, f"{gain:+.1f} %", ha="center", va="bottom", fontsize=8)
    bars.set_xticks(
        x,
        [f"({k}) {n}" for k, n in zip(keys, table["name"], strict=True)],
        rotation=20,
        ha="right",
        fontsize=7,
    )
    bars.set_ylabel("GPUs at full speed per MW of the feed")
    bars.set_title("throughput per site MW (gain over TDP provisioning)")
    bars.grid(alpha=0.3, axis="y")
    fit_y(bars, bottom=0.0)
    mw = 1e-6
    for key, color in zip(keys, colors, strict=True):
        trace = site_power_w.get(key)
        if trace is None or not len(trace):
            continue
        t = np.arange(len(trace)) * step_s
        power.plot(t, trace * mw, lw=1.0, color=color, label=f"({key})")
    power.axhline(site_w * mw, color="black", lw=1.5, ls="--", label="feed (site limit)")
    power.set_xlabel("seconds of the replay")
    power.set_ylabel("measured site power, MW")
    power.set_title("site power, every overhead in")
    power.grid(alpha=0.3)
    fit_y(power)
    power.legend(fontsize=7)
    return cast("Figure", fig)
