"""Size rack, row and site budgets and failsafe caps from profiles (pure: arrays in, numbers out).

The method (docs/PLANNER.md, Method) in four steps:

1. **One trace per workload.** All GPUs of a synchronous job rise and fall
   together, so a job is one correlated load: its profile is reduced to the
   mean power of its profiled GPUs at every step (the job's aggregate divided
   by its GPUs), and a job of ``g`` GPUs draws ``g`` times that trace.
2. **Diversity only across jobs.** Jobs are not synchronised with each other:
   each job's trace runs from its own random offset. The GPU power under a
   tree node is ``sum over jobs j of g_j(node) * trace_j(t + offset_j)``, with
   ``g_j(node)`` the job's GPUs under the node (from :func:`planner.mix.place`).
   Monte Carlo over offsets: ``draws`` independent offset sets, each over a
   window of ``horizon`` steps, ``samples = draws * horizon`` values per node.
   Nodes with the same job composition have the same distribution, so the
   work is per unique composition (racks wholly inside one job are one), not
   per GPU.
3. **A high quantile of each aggregate** (default p99.9), plus the node's
   non-GPU power, is the demand a node is sized for; its budget is that demand
   over its capping threshold (so capping starts only above the quantile),
   never above its limit. Tail model: the empirical quantile where the sample
   holds at least ``min_tail_points`` distinct values above it; otherwise a
   generalised Pareto tail fitted by probability-weighted moments to the top
   5 % (peaks over threshold); a flat top gives the top itself. Every value is
   kept ≤ the node's physical maximum (all GPUs at ``cap_max``). The *distinct*
   sample size is ``n_eff = min(samples, product of the trace lengths of the
   jobs under the node)``: a rack inside one job sees only that job's trace.
4. **Failsafe caps**: per GPU model, the largest cap (a common fraction of
   each model's cap range) at which every tree node, servers to the site,
   stays within its limit with every GPU at that cap and every overhead in.

For a tree of controllers (``powerplan size --tree``), :func:`fit_rows_to_leaf_pool`
then scales the rows' budgets by one common factor so they sum within what the
leaves may hold together on their file budgets (``powerd.topology.scope.leaf_pool_w``).

The risk of each node: the share of time its demand (uncapped) would be above
its capping threshold and above its limit, and the same in seconds per day;
a share of 0 means "below 1 / n_eff", which the table gives as resolution.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from planner.mix import Placement, server_ancestors
from planner.terms import NonGpuTerms
from policies.tree import LEVEL_NAMES, PHASE_CODES, RACK, ROW, SERVER, SITE
from powerd.gpu.models import GPU_MODELS
from powerd.topology import PLAUSIBLE_W, Topology
from powerd.topology.scope import leaf_pool_w, rows_budget_w, rows_within_site

SECONDS_PER_DAY = 86_400.0
# A rise's cut in force, p99, at 20,736 nodes over a broker: 1.2-1.9 s measured, 2 s its
# bound (bench/RESULTS.md, bench_scale); the default reaction an oversubscribed band covers.
REACTION_S = 2.0
# The sample matrix (jobs × samples, float64) stays below this; samples shrink to fit.
MAX_SAMPLE_BYTES = 512 * 2**20
# Aggregates are computed for at most this many bytes of unique compositions at a time.
CHUNK_BYTES = 64 * 2**20
GPD_TOP_FRACTION = 0.05  # peaks over the 95th percentile
GPD_MIN_POINTS = 30
GPD_MAX_POINTS = 5000


class SizingError(ValueError):
    """The inputs cannot give a valid budgets file; the message names the tree node."""


@dataclass(frozen=True)
class WorkloadTrace:
    """One workload's per-GPU power, one value per step: the job's mean over its GPUs."""

    workload: str
    power_w: np.ndarray  # float64 (T,)
    phase: np.ndarray  # int8 (T,) PHASE_CODES; "compute" where the profile says nothing
    step_s: float
    gpus: int  # GPUs the profile has for this workload

    @property
    def duration_s(self) -> float:
        return len(self.power_w) * self.step_s


@dataclass(frozen=True)
class SizingSettings:
    quantile: float = 0.999
    samples: int = 100_000  # per tree node: draws × horizon
    seed: int = 0
    min_tail_points: int = 10  # distinct samples above the quantile for the empirical estimate
    # A budget is at most this share of the node's limit: the rest is the margin for the
    # cycles between a rise and the cap that answers it (docs/BUDGETS.md keeps ~5-10 %).
    max_budget_fraction: float = 0.95
    # Levels (RACK, ROW, SITE) whose caps may sum beyond their limits, guarded by a band on
    # measured power (oversubscription_w, rise_margin_w); the others are guaranteed by caps.
    oversubscribe: tuple[int, ...] = ()
    # The controller's reaction, a rise measured to its cut in force: the band keeps the
    # quantile of a level's rise within it below the limit.
    reaction_s: float = REACTION_S

    def __post_init__(self) -> None:
        if not 0.5 <= self.quantile < 1.0:
            raise ValueError(f"quantile must be in [0.5, 1), not {self.quantile}")
        if self.samples < 100:
            raise ValueError(f"samples must be at least 100, not {self.samples}")
        if not 0.5 <= self.max_budget_fraction <= 1.0:
            raise ValueError(
                f"max_budget_fraction must be in [0.5, 1], not {self.max_budget_fraction}"
            )
        if self.min_tail_points < 1:
            raise ValueError(f"min_tail_points must be at least 1, not {self.min_tail_points}")
        if not set(self.oversubscribe) <= {RACK, ROW, SITE}:
            raise ValueError(f"oversubscribe: levels are RACK, ROW, SITE, not {self.oversubscribe}")
        if not (math.isfinite(self.reaction_s) and self.reaction_s > 0):
            raise ValueError(f"reaction_s must be a positive number, not {self.reaction_s}")


@dataclass
class Sizing:
    """What ``size`` decided: per tree node arrays (n_nodes,) and the table people read."""

    limit_w: np.ndarray
    budget_w: np.ndarray
    overhead_w: np.ndarray
    failsafe_cap_w: dict[str, float]  # per GPU model
    table: pd.DataFrame  # site, rows, racks: demand, budget, tail model, risk
    # (n_nodes,) the median demand (GPU power at the median of the same draws, with the
    # non-GPU power of the quantile's demand); NaN for servers. What `powerplan report`
    # plots beside demand_q_w, without a second Monte Carlo run.
    demand_p50_w: np.ndarray = field(default_factory=lambda: np.zeros(0))
    info: dict[str, object] = field(default_factory=dict)
    # per row (tree index): its sorted GPU power samples (the jobs' draws) and the constant
    # added to them (idle GPUs, non-GPU power): what p_capping is recomputed from when
    # fit_rows_to_leaf_pool lowers a row's budget. Rows only: one sample per distinct
    # job composition, shared by the rows that have it.
    row_samples: dict[int, tuple[np.ndarray, float]] = field(default_factory=dict, repr=False)
    # (n_nodes,) an oversubscribed level's allowance and the rise its band keeps below its
    # limit (0 at a level guaranteed by caps); empty: none (policies.allocation)
    oversubscription_w: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rise_margin_w: np.ndarray = field(default_factory=lambda: np.zeros(0))


# --- profiles -> traces ----------------------------------------------------------


def traces_from_profiles(profiles: pd.DataFrame, step_s: float = 1.0) -> dict[str, WorkloadTrace]:
    """Per workload, the mean power of its GPUs at every step of ``step_s`` (empty steps filled).

    ``profiles`` is the planner's profile table (planner/profile_table.py). Time is
    counted from each workload's first sample; every GPU's samples in a step
    are averaged first, then the GPUs, so a GPU sampled more often does not
    weigh more. Steps with no sample take the previous step's value.
    """
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be a positive number of seconds, not {step_s}")
    if profiles.empty:
        raise ValueError("the profiles are empty")
    workload_code, workload_names = pd.factorize(profiles["workload"], sort=True)
    gpu_code = profiles.groupby(["node", "gpu"], sort=False, observed=True).ngroup().to_numpy()
    time_s = profiles["time_s"].to_numpy(dtype=float)
    t0 = pd.Series(time_s).groupby(workload_code).transform("min").to_numpy()
    step = np.floor((time_s - t0) / step_s).astype(np.int64)
    if "phase" in profiles:
        phase = profiles["phase"].map(PHASE_CODES).astype("Float64").fillna(PHASE_CODES["compute"])
        phase_code = phase.to_numpy(dtype=float)
    else:
        phase_code = np.full(len(profiles), float(PHASE_CODES["compute"]))
    frame = pd.DataFrame(
        {
            "w": workload_code,
            "g": gpu_code,
            "b": step,
            "p": profiles["power_w"].to_numpy(dtype=float),
            "ph": phase_code,
        }
    )
    per_gpu = frame.groupby(["w", "g", "b"], sort=False).agg(p=("p", "mean"), ph=("ph", "first"))
    per_step = per_gpu.groupby(level=["w", "b"]).agg(p=("p", "mean"))
    # the phase most of the job's GPUs are in at each step
    votes = per_gpu.groupby([per_gpu.index.get_level_values("w"), "b", "ph"]).size()
    votes = votes.rename("n").reset_index().sort_values("n", kind="stable", ascending=False)
    per_step["ph"] = votes.drop_duplicates(["w", "b"]).set_index(["w", "b"])["ph"]
    gpus = frame.groupby("w")["g"].nunique()
    out: dict[str, WorkloadTrace] = {}
    for w, name in enumerate(workload_names):
        steps = per_step.loc[w]
        full = steps.reindex(np.arange(int(steps.index.max()) + 1)).ffill().bfill()
        out[str(name)] = WorkloadTrace(
            workload=str(name),
            power_w=full["p"].to_numpy(dtype=float),
            phase=full["ph"].to_numpy().astype(np.int8),
            step_s=float(step_s),
            gpus=int(gpus.loc[w]),
        )
    return out


def job_power_traces(
    top: Topology, placement: Placement, traces: dict[str, WorkloadTrace]
) -> list[np.ndarray]:
    """Each job's per-GPU trace, clipped to the cap range of the GPUs it runs on."""
    out: list[np.ndarray] = []
    for j, job in enumerate(placement.jobs):
        first, end = placement.job_servers[j]
        models = {top.server_model[k] for k in range(int(first), int(end))}
        cap_max = min(GPU_MODELS[m].cap_max_w for m in models)
        out.append(np.clip(traces[job.workload].power_w, 0.0, cap_max))
    return out


# --- the tail ----------------------------------------------------------------------


def tail_quantile(
    sorted_w: np.ndarray, p: float, n_eff: float, min_tail_points: int
) -> tuple[float, str]:
    """The ``p`` quantile of a sorted sample, and the tail model that gave it.

    ``empirical`` where ``n_eff * (1 - p) >= min_tail_points``; else ``gpd``
    (peaks over the top 5 %, generalised Pareto by probability-weighted
    moments, Hosking & Wallis 1987), ``flat`` when the top is one value, and
    ``max`` (the sample maximum) if the fit is unusable.
    """
    n = len(sorted_w)
    if sorted_w[-1] <= sorted_w[0]:
        return float(sorted_w[-1]), "constant"
    if n_eff * (1.0 - p) >= min_tail_points:
        return float(sorted_w[min(n - 1, math.ceil(p * n) - 1)]), "empirical"
    k = min(n - 1, max(GPD_MIN_POINTS, math.ceil(GPD_TOP_FRACTION * n)))
    threshold = float(sorted_w[n - k - 1])
    stride = max(1, k // GPD_MAX_POINTS)
    excess = sorted_w[n - k :: stride] - threshold
    if excess[-1] <= 0:
        return threshold, "flat"
    m = len(excess)
    a0 = float(excess.mean())
    plotting = (np.arange(1, m + 1) - 0.35) / m
    a1 = float(np.mean(excess * (1.0 - plotting)))
    denom = a0 - 2.0 * a1
    if not denom > 0:
        return float(sorted_w[-1]), "max"
    k_shape = a0 / denom - 2.0  # Hosking's k; scipy's c = -k
    scale = 2.0 * a0 * a1 / denom
    tail = (1.0 - p) * n / k  # exceedance probability beyond the threshold
    if tail >= 1.0:
        return float(sorted_w[min(n - 1, math.ceil(p * n) - 1)]), "empirical"
    if abs(k_shape) < 1e-9:
        excess_q = -scale * math.log(tail)
    else:
        excess_q = scale / k_shape * (1.0 - tail**k_shape)
    if not (math.isfinite(excess_q) and excess_q >= 0):
        return float(sorted_w[-1]), "max"
    return threshold + excess_q, "gpd"


# --- sizing ----------------------------------------------------------------------


def _compositions(top: Topology, placement: Placement, lvl: int) -> np.ndarray:
    """(nodes at level lvl, n_jobs): each job's GPUs under each node."""
    anc = server_ancestors(top)[lvl] - top.level_start[lvl]
    n_level = top.level_start[lvl + 1] - top.level_start[lvl]
    n_jobs = len(placement.jobs)
    busy = placement.server_job >= 0
    flat = anc[busy] * n_jobs + placement.server_job[busy]
    counts = np.bincount(
        flat, weights=top.server_gpu_count[busy], minlength=n_level * max(n_jobs, 1)
    )
    return counts.reshape(n_level, max(n_jobs, 1))[:, :n_jobs]


def _sample_matrix(
    job_traces: list[np.ndarray], samples: int, rng: np.random.Generator
) -> tuple[np.ndarray, int, int]:
    """(n_jobs, draws * horizon) per-GPU power of each job, each draw from its own offset."""
    n_jobs = len(job_traces)
    longest = max((len(t) for t in job_traces), default=1)
    samples = min(samples, max(100, MAX_SAMPLE_BYTES // (8 * max(n_jobs, 1))))
    horizon = min(longest, samples)
    draws = max(1, samples // horizon)
    s = np.empty((n_jobs, draws * horizon))
    steps = np.arange(horizon)
    for j, trace in enumerate(job_traces):
        offsets = rng.integers(0, len(trace), size=draws)
        s[j] = trace[(steps[None, :] + offsets[:, None]) % len(trace)].ravel()
    return s, draws, horizon


@dataclass(frozen=True)
class _Compositions:
    """The jobs' GPUs under every node of one level, grouped by mix: nodes with the same
    GPUs of the same jobs share one aggregate of the Monte Carlo draws."""

    unique: np.ndarray  # (mixes, n_jobs) each mix's GPUs per job
    inverse: np.ndarray  # (nodes at the level,) each node's mix


def _level_compositions(top: Topology, placement: Placement, lvl: int) -> _Compositions:
    comp = _compositions(top, placement, lvl)
    unique, inverse = np.unique(comp, axis=0, return_inverse=True)
    return _Compositions(unique, inverse.ravel())


@dataclass
class _NodeSizes:
    """What ``size`` works out per tree node (n_nodes,), filled level by level, bottom-up."""

    own_w: np.ndarray  # each node's own non-GPU power
    budget_w: np.ndarray
    cols: dict[str, np.ndarray]  # demand_q_w, demand_p50_w, n_eff, p_capping, p_over_limit
    tail_model: np.ndarray  # "empirical" or "gpd"
    n_jobs_under: np.ndarray
    row_samples: dict[int, tuple[np.ndarray, float]]


def size(
    top: Topology,
    placement: Placement,
    traces: dict[str, WorkloadTrace],
    terms: NonGpuTerms | None = None,
    settings: SizingSettings | None = None,
) -> Sizing:
    """Budgets for racks, rows and the site, and failsafe caps per model (module docstring)."""
    terms = terms or NonGpuTerms()
    settings = settings or SizingSettings()
    rng = np.random.default_rng(settings.seed)
    job_traces = job_power_traces(top, placement, traces)
    lengths = np.array([len(t) for t in job_traces], dtype=float)
    sample, draws, horizon = _sample_matrix(job_traces, settings.samples, rng)
    idle_w, max_gpu_w = _idle_and_max_w(top, placement)
    limit_w = np.asarray(top.limit_w, dtype=float).copy()
    groups = {lvl: _level_compositions(top, placement, lvl) for lvl in (RACK, ROW, SITE)}
    sizes = _size_levels(top, terms, settings, groups, sample, lengths, idle_w, max_gpu_w, limit_w)
    failsafe, failsafe_power_w = failsafe_caps(top, limit_w, sizes.own_w)
    overhead_below_w = top.subtree_sum(np.zeros(len(top.server_gpu_count)), sizes.own_w)
    max_caps_w = max_gpu_w + overhead_below_w
    oversubscription_w, rise_margin_w = _oversubscribed(
        top,
        groups,
        sample,
        horizon,
        limit_w,
        max_caps_w,
        overhead_below_w,
        step_s(traces),
        settings,
    )
    table = _sizing_table(top, settings, sizes, limit_w, sample.shape[1], failsafe_power_w)
    # safety by caps (policies.allocation): a level is guaranteed by the caps in force (its
    # caps plus overheads within its limit), or oversubscribed: its caps may sum beyond its
    # limit by oversubscription_w, a band rise_margin_w under the limit guarding it (the
    # rise_quantile of its rise within reaction_s). With every GPU at its maximum cap the
    # node would draw max_caps_w: above its limit by caps_over_limit_w, the share of its
    # caps a controller may move.
    view = slice(0, len(table))  # site, rows, racks
    table["guarantee"] = np.where(oversubscription_w[view] > 0, "band", "caps")
    table["oversubscription_w"] = oversubscription_w[view]
    table["rise_margin_w"] = rise_margin_w[view]
    table["max_caps_w"] = max_caps_w[view]
    table["caps_over_limit_w"] = np.maximum(table["max_caps_w"] - table["limit_w"], 0.0)
    return Sizing(
        limit_w,
        sizes.budget_w,
        sizes.own_w,
        failsafe,
        table,
        info=_sizing_info(settings, sample.shape[1], draws, horizon, step_s(traces)),
        demand_p50_w=sizes.cols["demand_p50_w"],
        row_samples=sizes.row_samples,
        oversubscription_w=oversubscription_w,
        rise_margin_w=rise_margin_w,
    )


def _idle_and_max_w(top: Topology, placement: Placement) -> tuple[np.ndarray, np.ndarray]:
    """(n_nodes,) the power of the idle GPUs (on servers no job uses) under each node, and
    of every GPU under it at its maximum cap."""
    models = [GPU_MODELS[m] for m in top.server_model]
    count = top.server_gpu_count.astype(float)
    idle_server = np.where(
        placement.server_job < 0, count * np.array([m.idle_power_w for m in models]), 0.0
    )
    max_gpu_w = top.subtree_sum(count * np.array([m.cap_max_w for m in models]))
    return top.subtree_sum(idle_server), max_gpu_w


def _size_levels(
    top: Topology,
    terms: NonGpuTerms,
    settings: SizingSettings,
    groups: dict[int, _Compositions],
    sample: np.ndarray,
    lengths: np.ndarray,
    idle_w: np.ndarray,
    max_gpu_w: np.ndarray,
    limit_w: np.ndarray,
) -> _NodeSizes:
    """Racks, then rows, then the site: each node's demand quantile (its mix's aggregate,
    idle GPUs and the non-GPU power below and its own), budget and risks."""
    p, n_nodes, n_samples = settings.quantile, top.n_nodes, sample.shape[1]
    own_w = np.asarray(top.overhead_w, dtype=float).copy()
    if terms.node_w is not None:
        own_w[top.level_start[SERVER] : top.level_start[SERVER + 1]] = terms.node_w
    sizes = _NodeSizes(
        own_w=own_w,
        budget_w=np.asarray(top.budget_w, dtype=float).copy(),
        cols={
            k: np.full(n_nodes, np.nan)
            for k in ("demand_q_w", "demand_p50_w", "n_eff", "p_capping", "p_over_limit")
        },
        tail_model=np.full(n_nodes, "", dtype=object),
        n_jobs_under=np.zeros(n_nodes, dtype=np.int64),
        row_samples={},
    )
    budget_w, cols = sizes.budget_w, sizes.cols
    thresholds = np.asarray(top.cap_threshold, dtype=float)
    floor_w = {lvl: PLAUSIBLE_W[lvl][0] for lvl in PLAUSIBLE_W}  # the loader's least budget
    for lvl in (RACK, ROW, SITE):
        nodes = np.arange(top.level_start[lvl], top.level_start[lvl + 1])
        unique, inverse = groups[lvl].unique, groups[lvl].inverse
        sizes.n_jobs_under[nodes] = np.count_nonzero(unique[inverse], axis=1)
        order = np.argsort(inverse, kind="stable")
        starts = np.searchsorted(inverse[order], np.arange(len(unique) + 1))
        overhead_sum = top.subtree_sum(np.zeros(len(top.server_gpu_count)), own_w)
        below_w = overhead_sum[nodes] - own_w[nodes]  # non-GPU power of the levels below
        for u, row in _sorted_aggregates(unique, sample):
            in_use = unique[u] > 0
            log_combos = float(np.log(lengths[in_use]).sum()) if in_use.any() else math.inf
            n_eff = n_samples if log_combos >= math.log(n_samples) else math.exp(log_combos)
            gpu_q, model = tail_quantile(row, p, n_eff, settings.min_tail_points)
            gpu_median, _ = tail_quantile(row, 0.5, n_eff, settings.min_tail_points)
            members = order[starts[u] : starts[u + 1]]
            for node, below in zip(nodes[members].tolist(), below_w[members], strict=True):
                gpu_w = min(gpu_q + idle_w[node], max_gpu_w[node])  # with idle GPUs
                own_w[node] = _own_overhead(top, terms, lvl, node, gpu_w, below)
                demand = gpu_w + below + own_w[node]
                most = math.floor(settings.max_budget_fraction * limit_w[node])
                budget_w[node] = min(most, max(math.ceil(demand / thresholds[node]), floor_w[lvl]))
                # the samples are the jobs' GPU power; idle GPUs and overheads are constant
                shift = idle_w[node] + below + own_w[node]
                cols["demand_q_w"][node] = demand
                gpu_p50_w = min(gpu_median + idle_w[node], max_gpu_w[node])
                cols["demand_p50_w"][node] = gpu_p50_w + below + own_w[node]
                cols["n_eff"][node] = n_eff
                cols["p_capping"][node] = _exceed(row, thresholds[node] * budget_w[node] - shift)
                cols["p_over_limit"][node] = _exceed(row, limit_w[node] - shift)
                sizes.tail_model[node] = model
                if lvl == ROW:
                    sizes.row_samples[node] = (row, float(shift))
    return sizes


def _sizing_table(
    top: Topology,
    settings: SizingSettings,
    sizes: _NodeSizes,
    limit_w: np.ndarray,
    n_samples: int,
    failsafe_power_w: np.ndarray,
) -> pd.DataFrame:
    """The table people read, site, rows and racks: demand, budget, tail model, risk. The
    caller adds the columns of safety by caps (``guarantee`` ... ``caps_over_limit_w``)."""
    view = np.arange(0, top.level_start[SERVER])
    level = np.asarray(top.level)[view]
    gpus_under = top.subtree_sum(top.server_gpu_count.astype(float))[view]
    cols, budget_w = sizes.cols, sizes.budget_w
    return pd.DataFrame(
        {
            "name": [top.names[i] for i in view],
            "level": [LEVEL_NAMES[int(lv)] for lv in level],
            "gpus": gpus_under.astype(np.int64),
            "jobs": sizes.n_jobs_under[view],
            "limit_w": limit_w[view],
            "demand_q_w": cols["demand_q_w"][view],
            "budget_w": budget_w[view],
            "bound": np.where(
                budget_w[view] >= np.floor(settings.max_budget_fraction * limit_w[view]),
                "limit",
                "quantile",
            ),
            "overhead_w": sizes.own_w[view],
            "tail_model": sizes.tail_model[view],
            "samples": n_samples,
            "n_eff": np.round(cols["n_eff"][view]).astype(np.int64),
            "p_capping": cols["p_capping"][view],
            "capping_s_per_day": cols["p_capping"][view] * SECONDS_PER_DAY,
            "p_over_limit": cols["p_over_limit"][view],
            "over_limit_s_per_day": cols["p_over_limit"][view] * SECONDS_PER_DAY,
            "resolution_s_per_day": SECONDS_PER_DAY / cols["n_eff"][view],
            "failsafe_power_w": failsafe_power_w[view],
        }
    )


def _sizing_info(
    settings: SizingSettings, n_samples: int, draws: int, horizon: int, profile_step_s: float
) -> dict[str, object]:
    """How the sizing was made: its quantile, samples, seed and tail rule."""
    return {
        "quantile": settings.quantile,
        "samples_per_node": n_samples,
        "draws": draws,
        "horizon_steps": horizon,
        "step_s": profile_step_s,
        "reaction_s": settings.reaction_s,
        "oversubscribed_levels": [LEVEL_NAMES[lvl] for lvl in sorted(settings.oversubscribe)],
        "seed": settings.seed,
        "min_tail_points": settings.min_tail_points,
        "tail_rule": (
            f"empirical where n_eff*(1-p) >= {settings.min_tail_points}, else GPD over"
            f" the top {GPD_TOP_FRACTION:.0%} (PWM), capped at all GPUs at cap_max"
        ),
    }


def step_s(traces: dict[str, WorkloadTrace]) -> float:
    """The profiles' step (s); NaN without a profile."""
    return next(iter(traces.values())).step_s if traces else float("nan")


def _oversubscribed(
    top: Topology,
    groups: dict[int, _Compositions],
    sample: np.ndarray,
    horizon: int,
    limit_w: np.ndarray,
    max_caps_w: np.ndarray,
    overhead_w: np.ndarray,
    profile_step_s: float,
    settings: SizingSettings,
) -> tuple[np.ndarray, np.ndarray]:
    """(n_nodes,) each oversubscribed node's allowance (what every GPU at its maximum cap,
    overheads in, would draw beyond its limit) and rise margin (the ``quantile`` of its
    GPUs' rise within ``reaction_s``, empirical over the Monte Carlo draws: the most the
    aggregate climbs from a step within the steps that cover the reaction); zeros at the
    other levels and where the caps cannot exceed the limit anyway."""
    over = np.zeros(top.n_nodes)
    margin = np.zeros(top.n_nodes)
    if not settings.oversubscribe:
        return over, margin
    steps = max(1, math.ceil(settings.reaction_s / profile_step_s - 1e-9))
    steps = min(steps, horizon - 1)
    draws = sample.shape[1] // horizon
    for lvl in sorted(settings.oversubscribe):
        nodes = np.arange(top.level_start[lvl], top.level_start[lvl + 1])
        unique, inverse = groups[lvl].unique, groups[lvl].inverse
        for u in range(len(unique)):
            agg = (unique[u] @ sample).reshape(draws, horizon)
            if steps < 1:
                q = 0.0
            else:
                rise = np.zeros((draws, horizon - steps))
                for j in range(1, steps + 1):
                    np.maximum(
                        rise, agg[:, j : horizon - steps + j] - agg[:, : horizon - steps], out=rise
                    )
                q = float(np.quantile(rise, settings.quantile))
            for node in nodes[inverse == u].tolist():
                allowance = max(max_caps_w[node] - limit_w[node], 0.0)
                # a margin that leaves no band above the node's own non-GPU power: the
                # level cannot be guarded by measured power; its caps guarantee it
                if allowance > 0 and limit_w[node] - math.ceil(q) > overhead_w[node]:
                    over[node] = allowance
                    margin[node] = max(math.ceil(q), 1.0)
    return over, margin


def over_limit(table: pd.DataFrame) -> pd.DataFrame:
    """The nodes of a sized ``table`` (``Sizing.table``) whose demand at the sizing
    quantile is above their limit: ``name``, ``level``, ``demand_q_w``, ``limit_w`` and
    ``over_w``, the most over (as a share of the limit) first. For them the budget is
    bound by the limit, and capping, not the plan, keeps them within their breakers."""
    over = table[table["demand_q_w"] > table["limit_w"]]
    over = over.assign(over_w=over["demand_q_w"] - over["limit_w"])
    order = (over["over_w"] / over["limit_w"]).sort_values(ascending=False, kind="stable")
    columns = ["name", "level", "demand_q_w", "limit_w", "over_w"]
    return over.loc[order.index, columns].reset_index(drop=True)


# --- a tree of controllers -------------------------------------------------------------


def sized_topology(top: Topology, sizing: Sizing) -> Topology:
    """``top`` with the sizing's limits, budgets and overheads: the numbers the written
    budgets file loads with (what ``powerd.topology.scope`` checks a tree against)."""
    limit_w, budget_w, overhead_w = (
        np.array(column, dtype=float)
        for column in (sizing.limit_w, sizing.budget_w, sizing.overhead_w)
    )
    for column in (limit_w, budget_w, overhead_w):
        column.setflags(write=False)  # as every Topology column
    sized = dataclasses.replace(top, limit_w=limit_w, budget_w=budget_w, overhead_w=overhead_w)
    if len(sizing.oversubscription_w):
        sized = dataclasses.replace(
            sized,
            oversubscription_w=sizing.oversubscription_w,
            rise_margin_w=sizing.rise_margin_w,
        )
    return sized


def fit_rows_to_leaf_pool(top: Topology, sizing: Sizing) -> tuple[Sizing, float]:
    """The rows' budgets scaled by one common factor to sum within the leaf pool.

    A leaf controller of a tree of controllers that hears no grant holds its rows'
    file budgets; those must sum to at most ``leaf_pool_w`` of the sized site
    (``powerd.topology.scope``). Rows are sized each for its own quantile, so they
    usually sum above it (diversity across rows): every row's budget becomes
    ``floor(budget * factor)`` with ``factor = pool / sum``, whole watts whose sum
    is within the pool. Racks, the site, limits, overheads and failsafe caps are
    left as sized. A row that would fall below the loader's least row budget
    (``PLAUSIBLE_W``) is held there and the others share a smaller factor
    (``info["tree"]["rows_at_floor"]``); :class:`SizingError` if the pool cannot
    hold every row at that floor. The table's ``budget_w``, ``bound`` (``leaf
    pool``), ``p_capping`` and ``capping_s_per_day`` of the scaled rows are
    recomputed from the same draws. Returns the new sizing (the input is not
    changed) and the factor (1.0 when the rows fit as sized).
    """
    sized = sized_topology(top, sizing)
    pool = leaf_pool_w(sized)
    before = rows_budget_w(sized)
    first, end = top.level_start[ROW], top.level_start[ROW + 1]
    rows = np.arange(first, end)
    original = np.asarray(sizing.budget_w, dtype=float)[rows]
    tree_info: dict[str, object] = {
        "leaf_pool_w": pool,
        "rows_budget_w_sized": before,
        "factor": 1.0,
        "rows_at_floor": [],
    }
    if rows_within_site(sized) is None:  # the loader's own test
        info = {**sizing.info, "tree": {**tree_info, "rows_budget_w": before}}
        return dataclasses.replace(sizing, info=info), 1.0
    floor_w = PLAUSIBLE_W[ROW][0]
    held = np.zeros(len(rows), dtype=bool)
    held_w = np.minimum(original, floor_w)  # a row held at the floor is never raised
    while True:
        room = pool - float(held_w[held].sum())
        if held.all() and room >= 0:  # every row at the floor, and that fits
            scaled = held_w.copy()
            break
        free_w = float(original[~held].sum())
        if room <= 0 or free_w <= 0:
            raise SizingError(
                f"site {top.site!r}: the leaves of a tree of controllers may hold "
                f"{pool:,.0f} W together (site budget_w {sized.budget_w[0]:,.0f} W less its "
                f"overhead_w {sized.overhead_w[0]:,.0f} W / cap_threshold "
                f"{sized.cap_threshold[0]:g}), too little for its {len(rows)} rows at the "
                f"least budget a row may have ({floor_w:,.0f} W each): size the site larger "
                "or run one controller for the site"
            )
        factor = min(1.0, room / free_w)
        scaled = np.where(held, held_w, np.floor(original * factor))
        for _ in range(64):  # float noise in original * factor: a few ulps at most
            if float(scaled[~held].sum()) <= room:
                break
            factor = math.nextafter(factor, 0.0)
            scaled = np.where(held, held_w, np.floor(original * factor))
        low = ~held & (scaled < floor_w)
        if not low.any():
            break
        held |= low
    budget_w = np.asarray(sizing.budget_w, dtype=float).copy()
    budget_w[rows] = scaled
    table = sizing.table.copy()
    index = {name: i for i, name in enumerate(table["name"])}
    thresholds = np.asarray(top.cap_threshold, dtype=float)
    for node in rows.tolist():
        if budget_w[node] == sizing.budget_w[node]:
            continue
        i = index.get(top.names[node])
        if i is None:
            continue
        at = table.index[i]
        table.at[at, "budget_w"] = budget_w[node]
        table.at[at, "bound"] = "leaf pool"
        p_capping = math.nan  # unknown, rather than the sized budget's, without the draws
        if node in sizing.row_samples:
            sample, shift = sizing.row_samples[node]
            p_capping = _exceed(sample, thresholds[node] * budget_w[node] - shift)
        table.at[at, "p_capping"] = p_capping
        table.at[at, "capping_s_per_day"] = p_capping * SECONDS_PER_DAY
    after = float(budget_w[rows].sum())
    tree_info.update(
        factor=factor,
        rows_budget_w=after,
        rows_at_floor=[top.names[int(n)] for n in rows[held]],
    )
    info = {**sizing.info, "tree": tree_info}
    return dataclasses.replace(sizing, budget_w=budget_w, table=table, info=info), factor


def _sorted_aggregates(unique: np.ndarray, sample: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(index, sorted GPU power samples) per unique composition, a bounded chunk at a time."""
    chunk = max(1, CHUNK_BYTES // (8 * sample.shape[1]))
    for c0 in range(0, len(unique), chunk):
        block = np.sort(unique[c0 : c0 + chunk] @ sample, axis=1)
        yield from enumerate(block, start=c0)


def _own_overhead(
    top: Topology, terms: NonGpuTerms, lvl: int, node: int, gpu_w: float, below_w: float
) -> float:
    """The node's own non-GPU power: network for racks, cooling for the site, else the file's.

    ``gpu_w`` is the node's GPU power at the quantile, ``below_w`` the non-GPU power
    under it: together its IT power without its own term.
    """
    given = float(top.overhead_w[node])
    if lvl == RACK and terms.network_fraction is not None:
        f = terms.network_fraction  # a share of the rack's IT power, network included
        return f / (1.0 - f) * (gpu_w + below_w)
    if lvl == SITE:
        cooling = (
            given if terms.cooling_fraction is None else terms.cooling_fraction * (gpu_w + below_w)
        )
        return cooling * (1.0 + terms.summer_rise)
    return given


def _exceed(sorted_w: np.ndarray, level_w: float) -> float:
    """The share of a sorted sample strictly above ``level_w``."""
    return float(len(sorted_w) - np.searchsorted(sorted_w, level_w, side="right")) / len(sorted_w)


def failsafe_caps(
    top: Topology, limit_w: np.ndarray, overhead_w: np.ndarray
) -> tuple[dict[str, float], np.ndarray]:
    """Per model the largest failsafe cap at which no tree node exceeds its limit.

    Every model gets the same fraction ``x`` of its cap range
    (``cap_min + x * (cap_max - cap_min)``, whole watts, rounded down); ``x``
    is the largest that keeps ``GPUs at their caps + overheads <= limit`` at
    every node, servers to the site. Returns the caps and each node's power
    at them. :class:`SizingError` names the node that does not fit even at
    ``cap_min``.
    """
    models = [GPU_MODELS[m] for m in top.server_model]
    count = top.server_gpu_count.astype(float)
    cap_min = np.array([m.cap_min_w for m in models])
    span = np.array([m.cap_max_w - m.cap_min_w for m in models])
    base = top.subtree_sum(count * cap_min, overhead_w)
    slope = top.subtree_sum(count * span)
    room = limit_w - base
    with np.errstate(divide="ignore", invalid="ignore"):
        x_node = np.where(slope > 0, room / slope, np.inf)
    worst = int(np.argmin(x_node))
    if x_node[worst] < 0:
        raise SizingError(
            f"{top.kind(top.names[worst])} {top.names[worst]!r}: with every GPU at its minimum"
            f" cap and its non-GPU power it draws {base[worst]:,.0f} W, above its limit"
            f" {limit_w[worst]:,.0f} W: no failsafe cap keeps it within its limit"
        )
    x = min(1.0, float(x_node[worst]))
    keys = list(dict.fromkeys(top.server_model))
    caps = {
        key: float(math.floor(GPU_MODELS[key].cap_min_w + x * _span(key) + 1e-9)) for key in keys
    }
    while True:  # rounding can only have gone up by float noise: step down until it fits
        per_server = count * np.array([caps[m] for m in top.server_model])
        power_w = top.subtree_sum(per_server, overhead_w)
        if np.all(power_w <= limit_w) or all(caps[k] <= GPU_MODELS[k].cap_min_w for k in keys):
            return caps, power_w
        caps = {k: max(GPU_MODELS[k].cap_min_w, c - 1.0) for k, c in caps.items()}


def _span(key: str) -> float:
    return GPU_MODELS[key].cap_max_w - GPU_MODELS[key].cap_min_w
