"""Policy cost: one ``policies.decide()`` over a GB200-class site, realistic and worst cases.

The default site is Meta's (docs/DOMAIN.md): 16 rows × 72 racks × 18 servers × 4
GPUs = 82,944 GPUs, 200-1200 W caps, budgets from ``tests.support.policy_trees.gb200_site``
(racks planned at 960 W per GPU, rows and site at 95 % of their racks).
Three states, each timed over ``--runs`` calls after a warm-up:

- ``realistic``: GPUs computing at 750-950 W, one job (1/8 of the GPUs) in
  communication at ~400 W, one (1/16) in a checkpoint at ~300 W, 4 % of the
  racks hot enough to cap, 10 % of the GPUs still capped from earlier cycles
  and being handed watts back, 0.5 % offline, a mix of priorities.
- ``worst_all_racks_over``: every GPU at 1100-1200 W, one priority class, no
  job floors: every rack, row and the site above its threshold, and each of
  those levels water-fills across all of its GPUs (the most sorting there is).
- ``worst_half_uncapping``: the site below its uncapping threshold with half
  of its GPUs capped low: every level's ramp limit binds.
- ``steady_one_rack_pushed``: every GPU at 960 W computing at ~720 W, one rack pushed
  to its caps (the fleet simulator's steady state).

    python -m bench.bench_policy [--runs 30] [--json out.json] [--rows 16 --racks 72 ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import add_safety_argument, machine, report
from policies import PHASE_CODES, ClusterState, PolicySettings, Tree, decide
from tests.support.policy_trees import gb200_site


def realistic(tree: Tree, rng: np.random.Generator) -> ClusterState:
    n = tree.n_gpus
    power = rng.uniform(750.0, 950.0, n)
    cap = np.full(n, 1200.0)
    phase = np.full(n, PHASE_CODES["compute"], dtype=np.int8)
    priority = rng.choice([0, 1, 2], n, p=[0.2, 0.6, 0.2]).astype(np.int8)
    # one job (an eighth of the GPUs) waiting on a collective, one (a sixteenth) in a checkpoint
    comm, ckpt = slice(0, n // 8), slice(n // 8, n // 8 + n // 16)
    power[comm], phase[comm] = rng.uniform(350.0, 450.0, n // 8), PHASE_CODES["communication"]
    power[ckpt], phase[ckpt] = rng.uniform(250.0, 350.0, n // 16), PHASE_CODES["checkpoint"]
    # 4 % of the racks run hot
    gpu_rack = tree.gpu_ancestor[2]
    racks = np.unique(gpu_rack)
    hot = np.isin(gpu_rack, rng.choice(racks, max(1, len(racks) // 25), replace=False))
    power[hot] = rng.uniform(1100.0, 1200.0, int(hot.sum()))
    # 10 % still capped from earlier cycles, being handed watts back
    capped = rng.random(n) < 0.10
    cap[capped] = rng.uniform(700.0, 1100.0, int(capped.sum()))
    power = np.minimum(power, cap)
    return ClusterState(
        power_w=power,
        cap_w=cap,
        priority=priority,
        floor_w=tree.cap_min_w.copy(),
        phase=phase,
        controllable=rng.random(n) > 0.005,
    )


def computing(tree: Tree, power_w: np.ndarray, cap_w: np.ndarray) -> ClusterState:
    """Every GPU computing, normal priority, controllable: the synthetic states below."""
    n = tree.n_gpus
    return ClusterState(
        power_w=power_w,
        cap_w=cap_w,
        priority=np.full(n, 1, dtype=np.int8),
        floor_w=tree.cap_min_w.copy(),
        phase=np.full(n, PHASE_CODES["compute"], dtype=np.int8),
        controllable=np.ones(n, dtype=bool),
    )


def all_racks_over(tree: Tree, rng: np.random.Generator) -> ClusterState:
    n = tree.n_gpus
    return computing(tree, rng.uniform(1100.0, 1200.0, n), np.full(n, 1200.0))


def half_uncapping(tree: Tree, rng: np.random.Generator) -> ClusterState:
    n = tree.n_gpus
    capped = rng.random(n) < 0.5
    cap = np.where(capped, rng.uniform(400.0, 700.0, n), 1200.0)
    return computing(tree, np.minimum(rng.uniform(600.0, 800.0, n), cap), cap)


def steady_below_caps(tree: Tree, rng: np.random.Generator) -> ClusterState:
    """The fleet simulator's steady state: every GPU at the plan's 960 W, computing at
    ~720 W (2 % noise) with a rack pushed to its caps: nothing to do but that rack."""
    n = tree.n_gpus
    cap = np.full(n, 960.0)
    power = 720.0 * (1.0 + 0.02 * rng.standard_normal(n))
    pushed = tree.gpu_ancestor[2] == tree.gpu_ancestor[2][0]
    power[pushed] = cap[pushed]
    return computing(tree, power, cap)


SCENARIOS = {
    "realistic": realistic,
    "worst_all_racks_over": all_racks_over,
    "worst_half_uncapping": half_uncapping,
    "steady_one_rack_pushed": steady_below_caps,
}


def measure(
    tree: Tree, state: ClusterState, runs: int, warmup: int = 3, safety_by_caps: bool = True
) -> dict:
    settings = PolicySettings(hold_floor_w_per_gpu=500.0, safety_by_caps=safety_by_caps)
    for _ in range(warmup):
        decision = decide(tree, state, 1.0, settings)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        decision = decide(tree, state, 1.0, settings)
        times.append((time.perf_counter() - start) * 1000.0)
    times.sort()
    cap_before = np.clip(state.cap_w, tree.cap_min_w, tree.cap_max_w)
    return {
        "runs": runs,
        "median_ms": round(statistics.median(times), 3),
        "p95_ms": round(times[min(len(times) - 1, int(np.ceil(0.95 * len(times))) - 1)], 3),
        "min_ms": round(times[0], 3),
        "nodes_capping": int(decision.node_capping.sum()),
        "gpus_cut": int(np.sum(decision.cap_w < cap_before - 1e-9)),
        "gpus_uncapped": int(np.sum(decision.cap_w > cap_before + 1e-9)),
        "clock_locked": int(np.sum(np.isfinite(decision.max_sm_clock_mhz))),
        "gpus_shifted": int(decision.shifted.sum()),
        "gpus_levelled": int(decision.levelled.sum()),  # lowered by rule 3c
    }


def run(
    rows: int,
    racks: int,
    servers: int,
    gpus: int,
    runs: int,
    seed: int = 0,
    safety_by_caps: bool = True,
) -> dict:
    tree = gb200_site(rows, racks, servers, gpus)
    results = {}
    for name, make in SCENARIOS.items():
        state = make(tree, np.random.default_rng(seed))
        results[name] = measure(tree, state, runs, safety_by_caps=safety_by_caps)
    argv = " ".join(sys.argv[1:])
    return {
        "benchmark": "policy",
        "tree": {
            "rows": rows,
            "racks_per_row": racks,
            "servers_per_rack": servers,
            "gpus_per_server": gpus,
            "n_gpus": tree.n_gpus,
            "n_nodes": tree.n_nodes,
        },
        "machine": machine(),
        "command": f"python -m bench.bench_policy {argv}".strip(),
        "scenarios": results,
        "target": {"median_ms": 50.0},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--racks", type=int, default=72, help="racks per row")
    parser.add_argument("--servers", type=int, default=18, help="servers per rack")
    parser.add_argument("--gpus", type=int, default=4, help="GPUs per server")
    parser.add_argument("--runs", type=int, default=30, help="timed calls per scenario")
    add_safety_argument(parser, "The policy timed.")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    result = run(
        args.rows,
        args.racks,
        args.servers,
        args.gpus,
        args.runs,
        safety_by_caps=args.safety == "caps",
    )
    report(result, args.json)


if __name__ == "__main__":
    main()
