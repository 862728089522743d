"""The budget tree and the cluster state as flat numpy arrays: what every policy takes.

Tree nodes (site, rows, racks, servers) are numbered in topological order:
a parent always comes before its children, the site is node 0. GPUs are
numbered separately and each belongs to one server (a leaf of the tree).
Builders: ``powerd.topology`` (from a budgets file) and the tests' generators.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from powerd.vocabulary import LEVELS, PHASES, PRIORITIES

# Level codes: a tree node's depth (LEVELS[code] names it).
SITE, ROW, RACK, SERVER = range(len(LEVELS))
LEVEL_NAMES = LEVELS

# GPU priority classes as codes, in the order watts are taken from them (lowest first).
LOW, NORMAL, HIGH = (len(PRIORITIES) - 1 - PRIORITIES.index(p) for p in ("low", "normal", "high"))
PRIORITY_CODES = {name: len(PRIORITIES) - 1 - rank for rank, name in enumerate(PRIORITIES)}

# Phase codes, per GPU: PHASES[code] names it.
PHASE_CODES = {name: code for code, name in enumerate(PHASES)}


@dataclass(frozen=True)
class Tree:
    """Static description of the power tree; arrays are read-only by convention."""

    # --- tree nodes (n_nodes,) ---
    parent: np.ndarray  # int32, -1 for the site
    level: np.ndarray  # int8: SITE, ROW, RACK, SERVER
    limit_w: np.ndarray  # hard limit (the breaker)
    budget_w: np.ndarray  # what the node is planned to draw
    cap_threshold_w: np.ndarray  # above this, capping starts
    cap_target_w: np.ndarray  # capping brings the node down to this
    uncap_threshold_w: np.ndarray  # below this, caps are handed back
    ramp_w_per_s: np.ndarray  # how fast the sum of caps under the node may rise
    overhead_w: np.ndarray  # power drawn at this node that is not a GPU (CPU, NIC, fans, switches)
    # --- GPUs (n_gpus,) ---
    gpu_server: np.ndarray  # int32: the SERVER tree node each GPU belongs to
    cap_min_w: np.ndarray
    cap_max_w: np.ndarray
    failsafe_cap_w: np.ndarray
    comm_clock_mhz: np.ndarray  # SM clock lock for communication phases, NaN: none
    # --- derived ---
    gpu_ancestor: np.ndarray = field(init=False)  # int32 (4, n_gpus): ancestor at each level

    def __post_init__(self) -> None:
        n_nodes = len(self.parent)
        for name in (
            "level",
            "limit_w",
            "budget_w",
            "cap_threshold_w",
            "cap_target_w",
            "uncap_threshold_w",
            "ramp_w_per_s",
            "overhead_w",
        ):
            if len(getattr(self, name)) != n_nodes:
                raise ValueError(
                    f"Tree.{name} has {len(getattr(self, name))} entries, not {n_nodes}"
                )
        n_gpus = len(self.gpu_server)
        for name in ("cap_min_w", "cap_max_w", "failsafe_cap_w", "comm_clock_mhz"):
            if len(getattr(self, name)) != n_gpus:
                raise ValueError(
                    f"Tree.{name} has {len(getattr(self, name))} entries, not {n_gpus}"
                )
        if n_nodes == 0 or self.parent[0] != -1:
            raise ValueError("node 0 must be the site (parent -1)")
        if np.any(self.parent[1:] >= np.arange(1, n_nodes)) or np.any(self.parent[1:] < 0):
            raise ValueError("tree nodes must be in topological order (parent before child)")
        ancestor = np.empty((4, n_gpus), dtype=np.int32)
        ancestor[SERVER] = self.gpu_server
        for lvl in (RACK, ROW, SITE):
            ancestor[lvl] = self.parent[ancestor[lvl + 1]]
        object.__setattr__(self, "gpu_ancestor", ancestor)

    @property
    def n_nodes(self) -> int:
        return len(self.parent)

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_server)

    def node_sum(self, per_gpu: np.ndarray) -> np.ndarray:
        """Sum a per-GPU quantity up the tree: (n_nodes,) totals, GPUs only (no overhead)."""
        total = np.zeros(self.n_nodes)
        for lvl in range(4):
            total += np.bincount(self.gpu_ancestor[lvl], weights=per_gpu, minlength=self.n_nodes)
        return total

    def overhead_sum(self) -> np.ndarray:
        """Each node's own overhead plus that of every node below it."""
        total = self.overhead_w.astype(float).copy()
        for child in range(self.n_nodes - 1, 0, -1):  # children after parents: fold upwards
            total[self.parent[child]] += total[child]
        return total


@dataclass
class ClusterState:
    """What the controller knows this cycle, per GPU (n_gpus,)."""

    power_w: np.ndarray  # measured; silent or offline GPUs at their failsafe cap
    cap_w: np.ndarray  # the caps in force now (read back from acks/telemetry)
    priority: np.ndarray  # int8: LOW, NORMAL, HIGH
    floor_w: np.ndarray  # a job's declared floor per GPU (>= cap_min_w), cap_min_w if none
    phase: np.ndarray  # int8 phase code (PHASE_CODES), "compute" when unknown
    controllable: np.ndarray  # bool: online and following the controller
