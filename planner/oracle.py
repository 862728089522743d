"""The oracle: the most work any controller could do on a site's limits (pure).

Strategy (o) of ``powerplan evaluate``. At every step of the replay
(``planner.demand.DemandSource``: the same jobs, offsets and demands as (c)) each
GPU's power ``x`` is chosen with perfect knowledge of every GPU's demand ``d``, no
reaction delay and priorities ignored, to maximise ``sum (x / d) ** a`` (the speed law
the replay uses, exponent ``a``) subject to every node's limit: GPU power under it plus
its non-GPU power within ``limit_w``. A GPU draws ``min(d, cap_min)`` at least (a cap
cannot go lower) and ``d`` at most; an idle GPU does no work and gets its least. The
optimum is a water-filling (``policies.fill`` with ``slope = d ** (-a / (1 - a))``, the
KKT point of the concave objective under a laminar family of limits).

Throughput is then counted as the replay counts it: a job runs at its slowest GPU's
speed. Every GPU of a job has the job's profile, so its GPUs get equal power unless a
limit binds unevenly between them; the per-GPU optimum is an upper bound on any
allocation's sum of GPU speeds, and on a site where limits bind evenly on a job's
GPUs, the job-paced throughput reported is that bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner.demand import DemandSource, SpeedModel
from planner.mix import Placement
from planner.sizing import WorkloadTrace
from planner.whatif import DEFAULT_SPEED_EXPONENT, WhatifSettings, power_law_speed
from policies.fill import fill
from powerd.topology import Topology


@dataclass
class OracleResult:
    throughput_gpus: float  # sum over jobs of GPUs x mean job speed
    job_speed: np.ndarray  # (n_jobs,) mean speed over the steps
    site_mean_w: float  # mean site power, overheads in
    steps: int
    distinct_steps: int  # steps solved (the rest repeat one solved already)


def oracle_power(
    top: Topology, demand_w: np.ndarray, busy: np.ndarray, exponent: float
) -> np.ndarray:
    """Each GPU's power in the optimum of ``sum (x / d) ** exponent`` under every limit."""
    tree = top.tree
    least = np.minimum(demand_w, tree.cap_min_w)
    most = np.where(busy & (demand_w > 0), demand_w, least)
    a = min(max(exponent, 1e-6), 0.999)
    weight = np.power(np.maximum(demand_w, 1e-9), -a / (1.0 - a))
    return fill(tree, np.zeros(len(demand_w)), weight, least, most, tree.gpu_room_w)


def replay_oracle(
    top: Topology,
    placement: Placement,
    traces: dict[str, WorkloadTrace],
    settings: WhatifSettings,
    speed: SpeedModel | None = None,
    exponent: float = DEFAULT_SPEED_EXPONENT,
    on_step: Callable[[int, int], None] | None = None,
) -> OracleResult:
    """(o) over the replay's steps (module docstring). ``speed`` counts the work (the
    replay's model); ``exponent`` is the law the allocation optimises (a measured sweep
    has none: its allocation is then the power law's, an approximation of the bound)."""
    speed = speed or power_law_speed(exponent)
    step_s = next(iter(traces.values())).step_s
    n_steps = max(1, math.ceil(settings.duration_s / step_s))
    rng = np.random.default_rng(settings.seed)
    source = DemandSource(
        top, placement, traces, rng, settings.synchronised, settings.comm_power_rel
    )
    n_jobs = len(placement.jobs)
    overhead_w = float(top.tree.overhead_below_w[0])
    solved: dict[bytes, tuple[np.ndarray, float]] = {}
    speed_sum = np.zeros(n_jobs)
    site_sum_w = 0.0
    for t in range(n_steps):
        now_w, now_phase, demand_w, _ = source.at(t)
        key = now_w.tobytes() + (now_phase.tobytes() if source.scale_comm else b"")
        if key not in solved:
            x = oracle_power(top, demand_w, source.busy, exponent)
            solved[key] = (source.speeds(x, demand_w, speed)[1], float(x.sum()))
        job_speed, gpus_w = solved[key]
        speed_sum += job_speed
        site_sum_w += gpus_w + overhead_w
        if on_step is not None:
            on_step(t + 1, n_steps)
    job_speed = speed_sum / n_steps
    return OracleResult(
        throughput_gpus=float(job_speed @ placement.job_gpus),
        job_speed=job_speed,
        site_mean_w=site_sum_w / n_steps,
        steps=n_steps,
        distinct_steps=len(solved),
    )
