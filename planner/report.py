"""What ``powerplan report`` says: the numbers of size, whatif and caps, as one document.

Nothing here is a new method: the demand of every site, row and rack comes
from :func:`planner.sizing.size` (its quantile and its median, from the same
Monte Carlo draws), how often capping
bites from :func:`planner.whatif.replay` at the budgets of the file, and the
cap curves from :func:`planner.caps.recommend`. This module puts them side by
side against the budgets file under review and says, in words, where demand
crosses a budget or a limit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from planner.demand import SpeedModel
from planner.mix import Placement
from planner.profiles import SWING_SHARE
from planner.report_doc import Document
from planner.sizing import SizingSettings, WorkloadTrace, size
from planner.sweep import foreign_sweeps, sweep_label_warnings
from planner.whatif import WhatifResult, WhatifSettings, grid_table, replay, site_limit_w
from policies.causes import largest_causes
from policies.tree import SERVER
from powerd.topology import Topology
from powerd.topology.checks import budget_warnings
from powerd.units import fmt_kw_or_mw

if TYPE_CHECKING:
    from planner.caps import CapsResult

MAX_TABLE_ROWS = 40  # longer tables show the tightest rows and say how many are left out
PLOTS = {
    "power": "power_distributions.png",
    "budgets": "budget_vs_demand.png",
    "capping": "capping.png",
    "caps": "cap_curves.png",
}
# The replay's shares, shown as percentages: one unit for capping (and what it costs)
# everywhere in the report, its summary, its tables and capping.png's "% of steps" axis.
PERCENT_COLUMNS = {
    "capping_share_mean": "capping_pct_of_steps_mean",
    "capping_share_max": "capping_pct_of_steps_max",
    "held_share": "held_pct_of_steps",
    "gpus_held_share": "gpus_held_pct_of_gpu_steps",
    "ramp_held_share": "ramp_held_pct_of_steps",
    "throughput_lost": "throughput_lost_pct",
}
LOST_PREFIX = "lost_"  # the replay's throughput lost per cause (lost_capping, ...): + "_pct"


@dataclass(frozen=True)
class ReportSettings:
    quantile: float = 0.999
    samples: int = 100_000
    seed: int = 0
    whatif_s: float = 600.0  # 0: no replay
    overhead_w: float | None = None  # for the cap curves: needed with a sweep, no default


@dataclass
class Report:
    document: Document
    figures: dict[str, Callable[[Path], None]]  # file name -> draws it there
    nodes: pd.DataFrame  # site, rows, racks: limit, budget, demand
    whatif: WhatifResult | None
    # cross-checks of the inputs the report found (a sweep of GPUs this site does not
    # have, ...), also in the document: for the command to repeat on stderr
    warnings: list[str]


def budget_vs_demand(
    top: Topology,
    placement: Placement,
    traces: dict[str, WorkloadTrace],
    settings: ReportSettings,
) -> pd.DataFrame:
    """Per site, row and rack: the file's limit and budget against the sized demand.

    ``demand_p50_w`` and ``demand_q_w`` are the median and the ``quantile`` of
    the node's demand (GPU and non-GPU power, the file's overheads), from the
    same draws; ``sized_budget_w`` is what ``powerplan size`` would set;
    ``demand_q_pct_of_budget`` above the node's cap_threshold (as a percentage)
    means the node caps more often than 1 - quantile (``demand_q_above_threshold``).
    ``samples`` is the Monte Carlo values per node the sizing drew (at most
    ``settings.samples``: a whole number of windows, within a memory bound).
    """
    settings_q = SizingSettings(
        quantile=settings.quantile, samples=settings.samples, seed=settings.seed
    )
    sized = size(top, placement, traces, settings=settings_q)
    high = sized.table
    view = np.arange(top.level_start[SERVER])
    budget_w = np.asarray(top.budget_w, dtype=float)[view]
    threshold_w = budget_w * np.asarray(top.cap_threshold, dtype=float)[view]
    return pd.DataFrame(
        {
            "name": high["name"],
            "level": high["level"],
            "gpus": high["gpus"],
            "jobs": high["jobs"],
            "limit_w": high["limit_w"],
            "budget_w": budget_w,
            "demand_p50_w": sized.demand_p50_w[view],
            "demand_q_w": high["demand_q_w"],
            "demand_q_pct_of_budget": 100 * high["demand_q_w"] / budget_w,
            "demand_q_above_threshold": high["demand_q_w"] > threshold_w,
            "headroom_to_limit_w": high["limit_w"] - high["demand_q_w"],
            "sized_budget_w": high["budget_w"],
            "tail_model": high["tail_model"],
            "n_eff": high["n_eff"],
            "samples": high["samples"],
        }
    )


def _tightest(frame: pd.DataFrame, by: str, n: int = MAX_TABLE_ROWS) -> tuple[pd.DataFrame, int]:
    if len(frame) <= n:
        return frame, 0
    return frame.sort_values(by, ascending=False).head(n), len(frame) - n


def _causes(whatif: WhatifResult) -> str:
    """' (staged phase 4.3 %, capping 1.0 %)': the causes of the site's lost throughput
    that cost anything, largest first (policies.causes); empty when nothing was lost."""
    by_cause = whatif.info["throughput_lost_site_by_cause"]
    assert isinstance(by_cause, dict)
    parts = largest_causes(by_cause)
    return f" ({', '.join(f'{c} {_pct(v)}' for c, v in parts)})" if parts else ""


def _pct(share: float) -> str:
    return f"{share * 100:.3g} %"


def _percent_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """The replay's shares as percentages (:data:`PERCENT_COLUMNS`, ``lost_*``), renamed
    to say so; other columns as they are."""
    names = {
        c: PERCENT_COLUMNS.get(c, f"{c}_pct" if c.startswith(LOST_PREFIX) else c)
        for c in frame.columns
    }
    shown = frame.rename(columns=names)
    for old, new in names.items():
        if new != old:
            shown[new] = 100 * frame[old]
    return shown


def _failsafe(top: Topology) -> pd.DataFrame:
    servers = pd.DataFrame(
        {
            "model": list(top.server_model),
            "gpus": top.server_gpu_count,
            "failsafe_cap_w": top.server_failsafe_cap_w,
        }
    )
    return (
        servers.groupby("model", sort=True)
        .agg(
            gpus=("gpus", "sum"),
            failsafe_cap_min_w=("failsafe_cap_w", "min"),
            failsafe_cap_max_w=("failsafe_cap_w", "max"),
        )
        .reset_index()
    )


def _summary(
    nodes: pd.DataFrame,
    q: float,
    whatif: WhatifResult | None,
    caps_mix: pd.DataFrame | None,
    foreign: dict[str, str],
) -> list[str]:
    """The summary's sentences; no cap for a GPU in ``foreign`` (not this site's)."""
    qname = _qname(q)
    site = nodes.iloc[0]
    kw = fmt_kw_or_mw
    items = [
        f"Site {site['name']}: limit {kw(site['limit_w'])}, budget {kw(site['budget_w'])};"
        f" demand median {kw(site['demand_p50_w'])}, {qname} {kw(site['demand_q_w'])}"
        f" ({site['demand_q_pct_of_budget']:.0f} % of the budget). `powerplan size` would set"
        f" {kw(site['sized_budget_w'])}."
    ]
    for level in ("row", "rack"):
        lv = nodes[nodes["level"] == level]
        if lv.empty:
            continue
        over_threshold = int(lv["demand_q_above_threshold"].sum())
        over_limit = int((lv["headroom_to_limit_w"] < 0).sum())
        items.append(
            f"{len(lv)} {level}s: {over_threshold} with {qname} demand above the capping"
            f" threshold of their budget, {over_limit} above their limit; tightest"
            f" {lv.loc[lv['demand_q_pct_of_budget'].idxmax(), 'name']} at"
            f" {lv['demand_q_pct_of_budget'].max():.0f} % of its budget."
        )
    if whatif is not None:
        levels = whatif.levels.set_index("level")
        bites = ", ".join(
            f"{lv} {_pct(levels.loc[lv, 'capping_share_mean'])} of steps"
            for lv in ("site", "row", "rack")
            if lv in levels.index
        )
        above = levels["s_above_limit_total"].sum() if "s_above_limit_total" in levels else 0.0
        items.append(
            f"Replayed {whatif.info['duration_s']:g} s through the controller's policy: steps"
            f" capping (mean node) {bites}; throughput lost site-wide"
            f" {_pct(float(str(whatif.info['throughput_lost_site'])))}{_causes(whatif)};"
            f" node-seconds above a limit {above:g}."
        )
    if caps_mix is not None and len(caps_mix):
        for row in caps_mix.itertuples(index=False):
            if row.gpu in foreign:  # said among the warnings: no cap of it is this site's
                continue
            items.append(
                f"{row.gpu}: cap {row.cap_w:g} W of {row.max_cap_w:g} W gives"
                f" {row.gain_pct:+.1f} % throughput per MW for the sweep's workload mix."
            )
    return items


def _grid_section(doc: Document, grid: dict[str, object], site_w: float) -> None:
    """The replayed site power as the grid sees it (planner.whatif.grid_table)."""
    doc.heading("The site as the grid sees it")
    if not grid.get("measured"):
        doc.paragraph("The replay was too short to measure the site's ramps.")
        return
    note = grid.get("oscillation_note") or "the whole band is seen"
    doc.paragraph(
        f"The replayed site power against the budgets file's grid spec ({grid['spec']}),"
        " measured as in docs/BUDGETS.md (policies.grid): the ramp over the spec's window,"
        f" the share of the power's variance in the oscillation band ({note}), the seconds"
        " outside each limit, what holding the spec's floor would burn, and the least any"
        " floor could burn to keep the ramp limits (policies.grid.least_ramp_floor)."
        " `powerplan whatif --synchronised --smoothing` replays the same with the GPUs"
        " held to their share of the limits, and says what that burns; with"
        " --storage-kj-per-rack, what rack energy storage would take instead."
    )
    breaches = grid.get("breaches")
    if isinstance(breaches, list) and breaches:
        doc.bullets([f"outside the grid spec: {b}" for b in breaches])
    doc.table(grid_table(grid, site_w))


def build(
    *,
    top: Topology,
    placement: Placement,
    traces: dict[str, WorkloadTrace],
    profiles: pd.DataFrame,
    sources: dict[str, str],
    settings: ReportSettings,
    speed: SpeedModel | None = None,
    sweep: pd.DataFrame | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> Report:
    """Every number and plot of the report; ``sources`` names the inputs (shown as given);
    ``on_step`` follows the replay (a progress bar)."""
    from planner.caps import recommend

    q = settings.quantile
    doc = Document("Power plan report")
    figures: dict[str, Callable[[Path], None]] = {}
    nodes = budget_vs_demand(top, placement, traces, settings)
    whatif = None
    if settings.whatif_s > 0:
        whatif = replay(
            top,
            placement,
            traces,
            WhatifSettings(duration_s=settings.whatif_s, seed=settings.seed),
            speed,
            on_step=on_step,
        )
        from planner.frontier import replay_position

        where = replay_position(top, whatif)
        if where is not None:  # where the site sits against `powerplan frontier`'s frontier
            whatif.info["frontier"] = where
    caps = None
    if sweep is not None:
        if settings.overhead_w is None:
            raise ValueError("a cap sweep needs overhead_w: it decides the best cap")
        caps = recommend(sweep, settings.overhead_w)
    site_models = sorted(set(top.server_model))
    foreign: dict[str, str] = {}
    sweep_warnings: list[str] = []
    if sweep is not None:
        labels = [str(g) for g in sweep["gpu"].unique()]
        foreign = foreign_sweeps(labels, site_models)
        sweep_warnings = [*foreign.values(), *sweep_label_warnings(sweep)]

    doc.paragraph(
        " ".join(f"{key}: {value}." for key, value in sources.items())
        + f" Demand quantile {_qname(q)}, {int(nodes['samples'].iat[0]):,} Monte Carlo samples"
        f" per node, seed {settings.seed}. Method: docs/PLANNER.md."
    )
    doc.heading("Summary")
    checks = [f"Warning: {w}" for w in [*budget_warnings(top), *sweep_warnings]]
    doc.bullets(
        checks + _summary(nodes, q, whatif, caps.mix if caps is not None else None, foreign)
    )
    _workloads_section(doc, figures, profiles, traces)
    _budgets_section(doc, figures, top, nodes, q)
    if whatif is not None:
        _capping_section(doc, figures, whatif)
    if caps is not None:
        _caps_section(doc, figures, caps, settings, site_models, foreign, sweep_warnings)
    _method_section(doc, nodes)
    return Report(doc, figures, nodes, whatif, sweep_warnings)


def _qname(q: float) -> str:
    """The demand quantile's name: p99.9."""
    return f"p{q * 100:g}"


def _workloads_section(
    doc: Document,
    figures: dict[str, Callable[[Path], None]],
    profiles: pd.DataFrame,
    traces: dict[str, WorkloadTrace],
) -> None:
    from planner import plots
    from planner.profiles import summarise

    doc.heading("Workloads")
    doc.paragraph(
        "Per-GPU power of each profiled workload, and the aggregate of its profiled GPUs"
        " (which rise and fall together): peak_to_mean is the aggregate's p99 over its mean;"
        " swings counts steps where the aggregate moves by more than"
        f" {SWING_SHARE * 100:g} % of its mean from one sample to the next."
    )
    summary = summarise(profiles)
    keep = [
        c
        for c in summary.columns
        if c in ("workload", "gpus", "duration_s", "mean_w", "p50_w", "p99_w", "max_w")
        or c in ("peak_to_mean", "swings", "max_swing_w_per_s")
        or c.startswith("share_")
    ]
    doc.table(summary[keep])
    figures[PLOTS["power"]] = lambda path: plots.plot_power_distributions(profiles, traces, path)
    doc.image(PLOTS["power"], "per-GPU power distributions and job traces")


def _budgets_section(
    doc: Document,
    figures: dict[str, Callable[[Path], None]],
    top: Topology,
    nodes: pd.DataFrame,
    q: float,
) -> None:
    from planner import plots

    doc.heading("Budgets against demand")
    doc.paragraph(
        f"The budgets file's limit and budget per site, row and rack against the demand of"
        f" its placed jobs (median and {_qname(q)}, GPU and non-GPU power). A"
        f" demand_q_pct_of_budget above the node's capping threshold ({_thresholds(top)} of"
        f" its budget) means the controller caps that node more often than {_pct(1 - q)} of"
        f" the time; headroom_to_limit_w below 0 means even the sized quantile is above the"
        f" breaker and only capping keeps it in."
    )
    shown = [
        "name",
        "gpus",
        "jobs",
        "limit_w",
        "budget_w",
        "demand_p50_w",
        "demand_q_w",
        "demand_q_pct_of_budget",
        "headroom_to_limit_w",
        "sized_budget_w",
        "tail_model",
        "n_eff",
    ]
    for level, title in (("site", "site"), ("row", "rows"), ("rack", "racks")):
        lv = nodes[nodes["level"] == level]
        if lv.empty:
            continue
        part, left = _tightest(lv, "demand_q_pct_of_budget")
        caption = title + (f": the {len(part)} tightest, {left} more not shown" if left else "")
        doc.table(part[shown], caption)
    figures[PLOTS["budgets"]] = lambda path: plots.plot_budget_vs_demand(nodes, path)
    doc.image(PLOTS["budgets"], "limit, budget and demand per site, row and rack")
    doc.paragraph("Failsafe caps in the file (what agents apply alone):")
    doc.table(_failsafe(top))


def _capping_section(
    doc: Document, figures: dict[str, Callable[[Path], None]], whatif: WhatifResult
) -> None:
    from planner import plots

    doc.heading("How often capping bites")
    doc.paragraph(
        f"The placed jobs' profiles replayed for {whatif.info['duration_s']:g} s"
        f" (step {whatif.info['step_s']:g} s) through policies.decide, the controller's"
        " own function, at the file's budgets; a synchronous job runs at its slowest"
        " GPU's pace. Capping and what it costs are percentages: capping_pct_of_steps"
        " of the replay's steps in which a node capped (mean and worst node of each"
        " level), held_pct_of_steps of the steps in which any GPU of a job drew below"
        " its demand, gpus_held_pct_of_gpu_steps of its GPUs held in a mean step,"
        " throughput_lost_pct and lost_<cause>_pct of the job's throughput."
    )
    doc.table(_percent_columns(whatif.levels), "per level (node = server)")
    jobs, left = _tightest(whatif.jobs, "throughput_lost")
    doc.table(
        _percent_columns(jobs),
        "jobs" + (f": the {len(jobs)} that lost most, {left} more" if left else ""),
    )
    figures[PLOTS["capping"]] = lambda path: plots.plot_capping(whatif.levels, path)
    doc.image(PLOTS["capping"], "% of steps capping and deepest cut per level")
    _grid_section(doc, whatif.info["grid"], site_limit_w(whatif))  # type: ignore[arg-type]
    where = whatif.info.get("frontier")
    if isinstance(where, dict):
        from planner.frontier import position_line

        doc.paragraph(f"Against `powerplan frontier`'s frontier, the site {position_line(where)}.")


def _caps_section(
    doc: Document,
    figures: dict[str, Callable[[Path], None]],
    caps: CapsResult,
    settings: ReportSettings,
    site_models: list[str],
    foreign: dict[str, str],
    sweep_warnings: list[str],
) -> None:
    from planner import plots

    doc.heading("Cap curves")
    doc.paragraph(
        f"Throughput per provisioned watt against the GPU power cap, each GPU provisioned"
        f" at its cap plus {settings.overhead_w:g} W that does not scale with it; the"
        " recommended cap is the measured cap with the most throughput per MW (ties to"
        f" the higher cap), for the GPU models this site has ({', '.join(site_models)};"
        " column site_has_gpu). A sweep of another GPU is shown for reference, not as this"
        " site's cap: where throughput per watt peaks depends on the chip (its clocks,"
        " memory and voltage curve), and scaling one GPU's curve by the other's cap"
        " range would be a guess."
    )
    if caps.warnings or sweep_warnings:
        doc.bullets([*sweep_warnings, *caps.warnings])
    mix = caps.mix.assign(site_has_gpu=[g not in foreign for g in caps.mix["gpu"]])
    doc.table(mix, "per GPU, its sweep's workloads weighted equally")
    per, left = _tightest(caps.per_workload, "gain_pct")
    cols = ["gpu", "workload", "cap_w", "max_cap_w", "speed_vs_max", "gain_pct"]
    doc.table(per[cols], "per workload" + (f": the {len(per)} largest gains" if left else ""))
    figures[PLOTS["caps"]] = lambda path: plots.plot_caps(caps, path)
    doc.image(PLOTS["caps"], "throughput per provisioned W against the cap")


def _method_section(doc: Document, nodes: pd.DataFrame) -> None:
    doc.heading("Method and limits")
    doc.bullets(
        [
            "A job's GPUs are one correlated load (its profile's mean per-GPU trace times its"
            " GPUs); jobs run from independent random offsets, the only source of diversity.",
            f"Demand quantiles are empirical where at least {SizingSettings().min_tail_points}"
            " distinct samples lie above them, else a generalised Pareto tail (tail_model);"
            " n_eff is the number of distinct samples, so a rack inside one job resolves no"
            f" finer than 1/n_eff (here {int(nodes['n_eff'].min()):,} at the least).",
            "Profiles wrap around: a profile shorter than a job's life repeats; phases a"
            " profile never saw (a start, a checkpoint) are not in the demand.",
        ]
    )


def _thresholds(top: Topology) -> str:
    """The capping thresholds of the site, rows and racks, as percentages of budget."""
    view = np.asarray(top.cap_threshold, dtype=float)[: top.level_start[SERVER]]
    lo, hi = float(view.min()), float(view.max())
    return f"{lo * 100:g} %" if lo == hi else f"{lo * 100:g} to {hi * 100:g} %"
