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
whose racks differ (in those, or in the limits, budgets, capping bands or
ramps (c) keeps) is refused. Per GPU, the non-GPU power that comes with it
is then ``o = (node overheads + rack overhead + row overhead / racks per row)
/ GPUs per rack``: 400 W on the 150 MW site (a 1 kW tray per 4 GB200, 10.8 kW
of switches per 72), close to the ~360 W docs/PLANNER.md derives from Meta's
figures.

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
spec's window and the seconds outside the spec. For (d) against (c): the GPU
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
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from planner.mix import Mix, Placement, place
from planner.sizing import (
    Sizing,
    SizingSettings,
    WorkloadTrace,
    over_limit,
    size,
    sized_topology,
)
from planner.terms import NonGpuTerms
from planner.whatif import SpeedModel, WhatifResult, WhatifSettings, power_law_speed, replay
from policies.tree import RACK, ROW, SERVER
from powerd.gpu.clock_table import ClockTable
from powerd.gpu.models import GPU_MODELS
from powerd.topology import Topology, parse_budgets
from powerd.topology.parse import THRESHOLDS

STRATEGIES = {
    "a": "TDP provisioning",
    "b": "static caps",
    "c": "oversubscription (powerd)",
    "d": "(c) + communication clock",
    "e": "(c) + grid smoothing",
}
W_PER_MW = 1e6
J_PER_KWH = 3.6e6


class EvaluateError(ValueError):
    """Inputs the evaluation cannot use; the message says which and why."""


@dataclass(frozen=True)
class EvaluateSettings:
    duration_s: float = 600.0
    seed: int = 0
    synchronised: bool = False
    quantile: float = 0.999  # (c): the stated risk `powerplan size` sizes for
    samples: int = 100_000
    static_cap_w: float | None = None  # (b); None: the file's failsafe cap per model
    gpu_bound_share: float = 1.0  # (d): the share of a communication wait the clock slows

    def __post_init__(self) -> None:
        if not 0.0 <= self.gpu_bound_share <= 1.0:
            raise ValueError(f"gpu_bound_share must be in [0, 1], not {self.gpu_bound_share}")


# --- the site, rack by rack --------------------------------------------------------------


@dataclass(frozen=True)
class NodeSpec:
    """One tree node as a built site writes it: its limit and budget, and where it keeps
    the file's, its capping bands (``THRESHOLDS``, fractions of the budget) and ramp."""

    limit_w: float
    budget_w: float
    bands: tuple[float, ...] = ()  # empty: inherited from the built file's [defaults]
    ramp_w_per_s: float = math.inf  # inf: no ramp of its own

    def lines(self) -> list[str]:
        out = [f"limit_w = {self.limit_w!r}", f"budget_w = {self.budget_w!r}"]
        out += [f"{key} = {value!r}" for key, value in zip(THRESHOLDS, self.bands, strict=False)]
        if math.isfinite(self.ramp_w_per_s):
            out.append(f"ramp_w_per_s = {self.ramp_w_per_s!r}")
        return out


def file_node(top: Topology, node: int) -> NodeSpec:
    """Tree node ``node`` of the file as it is written there (limit, budget, bands, ramp)."""
    bands = (top.cap_threshold[node], top.cap_target[node], top.uncap_threshold[node])
    return NodeSpec(
        float(top.limit_w[node]),
        float(top.budget_w[node]),
        tuple(float(b) for b in bands),
        float(top.ramp_w_per_s[node]),
    )


@dataclass(frozen=True)
class RackShape:
    """One rack of the file, the unit every strategy's site is built from, and the file's
    own limits, budgets, bands and ramps for (c), which keeps them (``file_*``)."""

    server_gpus: tuple[int, ...]
    server_model: tuple[str, ...]
    server_overhead_w: tuple[float, ...]
    rack_overhead_w: float
    racks_per_row: int
    row_overhead_w: float
    site_overhead_w: float
    file_servers: tuple[NodeSpec, ...]
    file_rack: NodeSpec
    file_row: NodeSpec  # the file's first row
    file_site: NodeSpec

    @property
    def gpus(self) -> int:
        return sum(self.server_gpus)

    def server_w(self, k: int, cap_w: Mapping[str, float]) -> float:
        """Server ``k``'s power with every GPU at its model's cap, overhead in (whole W, up)."""
        model = self.server_model[k]
        return float(math.ceil(self.server_gpus[k] * cap_w[model] + self.server_overhead_w[k]))

    def rack_w(self, cap_w: Mapping[str, float]) -> float:
        """A rack's power with every GPU at its model's cap, overheads in (whole W, up)."""
        servers = sum(self.server_w(k, cap_w) for k in range(len(self.server_gpus)))
        return float(math.ceil(servers + self.rack_overhead_w))

    def site_it_w(self, n_racks: int, cap_w: Mapping[str, float]) -> float:
        """``n_racks`` racks at the caps, in rows of ``racks_per_row``, row overheads in."""
        rows = math.ceil(n_racks / self.racks_per_row)
        return n_racks * self.rack_w(cap_w) + rows * self.row_overhead_w

    def overhead_w_per_gpu(self) -> float:
        """Non-GPU power that comes with each GPU: node, rack and row overheads (not the
        site's, a constant)."""
        per_rack = sum(self.server_overhead_w) + self.rack_overhead_w
        return (per_rack + self.row_overhead_w / self.racks_per_row) / self.gpus


def rack_shape(top: Topology) -> RackShape:
    """The file's rack; :class:`EvaluateError` if its racks are not all alike (servers,
    GPUs, models, overheads, limits, budgets, bands and ramps)."""
    first_server = top.level_start[SERVER]
    server_rack = np.asarray(top.parent[first_server : top.level_start[SERVER + 1]])
    overhead = np.asarray(top.overhead_w, dtype=float)
    shapes: dict[int, list[tuple[int, str, float, NodeSpec]]] = {}
    for k, rack in enumerate(server_rack.tolist()):
        node = first_server + k
        server = (
            int(top.server_gpu_count[k]),
            top.server_model[k],
            overhead[node],
            file_node(top, node),
        )
        shapes.setdefault(rack, []).append(server)
    racks = range(top.level_start[RACK], top.level_start[RACK + 1])
    signatures = {r: (tuple(shapes.get(r, [])), overhead[r], file_node(top, r)) for r in racks}
    first = signatures[racks[0]]
    odd = [top.names[r] for r, s in signatures.items() if s != first]
    if odd or not first[0]:
        raise EvaluateError(
            f"{top.source}: evaluate builds each strategy's site from whole racks of one shape,"
            f" but rack(s) {', '.join(odd[:3])}{' ...' if len(odd) > 3 else ''} differ from"
            f" {top.names[racks[0]]!r} (servers, GPUs, models, overheads, limits, budgets,"
            " capping bands or ramps)"
        )
    first_row = top.level_start[ROW]
    rack_parent = np.asarray(top.parent[top.level_start[RACK] : top.level_start[RACK + 1]])
    servers = first[0]
    return RackShape(
        server_gpus=tuple(s[0] for s in servers),
        server_model=tuple(s[1] for s in servers),
        server_overhead_w=tuple(float(s[2]) for s in servers),
        rack_overhead_w=float(first[1]),
        racks_per_row=int(np.count_nonzero(rack_parent == first_row)),
        row_overhead_w=float(overhead[first_row]),
        site_overhead_w=float(overhead[0]),
        file_servers=tuple(s[3] for s in servers),
        file_rack=first[2],
        file_row=file_node(top, first_row),
        file_site=file_node(top, 0),
    )


def _racks(top: Topology) -> int:
    return top.level_start[RACK + 1] - top.level_start[RACK]


def site_power_w(top: Topology) -> float:
    """``P``: the site's limit, the feed every strategy shares (module docstring)."""
    return float(top.limit_w[0])


def racks_that_fit(shape: RackShape, site_w: float, cap_w: Mapping[str, float]) -> int:
    """The most racks whose power at ``cap_w``, overheads in, fits ``site_w``."""
    room = site_w - shape.site_overhead_w
    n = max(0, math.floor(room / shape.rack_w(cap_w)))
    while n > 0 and shape.site_it_w(n, cap_w) > room:
        n -= 1
    return n


def tdp_caps(shape: RackShape) -> dict[str, float]:
    return {m: GPU_MODELS[m].cap_max_w for m in dict.fromkeys(shape.server_model)}


def static_caps(top: Topology, shape: RackShape, cap_w: float | None) -> dict[str, float]:
    """(b)'s cap per model: ``cap_w`` (a site of one GPU model) or the file's failsafe caps."""
    models = list(dict.fromkeys(shape.server_model))
    if cap_w is None:
        failsafe = np.asarray(top.server_failsafe_cap_w, dtype=float)
        return {m: float(failsafe[[s == m for s in top.server_model]].min()) for m in models}
    if len(models) > 1:
        raise EvaluateError(
            f"{top.source}: one static cap for GPU models {', '.join(models)}: leave it out"
            " to use the file's failsafe cap per model"
        )
    model = GPU_MODELS[models[0]]
    if not model.cap_min_w <= cap_w <= model.cap_max_w:
        raise EvaluateError(
            f"static cap {cap_w:g} W is outside {model.key}'s {model.cap_min_w:g}-"
            f"{model.cap_max_w:g} W"
        )
    return {models[0]: float(cap_w)}


@dataclass(frozen=True)
class Layout:
    """What a built site writes at each level: ``row(count)`` for a row of ``count`` racks,
    the failsafe cap per model and the file's ``[defaults]`` lines."""

    site: NodeSpec
    row: Callable[[int], NodeSpec]
    rack: NodeSpec
    servers: tuple[NodeSpec, ...]
    failsafe_w: Mapping[str, float]
    defaults: tuple[str, ...] = ()


def static_layout(top: Topology, shape: RackShape, cap_w: Mapping[str, float]) -> Layout:
    """Provisioned at ``cap_w``: every node's limit and budget are its power with every GPU
    at its cap (capping threshold 1: nothing caps), the site's limit and budget ``P``."""
    site_w = site_power_w(top)
    rack_w = shape.rack_w(cap_w)

    def row(count: int) -> NodeSpec:
        row_w = count * rack_w + math.ceil(shape.row_overhead_w)
        return NodeSpec(row_w, row_w)

    servers = tuple(
        NodeSpec(shape.server_w(k, cap_w), shape.server_w(k, cap_w))
        for k in range(len(shape.server_gpus))
    )
    defaults = ("cap_threshold = 1", "cap_target = 0.99", "uncap_threshold = 0.98")
    return Layout(NodeSpec(site_w, site_w), row, NodeSpec(rack_w, rack_w), servers, cap_w, defaults)


def file_layout(shape: RackShape) -> Layout:
    """(c): the file's own limits, budgets, capping bands and ramps at every level (a row of
    any size gets the file's first row's), the least cap of each model as failsafe (sizing
    sets the real one, but the loader must accept every count the search tries)."""
    least = {m: GPU_MODELS[m].cap_min_w for m in dict.fromkeys(shape.server_model)}
    return Layout(
        shape.file_site, lambda _: shape.file_row, shape.file_rack, shape.file_servers, least
    )


def built_topology(
    top: Topology, shape: RackShape, n_racks: int, layout: Layout, label: str
) -> Topology:
    """``n_racks`` racks of ``shape`` in rows of ``shape.racks_per_row``, each node as
    ``layout`` writes it, overheads the file's; the file's grid spec and clocks."""
    lines = [
        "version = 1",
        "[defaults]",
        *layout.defaults,
        "[site]",
        f"name = {json.dumps(top.site)}",
        *layout.site.lines(),
        *_overhead(shape.site_overhead_w),
    ]
    for model, cap in layout.failsafe_w.items():
        lines += [f"[models.{model}]", f"failsafe_cap_w = {cap!r}"]
    left, row = n_racks, 0
    while left > 0:
        row += 1
        count = min(left, shape.racks_per_row)
        left -= count
        lines += ["[[rows]]", f'name = "row{row:02d}"', *layout.row(count).lines()]
        lines += [*_overhead(shape.row_overhead_w), "[rows.racks]"]
        lines += [f"count = {count}", 'name = "{row}-k{i:02d}"', *layout.rack.lines()]
        lines += _overhead(shape.rack_overhead_w)
        for k, (gpus, model) in enumerate(zip(shape.server_gpus, shape.server_model, strict=True)):
            lines += ["[[rows.racks.nodes]]", f'name = "{{rack}}-n{k + 1:02d}"']
            lines += [f"gpus = {gpus}", f"model = {json.dumps(model)}"]
            lines += [*layout.servers[k].lines(), *_overhead(shape.server_overhead_w[k])]
    built = parse_budgets("\n".join(lines) + "\n", source=f"{top.source} ({label})")
    return dataclasses.replace(built, grid=top.grid, comm_clock_mhz=top.comm_clock_mhz)


def static_topology(
    top: Topology, shape: RackShape, n_racks: int, cap_w: Mapping[str, float], label: str
) -> Topology:
    """``n_racks`` racks of ``shape`` provisioned at ``cap_w`` (:func:`static_layout`)."""
    return built_topology(top, shape, n_racks, static_layout(top, shape, cap_w), label)


def _overhead(overhead_w: float) -> list[str]:
    return [f"overhead_w = {overhead_w!r}"] if overhead_w > 0 else []


def oversubscribed_topology(
    top: Topology,
    placement: Placement,
    traces: dict[str, WorkloadTrace],
    settings: EvaluateSettings,
) -> tuple[Topology, Sizing]:
    """``top`` with the budgets, overheads and failsafe caps ``powerplan size`` gives at
    ``settings.quantile`` (the file's own overheads, as `size` without terms)."""
    sizing = size(
        top,
        placement,
        traces,
        NonGpuTerms(),
        SizingSettings(quantile=settings.quantile, samples=settings.samples, seed=settings.seed),
    )
    failsafe = np.array([sizing.failsafe_cap_w[m] for m in top.server_model], dtype=float)
    failsafe.setflags(write=False)
    sized = dataclasses.replace(sized_topology(top, sizing), server_failsafe_cap_w=failsafe)
    return sized, sizing


@dataclass
class SizedSite:
    """(c) at one rack count: the sized site, its placement and the sizing."""

    top: Topology
    placement: Placement
    sizing: Sizing

    @property
    def racks(self) -> int:
        return _racks(self.top)

    def over_limit(self) -> pd.DataFrame:
        """Its racks, rows and site whose demand at the quantile is above their limit."""
        return over_limit(self.sizing.table)


def sized_site(
    top: Topology,
    shape: RackShape,
    n_racks: int,
    mix: Mix,
    traces: dict[str, WorkloadTrace],
    settings: EvaluateSettings,
) -> SizedSite:
    """``n_racks`` racks with the file's limits (:func:`file_layout`), the mix placed on
    them, sized by ``powerplan size`` at ``settings.quantile``."""
    built = built_topology(top, shape, n_racks, file_layout(shape), STRATEGIES["c"])
    placement = place(built, mix)
    sized, sizing = oversubscribed_topology(built, placement, traces, settings)
    return SizedSite(sized, placement, sizing)


def mean_demand_w(shape: RackShape, mix: Mix, traces: dict[str, WorkloadTrace]) -> dict[str, float]:
    """Per GPU model of the rack, a GPU's mean demand under the mix: each job's share of its
    trace's mean (clipped to the model's maximum cap, as sizing clips), idle power for the
    share no job takes."""
    busy_share = sum(job.share or 0.0 for job in mix.jobs)
    out = {}
    for key in dict.fromkeys(shape.server_model):
        model = GPU_MODELS[key]
        busy_w = sum(
            (job.share or 0.0)
            * float(np.clip(traces[job.workload].power_w, 0, model.cap_max_w).mean())
            for job in mix.jobs
        )
        out[key] = busy_w + max(0.0, 1.0 - busy_share) * model.idle_power_w
    return out


def largest_fitting(fits: Callable[[int], bool], least: int, guess: int, most: int) -> int:
    """The largest count in ``[least, most]`` that ``fits``, never less than ``least``:
    first ``guess + 1`` (expected not to fit), then bisection of what is left. Assumes
    ``fits`` holds below some count and not above it; the answer is ``least`` or a count
    that was seen to fit."""
    lo, hi = least, most + 1  # lo is least or fits; hi does not fit (or is past most)
    first = min(max(guess + 1, lo + 1), hi)
    if first < hi:
        if fits(first):
            lo = first
        else:
            hi = first
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


@dataclass
class Oversubscribed:
    """(c)'s site and how its rack count was found: ``probes`` (racks, nodes over a limit)."""

    site: SizedSite
    least_racks: int  # (b)'s
    probes: list[tuple[int, int]]


def oversubscribed_site(
    top: Topology,
    shape: RackShape,
    mix: Mix,
    traces: dict[str, WorkloadTrace],
    settings: EvaluateSettings,
    least_racks: int,
) -> Oversubscribed:
    """(c): the most racks whose plan at ``settings.quantile`` has no rack, row or site
    above its limit, at least ``least_racks`` (module docstring). The search guesses the
    count at the GPUs' mean demand (:func:`mean_demand_w`) and never goes past the most
    racks the feed holds with every GPU at its least cap (no failsafe cap exists beyond)."""
    site_w = site_power_w(top)
    least_cap = {m: GPU_MODELS[m].cap_min_w for m in dict.fromkeys(shape.server_model)}
    most = max(least_racks, racks_that_fit(shape, site_w, least_cap))
    guess = racks_that_fit(shape, site_w, mean_demand_w(shape, mix, traces))
    seen: dict[int, SizedSite] = {}
    probes: list[tuple[int, int]] = []

    def fits(n_racks: int) -> bool:
        seen[n_racks] = sized_site(top, shape, n_racks, mix, traces, settings)
        probes.append((n_racks, len(seen[n_racks].over_limit())))
        return probes[-1][1] == 0

    n_racks = largest_fitting(fits, least_racks, guess, most)
    site = seen.get(n_racks) or sized_site(top, shape, n_racks, mix, traces, settings)
    return Oversubscribed(site, least_racks, probes)


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
        duration_s=settings.duration_s, seed=settings.seed, synchronised=settings.synchronised
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
        static = dataclasses.replace(base, static_caps=True)
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
        f" {found.least_racks:,} racks, the file {_racks(top):,}; racks probed:"
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
    table = pd.DataFrame(rows)
    tdp = float(table.loc[table["strategy"] == "a", "throughput_gpus"].iloc[0])
    table.insert(
        table.columns.get_loc("throughput_per_mw") + 1,
        "gain_vs_tdp_pct",
        100.0 * (table["throughput_gpus"] / tdp - 1.0) if tdp > 0 else math.nan,
    )
    notes += _sizing_notes(found.site.sizing, settings)
    by_key = {plan.key: plan for plan in todo}
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
    return jobs["gpus"].to_numpy() * (1.0 - jobs["throughput_lost"].to_numpy()) / slower


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
        "racks": _racks(plan.top),
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
