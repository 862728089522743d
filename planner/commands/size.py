"""``powerplan size``: topology + workload mix + profiles -> a budgets file the controller loads."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import click
import pandas as pd

from planner.commands.options import demand_options, placed_inputs
from planner.output import column_mapping, emit, format_option, write_whole
from planner.sizing import REACTION_S
from policies.tree import RACK, ROW, SITE
from powerd.click_types import Fraction, Quantity
from powerd.topology import PLAUSIBLE_W

if TYPE_CHECKING:
    from planner.mix import Mix, Placement
    from planner.sizing import Sizing, SizingSettings, WorkloadTrace
    from planner.terms import NonGpuTerms
    from powerd.topology import Topology

HELP = """Size rack, row and site budgets and the failsafe caps from measured profiles.

\b
TOPOLOGY  a budgets file (docs/BUDGETS.md): the tree, its limits, node budgets,
          GPU models, capping bands and overheads; its budgets are replaced
PROFILES  profile files (.csv, .parquet, .lp; see `powerplan profiles --help`)
--mix     which jobs run: a TOML file of [[jobs]] tables
          workload = "<a workload of the profiles>", share = 0.25 (of the GPUs)
          or gpus = 4096, count = 2 (that many equal jobs), priority = "high"

\b
Method (docs/PLANNER.md):
- the GPUs of one synchronous job rise and fall together: a job is one
  correlated load, g GPUs times its profile's mean per-GPU power trace;
- jobs are not synchronised with each other: each runs from a random offset,
  and only that gives diversity; jobs fill whole nodes in topology order;
- every rack, row and the site is sized from the distribution of its
  aggregate (Monte Carlo over offsets, --samples values per node): the
  --quantile of its GPU power plus its non-GPU power is the demand, and the
  budget is demand / cap_threshold (capping starts only above the quantile),
  at most --max-budget-fraction of the limit. Tail: the empirical quantile
  when at least 10 distinct samples lie above it, else a generalised Pareto
  tail over the top 5 %; never above all GPUs at their maximum cap;
- the failsafe cap per GPU model is the largest at which every node, servers
  to the site, stays within its limit with all its GPUs at that cap;
- a sample held at a cap below its GPU's maximum says only demand >= draw:
  by default its demand is estimated from the uncensored samples of its
  workload and phase, else taken as the GPU's highest cap (--capped-demand).

\b
A tree of controllers (one leaf controller per row, a site coordinator): a
leaf that hears no grant holds its rows' file budgets, so these must sum to
at most site budget_w - site overhead_w / site cap_threshold, or a leaf
controller refuses the file. Rows sized each for its own quantile usually sum
above it; the output says whether the file fits. --tree scales every row's
budget by one common factor (whole watts, rounded down) so they fit; racks
and the site keep their sized budgets, and the coordinator grants rows more
at run time, up to their limits.

\b
Non-GPU power: each term unset keeps the topology's overheads.
  --node-w W               per node (CPUs, memory, NICs, fans), e.g. 1000
  --network-fraction F     switches / back-end network, share of rack IT power, e.g. 0.11
  --cooling-fraction F     site cooling and conversion, share of site IT power, e.g. 0.27
  --summer-rise F          cooling grows by this share in summer, e.g. 0.15
  --terms FILE             the same keys in a TOML file (flags win)

\b
Output: the budgets file (-o), written whole only when everything checked,
including that it loads back with the controller's loader; and per node the
sized demand, budget, tail model, sample size and risk: the share of time
(and seconds per day) the uncapped demand is above the capping threshold and
above the limit. Limits, node budgets and capping bands are the topology's.

\b
Examples:
  powerplan size powerd/data/budgets/tree-3rows.toml tests/data/profiles/telemetry.lp \\
      tests/data/profiles/train.csv --workload untagged --mix examples/planning/mix.toml \\
      -o sized.toml
  powerplan size powerd/data/budgets/tree-3rows.toml tests/data/profiles/telemetry.lp \\
      tests/data/profiles/train.csv --workload untagged --mix examples/planning/mix.toml \\
      -o tree.toml --tree --quantile 0.99 --summer-rise 0.15
"""


@dataclass
class Inputs:
    top: Topology
    mix: Mix
    placement: Placement
    traces: dict[str, WorkloadTrace]
    profiles: pd.DataFrame  # the mix's workloads' rows, demand as capped_demand made it
    warnings: list[str]  # the budgets file's (powerd.topology.checks.budget_warnings)
    capped: pd.DataFrame | None = None  # per workload, its capped samples (planner.censored)


def load_inputs(
    topology: Path,
    profiles: tuple[Path, ...],
    mix_path: Path,
    step_s: float,
    column_pairs: tuple[str, ...],
    workload: str | None,
    capped_demand: str = "as-is",
) -> Inputs:
    """Topology, mix, profiles -> placed jobs and their traces; a clear error for bad input.
    ``column_pairs``: the ``--column NAME=COLUMN`` options.

        What is out of proportion in the budgets file (a limit far above what its GPUs can
        draw, a budget below their lowest caps) is printed on stderr as ``warning: ...`` for
        every command that loads one here, and kept in ``Inputs.warnings``; so are the
        workloads with samples held at a cap (``planner.censored``), whose demand is what
        ``capped_demand`` makes of them (a mode of ``planner.censored.MODES``)."""
    from planner.censored import CensoredError, resolve
    from planner.errors import ProfileError
    from planner.mix import check_workloads, load_mix, place
    from planner.profiles import read_profiles
    from planner.sizing import traces_from_profiles
    from powerd.topology import BudgetError, load_budgets
    from powerd.topology.checks import budget_warnings

    try:
        top = load_budgets(topology)
        warnings = budget_warnings(top)
        echo_warnings(warnings)
        mix = load_mix(mix_path)
        table = read_profiles(
            list(profiles), columns=column_mapping(column_pairs) or None, workload=workload
        )
        check_workloads(mix, table["workload"].unique(), "the profiles " + _names(profiles))
        placement = place(top, mix)
        wanted = table[table["workload"].isin(mix.workloads)]
        resolved = resolve(wanted, capped_demand)
        echo_warnings([f"profiles {_names(profiles)}: {w}" for w in resolved.warnings])
        traces = traces_from_profiles(resolved.table, step_s)
    except CensoredError as exc:
        raise click.ClickException(f"profiles {_names(profiles)}: {exc}") from None
    except (BudgetError, ProfileError) as exc:
        raise click.ClickException(str(exc)) from None
    return Inputs(top, mix, placement, traces, resolved.table, warnings, resolved.shares)


def echo_warnings(warnings: list[str]) -> None:
    """Each on stderr as ``warning: ...``: stdout stays the command's output alone."""
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


def _names(paths: tuple[Path, ...]) -> str:
    shown = ", ".join(str(p) for p in paths[:3])
    return f"({shown}{', ...' if len(paths) > 3 else ''})"


def _rack_summary(racks: pd.DataFrame) -> pd.DataFrame:
    if racks.empty:
        return racks
    return pd.DataFrame(
        {
            "racks": [len(racks)],
            "budget_min_w": [racks["budget_w"].min()],
            "budget_median_w": [racks["budget_w"].median()],
            "budget_max_w": [racks["budget_w"].max()],
            "bound_by_limit": [int((racks["bound"] == "limit").sum())],
            "tail_models": [
                ", ".join(f"{k} {v}" for k, v in racks["tail_model"].value_counts().items())
            ],
            "capping_s_per_day_max": [racks["capping_s_per_day"].max()],
            "over_limit_s_per_day_max": [racks["over_limit_s_per_day"].max()],
        }
    )


def _levels(text: str) -> tuple[int, ...]:
    """``rack,row`` -> (RACK, ROW); a clear error for any other word."""
    from policies.tree import LEVEL_NAMES

    names = {LEVEL_NAMES[lvl]: lvl for lvl in (RACK, ROW, SITE)}
    words = [w.strip().lower() for w in text.split(",") if w.strip()]
    unknown = [w for w in words if w not in names]
    if unknown:
        raise click.BadParameter(
            f"{', '.join(unknown)}: levels are {', '.join(names)}", param_hint="--oversubscribe"
        )
    return tuple(sorted({names[w] for w in words}))


def _guarantees(table: pd.DataFrame, quantile: float, reaction_s: float) -> pd.DataFrame:
    """Per level: how many nodes the caps guarantee and how many are oversubscribed, by
    how much at most, with the band's margin (the level's rise within the reaction)."""
    rows = []
    for level, nodes in table.groupby("level", sort=False):
        band = nodes[nodes["guarantee"] == "band"]
        rows.append(
            {
                "level": level,
                "guaranteed_by_caps": int(len(nodes) - len(band)),
                "oversubscribed": len(band),
                "oversubscription_max_w": float(band["oversubscription_w"].max())
                if len(band)
                else 0.0,
                "oversubscription_max_pct": float(
                    (100 * band["oversubscription_w"] / band["limit_w"]).max()
                )
                if len(band)
                else 0.0,
                "rise_margin_max_w": float(band["rise_margin_w"].max()) if len(band) else 0.0,
                "rise_quantile": quantile if len(band) else math.nan,
                "reaction_s": reaction_s if len(band) else math.nan,
            }
        )
    return pd.DataFrame(rows)


def _guarantee_note(sized: Sizing, settings: SizingSettings) -> str:
    """One sentence: which levels the caps guarantee and which are oversubscribed."""
    from policies.tree import LEVEL_NAMES

    levels = [LEVEL_NAMES[lvl] for lvl in settings.oversubscribe]
    if not levels:
        return (
            "Every rack, row and the site is guaranteed by the caps in force (safety by caps:"
            " their caps plus overheads within their limits)."
        )
    table = sized.table
    band = table[table["guarantee"] == "band"]
    return (
        f"Oversubscribed ({', '.join(levels)}): {len(band)} node(s) whose caps"
        f" may sum beyond their limits, by up to {band['oversubscription_w'].max():,.0f} W,"
        f" each guarded by a band its p{settings.quantile * 100:g} rise within"
        f" {settings.reaction_s:g} s (up to {band['rise_margin_w'].max():,.0f} W)"
        " under its limit; the other levels are guaranteed by the caps in force."
        if len(band)
        else f"Oversubscribed ({', '.join(levels)}): none, their GPUs at"
        " their maximum caps fit their limits; every level is guaranteed by the caps in force."
    )


def _tree_fit(top: Topology, sized: Sizing, factor: float | None) -> dict[str, object]:
    """Whether the rows' budgets as written fit a tree of controllers' leaf pool: the
    numbers, and a note for people ('the rows' budgets sum to ...: fits'). ``factor``:
    what --tree scaled the rows by (None without --tree)."""
    from planner.sizing import sized_topology
    from powerd.topology.scope import leaf_pool_w, rows_budget_w, rows_within_site

    written = sized_topology(top, sized)
    total, pool = rows_budget_w(written), leaf_pool_w(written)
    fits = rows_within_site(written) is None
    fit = sized.info.get("tree", {})
    at_floor = list(fit.get("rows_at_floor", [])) if isinstance(fit, dict) else []
    sums = f"sum to {total / 1e3:,.1f} kW, the leaves may hold {pool / 1e3:,.1f} kW together"
    refused = (  # the budgets file does not say how many controllers run it: both cases
        "one controller for the whole site loads this file; a tree of controllers does not "
        "(its leaves would refuse it: powerplan size --tree sizes the rows within it)"
    )
    if factor is None:
        note = f"the rows' budgets {sums}: {'fits' if fits else refused}"
    elif factor == 1.0:
        note = f"the rows' budgets {sums}: fits as sized (--tree: factor 1, no row scaled)"
    else:
        before = float(fit["rows_budget_w_sized"]) if isinstance(fit, dict) else math.nan
        note = (
            f"the rows' budgets, scaled by {factor:.6g} (--tree) from {before / 1e3:,.1f} kW as "
            f"sized, {sums}: {'fits' if fits else 'does not fit'}; they are the leaves' "
            "fallback, the coordinator grants rows more, up to their limits"
        )
        if at_floor:
            least = f"{PLAUSIBLE_W[ROW][0]:,.0f} W"
            note += f"; held at the least row budget ({least}): {', '.join(at_floor)}"
    return {
        "rows_budget_w": total,
        "leaf_pool_w": pool,
        "fits": fits,
        "factor": factor,
        "rows_at_floor": at_floor,
        "note": note,
    }


def over_limit_message(over: pd.DataFrame, quantile: float, *, allowed: bool) -> str:
    """Which nodes' demand at the quantile is above their limit, by how much, and what to do
    (``over``: :func:`planner.sizing.over_limit`)."""
    shown = 5
    each = [
        f"{row.level} {row.name!r} {row.demand_q_w:,.0f} W > {row.limit_w:,.0f} W"
        f" (+{row.over_w:,.0f} W, +{100 * row.over_w / row.limit_w:.1f} %)"
        for row in over.head(shown).itertuples(index=False)
    ]
    more = f" and {len(over) - shown} more" if len(over) > shown else ""
    what = (
        "written anyway (--allow-over-limit)"
        if allowed
        else "not written; raise their limits, place fewer GPUs or lower-power jobs under"
        " them, or pass --allow-over-limit to write it anyway"
    )
    return (
        f"{len(over)} node(s) with p{quantile * 100:g} demand above their limit: "
        f"{', '.join(each)}{more}. Their budgets are held to --max-budget-fraction of the"
        f" limit, so more than {(1 - quantile) * 100:.3g} % of the time only capping keeps"
        f" them within their breakers. The budgets file is {what}."
    )


def _write_agent_failsafe(output: Path, caps_w: dict[str, float]) -> list[Path]:
    """Beside the budgets file, the agents' [failsafe] section per GPU model: the budgets
    file is the one source of failsafe caps, and the agents must hold what it plans."""
    written = []
    for model, cap_w in sorted(caps_w.items()):
        path = output.with_name(f"{output.stem}.agent-{model}.toml")
        text = (
            f"# The [failsafe] section of /etc/powerd/agent.toml for nodes with {model} GPUs,\n"
            f"# written by `powerplan size` with {output.name}: the cap every rack, row and the\n"
            "# site were proven to hold at. An agent holding more is flagged by the controller\n"
            "# (failsafe_over_plan) and counted at its own cap.\n"
            f"[failsafe]\ncap_w = {cap_w:g}\n"
        )
        write_whole(path, partial(Path.write_text, data=text, encoding="utf-8"))
        written.append(path)
    return written


@click.command(
    help=HELP, short_help="Topology + workload mix + profiles -> a budgets file for the controller."
)
@placed_inputs("topology")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The budgets file to write.",
)
@demand_options("Size each node for this quantile of its demand.")
@click.option(
    "--max-budget-fraction",
    type=Fraction(0.5, 1.0),
    default=0.95,
    show_default=True,
    help="A budget is at most this share of its limit.",
)
@click.option(
    "--terms",
    "terms_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Non-GPU power terms (TOML; above).",
)
@click.option(
    "--node-w",
    type=Quantity("W", 0),
    default=None,
    help="Per node: CPUs, memory, NICs, fans [default: --terms, else the topology's].",
)
@click.option(
    "--network-fraction",
    type=Fraction(0, 0.9),
    default=None,
    help="Switches and back-end network, a share of rack IT power "
    "[default: --terms, else the topology's].",
)
@click.option(
    "--cooling-fraction",
    type=Fraction(0, 5),
    default=None,
    help="Site cooling and conversion, a share of site IT power "
    "[default: --terms, else the topology's].",
)
@click.option(
    "--summer-rise",
    type=Fraction(0, 5),
    default=None,
    help="Cooling grows by this share in summer [default: --terms, else 0].",
)
@click.option(
    "--tree",
    is_flag=True,
    help="Size the rows for a tree of controllers: scale their budgets to fit the leaf pool.",
)
@click.option(
    "--oversubscribe",
    "oversubscribe",
    default="",
    metavar="LEVELS",
    help="Comma-separated levels (rack, row, site) whose caps may sum beyond their limits,"
    " a band on measured power guarding each: its margin the --quantile of the level's rise"
    " within --reaction-s. The others are guaranteed by the caps in force. [default: none]",
)
@click.option(
    "--reaction-s",
    type=Quantity("s", 0.01),
    default=REACTION_S,
    show_default=True,
    help="The controller's reaction, a rise to its cut in force (bench_scale measures it:"
    " p99 1.2-1.9 s at 20,736 nodes).",
)
@click.option(
    "--allow-over-limit",
    is_flag=True,
    help="Write the file even where a node's demand at --quantile is above its limit"
    " (a warning on stderr instead of an error).",
)
@format_option()
def command(
    topology: Path,
    profiles: tuple[Path, ...],
    mix_path: Path,
    output: Path,
    quantile: float,
    samples: int,
    step_s: float,
    seed: int,
    max_budget_fraction: float,
    terms_path: Path | None,
    node_w: float | None,
    network_fraction: float | None,
    cooling_fraction: float | None,
    summer_rise: float | None,
    column_pairs: tuple[str, ...],
    workload: str | None,
    tree: bool,
    oversubscribe: str,
    reaction_s: float,
    allow_over_limit: bool,
    capped_demand: str,
    fmt: str,
) -> None:
    from planner.sizing import SizingSettings

    if not output.parent.is_dir():
        raise click.BadParameter(f"{output.parent}: no such directory", param_hint="--output")
    levels = _levels(oversubscribe)
    terms = _load_terms(terms_path, node_w, network_fraction, cooling_fraction, summer_rise)
    inputs = load_inputs(
        topology, profiles, mix_path, step_s, column_pairs, workload, capped_demand
    )
    settings = SizingSettings(
        quantile=quantile,
        samples=samples,
        seed=seed,
        max_budget_fraction=max_budget_fraction,
        oversubscribe=levels,
        reaction_s=reaction_s,
    )
    sized, over, tree_doc, text = _size_and_write(
        topology, profiles, mix_path, inputs, terms, settings, tree, allow_over_limit
    )
    write_whole(output, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    agent_configs = _write_agent_failsafe(output, sized.failsafe_cap_w)
    extra = {
        "output": str(output),
        "failsafe_cap_w": sized.failsafe_cap_w,
        "agent_configs": [str(p) for p in agent_configs],
        **{k: v for k, v in sized.info.items() if k != "tree"},
        "terms": terms.describe(),
        "tree_of_controllers": tree_doc["note"],
        "over_limit": over["name"].tolist(),
        "guarantee": _guarantee_note(sized, settings),
        "capped_demand": capped_demand,
        "capped_samples": [] if inputs.capped is None else inputs.capped.to_dict("records"),
    }
    if fmt == "json":
        extra["tree"] = {k: v for k, v in tree_doc.items() if k != "note"}
    _emit_sizing(sized.table, _jobs_frame(inputs), quantile, reaction_s, fmt, extra)


def _load_terms(
    terms_path: Path | None,
    node_w: float | None,
    network_fraction: float | None,
    cooling_fraction: float | None,
    summer_rise: float | None,
) -> NonGpuTerms:
    """The non-GPU terms: --terms, each overridden by its own option."""
    from planner.errors import ProfileError
    from planner.terms import NonGpuTerms, load_terms

    try:
        terms = load_terms(terms_path) if terms_path else NonGpuTerms()
        return terms.merged(
            node_w=node_w,
            network_fraction=network_fraction,
            cooling_fraction=cooling_fraction,
            summer_rise=summer_rise,
        )
    except (ProfileError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


def _size_and_write(
    topology: Path,
    profiles: tuple[Path, ...],
    mix_path: Path,
    inputs: Inputs,
    terms: NonGpuTerms,
    settings: SizingSettings,
    tree: bool,
    allow_over_limit: bool,
) -> tuple[Sizing, pd.DataFrame, dict[str, object], str]:
    """The sizing, its nodes over their limits, the tree of controllers' fit and the budgets
    file's text; a node over its limit is an error unless ``allow_over_limit``."""
    from planner.budgets_toml import budgets_toml
    from planner.sizing import SizingError, fit_rows_to_leaf_pool, over_limit, size
    from powerd.topology import BudgetError

    quantile = settings.quantile
    try:
        sized = size(inputs.top, inputs.placement, inputs.traces, terms, settings)
        over = over_limit(sized.table)
        if len(over):
            problem = over_limit_message(over, quantile, allowed=allow_over_limit)
            if not allow_over_limit:
                raise click.ClickException(f"{topology}: {problem}")
            echo_warnings([f"{topology}: {problem}"])
        factor = None
        if tree:
            sized, factor = fit_rows_to_leaf_pool(inputs.top, sized)
        tree_doc = _tree_fit(inputs.top, sized, factor)
        header = [
            f"powerd budgets file written by `powerplan size` from {topology},",
            f"mix {mix_path}, profiles {_names(profiles)}.",
            f"Racks, rows and the site are sized for p{quantile * 100:g} of their demand"
            f" ({sized.info['samples_per_node']:,} samples per node, seed {settings.seed});",
            "failsafe caps keep every node within its limit. Method: docs/PLANNER.md.",
            *textwrap.wrap(_guarantee_note(sized, settings), width=86),
            *textwrap.wrap(f"Tree of controllers: {tree_doc['note']}.", width=86),
            "",
        ]
        text = budgets_toml(inputs.top, sized, header)
    except (SizingError, BudgetError) as exc:
        raise click.ClickException(f"{topology}: {exc}") from None
    return sized, over, tree_doc, text


def _jobs_frame(inputs: Inputs) -> pd.DataFrame:
    """The placed jobs: workload, GPUs, and their profile's length and GPUs."""
    jobs = inputs.placement.jobs
    return pd.DataFrame(
        {
            "job": [j.name for j in jobs],
            "workload": [j.workload for j in jobs],
            "gpus": inputs.placement.job_gpus,
            "profile_s": [inputs.traces[j.workload].duration_s for j in jobs],
            "profiled_gpus": [inputs.traces[j.workload].gpus for j in jobs],
        }
    )


def _emit_sizing(
    table: pd.DataFrame,
    jobs: pd.DataFrame,
    quantile: float,
    reaction_s: float,
    fmt: str,
    extra: dict[str, object],
) -> None:
    """The sizing as people read it (site and rows, guarantees, racks, jobs), or whole."""
    if fmt != "table":
        emit({"nodes": table, "jobs": jobs}, fmt, extra=extra)
        return
    upper = table[table["level"] != "rack"]
    racks = table[table["level"] == "rack"]
    worst = racks.sort_values("capping_s_per_day", ascending=False).head(10)
    short = [
        "name",
        "level",
        "gpus",
        "jobs",
        "limit_w",
        "demand_q_w",
        "budget_w",
        "bound",
        "tail_model",
        "n_eff",
        "capping_s_per_day",
        "over_limit_s_per_day",
    ]
    emit(
        {
            "site and rows": upper[short],
            "guaranteed by caps or oversubscribed": _guarantees(table, quantile, reaction_s),
            "racks": _rack_summary(racks),
            "racks with the most capping": worst[short],
            "jobs": jobs,
        },
        fmt,
        extra=extra,
    )
