"""What a budgets file says, validated: the ``Topology`` (names, structure, numbers).

The parts of powerd that act on the tree take ``Topology.tree`` (``policies.tree.Tree``,
built once and shared); the ``Topology`` keeps what only the file knows: the
thresholds as fractions, the GPU model of each server, where a failsafe cap
came from, the names by level.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np

from policies.tree import LEVEL_NAMES, RACK, ROW, SERVER, Tree
from powerd.gpu.clock_table import ClockTable, shipped_clock_table
from powerd.gpu.models import GPU_MODELS
from powerd.topology.grid import GridSpec


class BudgetError(ValueError):
    """A budgets file that cannot be used; the message names the file, tree node and number."""

    def __init__(self, source: str, node: str, problem: str) -> None:
        super().__init__(f"{source}: {node}: {problem}" if node else f"{source}: {problem}")
        self.source = source
        self.node = node
        self.problem = problem


class Server(NamedTuple):
    """One server (a leaf of the tree, a ``node`` in the file and the protocol)."""

    name: str
    row: str
    rack: str
    gpus: int
    model: str
    failsafe_cap_w: float
    gpu_indices: range  # its GPUs in the site-wide GPU order


@dataclass(frozen=True, eq=False)
class Topology:
    """A validated budgets file: names, structure and per-node numbers, read-only.

    Tree nodes are numbered level by level (site 0, then rows, racks, servers,
    each level in file order and grouped by parent), which is a topological
    order. GPUs are numbered server by server in file order, local index
    ascending. Thresholds are fractions of the budget; ``tree`` gives watts.
    """

    source: str
    names: tuple[str, ...]  # every tree node, by tree index
    level: np.ndarray  # int8 (n_nodes,)
    parent: np.ndarray  # int32 (n_nodes,), -1 for the site
    limit_w: np.ndarray
    budget_w: np.ndarray
    cap_threshold: np.ndarray  # fractions of budget_w
    cap_target: np.ndarray
    uncap_threshold: np.ndarray
    ramp_w_per_s: np.ndarray  # inf: no limit of its own
    overhead_w: np.ndarray
    level_start: tuple[int, ...]  # level L is names[level_start[L]:level_start[L + 1]]
    server_gpu_count: np.ndarray  # int32 (n_servers,)
    server_model: tuple[str, ...]  # GPU model key per server
    server_failsafe_cap_w: np.ndarray  # per server (all its GPUs)
    comm_clock_mhz: Mapping[str, float] = field(default_factory=dict)  # per model, NaN: none
    grid: GridSpec | None = None  # the site's [site.grid]; None: no grid limits
    # per model, the clock table its comm clock was chosen from (comm_max_slowdown with the
    # file's clock_table, or the shipped one); see clock_table()
    clock_tables: Mapping[str, ClockTable] = field(default_factory=dict)
    # per model, the [models.<key>] keys that chose its comm clock (comm_clock_mhz, or
    # comm_max_slowdown and clock_table, a path made absolute), for a file written from this
    # topology to choose the same clock from the same table; absent: no comm clock
    comm_clock_keys: Mapping[str, Mapping[str, float | str]] = field(default_factory=dict)
    # (n_nodes,) an oversubscribed level's allowance (what its caps may sum to beyond its
    # limit) and the rise its band keeps below the limit (docs/BUDGETS.md); None: all 0
    oversubscription_w: np.ndarray | None = None
    rise_margin_w: np.ndarray | None = None

    def clock_table(self, model: str) -> ClockTable | None:
        """How a clock lock acts on a GPU of ``model``: the table the file chose its
        communication clock from, else the model's shipped table; None where there is
        neither (the parametric clock model). The controller's clock and every simulated
        GPU's answer to it (demo, fleet, planner) come from the same table."""
        table = self.clock_tables.get(model)
        return table if table is not None else shipped_clock_table(model)

    # --- names and structure ---
    @property
    def site(self) -> str:
        return self.names[0]

    @property
    def n_nodes(self) -> int:
        return len(self.names)

    def _level_names(self, lvl: int) -> tuple[str, ...]:
        return self.names[self.level_start[lvl] : self.level_start[lvl + 1]]

    @property
    def rows(self) -> tuple[str, ...]:
        return self._level_names(ROW)

    @property
    def racks(self) -> tuple[str, ...]:
        return self._level_names(RACK)

    @property
    def servers(self) -> tuple[str, ...]:
        return self._level_names(SERVER)

    @property
    def n_gpus(self) -> int:
        return int(self.gpu_start[-1])

    @cached_property
    def gpu_start(self) -> np.ndarray:
        """(n_servers + 1,) offsets: server k owns GPUs gpu_start[k]:gpu_start[k + 1]."""
        start = np.zeros(len(self.server_gpu_count) + 1, dtype=np.int64)
        np.cumsum(self.server_gpu_count, out=start[1:])
        start.setflags(write=False)
        return start

    @cached_property
    def gpu_server(self) -> np.ndarray:
        """int32 (n_gpus,): the tree index of each GPU's server."""
        first = self.level_start[SERVER]
        servers = np.arange(first, first + len(self.server_gpu_count), dtype=np.int32)
        out = np.repeat(servers, self.server_gpu_count)
        out.setflags(write=False)
        return out

    @cached_property
    def gpu_local(self) -> np.ndarray:
        """int32 (n_gpus,): each GPU's index on its server (the NVML index)."""
        out = np.arange(self.n_gpus, dtype=np.int64)
        out -= np.repeat(self.gpu_start[:-1], self.server_gpu_count)
        out = out.astype(np.int32)
        out.setflags(write=False)
        return out

    @cached_property
    def gpus(self) -> list[tuple[str, int]]:
        """(server name, local index) per GPU: one Python tuple per GPU, built on first use."""
        servers = self.servers
        first = self.level_start[SERVER]
        return [
            (servers[s - first], int(k))
            for s, k in zip(self.gpu_server.tolist(), self.gpu_local.tolist(), strict=True)
        ]

    def gpu(self, index: int) -> tuple[str, int]:
        """(server name, local index) of one GPU, without building ``gpus``."""
        if not 0 <= index < self.n_gpus:
            raise IndexError(f"{self.source}: GPU index {index} not in 0..{self.n_gpus - 1}")
        k = int(np.searchsorted(self.gpu_start, index, side="right")) - 1
        return self.servers[k], int(index - self.gpu_start[k])

    # --- lookups by name ---
    def node_index(self, name: str) -> int:
        """Tree index of a site, row, rack or server name."""
        try:
            return self.tree.index[name]
        except KeyError:
            raise KeyError(f"{self.source}: no tree node named {name!r}") from None

    def kind(self, name: str) -> str:
        """'site', 'row', 'rack' or 'node'."""
        return LEVEL_NAMES[int(self.level[self.node_index(name)])]

    def parent_of(self, name: str) -> str | None:
        p = int(self.parent[self.node_index(name)])
        return None if p < 0 else self.names[p]

    def _server_pos(self, name: str) -> int:
        i = self.node_index(name)
        if self.level[i] != SERVER:
            raise KeyError(f"{self.source}: {name!r} is a {self.kind(name)}, not a node (server)")
        return i - self.level_start[SERVER]

    def server_gpus(self, name: str) -> range:
        """The site-wide GPU indices of one server (contiguous)."""
        k = self._server_pos(name)
        return range(int(self.gpu_start[k]), int(self.gpu_start[k + 1]))

    def failsafe_cap_w(self, node_name: str) -> float:
        """The failsafe cap per GPU of one server: what its agent holds with no controller."""
        return float(self.server_failsafe_cap_w[self._server_pos(node_name)])

    def server(self, name: str) -> Server:
        k = self._server_pos(name)
        rack = int(self.parent[self.level_start[SERVER] + k])
        return Server(
            name=name,
            row=self.names[int(self.parent[rack])],
            rack=self.names[rack],
            gpus=int(self.server_gpu_count[k]),
            model=self.server_model[k],
            failsafe_cap_w=float(self.server_failsafe_cap_w[k]),
            gpu_indices=range(int(self.gpu_start[k]), int(self.gpu_start[k + 1])),
        )

    # --- the policies' view ---
    @cached_property
    def tree(self) -> Tree:
        """The ``Tree`` the controller, the planner and the demo share (thresholds in watts)."""
        cap_min = np.array([GPU_MODELS[m].cap_min_w for m in self.server_model], dtype=float)
        cap_max = np.array([GPU_MODELS[m].cap_max_w for m in self.server_model], dtype=float)
        clock = np.array([self.comm_clock_mhz.get(m, np.nan) for m in self.server_model])
        count = self.server_gpu_count
        budget = self.budget_w
        return Tree(
            names=self.names,
            parent=self.parent,
            level=self.level,
            limit_w=self.limit_w,
            budget_w=budget,
            cap_threshold_w=budget * self.cap_threshold,
            cap_target_w=budget * self.cap_target,
            uncap_threshold_w=budget * self.uncap_threshold,
            ramp_w_per_s=self.ramp_w_per_s,
            overhead_w=self.overhead_w,
            gpu_server=self.gpu_server,
            cap_min_w=np.repeat(cap_min, count),
            cap_max_w=np.repeat(cap_max, count),
            failsafe_cap_w=np.repeat(self.server_failsafe_cap_w, count),
            comm_clock_mhz=np.repeat(clock, count),
            oversubscription_w=self.oversubscription_w,
            rise_margin_w=self.rise_margin_w,
        )

    def subtree_sum(self, per_server: np.ndarray, own: np.ndarray | None = None) -> np.ndarray:
        """(n_nodes,) subtree totals of a per-server quantity, plus a per-node ``own``."""
        return self.tree.fold_up(per_node(self.level_start, per_server, own))

    def failsafe_power_w(self) -> np.ndarray:
        """(n_nodes,) power under each node, every GPU at its failsafe cap, overheads in."""
        per_server = self.server_gpu_count * self.server_failsafe_cap_w
        return self.subtree_sum(per_server, self.overhead_w)


def per_node(
    level_start: tuple[int, ...], per_server: np.ndarray, own: np.ndarray | None = None
) -> np.ndarray:
    """(n_nodes,) ``own`` (default 0) with a per-server quantity added at the servers: what
    ``fold_up`` turns into subtree totals."""
    total = np.zeros(level_start[-1]) if own is None else np.array(own, dtype=float)
    total[level_start[SERVER] : level_start[SERVER + 1]] += per_server
    return total
