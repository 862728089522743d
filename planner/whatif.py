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
(``info["grid"]``), and under a ramp limit the work lost to the grid against
its bound (``grid_report``'s ``lost_*``: the site's demand, every GPU's demand
uncapped plus the overheads, not served; budget capping, were it to bind,
counts too). Without one the same is measured with the defaults and
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

Rack energy storage on the replayed site series: ``planner.whatif_storage``.
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
    Decision,
    PolicySettings,
    Tree,
)
from policies.causes import (
    LOST_CAUSES,
    NOT_HELD,
    carry_causes,
    grid_held_w,
    held_causes,
    initial_carried,
    job_causes,
    lost_column,
    lost_index,
)
from policies.grid import ResumeLevels
from policies.rules import WAITING_PHASES
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
from policies.tree import LEVEL_NAMES, PRIORITY_CODES, in_codes, phase_codes
from policies.turns import MAX_RAISES_PER_S, Turns, decide_in_turn
from powerd.controller.smoothing import file_tree_in_force
from powerd.topology import Topology
from powerd.topology.grid import grid_report
from powerd.vocabulary import PROGRESS_PHASES

DEFAULT_SPEED_EXPONENT = 0.28  # ln(0.95) / ln(1000 / 1200): docs/DOMAIN.md, Meta's GB200


def power_law_speed(exponent: float = DEFAULT_SPEED_EXPONENT) -> SpeedModel:
    if not (math.isfinite(exponent) and 0 <= exponent <= 2):
        raise ValueError(f"speed exponent must be in 0..2, not {exponent}")

    def speed(workload: str, ratio: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.power(np.clip(ratio, 0.0, 1.0), exponent)
        return out

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
        out: np.ndarray = np.interp(np.clip(ratio, 0.0, 1.0), grid, curves.get(workload, median))
        return out

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
    # per step, what the site would draw with no grid spec: no floor held, nothing held back
    # by a grid rule (budget capping in); the demand every grid bound is computed on
    site_demand_w: np.ndarray = field(default_factory=lambda: np.zeros(0))
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
    source = DemandSource(
        top, placement, traces, rng, settings.synchronised, settings.comm_power_rel
    )
    ramps = site_ramps(top, settings) if settings.smoothing else NO_SMOOTHING
    if settings.smoothing:  # the controller's policy under grid smoothing
        policy = with_cut_fall(grid_policy(policy), ramps.down_w_per_s)
    smoothing = _Smoothing(ramps, step_s) if settings.smoothing else None
    tallies = _Tallies.zeros(tree.n_nodes, len(placement.jobs), n_steps, settings.smoothing)
    max_raises = max(1, round(settings.max_raises_per_s * step_s))
    steps = _Steps(
        tree, source, placement, policy, speed, smoothing, step_s, max_raises, settings.static_caps
    )
    for t in range(n_steps):
        steps.step(t, tallies)
        if on_step is not None:
            on_step(t + 1, n_steps)
    jobs_j = float(tallies.job_acc["power_w"] @ placement.job_gpus) * step_s
    info = _replay_info(top, tree, settings, speed, ramps, tallies, n_steps, step_s, jobs_j)
    result = _result(
        top, tree, placement, tallies.acc, tallies.job_acc, tallies.job_lost, n_steps, info
    )
    result.site_power_w = tallies.site_w
    result.site_demand_w = tallies.site_need_w
    result.jobs_energy_j = jobs_j
    return result


_NODE_TALLIES = (
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
_JOB_TALLIES = (
    "speed",
    "held",
    "gpus_held",
    "ramp_held",
    "demand_w",
    "power_w",
    "comm",
    "comm_power_w",
)


@dataclass
class _Tallies:
    """What a replay adds up, step by step."""

    acc: dict[str, np.ndarray]  # _NODE_TALLIES per tree node
    job_acc: dict[str, np.ndarray]  # _JOB_TALLIES per job
    job_lost: np.ndarray  # (n_jobs, causes): by cause (policies.causes.lost_index)
    site_w: np.ndarray  # (n_steps,) the site's measured power, for the grid
    site_natural_w: np.ndarray  # ... what it would draw with no floor held (site_w unsmoothed)
    # ... and were every waiting GPU to resume at once (policies.grid.least_ready_floor)
    site_resume_w: np.ndarray
    # ... with no grid spec: the natural draw plus what the grid's rules held back (budget
    # capping stays in: its cost is not the grid's); and that held-back work, J, GPU by GPU
    site_need_w: np.ndarray
    grid_held_j: float
    held_j_by_phase: np.ndarray  # energy burnt holding floors and ramps, by phase

    @classmethod
    def zeros(cls, n_nodes: int, n_jobs: int, n_steps: int, smoothing: bool) -> _Tallies:
        site_w = np.empty(n_steps)
        return cls(
            acc={k: np.zeros(n_nodes) for k in _NODE_TALLIES},
            job_acc={k: np.zeros(n_jobs) for k in _JOB_TALLIES},
            job_lost=np.zeros((n_jobs, len(LOST_CAUSES))),
            site_w=site_w,
            site_natural_w=np.empty(n_steps) if smoothing else site_w,
            site_resume_w=np.empty(n_steps),
            site_need_w=np.empty(n_steps),
            grid_held_j=0.0,
            held_j_by_phase=np.zeros(len(PHASE_CODES)),
        )


@dataclass
class _Smoothing:
    """The GPUs' draw under grid smoothing, carried from step to step."""

    ramps: GpuRamps
    step_s: float
    drawn_w: np.ndarray | None = None
    falling_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # wanting to fall (s)

    def draw(
        self,
        natural_w: np.ndarray,
        cap_w: np.ndarray,
        running: np.ndarray,
        phase: np.ndarray,
        held_j_by_phase: np.ndarray,
    ) -> tuple[np.ndarray, float]:
        """What the GPUs draw this step, and its sum less their natural draw; adds the
        energy burnt above the natural draw to ``held_j_by_phase``, in place."""
        want = wanted_w(natural_w, cap_w, running, self.ramps)
        if self.drawn_w is None:
            self.drawn_w, self.falling_s = want, np.zeros(len(want))
        else:
            self.drawn_w, self.falling_s = ramp_toward(
                self.drawn_w, want, cap_w, self.ramps, self.step_s, self.falling_s
            )
        moved_w = self.drawn_w - natural_w  # above: burnt; below: held back by the ramp-up
        above = np.maximum(moved_w, 0.0)
        n_phases = len(held_j_by_phase)
        held_j_by_phase += np.bincount(phase, weights=above, minlength=n_phases) * self.step_s
        return self.drawn_w, float(moved_w.sum())


class _Steps:
    """One replay's steps: the jobs' demand, the GPUs' draw, the controller's decision,
    and what is tallied; the caps and their causes carry from step to step."""

    def __init__(
        self,
        tree: Tree,
        source: DemandSource,
        placement: Placement,
        policy: PolicySettings,
        speed: SpeedModel,
        smoothing: _Smoothing | None,
        step_s: float,
        max_raises: int,
        static_caps: bool,
    ) -> None:
        self.tree, self.source, self.placement = tree, source, placement
        self.policy, self.speed, self.smoothing = policy, speed, smoothing
        self.step_s, self.max_raises = step_s, max_raises
        self.static_caps = static_caps  # every GPU keeps its failsafe cap: no controller
        self.turns, self.all_live = Turns.of(tree), np.ones(tree.n_servers, dtype=bool)
        job_priority = np.array([PRIORITY_CODES[j.priority] for j in placement.jobs], dtype=np.int8)
        busy = source.busy
        self.priority = np.where(busy, job_priority[source.job_of], NORMAL).astype(np.int8)
        self.floor_w = tree.cap_min_w.copy()
        self.controllable = np.ones(tree.n_gpus, dtype=bool)
        self.cap_w = tree.failsafe_cap_w.copy()  # agents start at their failsafe caps
        self.carried = initial_carried(tree.n_gpus)  # why each GPU's cap is where it is
        self.resume_levels = ResumeLevels(tree.n_gpus)

    def step(self, t: int, tallies: _Tallies) -> None:
        tree, source, busy = self.tree, self.source, self.source.busy
        now_w, now_phase, demand_w, phase = source.at(t)
        natural_w = np.minimum(demand_w, self.cap_w)
        power_w, moved_sum_w = natural_w, 0.0
        if self.smoothing is not None:
            running = busy & ~in_codes(phase, _NOT_RUNNING_CODES)
            power_w, moved_sum_w = self.smoothing.draw(
                natural_w, self.cap_w, running, phase, tallies.held_j_by_phase
            )
        state = ClusterState(
            power_w,
            self.cap_w,
            self.priority,
            self.floor_w,
            phase,
            self.controllable,
            phase_s=source.phase_s(t),
            phase_expected_s=source.phase_expected_s(t),
        )
        decision, _ = decide_in_turn(
            tree,
            state,
            self.all_live,
            self.step_s,
            self.policy,
            self.turns,
            self.max_raises,
            self.step_s,
        )
        node_w = decision.node_power_w
        tallies.site_w[t] = node_w[0]
        if self.smoothing is not None:
            tallies.site_natural_w[t] = node_w[0] - moved_sum_w
        shortfall_w = self.resume_levels.step(
            natural_w,
            busy & in_codes(phase, _PROGRESS_CODES),
            busy & in_codes(phase, _WAITING_CODES),
        )
        tallies.site_resume_w[t] = tallies.site_natural_w[t] + shortfall_w
        node_demand_w = tree.node_sum(demand_w) + tree.overhead_below_w
        _tally_nodes(tallies.acc, tree, decision, node_demand_w)
        held_w, above_natural_w = self._tally_jobs(
            tallies, power_w, demand_w, natural_w, now_w, now_phase
        )
        tallies.site_need_w[t] = tallies.site_natural_w[t] + above_natural_w
        tallies.grid_held_j += held_w * self.step_s
        if not self.static_caps:
            self.carried = carry_causes(self.carried, self.cap_w, decision, phase)
            self.cap_w = decision.cap_w

    def _tally_jobs(
        self,
        tallies: _Tallies,
        power_w: np.ndarray,
        demand_w: np.ndarray,
        natural_w: np.ndarray,
        now_w: np.ndarray,
        now_phase: np.ndarray,
    ) -> tuple[float, float]:
        """Per job: its speed, whether and why it was held, its demand and draw. Returns
        what the grid's rules held back now, W: (the demand they held back, the part of it
        that is not already in the site's natural draw), ``grid_held_w``."""
        busy_idx, job_start = self.source.busy_idx, self.source.job_start  # contiguous
        job_gpus, job_acc = self.placement.job_gpus, tallies.job_acc
        speed_gpu, job_speed = self.source.speeds(power_w, demand_w, self.speed)
        job_acc["speed"] += job_speed
        cause = self.carried.cause[busy_idx]
        gpu_cause = held_causes(power_w[busy_idx], demand_w[busy_idx], natural_w[busy_idx], cause)
        held = gpu_cause != NOT_HELD
        job_acc["held"] += np.maximum.reduceat(held, job_start)
        job_acc["gpus_held"] += np.add.reduceat(held, job_start) / job_gpus
        job_cause = job_causes(speed_gpu, gpu_cause, job_start)
        tallies.job_lost[np.arange(len(job_gpus)), lost_index(job_cause)] += 1.0 - job_speed
        if self.smoothing is not None:  # held below its natural draw by the ramp-up rate
            short = power_w[busy_idx] < natural_w[busy_idx] - RAMP_HELD_TOLERANCE_W
            job_acc["ramp_held"] += np.maximum.reduceat(short, job_start)
        job_acc["demand_w"] += now_w
        job_power_w = np.add.reduceat(power_w[busy_idx], job_start) / job_gpus
        job_acc["power_w"] += job_power_w
        in_comm = now_phase == _COMM_CODE
        job_acc["comm"] += in_comm
        job_acc["comm_power_w"] += np.where(in_comm, job_power_w, 0.0)
        held_w, beyond_w = grid_held_w(
            power_w[busy_idx],
            demand_w[busy_idx],
            natural_w[busy_idx],
            cause,
            self.carried.staged_from_w[busy_idx],
        )
        return float(held_w.sum()), float(beyond_w.sum())


_NOT_RUNNING_CODES = phase_codes(("idle", "shutdown"))
_PROGRESS_CODES = phase_codes(PROGRESS_PHASES)
_WAITING_CODES = phase_codes(WAITING_PHASES)
_COMM_CODE = np.int8(PHASE_CODES["communication"])


def _tally_nodes(
    acc: dict[str, np.ndarray], tree: Tree, decision: Decision, node_demand_w: np.ndarray
) -> None:
    """Per tree node: capping, cuts, what was withheld, time above budget and limit, peaks."""
    node_w = decision.node_power_w
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


def _replay_info(
    top: Topology,
    tree: Tree,
    settings: WhatifSettings,
    speed: SpeedModel,
    ramps: GpuRamps,
    tallies: _Tallies,
    n_steps: int,
    step_s: float,
    jobs_j: float,
) -> dict[str, object]:
    """How the replay ran, and the grid's (and smoothing's) report of the site's draw."""
    held_j_by_phase = tallies.held_j_by_phase
    info: dict[str, object] = {
        "steps": n_steps,
        "step_s": step_s,
        "duration_s": n_steps * step_s,
        "seed": settings.seed,
        "speed_model": getattr(speed, "description", "custom"),
        "start": "every GPU at its failsafe cap, as agents start",
    }
    burnt = float(held_j_by_phase.sum()) if settings.smoothing else None
    info["grid"] = grid_report(
        tallies.site_w,
        step_s,
        top.grid,
        jobs_j,
        smoothing_j=burnt,
        demand_w=tallies.site_natural_w,
        resume_w=tallies.site_resume_w,
        need_w=tallies.site_need_w,
        lost_j=tallies.grid_held_j,
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
    return info


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
            "priority": [j.priority for j in placement.jobs],
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


def site_limit_w(result: WhatifResult) -> float:
    """The replayed site's limit: the scale :func:`grid_table` writes the site's power in."""
    nodes = result.nodes
    return float(nodes.loc[nodes["level"] == "site", "limit_w"].iloc[0])


def grid_table(grid: dict[str, object], site_w: float) -> pd.DataFrame:
    """``info["grid"]`` (powerd.topology.grid.grid_report) as rows: what, unit, value, limit,
    seconds outside it. Power and ramps in the site's scale (``powerd.units.power_unit`` of
    ``site_w``, its limit: kW/s for a 215 kW site, MW/s for 150 MW), the unit the grid
    spec's own line is written in (JSON keeps watts)."""
    from powerd.units import power_unit

    factor, symbol = power_unit(site_w)

    def scaled(value: object) -> object:
        return value / factor if isinstance(value, int | float) else value

    edges = grid["oscillation_band_seen_hz"] or grid["oscillation_band_hz"]
    assert isinstance(edges, list)
    lo, hi = edges
    window = f"{grid['oscillation_window_s']:g} s"
    ramp = f"over {grid['ramp_window_s']:g} s"
    rows: list[tuple[str, str, object, object, object]] = []
    for way in ("up", "down"):
        limit = scaled(grid.get(f"ramp_{way}_limit_w_per_s"))
        rows.append(
            (
                f"ramp {way}, max {ramp}",
                f"{symbol}/s",
                scaled(grid[f"ramp_{way}_max_w_per_s"]),
                limit,
                grid.get(f"s_outside_ramp_{way}"),
            )
        )
        p99 = scaled(grid[f"ramp_{way}_p99_w_per_s"])
        rows.append((f"ramp {way}, p99 {ramp}", f"{symbol}/s", p99, limit, None))
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
            symbol,
            scaled(grid["oscillation_band_rms_max_w"]),
            scaled(grid.get("oscillation_min_rms_w") or None),
            None,
        ),
        (f"peak-to-peak, worst {window}", symbol, scaled(grid["peak_to_peak_max_w"]), None, None),
    ]
    rows += [(what, unit, value, None, None) for what, unit, value in _grid_cost_rows(grid)]
    return pd.DataFrame(rows, columns=["what", "unit", "value", "limit", "s_outside"])


_LOST_WORK_ROWS = (  # (what, unit, grid_report's key): policies.grid_frontier's bounds
    ("energy burnt over the least a causal floor burns", "ratio", "floor_ratio_to_causal"),
    (
        "seconds that causal floor is outside the oscillation limit (it minds ramps only)",
        "s",
        "floor_ready_s_outside_oscillation",
    ),
    ("work lost to the grid (demand not served)", "kWh", "lost_work_kwh"),
    ("least work lost within the ramp limits, burning as much", "kWh", "lost_least_kwh"),
    ("work lost over the least at that energy", "ratio", "lost_ratio_to_bound"),
    (
        "least work lost keeping these floors, rising at the ramp limit",
        "kWh",
        "lost_at_floors_kwh",
    ),
    ("work lost over the least at these floors", "ratio", "lost_ratio_at_floors"),
)


def _grid_cost_rows(grid: dict[str, object]) -> list[tuple[str, str, object]]:
    """``grid_table``'s rows of what smoothing costs: the floor energy, the least floors,
    the work lost and its bounds (what, unit, value), where the report has them."""
    rows: list[tuple[str, str, object]] = []
    if "floor_energy_kwh" in grid:
        if grid["floor_source"] == "burnt by smoothing":
            floor = "floors and ramp-downs (smoothing, burnt)"
        else:
            floor = f"floor at {grid['floor_fraction']:g} of the recent peak (if held)"
        rows.append((f"energy holding the {floor}", "kWh", grid["floor_energy_kwh"]))
        share = grid["floor_energy_share_of_jobs"]
        rows.append((f"energy holding the {floor}", "share of jobs' energy", share))
    for key, what in (
        ("least", "energy the least floor within the ramp limits burns"),
        ("ready", "energy the least floor that cannot know when waits end burns"),
    ):
        if f"floor_{key}_kwh" in grid:  # no floor (that knows so much) meets the limits for less
            rows.append((what, "kWh", grid[f"floor_{key}_kwh"]))
            rows.append((what, "share of jobs' energy", grid[f"floor_{key}_share_of_jobs"]))
    if "lost_work_kwh" in grid:
        rows += [(what, unit, grid.get(key)) for what, unit, key in _LOST_WORK_ROWS]
    return rows
