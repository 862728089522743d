"""Replay profiles through the controller's own policy at given budgets: what capping costs.

Every step (``step_s``, the controller's cycle) each GPU of a placed job
demands its job's trace at the job's own random offset (idle GPUs their
model's idle power), draws ``min(demand, cap)`` with the cap the controller
set the step before, and ``policies.turns.decide_in_turn`` (what the
controller runs: the turns nodes take under its ``max_raises_per_s``, then
``policies.decide``) sets the next caps from that, under the controller's tree
(``powerd.controller.smoothing.file_tree_in_force``). Agents start at their
failsafe caps, as they do. Counted per tree node: steps above the capping threshold (how often
capping bites), the watts it takes (``node_cut_w``: how deep) and the watts
held below demand under it, seconds above the budget and above the limit,
and, for comparison, seconds the uncapped demand would be above the limit.

The grid: the site's power is kept per step (one float a step,
``WhatifResult.site_power_w``) and measured as the grid would
(``policies.grid``, docs/BUDGETS.md "The grid spec"): ramp up and down over
the spec's window (max and p99, W/s), the share of its variance in the
oscillation band (the part of it the step can see: 1 s steps see up to
0.5 Hz), the worst peak-to-peak, and with a ``[site.grid]`` the seconds
outside each limit and the energy holding its floor would burn
(``info["grid"]``). Without one the same is measured with the defaults and
``info["grid"]["spec"]`` says "no grid spec".

Throughput: a synchronous job runs at the pace of its slowest GPU, so a
job's speed in a step is the lowest relative speed of its GPUs. A GPU held
at a fraction ``r = power / demand`` of its demand runs at ``r ** 0.28`` by
default (``speed_exponent``): 0.28 is what Meta's GB200 figure gives, 1200
→ 1000 W costing ~5 % speed (docs/DOMAIN.md). With a measured cap sweep
(``planner.sweep.load_sweep``) the speed is read off the sweep instead: per
workload where the sweep has the profile's workload name, else the median
curve of all its workloads, each as relative throughput against cap over the
power drawn at the sweep's highest cap.

Two settings serve ``planner.evaluate``: ``static_caps`` replays with no
controller (every GPU holds its failsafe cap throughout: a site provisioned
at TDP or at a static cap), and ``comm_power_rel`` scales, per GPU model,
what a communication phase draws (its SM clock locked). Per job, the replay
also keeps the share of steps in communication and the mean per-GPU power
drawn in them (``WhatifResult.communication``).

Rack energy storage (``storage_report``): after the replay, storage of a given
size per rack is dispatched over the replayed site series
(``policies.storage``: one site-level pool, within ``margin`` × the spec's
ramp limits), and the grid draw it leaves is measured as the site is; the
replay itself is the same (no smoothing: a floor and storage together are not
modelled).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from planner.demand import DemandSource, SpeedModel
from planner.mix import Placement
from planner.sizing import WorkloadTrace
from policies import (
    NORMAL,
    PHASE_CODES,
    SERVER,
    ClusterState,
    PolicySettings,
    Tree,
)
from policies.capping import WAITING_PHASES
from policies.causes import (
    LOST_CAUSES,
    NOT_HELD,
    cap_causes,
    held_causes,
    initial_causes,
    job_causes,
    lost_column,
    lost_index,
)
from policies.grid import J_PER_KWH, ResumeLevels
from policies.smoothing import (
    DEFAULT_MARGIN,
    NO_SMOOTHING,
    GpuRamps,
    gpu_ramps,
    grid_policy,
    ramp_toward,
    wanted_w,
    with_cut_fall,
)
from policies.storage import DEFAULT_HORIZON_S, DEFAULT_ROUND_TRIP, Storage, dispatch
from policies.tree import LEVEL_NAMES, RACK, in_codes, phase_codes
from policies.turns import MAX_RAISES_PER_S, Turns, decide_in_turn
from powerd.controller.smoothing import file_tree_in_force
from powerd.topology import Topology
from powerd.topology.grid import GridSpec, grid_report
from powerd.vocabulary import PROGRESS_PHASES

DEFAULT_SPEED_EXPONENT = 0.28  # ln(0.95) / ln(1000 / 1200): docs/DOMAIN.md, Meta's GB200


def power_law_speed(exponent: float = DEFAULT_SPEED_EXPONENT) -> SpeedModel:
    if not (math.isfinite(exponent) and 0 <= exponent <= 2):
        raise ValueError(f"speed exponent must be in 0..2, not {exponent}")

    def speed(workload: str, ratio: np.ndarray) -> np.ndarray:
        return np.power(np.clip(ratio, 0.0, 1.0), exponent)

    speed.description = f"speed = (power/demand)^{exponent:g}"  # type: ignore[attr-defined]
    return speed


def sweep_speed(sweep: pd.DataFrame) -> SpeedModel:
    """Relative speed from a cap sweep (planner.sweep form), per workload or the median curve."""
    grid = np.linspace(0.0, 1.0, 101)
    curves: dict[str, np.ndarray] = {}
    for (_, workload), g in sweep.groupby(["gpu", "workload"], sort=True):
        g = g.sort_values("cap_w")
        top = g.iloc[-1]
        drawn = top["avg_power_w"] if math.isfinite(top["avg_power_w"]) else top["cap_w"]
        x = (g["cap_w"] / drawn).to_numpy(dtype=float)
        y = (g["throughput"] / top["throughput"]).to_numpy(dtype=float)
        y = np.minimum(np.maximum.accumulate(y), 1.0)  # more watts never slow a job
        xs = np.concatenate([[0.0], x, [max(1.0, x[-1])]])
        ys = np.concatenate([[0.0], y, [1.0]])
        curve = np.interp(grid, xs, ys)
        # a GPU not held below its demand runs at full speed: the curve ends at 1
        curves[str(workload)] = np.minimum(curve / curve[-1], 1.0)
    if not curves:
        raise ValueError("the sweep has no workloads")
    median = np.median(np.stack(list(curves.values())), axis=0)

    def speed(workload: str, ratio: np.ndarray) -> np.ndarray:
        return np.interp(np.clip(ratio, 0.0, 1.0), grid, curves.get(workload, median))

    speed.description = (  # type: ignore[attr-defined]
        f"speed read off a cap sweep of {len(curves)} workloads (median curve for the others)"
    )
    return speed


@dataclass(frozen=True)
class WhatifSettings:
    duration_s: float = 3600.0
    seed: int = 0
    policy: PolicySettings = field(default_factory=PolicySettings)
    synchronised: bool = False  # every job from the start of its profile, together
    smoothing: bool = False  # GPUs move within their share of the grid spec's ramps
    smoothing_margin: float = DEFAULT_MARGIN
    # No controller: every GPU holds its failsafe cap throughout (provisioning at TDP or at
    # a static cap, planner.evaluate). decide() still measures the tree; its caps are unused.
    static_caps: bool = False
    # Per GPU model, what a communication phase draws relative to its profile: the SM clock
    # locked during communication (planner.evaluate reads it off a clock table). 1: no lock.
    comm_power_rel: Mapping[str, float] = field(default_factory=dict)
    # The controller's bound on commands that may wait: its decisions take turns under it
    # (policies.turns), a step being a cycle
    max_raises_per_s: float = MAX_RAISES_PER_S

    def __post_init__(self) -> None:
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"duration_s must be positive, not {self.duration_s}")
        bad = {m: r for m, r in self.comm_power_rel.items() if not (math.isfinite(r) and r > 0)}
        if bad:
            raise ValueError(f"comm_power_rel must be positive, not {bad}")


@dataclass
class WhatifResult:
    nodes: pd.DataFrame  # site, rows, racks
    levels: pd.DataFrame  # one row per level, servers included
    jobs: pd.DataFrame
    info: dict[str, object]
    site_power_w: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per step, measured
    # per job: the share of steps in communication and the mean per-GPU power drawn in them
    communication: pd.DataFrame = field(default_factory=pd.DataFrame)
    jobs_energy_j: float = 0.0  # what the jobs' GPUs drew: what costs are a share of


RAMP_HELD_TOLERANCE_W = 0.5  # a GPU this far below its natural draw is held by the ramp


def site_ramps(top: Topology, settings: WhatifSettings) -> GpuRamps:
    """Each GPU's share of the site's grid spec (``policies.smoothing``); the spec must
    limit something."""
    spec = top.grid
    if spec is None or not spec.can_smooth:
        raise ValueError(
            "smoothing needs a grid spec with a ramp limit or a floor: add [site.grid] "
            "to the budgets file (docs/BUDGETS.md, 'The grid spec')"
        )
    return gpu_ramps(
        spec.ramp_up_w_per_s,
        spec.ramp_down_w_per_s,
        spec.floor_fraction,
        top.tree.n_gpus,
        settings.smoothing_margin,
        hysteresis_s=spec.window_s,
    )


def replay(
    top: Topology,
    placement: Placement,
    traces: dict[str, WorkloadTrace],
    settings: WhatifSettings | None = None,
    speed: SpeedModel | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> WhatifResult:
    """Run the controller's policy over the placed jobs' profiles (module docstring);
    ``on_step(done, n_steps)`` after every step (a progress bar)."""
    settings = settings or WhatifSettings()
    speed = speed or power_law_speed()
    step_s = next(iter(traces.values())).step_s
    n_steps = max(1, math.ceil(settings.duration_s / step_s))
    rng = np.random.default_rng(settings.seed)
    policy = settings.policy
    # the controller's tree: its site ramp the grid's where the caps bound the draw's rise
    tree = file_tree_in_force(top, settings.smoothing, policy.safety_by_caps)
    n_nodes = tree.n_nodes
    jobs = placement.jobs
    n_jobs = len(jobs)

    source = DemandSource(
        top, placement, traces, rng, settings.synchronised, settings.comm_power_rel
    )
    ramps = site_ramps(top, settings) if settings.smoothing else NO_SMOOTHING
    if settings.smoothing:  # the controller's policy under grid smoothing
        policy = with_cut_fall(grid_policy(policy), ramps.down_w_per_s)
    turns, all_live = Turns.of(tree), np.ones(tree.n_servers, dtype=bool)
    max_raises = max(1, round(settings.max_raises_per_s * step_s))
    not_running = np.array([PHASE_CODES["idle"], PHASE_CODES["shutdown"]], dtype=np.int8)
    drawn_w: np.ndarray | None = None  # the draw under smoothing, carried step to step
    falling_s = np.zeros(0)  # how long each GPU has wanted to fall (the hysteresis)
    n_phases = len(PHASE_CODES)
    held_j_by_phase = np.zeros(n_phases)  # energy burnt holding floors and ramps, by phase

    busy, job_of = source.busy, source.job_of
    comm_code = np.int8(PHASE_CODES["communication"])
    job_priority = np.array([j.priority for j in jobs], dtype=np.int8)
    priority = np.where(busy, job_priority[job_of], NORMAL).astype(np.int8)
    floor_w = tree.cap_min_w.copy()
    controllable = np.ones(tree.n_gpus, dtype=bool)
    overhead_w = tree.overhead_below_w
    busy_idx, job_start = source.busy_idx, source.job_start  # a job's GPUs: contiguous

    all_jobs = np.arange(n_jobs)
    cap_w = tree.failsafe_cap_w.copy()  # agents start at their failsafe caps
    acc = {
        k: np.zeros(n_nodes)
        for k in (
            "capping",
            "cut_sum",
            "cut_max",
            "withheld_sum",
            "withheld_max",
            "above_budget",
            "above_limit",
            "above_limit_uncapped",
            "peak_w",
            "peak_demand_w",
        )
    }
    job_acc = {
        k: np.zeros(n_jobs)
        for k in (
            "speed",
            "held",
            "gpus_held",
            "ramp_held",
            "demand_w",
            "power_w",
            "comm",
            "comm_power_w",
        )
    }
    job_lost = np.zeros((n_jobs, len(LOST_CAUSES)))  # by cause (policies.causes.lost_index)
    causes = initial_causes(tree.n_gpus)  # why each GPU's cap is where it is
    site_w = np.empty(n_steps)  # the site's measured power, for the grid
    site_natural_w = site_w  # ... and what it would draw with no floor held (smoothing: below)
    if settings.smoothing:
        site_natural_w = np.empty(n_steps)
    # ... and were every waiting GPU to resume at once (policies.grid.least_ready_floor)
    site_resume_w = np.empty(n_steps)
    resume_levels = ResumeLevels(tree.n_gpus)
    progress_codes = phase_codes(PROGRESS_PHASES)
    waiting_codes = phase_codes(WAITING_PHASES)

    for t in range(n_steps):
        now_w, now_phase, demand_w, phase = source.at(t)
        power_w = np.minimum(demand_w, cap_w)
        natural_w = power_w
        if settings.smoothing:
            running = busy & ~np.isin(phase, not_running)
            want = wanted_w(natural_w, cap_w, running, ramps)
            if drawn_w is None:
                drawn_w, falling_s = want, np.zeros(tree.n_gpus)
            else:
                drawn_w, falling_s = ramp_toward(drawn_w, want, cap_w, ramps, step_s, falling_s)
            moved_w = drawn_w - natural_w  # above: burnt; below: held back by the ramp-up
            above = np.maximum(moved_w, 0.0)
            held_j_by_phase += np.bincount(phase, weights=above, minlength=n_phases) * step_s
            moved_sum_w = float(moved_w.sum())
            power_w = drawn_w
        state = ClusterState(
            power_w,
            cap_w,
            priority,
            floor_w,
            phase,
            controllable,
            phase_s=source.phase_s(t),
            phase_expected_s=source.phase_expected_s(t),
        )
        decision, _ = decide_in_turn(
            tree, state, all_live, step_s, policy, turns, max_raises, step_s
        )
        node_w = decision.node_power_w
        site_w[t] = node_w[0]
        if settings.smoothing:
            site_natural_w[t] = node_w[0] - moved_sum_w
        shortfall_w = resume_levels.step(
            natural_w, busy & in_codes(phase, progress_codes), busy & in_codes(phase, waiting_codes)
        )
        site_resume_w[t] = site_natural_w[t] + shortfall_w
        node_demand_w = tree.node_sum(demand_w) + overhead_w
        withheld = np.maximum(node_demand_w - node_w, 0.0)  # float noise below 0
        acc["capping"] += decision.node_capping
        acc["cut_sum"] += decision.node_cut_w
        np.maximum(acc["cut_max"], decision.node_cut_w, out=acc["cut_max"])
        acc["withheld_sum"] += withheld
        np.maximum(acc["withheld_max"], withheld, out=acc["withheld_max"])
        acc["above_budget"] += node_w > tree.budget_w
        acc["above_limit"] += node_w > tree.limit_w
        acc["above_limit_uncapped"] += node_demand_w > tree.limit_w
        np.maximum(acc["peak_w"], node_w, out=acc["peak_w"])
        np.maximum(acc["peak_demand_w"], node_demand_w, out=acc["peak_demand_w"])
        d = demand_w[busy_idx]
        speed_gpu, job_speed = source.speeds(power_w, demand_w, speed)
        job_acc["speed"] += job_speed
        gpu_cause = held_causes(power_w[busy_idx], d, natural_w[busy_idx], causes[busy_idx])
        held = gpu_cause != NOT_HELD
        job_acc["held"] += np.maximum.reduceat(held, job_start)
        job_acc["gpus_held"] += np.add.reduceat(held, job_start) / placement.job_gpus
        job_cause = job_causes(speed_gpu, gpu_cause, job_start)
        job_lost[all_jobs, lost_index(job_cause)] += 1.0 - job_speed
        if settings.smoothing:  # held below its natural draw by the ramp-up rate
            short = power_w[busy_idx] < natural_w[busy_idx] - RAMP_HELD_TOLERANCE_W
            job_acc["ramp_held"] += np.maximum.reduceat(short, job_start)
        job_acc["demand_w"] += now_w
        job_power_w = np.add.reduceat(power_w[busy_idx], job_start) / placement.job_gpus
        job_acc["power_w"] += job_power_w
        in_comm = now_phase == comm_code
        job_acc["comm"] += in_comm
        job_acc["comm_power_w"] += np.where(in_comm, job_power_w, 0.0)
        if not settings.static_caps:
            causes = cap_causes(causes, cap_w, decision, phase)
            cap_w = decision.cap_w
        if on_step is not None:
            on_step(t + 1, n_steps)

    info = {
        "steps": n_steps,
        "step_s": step_s,
        "duration_s": n_steps * step_s,
        "seed": settings.seed,
        "speed_model": getattr(speed, "description", "custom"),
        "start": "every GPU at its failsafe cap, as agents start",
    }
    jobs_j = float(job_acc["power_w"] @ placement.job_gpus) * step_s
    burnt = float(held_j_by_phase.sum()) if settings.smoothing else None
    info["grid"] = grid_report(
        site_w,
        step_s,
        top.grid,
        jobs_j,
        smoothing_j=burnt,
        demand_w=site_natural_w,
        resume_w=site_resume_w,
    )
    if settings.smoothing:
        info["smoothing"] = {
            "gpu_ramp_up_w_per_s": ramps.up_w_per_s,
            "gpu_ramp_down_w_per_s": ramps.down_w_per_s,
            "gpu_floor_fraction_of_cap": ramps.floor_fraction,
            "gpu_ramp_down_hysteresis_s": ramps.hysteresis_s,
            "margin": settings.smoothing_margin,
            "site_gpus": tree.n_gpus,
            # of the jobs' energy, by the phase the GPU was in when it burnt it
            "floor_energy_share_by_phase": {
                name: float(held_j_by_phase[code]) / jobs_j
                for name, code in PHASE_CODES.items()
                if held_j_by_phase[code] > 0 and jobs_j > 0
            },
        }
    info["synchronised"] = settings.synchronised
    if settings.static_caps:
        info["start"] = "every GPU at its failsafe cap throughout: no controller (static caps)"
    result = _result(top, tree, placement, acc, job_acc, job_lost, n_steps, info)
    result.site_power_w = site_w
    result.jobs_energy_j = jobs_j
    return result


def _result(
    top: Topology,
    tree: Tree,
    placement: Placement,
    acc: dict[str, np.ndarray],
    job_acc: dict[str, np.ndarray],
    job_lost: np.ndarray,
    n_steps: int,
    info: dict[str, object],
) -> WhatifResult:
    step_s = float(info["step_s"])  # type: ignore[arg-type]
    level = np.asarray(tree.level)
    cut_mean = np.divide(
        acc["cut_sum"], acc["capping"], out=np.zeros_like(acc["cut_sum"]), where=acc["capping"] > 0
    )
    table = pd.DataFrame(
        {
            "name": list(top.names),
            "level": [LEVEL_NAMES[int(v)] for v in level],
            "budget_w": tree.budget_w,
            "limit_w": tree.limit_w,
            "peak_demand_w": acc["peak_demand_w"],
            "peak_w": acc["peak_w"],
            "capping_share": acc["capping"] / n_steps,
            "cut_mean_w": cut_mean,
            "cut_max_w": acc["cut_max"],
            "withheld_mean_w": acc["withheld_sum"] / n_steps,
            "withheld_max_w": acc["withheld_max"],
            "s_above_budget": acc["above_budget"] * step_s,
            "s_above_limit": acc["above_limit"] * step_s,
            "s_above_limit_uncapped": acc["above_limit_uncapped"] * step_s,
        }
    )
    levels = (
        table.groupby("level", sort=False)
        .agg(
            nodes=("name", "size"),
            capping_share_mean=("capping_share", "mean"),
            capping_share_max=("capping_share", "max"),
            cut_max_w=("cut_max_w", "max"),
            s_above_budget_max=("s_above_budget", "max"),
            s_above_limit_max=("s_above_limit", "max"),
            s_above_limit_total=("s_above_limit", "sum"),
            s_above_limit_uncapped_max=("s_above_limit_uncapped", "max"),
        )
        .reset_index()
    )
    n = n_steps
    jobs = pd.DataFrame(
        {
            "job": [j.name for j in placement.jobs],
            "workload": [j.workload for j in placement.jobs],
            "priority": [("low", "normal", "high")[j.priority] for j in placement.jobs],
            "gpus": placement.job_gpus,
            "demand_w_per_gpu": job_acc["demand_w"] / n,
            "power_w_per_gpu": job_acc["power_w"] / n,
            "held_share": job_acc["held"] / n,
            "gpus_held_share": job_acc["gpus_held"] / n,
            "ramp_held_share": job_acc["ramp_held"] / n,
            "throughput_lost": 1.0 - job_acc["speed"] / n,
            **{lost_column(c): job_lost[:, k] / n for k, c in enumerate(LOST_CAUSES)},
        }
    )
    total_gpus = float(placement.job_gpus.sum())
    lost = float((jobs["throughput_lost"] * jobs["gpus"]).sum() / total_gpus) if total_gpus else 0.0
    by_cause = {
        c: float((jobs[lost_column(c)] * jobs["gpus"]).sum() / total_gpus) if total_gpus else 0.0
        for c in LOST_CAUSES
    }
    info = {**info, "throughput_lost_site": lost, "throughput_lost_site_by_cause": by_cause}
    below_servers = np.asarray(tree.level) < SERVER
    communication = pd.DataFrame(
        {
            "job": jobs["job"],
            "communication_share": job_acc["comm"] / n,
            "communication_w_per_gpu": np.divide(
                job_acc["comm_power_w"],
                job_acc["comm"],
                out=np.zeros(len(placement.jobs)),
                where=job_acc["comm"] > 0,
            ),
        }
    )
    table = table[below_servers].reset_index(drop=True)
    return WhatifResult(table, levels, jobs, info, communication=communication)


def lost_table(result: WhatifResult) -> pd.DataFrame:
    """Throughput lost, split by cause (``policies.causes``): one row per job and one for the
    site (GPU-weighted), one column per cause, as fractions of the job's throughput; the
    causes of a row add up to its ``throughput_lost``."""
    jobs = result.jobs
    rows = pd.DataFrame(
        {
            "job": jobs["job"],
            "priority": jobs["priority"],
            "throughput_lost": jobs["throughput_lost"],
            **{c: jobs[lost_column(c)] for c in LOST_CAUSES},
        }
    )
    by_cause = result.info["throughput_lost_site_by_cause"]
    assert isinstance(by_cause, dict)
    site = {
        "job": "site (GPU-weighted)",
        "priority": "",
        "throughput_lost": result.info["throughput_lost_site"],
        **by_cause,
    }
    return pd.concat([rows, pd.DataFrame([site])], ignore_index=True)


def grid_table(grid: dict[str, object]) -> pd.DataFrame:
    """``info["grid"]`` (powerd.topology.grid.grid_report) as rows: what, unit, value, limit,
    seconds outside it."""
    edges = grid["oscillation_band_seen_hz"] or grid["oscillation_band_hz"]
    assert isinstance(edges, list)
    lo, hi = edges
    window = f"{grid['oscillation_window_s']:g} s"
    ramp = f"over {grid['ramp_window_s']:g} s"
    rows: list[tuple[str, str, object, object, object]] = []
    for way in ("up", "down"):
        limit = grid.get(f"ramp_{way}_limit_w_per_s")
        rows.append(
            (
                f"ramp {way}, max {ramp}",
                "W/s",
                grid[f"ramp_{way}_max_w_per_s"],
                limit,
                grid.get(f"s_outside_ramp_{way}"),
            )
        )
        p99 = grid[f"ramp_{way}_p99_w_per_s"]
        rows.append((f"ramp {way}, p99 {ramp}", "W/s", p99, limit, None))
    band = f"{lo:g}-{hi:g} Hz"
    rows += [
        (
            f"oscillation share {band}, worst {window}",
            "share",
            grid["oscillation_share_max"],
            grid.get("oscillation_max_share"),
            grid.get("s_outside_oscillation"),
        ),
        (f"oscillation share {band}, whole replay", "share", grid["oscillation_share"], None, None),
        (
            f"oscillation in {band}, RMS, worst {window}",
            "W",
            grid["oscillation_band_rms_max_w"],
            grid.get("oscillation_min_rms_w") or None,
            None,
        ),
        (f"peak-to-peak, worst {window}", "W", grid["peak_to_peak_max_w"], None, None),
    ]
    if "floor_energy_kwh" in grid:
        if grid["floor_source"] == "burnt by smoothing":
            floor = "floors and ramp-downs (smoothing, burnt)"
        else:
            floor = f"floor at {grid['floor_fraction']:g} of the recent peak (if held)"
        rows.append((f"energy holding the {floor}", "kWh", grid["floor_energy_kwh"], None, None))
        rows.append(
            (
                f"energy holding the {floor}",
                "share of jobs' energy",
                grid["floor_energy_share_of_jobs"],
                None,
                None,
            )
        )
    for key, what in (
        ("least", "energy the least floor within the ramp limits burns"),
        ("ready", "energy the least floor that cannot know when waits end burns"),
    ):
        if f"floor_{key}_kwh" in grid:  # no floor (that knows so much) meets the limits for less
            rows.append((what, "kWh", grid[f"floor_{key}_kwh"], None, None))
            share = grid[f"floor_{key}_share_of_jobs"]
            rows.append((what, "share of jobs' energy", share, None, None))
    return pd.DataFrame(rows, columns=["what", "unit", "value", "limit", "s_outside"])


# --- rack energy storage, on the replayed site series ------------------------------------


@dataclass(frozen=True)
class StorageSizing:
    """Rack energy storage to try (``storage_report``): per rack, as a vendor states it."""

    kj_per_rack: float
    kw_per_rack: float  # charge and discharge
    round_trip: float = DEFAULT_ROUND_TRIP
    horizon_s: float = DEFAULT_HORIZON_S
    margin: float = DEFAULT_MARGIN  # of the spec's ramp limits the grid draw may use

    def pool(self, racks: int) -> Storage:
        """Every rack's storage as one site-level pool (``policies.storage``)."""
        return Storage(
            self.kj_per_rack * 1e3 * racks, self.kw_per_rack * 1e3 * racks, self.round_trip
        )


def storage_spec(top: Topology) -> GridSpec:
    """The grid spec storage is dispatched to meet: it must limit the ramp."""
    if top.grid is None or not top.grid.limits_ramp:
        raise ValueError(
            "rack storage needs a grid spec with a ramp limit to dispatch to: add "
            "[site.grid] with ramp_up_mw_per_s / ramp_down_mw_per_s to the budgets file "
            "(docs/BUDGETS.md, 'The grid spec')"
        )
    return top.grid


def rack_count(top: Topology) -> int:
    """The site's racks (what storage per rack is multiplied by)."""
    racks = int(np.count_nonzero(np.asarray(top.tree.level) == RACK))
    if racks == 0:
        raise ValueError("rack storage needs racks: the budgets file has none")
    return racks


def check_storage(top: Topology, sizing: StorageSizing) -> tuple[GridSpec, Storage]:
    """Everything ``storage_report`` needs, checked before a long replay (ValueError): the
    spec it dispatches to and the site's pool."""
    spec = storage_spec(top)
    pool = sizing.pool(rack_count(top))
    if not (math.isfinite(sizing.horizon_s) and sizing.horizon_s > 0):
        raise ValueError(f"the storage horizon must be positive, not {sizing.horizon_s} s")
    if not 0 < sizing.margin <= 1:
        raise ValueError(f"the storage margin must be in (0, 1], not {sizing.margin}")
    return spec, pool


def _kwh_and_share(name: str, joules: float, jobs_j: float) -> dict[str, float | None]:
    share = joules / jobs_j if jobs_j > 0 else None
    return {f"{name}_kwh": joules / J_PER_KWH, f"{name}_share_of_jobs": share}


def storage_report(top: Topology, result: WhatifResult, sizing: StorageSizing) -> dict[str, object]:
    """``info["storage"]``: the storage dispatched over the replayed site series, the grid
    draw it leaves measured as the site is (``grid_report``, without its floor costs: the
    storage's own are here), and where the energy went, each in kWh and as a share of the
    jobs' energy, beside the least floor without storage (``info["grid"]``)."""
    spec, pool = check_storage(top, sizing)
    racks = rack_count(top)
    step_s = float(result.info["step_s"])  # type: ignore[arg-type]
    up, down = (sizing.margin * spec.ramp_up_w_per_s, sizing.margin * spec.ramp_down_w_per_s)
    run = dispatch(result.site_power_w, step_s, pool, up, down, sizing.horizon_s)
    jobs_j = result.jobs_energy_j
    measured = grid_report(run.grid_w, step_s, spec, jobs_j, demand_w=run.grid_w)
    site_grid = result.info.get("grid", {})
    assert isinstance(site_grid, dict)
    capacity = pool.capacity_j or math.nan
    return {
        "kj_per_rack": sizing.kj_per_rack,
        "kw_per_rack": sizing.kw_per_rack,
        "racks": racks,
        "capacity_kwh": pool.capacity_j / J_PER_KWH,
        "power_w": pool.power_w,
        "round_trip_efficiency": pool.round_trip,
        "horizon_s": sizing.horizon_s,
        "margin": sizing.margin,
        "assumptions": [
            "one site-level pool: every rack's storage dispatched together (the grid sees "
            "only the site)",
            f"round trip {pool.round_trip:g} (assumed), {pool.one_way:.3f} each way; "
            "no ageing, self-discharge or cost",
            f"grid draw: the demand's mean over the last {sizing.horizon_s:g} s plus a pull "
            f"back to {pool.reference:g} charge, moved within {sizing.margin:g} x the spec's "
            "ramp limits",
            "what storage cannot take is burnt (a floor); what it cannot give is held back "
            "(GPUs capped): the grid spec is kept",
            "the replay is the same without storage: work held back is not replayed later",
        ],
        "grid": {k: v for k, v in measured.items() if not k.startswith("floor")},
        **_kwh_and_share("burnt", run.burnt_j, jobs_j),
        **_kwh_and_share("conversion_loss", run.conversion_loss_j, jobs_j),
        **_kwh_and_share("burnt_and_losses", run.burnt_j + run.conversion_loss_j, jobs_j),
        **_kwh_and_share("held_back", run.held_back_j, jobs_j),
        "least_floor_without_storage_kwh": site_grid.get("floor_least_kwh"),
        "least_floor_without_storage_share_of_jobs": site_grid.get("floor_least_share_of_jobs"),
        "charge_min_share": run.charge_min_j / capacity if pool.capacity_j else None,
        "charge_max_share": run.charge_max_j / capacity if pool.capacity_j else None,
    }


def storage_table(storage: dict[str, object]) -> pd.DataFrame:
    """``info["storage"]`` (``storage_report``) as rows: what, unit, value; its grid draw is
    ``grid_table(storage["grid"])``."""
    rows: list[tuple[str, str, object]] = [
        ("storage per rack", "kJ", storage["kj_per_rack"]),
        ("storage per rack, charge and discharge", "kW", storage["kw_per_rack"]),
        ("racks (one pool)", "", storage["racks"]),
        ("round trip efficiency (assumed)", "share", storage["round_trip_efficiency"]),
        ("grid draw target: mean over", "s", storage["horizon_s"]),
    ]
    for key, what in (
        ("burnt", "energy burnt (a floor: storage full or at its power)"),
        ("conversion_loss", "energy lost charging and discharging"),
        ("burnt_and_losses", "burnt and lost together"),
        ("held_back", "energy held back (GPUs capped: storage empty or at its power)"),
        ("least_floor_without_storage", "the least floor within the ramp limits, no storage"),
    ):
        rows.append((what, "kWh", storage[f"{key}_kwh"]))
        rows.append((what, "share of jobs' energy", storage[f"{key}_share_of_jobs"]))
    rows.append(("charge, lowest", "share of capacity", storage["charge_min_share"]))
    rows.append(("charge, highest", "share of capacity", storage["charge_max_share"]))
    return pd.DataFrame(rows, columns=["what", "unit", "value"])
