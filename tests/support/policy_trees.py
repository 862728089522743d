"""Small power trees and cluster states for the policy tests (and the policy benchmark).

``uniform_tree`` builds site → rows → racks → servers → GPUs with the same
fan-out everywhere, nodes numbered level by level (site 0, then rows, racks,
servers), GPUs server by server. Bands default to "between bands everywhere"
(threshold and target infinite, uncapping threshold -inf), ramps to unlimited;
``with_bands`` and ``with_ramp`` change them for chosen nodes.
``random_tree_and_state`` draws an irregular tree and a state from a numpy
generator, for the property tests.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from policies.tree import PHASE_CODES, RACK, ROW, SERVER, SITE, ClusterState, Tree

INF = float("inf")
COMPUTE = PHASE_CODES["compute"]


def tree_from_fanout(
    racks_per_row: list[list[int]],
    gpus_per_server: int | list[int],
    *,
    cap_min_w: float | np.ndarray = 200.0,
    cap_max_w: float | np.ndarray = 1200.0,
    overhead_w: float | np.ndarray = 0.0,
    comm_clock_mhz: float = float("nan"),
) -> Tree:
    """A tree from its shape: ``racks_per_row[row][rack]`` = servers in that rack."""
    parent, level = [-1], [SITE]
    rows = []
    for _ in racks_per_row:
        rows.append(len(parent))
        parent.append(0)
        level.append(ROW)
    racks = []
    for row, servers_per_rack in zip(rows, racks_per_row, strict=True):
        for n_servers in servers_per_rack:
            racks.append((len(parent), n_servers))
            parent.append(row)
            level.append(RACK)
    servers = []
    for rack, n_servers in racks:
        for _ in range(n_servers):
            servers.append(len(parent))
            parent.append(rack)
            level.append(SERVER)
    n_nodes = len(parent)
    per_server = np.broadcast_to(np.asarray(gpus_per_server), (len(servers),))
    gpu_server = np.repeat(np.asarray(servers, dtype=np.int32), per_server)
    n_gpus = len(gpu_server)
    cap_min = np.broadcast_to(np.asarray(cap_min_w, dtype=float), (n_gpus,)).copy()
    cap_max = np.broadcast_to(np.asarray(cap_max_w, dtype=float), (n_gpus,)).copy()
    return Tree(
        parent=np.asarray(parent, dtype=np.int32),
        level=np.asarray(level, dtype=np.int8),
        limit_w=np.full(n_nodes, INF),
        budget_w=np.full(n_nodes, INF),
        cap_threshold_w=np.full(n_nodes, INF),
        cap_target_w=np.full(n_nodes, INF),
        uncap_threshold_w=np.full(n_nodes, -INF),
        ramp_w_per_s=np.full(n_nodes, INF),
        overhead_w=np.broadcast_to(np.asarray(overhead_w, dtype=float), (n_nodes,)).copy(),
        gpu_server=gpu_server,
        cap_min_w=cap_min,
        cap_max_w=cap_max,
        failsafe_cap_w=cap_min.copy(),
        comm_clock_mhz=np.full(n_gpus, comm_clock_mhz),
    )


def uniform_tree(rows: int = 1, racks: int = 1, servers: int = 1, gpus: int = 4, **kw) -> Tree:
    return tree_from_fanout([[servers] * racks for _ in range(rows)], gpus, **kw)


def with_bands(
    tree: Tree, nodes, threshold_w: float, target_w: float, uncap_w: float = -INF
) -> Tree:
    """A copy of ``tree`` with the three bands of ``nodes`` set."""
    threshold, target, uncap = (
        tree.cap_threshold_w.copy(),
        tree.cap_target_w.copy(),
        tree.uncap_threshold_w.copy(),
    )
    threshold[nodes], target[nodes], uncap[nodes] = threshold_w, target_w, uncap_w
    return dataclasses.replace(
        tree, cap_threshold_w=threshold, cap_target_w=target, uncap_threshold_w=uncap
    )


def with_ramp(tree: Tree, nodes, ramp_w_per_s: float) -> Tree:
    ramp = tree.ramp_w_per_s.copy()
    ramp[nodes] = ramp_w_per_s
    return dataclasses.replace(tree, ramp_w_per_s=ramp)


def uncapping_everywhere(tree: Tree) -> Tree:
    """Every node far below its uncapping threshold: caps are handed back."""
    return with_bands(tree, slice(None), INF, INF, INF)


def make_state(
    tree: Tree,
    power_w,
    cap_w=None,
    *,
    priority=1,
    floor_w=None,
    phase=COMPUTE,
    controllable=True,
) -> ClusterState:
    """Scalars broadcast to every GPU; cap defaults to cap_max, floor to cap_min."""
    n = tree.n_gpus

    def per_gpu(value, dtype) -> np.ndarray:
        return np.broadcast_to(np.asarray(value, dtype=dtype), (n,)).copy()

    return ClusterState(
        power_w=per_gpu(power_w, float),
        cap_w=per_gpu(tree.cap_max_w if cap_w is None else cap_w, float),
        priority=per_gpu(priority, np.int8),
        floor_w=per_gpu(tree.cap_min_w if floor_w is None else floor_w, float),
        phase=per_gpu(phase, np.int8),
        controllable=per_gpu(controllable, bool),
    )


def gb200_site(
    rows: int = 16,
    racks: int = 72,
    servers: int = 18,
    gpus: int = 4,
    *,
    server_overhead_w: float = 800.0,
    rack_overhead_w: float = 3000.0,
) -> Tree:
    """A GB200-class site (docs/DOMAIN.md): 200-1200 W GPUs planned at 960 W, oversubscribed racks.

    Budgets: a server at its GPUs' TDP (its PSU), a rack at 960 W per GPU plus
    overhead, a row at 95 % of the sum of its racks, the site at 93 %. Bands:
    threshold at the budget, target 3 % below, uncapping 8 % below. Ramps:
    a site may rise 2 % of its budget per second, a row 5 %, a rack 10 %, a
    server 25 %.
    """
    tree = uniform_tree(
        rows, racks, servers, gpus, cap_min_w=200.0, cap_max_w=1200.0, comm_clock_mhz=1200.0
    )
    overhead = np.zeros(tree.n_nodes)
    overhead[tree.level == SERVER] = server_overhead_w
    overhead[tree.level == RACK] = rack_overhead_w
    server_budget = gpus * 1200.0 + server_overhead_w
    rack_budget = servers * (gpus * 960.0 + server_overhead_w) + rack_overhead_w
    budget = np.select(
        [tree.level == SERVER, tree.level == RACK, tree.level == ROW],
        [server_budget, rack_budget, 0.95 * racks * rack_budget],
        0.93 * rows * racks * rack_budget,
    ).astype(float)
    ramp_share = np.select(
        [tree.level == SERVER, tree.level == RACK, tree.level == ROW], [0.25, 0.10, 0.05], 0.02
    )
    return dataclasses.replace(
        tree,
        overhead_w=overhead,
        limit_w=budget * 1.1,
        budget_w=budget,
        cap_threshold_w=budget,
        cap_target_w=budget * 0.97,
        uncap_threshold_w=budget * 0.92,
        ramp_w_per_s=budget * ramp_share,
        failsafe_cap_w=np.full(tree.n_gpus, 900.0),
    )


def random_tree_and_state(rng: np.random.Generator) -> tuple[Tree, ClusterState, float]:
    """An irregular tree (1-3 rows, 1-4 racks, 1-4 servers, 1-8 GPUs), a state and a dt.

    Budgets are drawn around each node's nominal draw (cap_max of its GPUs plus
    overhead), so some nodes are over their threshold, some between bands and
    some below the uncapping threshold; some are infeasible (floors too high).
    Two in five states are calm (low power, roomy budgets): caps come back.
    """
    shape = [
        [int(rng.integers(1, 5)) for _ in range(int(rng.integers(1, 5)))]
        for _ in range(int(rng.integers(1, 4)))
    ]
    n_servers = sum(sum(row) for row in shape)
    gpus = rng.integers(1, 9, size=n_servers)
    n_gpus = int(gpus.sum())
    cap_min = rng.uniform(100.0, 300.0, n_gpus)
    cap_max = cap_min + rng.choice([0.0, 1.0], n_gpus, p=[0.05, 0.95]) * rng.uniform(
        50.0, 1000.0, n_gpus
    )
    tree = tree_from_fanout(shape, list(gpus), cap_min_w=cap_min, cap_max_w=cap_max)
    n_nodes = tree.n_nodes
    overhead = rng.uniform(0.0, 300.0, n_nodes) * (rng.random(n_nodes) < 0.7)
    tree = dataclasses.replace(tree, overhead_w=overhead)
    nominal = tree.node_sum(cap_max) + tree.overhead_below_w
    calm = rng.random() < 0.4  # a quiet cluster with room: caps are being handed back
    threshold = nominal * rng.uniform(*((0.7, 1.2) if calm else (0.3, 1.1)), n_nodes)
    target = threshold * rng.uniform(0.8, 1.0, n_nodes)
    uncap = target * rng.uniform(0.6, 1.0, n_nodes)
    ramp = nominal * rng.uniform(0.0, 0.3, n_nodes) * (rng.random(n_nodes) < 0.9)
    ramp[rng.random(n_nodes) < 0.1] = np.inf
    tree = dataclasses.replace(
        tree,
        cap_threshold_w=threshold,
        cap_target_w=target,
        uncap_threshold_w=uncap,
        ramp_w_per_s=ramp,
        failsafe_cap_w=rng.uniform(cap_min, cap_max),
        comm_clock_mhz=np.where(rng.random(n_gpus) < 0.8, 1400.0, np.nan),
    )
    span = cap_max - cap_min
    state = ClusterState(
        power_w=rng.uniform(0.0, 0.5 if calm else 1.2, n_gpus) * cap_max,
        cap_w=cap_min + rng.uniform(0.0, 1.0, n_gpus) * span
        if rng.random() < 0.7
        else cap_max.copy(),
        priority=rng.integers(0, 3, n_gpus).astype(np.int8),
        floor_w=np.where(
            rng.random(n_gpus) < 0.5, cap_min, cap_min + rng.uniform(0.0, 1.0, n_gpus) * span
        ),
        phase=rng.integers(0, len(PHASE_CODES), n_gpus).astype(np.int8),
        controllable=rng.random(n_gpus) < 0.85,
    )
    dt_s = float(rng.choice([0.1, 1.0, 3.0]))
    if rng.random() < 0.5:  # announced phases: their times known (some not: NaN)
        state.phase_s = np.where(rng.random(n_gpus) < 0.1, np.nan, rng.uniform(0, 5, n_gpus))
        state.wait_before_s = rng.uniform(0, 5, n_gpus) * (rng.random(n_gpus) < 0.5)
    return tree, state, dt_s
