"""The sites ``powerplan evaluate`` compares: whole racks of the budgets file's shape
at a site power, each strategy's caps and layout, and the oversubscribed site's
search for the most racks whose sized plan keeps every node within its limit.

The specification is ``planner.evaluate``'s docstring; this module builds the
sites it describes, the strategies and their results are there.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

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
from policies.tree import RACK, ROW, SERVER
from powerd.gpu.models import GPU_MODELS
from powerd.topology import Topology, parse_budgets
from powerd.topology.parse import THRESHOLDS

STRATEGIES = {
    "a": "TDP provisioning",
    "b": "static caps",
    "c": "oversubscription (powerd)",
    "d": "(c) + communication clock",
    "e": "(c) + grid smoothing",
    "o": "oracle: (c)'s site, perfect knowledge",
}


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
    # (c), (d), (e): the controller keeps every level within its limit by the caps in force
    # (policies.allocation); False: by bands on measured power (policies.capping)
    safety_by_caps: bool = True
    # (o): the speed law's exponent the oracle's allocation optimises (planner.oracle)
    speed_exponent: float = 0.28

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
    GPUs, models, overheads, limits, bands and ramps). Their budgets may differ: no
    strategy keeps a rack's budget ((a) and (b) set their own, (c) sizes them as `size`
    does), and a file `powerplan size` wrote has one per rack."""
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
    signatures = {
        r: (
            tuple(shapes.get(r, [])),
            overhead[r],
            dataclasses.replace(file_node(top, r), budget_w=0.0),
        )
        for r in racks
    }
    first = signatures[racks[0]]
    odd = [top.names[r] for r, s in signatures.items() if s != first]
    if odd or not first[0]:
        raise EvaluateError(
            f"{top.source}: evaluate builds each strategy's site from whole racks of one shape,"
            f" but rack(s) {', '.join(odd[:3])}{' ...' if len(odd) > 3 else ''} differ from"
            f" {top.names[racks[0]]!r} (servers, GPUs, models, overheads, limits,"
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
        file_rack=file_node(top, racks[0]),  # (c) sizes its budget
        file_row=file_node(top, first_row),
        file_site=file_node(top, 0),
    )


def racks_of(top: Topology) -> int:
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
    return dataclasses.replace(
        built,
        grid=top.grid,
        comm_clock_mhz=top.comm_clock_mhz,
        clock_tables=top.clock_tables,
        comm_clock_keys=top.comm_clock_keys,
    )


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
        return racks_of(self.top)

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
