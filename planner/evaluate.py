"""How much work the same site power does under five provisioning strategies (pure).

A specification of ``powerplan evaluate`` (docs/EVALUATION.md shows it on the shipped sites).

**The same power.** Every strategy gets the same site power ``P``: the budgets
file's site ``limit_w``, the utility feed. The limit, not the budget: the feed
is what the site buys and may never exceed, while the budget is already a
choice of the oversubscribed strategy (where the controller starts capping,
below the feed). Provisioning at TDP or at a static cap guarantees the feed by
construction, so it may fill ``P`` to the watt. The site's own overhead
(cooling and conversion, the file's site ``overhead_w``) is taken as the
constant the file gives, the same in every strategy; ``P_it = P - site
overhead`` is what racks may use.

**A rack is the unit.** Every site is built from whole racks of the file's
shape (its servers, their GPUs, models and overheads, and the rack's own
overhead), in rows of the file's first row's rack count and overhead; a file
whose racks differ (in those, or in the limits, capping bands or ramps (c)
keeps) is refused. Rack budgets may differ (no strategy keeps them: (c) sizes
its own), so the file ``powerplan size`` wrote, a budget per rack, evaluates.
Per GPU, the non-GPU power that comes with it is then ``o = (node overheads +
rack overhead + row overhead / racks per row) / GPUs per rack``: 400 W on the
150 MW site (a 1 kW tray per 4 GB200, 10.8 kW of switches per 72), close to the
~360 W docs/PLANNER.md derives from Meta's figures.

**The strategies.**

- (a) *TDP provisioning*: ``R_a`` = the most racks whose power with every GPU
  at its TDP (``cap_max_w``), overheads in, fits ``P_it`` (each partly filled
  row adds its overhead); every GPU uncapped, no controller. Every node's
  limit and budget are what it draws at TDP, so nothing is ever over one.
- (b) *static caps*: the same at a cap ``c`` (``static_cap_w``; default the
  file's failsafe cap per model, the planning point: 960 W on the 150 MW
  site, Meta's 80 % of TDP), every GPU held at ``c`` throughout, no
  controller. ``powerplan caps`` recommends ``c`` from a cap sweep.
- (c) *oversubscription*: ``R_c`` = the most racks whose ``powerplan size`` plan
  at ``quantile`` (the stated risk: the share of time a node's uncapped demand
  is above its capping threshold) keeps every rack's, row's and the site's
  demand at that quantile within its limit (``planner.sizing.over_limit``
  empty: what `size` requires before it writes a file), and never fewer than
  ``R_b``: oversubscription is there to host more GPUs than a static cap. Its
  racks keep the file's limits, budgets, capping bands and ramps at every level
  (every row, full or not, the file's first row's: a row's breaker does not
  shrink with its racks), its site the feed ``P``; the mix is placed on the
  ``R_c`` racks by shares and their rack, row and site budgets and failsafe
  caps are sized as `size` sizes them (the file's own overheads, no terms).
  Replayed with powerd's dynamic capping (``policies.decide`` every step). If no
  count from ``R_b`` up has such a plan (on both shipped sites: their jobs'
  demand at the quantile, per GPU, is above (b)'s cap), (c) hosts ``R_b`` racks
  with the plan `size --allow-over-limit` writes, and the notes name the nodes
  only capping keeps within their breakers.

  *The search.* An empty ``over_limit`` is taken to be monotone in the rack
  count (more racks, more demand under the site and in the last row; a
  placement that moves a job's edge to another rack could break it, so the
  answer is always ``R_b`` or a count seen to fit). The first probe is the count
  just above the GPUs' mean demand plus overheads (:func:`mean_demand_w`: a
  quantile above the mean puts the answer below it); then bisection between
  ``R_b`` and the first count that fails, never past the most racks the feed
  holds with every GPU at its least cap, beyond which no failsafe cap exists.
  Each probe is one full sizing (``samples`` draws): on the 150 MW site a probe,
  the site built and sized, takes ~0.2 s, and the search (7 probes there) ~1.6 s
  of a ~40 s run, so fewer samples would buy little and add noise between the
  search and the plan. The file's own rack count is not replayed: at that count
  (c)'s plan is the file's planning choice, not the strategy's, and it is what
  made (c) host fewer GPUs than (b); the notes and ``file_gpus`` give it.
- (d) = (c) with the communication clock: every GPU of a job in a
  ``communication`` phase runs at its model's ``comm_clock_mhz`` (the
  budgets file), whose time and power relative to the highest clock come
  from a clock table (``powerd.gpu.clock_table``; measured on training
  steps, an assumption for communication). The phase draws ``power_rel``
  times its profiled power (in the replay, so the controller and the grid see
  it) and lasts ``1 + gpu_bound_share * (time_rel - 1)`` times as long
  (``stretch``): only the GPU-bound share of a communication phase slows with
  the clock; 1.0, the default, is the conservative bound (all of it). A job
  with ``communication_share`` of its steps in communication then does its
  work ``1 + communication_share * (stretch - 1)`` times slower. (c) and (e)
  are replayed with no clock effect at all.
- (e) = (c) with grid smoothing (``WhatifSettings(smoothing=True)``, as
  ``powerplan whatif --smoothing``), where the file has a ``[site.grid]``.

Each is replayed (``planner.whatif.replay``) for ``duration_s`` with the same
mix placed on its site (the mix must give shares: job sizes scale with the
site), the same profiles, seed and speed model (by default ``speed =
(power / demand) ** 0.28``, Meta's GB200 figure: a static cap costs nothing
in phases that draw less than it).

**What is reported**, per strategy: GPUs hosted (and racks; for (c) the racks
its search probed and how many nodes each had over a limit); cluster
throughput, ``sum over jobs of GPUs * (1 - throughput_lost) / slowdown``, in
GPUs at full speed (idle GPUs do no work), per MW of ``P`` and relative to
(a); site energy per GPU-hour of that work (mean measured site power, every
overhead in, over the throughput; for (d) the power is not lowered for the
stretched time, which errs high); the worst node's seconds above its limit,
per level and overall; the most-capping node's share of steps and the share
of steps a job has a GPU held below its demand (a static cap holds GPUs
without any node capping); the worst site ramp up and down over the grid
spec's window and the seconds outside the spec; for (e), the floor energy over
the least a causal floor burns and the work lost to the grid over the least any
schedule keeping its floors loses (``powerplan whatif``'s). For (d) against (c): the GPU
energy in communication phases (locked power over the stretched time), the
energy saved and the iteration time it costs.

**Where the model is an assumption.** The speed law (or a sweep); profiles
standing for every GPU of a job; a constant facility overhead; racks of one
shape, and (c)'s with the file's limits; the quantile's demand standing for the
risk (diversity only across jobs, as `size` models it); the clock table of a
training step standing for communication, and the GPU-bound share of a wait;
a replay of ``duration_s`` standing for the site's life.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from planner.demand import SpeedModel
from planner.evaluate_site import (
    STRATEGIES,
    EvaluateError,
    EvaluateSettings,
    Oversubscribed,
    oversubscribed_site,
    rack_shape,
    racks_of,
    racks_that_fit,
    site_power_w,
    static_caps,
    static_topology,
    tdp_caps,
)
from planner.mix import Mix, Placement, place
from planner.oracle import OracleResult, replay_oracle
from planner.sizing import (
    Sizing,
    WorkloadTrace,
)
from planner.whatif import WhatifResult, WhatifSettings, power_law_speed, replay
from policies import PolicySettings
from powerd.gpu.clock_table import ClockTable
from powerd.topology import Topology

W_PER_MW = 1e6
J_PER_KWH = 3.6e6


# --- the communication clock -------------------------------------------------------------


@dataclass(frozen=True)
class CommClock:
    """A model's communication clock and what it does to a communication phase."""

    model: str
    clock_mhz: float
    time_rel: float  # of a unit of GPU work at the clock, against the highest clock
    power_rel: float
    source: str

    def stretch(self, gpu_bound_share: float) -> float:
        """How much longer a communication phase lasts: only its GPU-bound share slows, and
        a clock measured faster than the highest (noise) is taken as no faster."""
        return 1.0 + gpu_bound_share * max(0.0, self.time_rel - 1.0)


def comm_clocks(top: Topology, tables: Mapping[str, ClockTable]) -> dict[str, CommClock]:
    """Per GPU model with a ``comm_clock_mhz`` in the file and a clock table: its clock."""
    out = {}
    for model in dict.fromkeys(top.server_model):
        clock = float(top.comm_clock_mhz.get(model, math.nan))
        table = tables.get(model)
        if table is None or not math.isfinite(clock):
            continue
        time_rel, power_rel = table.at(clock)
        out[model] = CommClock(model, clock, time_rel, power_rel, table.source)
    return out


# --- the evaluation ----------------------------------------------------------------------


@dataclass
class Plan:
    """One strategy, ready to replay."""

    key: str
    top: Topology
    placement: Placement
    settings: WhatifSettings
    cap: str  # how its GPUs are capped, in words
    stretch_by_model: dict[str, float] = field(default_factory=dict)


@dataclass
class Evaluation:
    table: pd.DataFrame  # one row per strategy replayed
    comm: dict[str, object]  # (d) against (c): the communication phases; {} without (d)
    levels: pd.DataFrame  # per strategy and level: the worst node's seconds above its limit
    notes: list[str]  # what was left out or bound, in words
    info: dict[str, object]
    results: dict[str, WhatifResult]
    site_w: float


def require_shares(mix: Mix) -> None:
    """Each strategy hosts a different number of GPUs, so jobs are sized by shares."""
    fixed = [job.name for job in mix.jobs if job.share is None]
    if fixed:
        raise EvaluateError(
            f"{mix.source}: job(s) {', '.join(fixed[:3])} give gpus; evaluate places the mix"
            " on sites of different sizes: give each job a share of the GPUs instead"
        )


def plans(
    top: Topology,
    mix: Mix,
    traces: dict[str, WorkloadTrace],
    settings: EvaluateSettings,
    clocks: Mapping[str, CommClock],
    notes: list[str],
) -> tuple[list[Plan], Oversubscribed]:
    """The strategies' sites, placements and replay settings (module docstring)."""
    require_shares(mix)
    shape = rack_shape(top)
    site_w = site_power_w(top)
    base = WhatifSettings(
        duration_s=settings.duration_s,
        seed=settings.seed,
        synchronised=settings.synchronised,
        policy=PolicySettings(safety_by_caps=settings.safety_by_caps),
    )
    out = []
    racks: dict[str, int] = {}
    for key, cap_w in (
        ("a", tdp_caps(shape)),
        ("b", static_caps(top, shape, settings.static_cap_w)),
    ):
        n_racks = racks[key] = racks_that_fit(shape, site_w, cap_w)
        if n_racks == 0:
            raise EvaluateError(
                f"{top.source}: not one rack fits the site's {site_w:,.0f} W at "
                f"{_caps_text(cap_w)} ({shape.rack_w(cap_w):,.0f} W a rack)"
            )
        site = static_topology(top, shape, n_racks, cap_w, STRATEGIES[key])
        # no controller: the replay's decisions only say which nodes draw over their capping
        # thresholds (the bands' test, as before safety by caps was the default); under
        # safety by caps a static site at its caps, its GPUs short of their demand, would
        # read as capping every step
        bands = PolicySettings(safety_by_caps=False)
        static = dataclasses.replace(base, static_caps=True, policy=bands)
        out.append(Plan(key, site, place(site, mix), static, _caps_text(cap_w)))
    found = oversubscribed_site(top, shape, mix, traces, settings, least_racks=racks["b"])
    sized_top, placement, sizing = found.site.top, found.site.placement, found.site.sizing
    notes.append(search_note(top, found, settings.quantile))
    failsafe = _caps_text(sizing.failsafe_cap_w)
    out.append(Plan("c", sized_top, placement, base, f"dynamic, failsafe {failsafe}"))
    if clocks:
        rel = {m: c.power_rel for m, c in clocks.items()}
        stretch = {m: c.stretch(settings.gpu_bound_share) for m, c in clocks.items()}
        locked = ", ".join(f"{m} {c.clock_mhz:g} MHz" for m, c in clocks.items())
        out.append(
            Plan(
                "d",
                sized_top,
                placement,
                dataclasses.replace(base, comm_power_rel=rel),
                f"dynamic, communication at {locked}",
                stretch,
            )
        )
    else:
        notes.append(
            "(d) left out: no GPU model of the site has both a comm_clock_mhz in the budgets"
            " file and a clock table"
        )
    if top.grid is not None and top.grid.can_smooth:
        smooth = dataclasses.replace(base, smoothing=True)
        out.append(Plan("e", sized_top, placement, smooth, "dynamic, grid smoothing"))
    else:
        notes.append("(e) left out: the budgets file has no [site.grid] with a ramp or a floor")
    return out, found


def search_note(top: Topology, found: Oversubscribed, quantile: float) -> str:
    """How (c)'s rack count was found, in words."""
    site = found.site
    probed = ", ".join(
        f"{n:,} {'fit' if over == 0 else f'({over} over)'}" for n, over in found.probes
    )
    what = (
        f"the most whose p{quantile * 100:g} plan keeps every rack, row and the site within"
        " its limit"
        if site.over_limit().empty
        else f"(b)'s, the least it may host: no count from it up has a p{quantile * 100:g} plan"
        " within every limit"
    )
    return (
        f"(c) hosts {site.racks:,} racks ({site.top.n_gpus:,} GPUs), {what}; (b)"
        f" {found.least_racks:,} racks, the file {racks_of(top):,}; racks probed:"
        f" {probed or 'none'}"
    )


def _caps_text(cap_w: Mapping[str, float]) -> str:
    return ", ".join(f"{m} {c:g} W" for m, c in cap_w.items())


def evaluate(
    top: Topology,
    mix: Mix,
    traces: dict[str, WorkloadTrace],
    settings: EvaluateSettings | None = None,
    clock_tables: Mapping[str, ClockTable] | None = None,
    speed: SpeedModel | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> Evaluation:
    """Every strategy replayed on the same site power (module docstring); ``clock_tables``
    per GPU model for (d); ``on_step(done, total)`` over all the replays' steps."""
    settings = settings or EvaluateSettings()
    speed = speed or power_law_speed()
    notes: list[str] = []
    clocks = comm_clocks(top, clock_tables or {})
    todo, found = plans(top, mix, traces, settings, clocks, notes)
    results: dict[str, WhatifResult] = {}
    step_s = next(iter(traces.values())).step_s
    n_steps = max(1, math.ceil(settings.duration_s / step_s))
    for k, plan in enumerate(todo):
        progress = None if on_step is None else _stage(on_step, k, n_steps, len(todo))
        results[plan.key] = replay(
            plan.top, plan.placement, traces, plan.settings, speed, on_step=progress
        )
    site_w = site_power_w(top)
    rows = [
        strategy_row(plan, results[plan.key], site_w, settings.gpu_bound_share) for plan in todo
    ]
    by_key = {plan.key: plan for plan in todo}
    progress = None if on_step is None else _stage(on_step, len(todo), n_steps, len(todo) + 1)
    oracle = replay_oracle(
        by_key["c"].top,
        by_key["c"].placement,
        traces,
        by_key["c"].settings,
        speed,
        settings.speed_exponent,
        on_step=progress,
    )
    rows.append(oracle_row(by_key["c"], oracle, site_w))
    table = pd.DataFrame(rows)
    through = dict(zip(table["strategy"], table["throughput_gpus"], strict=True))
    for other in ("b", "o"):
        table[f"vs_{other}"] = table["throughput_gpus"] / through[other]
    tdp = float(table.loc[table["strategy"] == "a", "throughput_gpus"].iloc[0])
    table.insert(
        table.columns.get_loc("throughput_per_mw") + 1,
        "gain_vs_tdp_pct",
        100.0 * (table["throughput_gpus"] / tdp - 1.0) if tdp > 0 else math.nan,
    )
    notes += _sizing_notes(found.site.sizing, settings)
    comm = (
        comm_summary(by_key["c"], results["c"], by_key["d"], results["d"], clocks, settings)
        if ("d" in results)
        else {}
    )
    info: dict[str, object] = {
        "site_power_w": site_w,
        "site_overhead_w": rack_shape(top).site_overhead_w,
        "overhead_w_per_gpu": rack_shape(top).overhead_w_per_gpu(),
        "duration_s": n_steps * step_s,
        "step_s": step_s,
        "seed": settings.seed,
        "synchronised": settings.synchronised,
        "quantile": settings.quantile,
        "file_gpus": top.n_gpus,
        "c_racks_probed": [{"racks": n, "nodes_over_limit": over} for n, over in found.probes],
        "speed_model": results["a"].info["speed_model"],
        "safety": "caps" if settings.safety_by_caps else "bands",
        "c_vs_b": float(through["c"] / through["b"]),
        "c_vs_o": float(through["c"] / through["o"]),
        "oracle_steps_solved": oracle.distinct_steps,
    }
    return Evaluation(table, comm, limit_levels(results), notes, info, results, site_w)


def _stage(
    on_step: Callable[[int, int], None], k: int, n_steps: int, stages: int
) -> Callable[[int, int], None]:
    """Replay ``k``'s progress as a share of every replay's steps."""

    def progress(done: int, _: int) -> None:
        on_step(k * n_steps + done, stages * n_steps)

    return progress


def _sizing_notes(sizing: Sizing, settings: EvaluateSettings) -> list[str]:
    table = sizing.table
    site = table.iloc[0]
    out = [
        f"(c) site sized at p{settings.quantile * 100:g}: demand {site['demand_q_w'] / 1e6:,.2f}"
        f" MW, budget {site['budget_w'] / 1e6:,.2f} MW (bound by its {site['bound']}); its"
        f" uncapped demand is above the capping threshold {site['capping_s_per_day']:,.0f} s"
        " a day"
    ]
    bound = table[(table["level"] != "site") & (table["bound"] == "limit")]
    if len(bound):
        out.append(
            f"(c) {len(bound)} row(s) and rack(s) have budgets bound by their limit: they cap"
            f" more than p{settings.quantile * 100:g} allows"
        )
    over = table[table["demand_q_w"] > table["limit_w"]]
    if len(over):
        out.append(
            f"(c) {len(over)} node(s) have demand at p{settings.quantile * 100:g} above their"
            " limit: only capping keeps them within their breakers"
        )
    return out


def job_stretch(plan: Plan) -> np.ndarray:
    """Per job, how much longer its communication phases last (1 without a clock)."""
    out = np.ones(len(plan.placement.jobs))
    for j, (first, _) in enumerate(plan.placement.job_servers):
        out[j] = plan.stretch_by_model.get(plan.top.server_model[int(first)], 1.0)
    return out


def job_throughput(plan: Plan, result: WhatifResult) -> np.ndarray:
    """Per job, GPUs at full speed: ``gpus * (1 - throughput_lost) / (1 + comm * (stretch
    - 1))``."""
    jobs = result.jobs
    comm_share = result.communication["communication_share"].to_numpy()
    slower = 1.0 + comm_share * (job_stretch(plan) - 1.0)
    done: np.ndarray = jobs["gpus"].to_numpy() * (1.0 - jobs["throughput_lost"].to_numpy()) / slower
    return done


def comm_energy_j(plan: Plan, result: WhatifResult) -> float:
    """GPU energy in communication phases over the replay, their stretch in."""
    comm = result.communication
    duration_s = float(result.info["duration_s"])  # type: ignore[arg-type]
    per_job = (
        result.jobs["gpus"].to_numpy()
        * comm["communication_share"].to_numpy()
        * comm["communication_w_per_gpu"].to_numpy()
        * job_stretch(plan)
    )
    return float(per_job.sum()) * duration_s


def strategy_row(
    plan: Plan, result: WhatifResult, site_w: float, gpu_bound_share: float
) -> dict[str, object]:
    """One strategy's numbers (module docstring, "What is reported")."""
    jobs = result.jobs
    gpus_busy = jobs["gpus"].to_numpy()
    throughput = float(job_throughput(plan, result).sum())
    site_mean_w = float(np.mean(result.site_power_w))
    grid = result.info["grid"]
    assert isinstance(grid, dict)
    levels = result.levels
    held = float((jobs["held_share"] * jobs["gpus"]).sum() / max(1, gpus_busy.sum()))
    outside = [grid.get(f"s_outside_ramp_{way}") for way in ("up", "down")]
    return {
        "strategy": plan.key,
        "name": STRATEGIES[plan.key],
        "gpus": plan.top.n_gpus,
        "racks": racks_of(plan.top),
        "busy_gpus": int(gpus_busy.sum()),
        "caps": plan.cap,
        "throughput_gpus": throughput,
        "throughput_per_mw": throughput / (site_w / W_PER_MW),
        "throughput_lost_pct": 100.0 * float(result.info["throughput_lost_site"]),  # type: ignore[arg-type]
        "site_mean_mw": site_mean_w / W_PER_MW,
        "kwh_per_gpu_hour": site_mean_w / throughput / 1e3 if throughput > 0 else math.nan,
        "s_above_limit": float(levels["s_above_limit_max"].max()),
        "capping_pct_of_steps_max": 100.0 * float(levels["capping_share_max"].max()),
        "held_pct_of_steps": 100.0 * held,
        "ramp_up_max_mw_per_s": float(grid["ramp_up_max_w_per_s"]) / W_PER_MW,
        "ramp_down_max_mw_per_s": float(grid["ramp_down_max_w_per_s"]) / W_PER_MW,
        "s_outside_ramp": sum(float(s) for s in outside if s is not None),
        "s_outside_oscillation": grid.get("s_outside_oscillation"),
        # grid smoothing's two costs against their bounds (powerd.topology.grid._lost_work)
        "floor_ratio_to_causal": grid.get("floor_ratio_to_causal"),
        "lost_ratio_at_floors": grid.get("lost_ratio_at_floors"),
    }


def oracle_row(plan_c: Plan, oracle: OracleResult, site_w: float) -> dict[str, object]:
    """(o)'s row: (c)'s site and jobs, the oracle's throughput and draw; no limit is ever
    passed (by construction), no controller caps, no grid measure."""
    busy = int(plan_c.placement.job_gpus.sum())
    thr = oracle.throughput_gpus
    return {
        "strategy": "o",
        "name": STRATEGIES["o"],
        "gpus": plan_c.top.n_gpus,
        "racks": racks_of(plan_c.top),
        "busy_gpus": busy,
        "caps": "each GPU its optimum under every limit, every step",
        "throughput_gpus": thr,
        "throughput_per_mw": thr / (site_w / W_PER_MW),
        "throughput_lost_pct": 100.0 * (1.0 - thr / busy) if busy else math.nan,
        "site_mean_mw": oracle.site_mean_w / W_PER_MW,
        "kwh_per_gpu_hour": oracle.site_mean_w / thr / 1e3 if thr > 0 else math.nan,
        "s_above_limit": 0.0,
        "capping_pct_of_steps_max": math.nan,
        "held_pct_of_steps": math.nan,
        "ramp_up_max_mw_per_s": math.nan,
        "ramp_down_max_mw_per_s": math.nan,
        "s_outside_ramp": math.nan,
        "s_outside_oscillation": None,
        "floor_ratio_to_causal": None,
        "lost_ratio_at_floors": None,
    }


def limit_levels(results: Mapping[str, WhatifResult]) -> pd.DataFrame:
    """Per strategy and level, the worst node's seconds above its limit (and uncapped)."""
    frames = []
    for key, result in results.items():
        levels = result.levels[["level", "s_above_limit_max", "s_above_limit_uncapped_max"]]
        frames.append(levels.assign(strategy=key))
    out = pd.concat(frames, ignore_index=True)
    return out[["strategy", "level", "s_above_limit_max", "s_above_limit_uncapped_max"]]


def comm_summary(
    plan_c: Plan,
    result_c: WhatifResult,
    plan_d: Plan,
    result_d: WhatifResult,
    clocks: Mapping[str, CommClock],
    settings: EvaluateSettings,
) -> dict[str, object]:
    """(d) against (c): the communication phases' energy and what the clock costs in time."""
    jobs = result_c.jobs
    weights = jobs["gpus"].to_numpy() / max(1, int(jobs["gpus"].sum()))
    job_comm = result_c.communication["communication_share"].to_numpy()
    comm_share = float(weights @ job_comm)
    before_j = comm_energy_j(plan_c, result_c)
    after_j = comm_energy_j(plan_d, result_d)
    slower = job_comm * (job_stretch(plan_d) - 1.0)
    thr_c = float(job_throughput(plan_c, result_c).sum())
    thr_d = float(job_throughput(plan_d, result_d).sum())
    return {
        "clocks": {
            m: {
                "clock_mhz": c.clock_mhz,
                "time_rel": c.time_rel,
                "power_rel": c.power_rel,
                "stretch": c.stretch(settings.gpu_bound_share),
                "table": c.source,
            }
            for m, c in clocks.items()
        },
        "gpu_bound_share": settings.gpu_bound_share,
        "communication_pct_of_steps": 100.0 * comm_share,
        "comm_energy_kwh_c": before_j / J_PER_KWH,
        "comm_energy_kwh_d": after_j / J_PER_KWH,
        "comm_energy_saved_kwh": (before_j - after_j) / J_PER_KWH,
        "comm_energy_saved_pct": 100.0 * (1.0 - after_j / before_j) if before_j > 0 else math.nan,
        "iteration_time_cost_pct": 100.0 * float(weights @ slower),
        "throughput_d_vs_c_pct": 100.0 * (thr_d / thr_c - 1.0) if thr_c > 0 else math.nan,
    }


def provisioning_gain(tdp_w: float, cap_w: float, overhead_w: float, speed: float) -> float:
    """(b) over (a) per site watt, without rounding to racks: ``(tdp + o) / (cap + o) *
    speed - 1``; 0.090 for Meta's GB200 (1200 -> 1000 W, o = 360 W, speed 0.95)."""
    return (tdp_w + overhead_w) / (cap_w + overhead_w) * speed - 1.0
