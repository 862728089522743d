"""The budget tree and the cluster state as flat numpy arrays: what every policy takes.

Tree nodes (site, rows, racks, servers) are numbered in topological order:
a parent always comes before its children, the site is node 0. GPUs are
numbered separately and each belongs to one server (a leaf of the tree).
Builders: ``powerd.topology`` (``Topology.tree``, from a budgets file) and the
tests' generators.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

import numpy as np

from powerd.vocabulary import LEVELS, PHASES, PRIORITIES

# Level codes: a tree node's depth (LEVELS[code] names it).
SITE, ROW, RACK, SERVER = range(len(LEVELS))
LEVEL_NAMES = LEVELS

# GPU priority classes as codes, in the order watts are taken from them (lowest first).
LOW, NORMAL, HIGH = (len(PRIORITIES) - 1 - PRIORITIES.index(p) for p in ("low", "normal", "high"))
PRIORITY_CODES = {name: len(PRIORITIES) - 1 - rank for rank, name in enumerate(PRIORITIES)}

# Phase codes, per GPU: PHASES[code] names it.
PHASE_CODES: dict[str, int] = {name: code for code, name in enumerate(PHASES)}


def over_limit_by_level(
    level: np.ndarray, power_w: np.ndarray, limit_w: np.ndarray
) -> tuple[int, int, int]:
    """How many sites, rows and racks (``level`` codes) draw more than their limit."""
    over = np.asarray(power_w) > np.asarray(limit_w)
    level = np.asarray(level)
    site, row, rack = (int(np.count_nonzero(over & (level == code))) for code in (SITE, ROW, RACK))
    return site, row, rack


def phase_codes(phases: Iterable[str]) -> np.ndarray:
    """The codes of ``phases``, for ``in_codes``."""
    return np.array([PHASE_CODES[p] for p in phases], dtype=np.int8)


def in_codes(phase: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Which GPUs' phase code is one of ``codes`` (at least one): a comparison per code,
    several times faster than ``np.isin`` on a site's GPUs; any other value, a garbled
    code included, is in none."""
    out: np.ndarray = phase == codes[0]
    for code in codes[1:]:
        out |= phase == code
    return out


@dataclass(frozen=True, eq=False)
class Tree:
    """The power tree every part of powerd shares: structure, limits and GPUs as flat arrays.

    Tree nodes (site, rows, racks, servers) are numbered in topological order
    (a parent before its children, the site is node 0). A tree from a budgets
    file numbers its GPUs server by server, in the servers' tree order, so each
    server owns one contiguous run of GPUs (``server_gpus``); the policies do not
    care about the GPUs' order (the property tests shuffle it). Servers also have an ordinal,
    0 .. n_servers - 1 in tree order: the index the controller keeps per-node
    state under. Names are optional (the tests' generated trees have none);
    a tree from a budgets file (``Topology.tree``) has them.

    Every array is made read-only: one tree is shared by the controller, the
    planner and the demo, and nothing may change it under them. A variant is
    a new tree (``dataclasses.replace``).
    """

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
    # --- names, by tree index (empty: an unnamed tree) ---
    names: tuple[str, ...] = ()
    # What the caps in force under the root may add up to, overheads in, besides its
    # limit_w (policies.allocation): an operator's site limit gliding down, a
    # coordinator's grant to a leaf. inf: only the limits.
    root_caps_limit_w: float = float("inf")
    # (n_nodes,) oversubscribed levels (policies.allocation, "Oversubscription"): what the
    # caps under a node may sum to beyond its limit, and the rise within the controller's
    # reaction its band keeps below the limit. None: every level guaranteed by its caps.
    oversubscription_w: np.ndarray | None = None
    rise_margin_w: np.ndarray | None = None
    # --- derived ---
    level_nodes: tuple[np.ndarray, ...] = field(init=False, repr=False)  # intp node ids per level
    level_parent: tuple[np.ndarray, ...] = field(init=False, repr=False)  # intp, their parents
    gpu_ancestor: np.ndarray = field(init=False, repr=False)  # intp (4, n_gpus): per level
    server_nodes: np.ndarray = field(init=False, repr=False)  # intp (n_servers,): tree index
    gpu_server_ordinal: np.ndarray = field(init=False, repr=False)  # intp (n_gpus,)

    def __post_init__(self) -> None:
        n_nodes = len(self.parent)
        for name in _NODE_ARRAYS:
            if len(getattr(self, name)) != n_nodes:
                raise ValueError(
                    f"Tree.{name} has {len(getattr(self, name))} entries, not {n_nodes}"
                )
        n_gpus = len(self.gpu_server)
        for name in _GPU_ARRAYS:
            if len(getattr(self, name)) != n_gpus:
                raise ValueError(
                    f"Tree.{name} has {len(getattr(self, name))} entries, not {n_gpus}"
                )
        for name in ("oversubscription_w", "rise_margin_w"):
            value = getattr(self, name)
            if value is not None and len(value) != n_nodes:
                raise ValueError(f"Tree.{name} has {len(value)} entries, not {n_nodes}")
        if self.names and len(self.names) != n_nodes:
            raise ValueError(f"Tree.names has {len(self.names)} entries, not {n_nodes}")
        if n_nodes == 0 or self.parent[0] != -1:
            raise ValueError("node 0 must be the site (parent -1)")
        if np.any(self.parent[1:] >= np.arange(1, n_nodes)) or np.any(self.parent[1:] < 0):
            raise ValueError("tree nodes must be in topological order (parent before child)")
        level_nodes = tuple(np.flatnonzero(self.level == lvl) for lvl in range(len(LEVELS)))
        servers = level_nodes[SERVER]
        gpu_server = np.asarray(self.gpu_server, dtype=np.intp)
        if n_gpus and np.any(self.level[gpu_server] != SERVER):
            raise ValueError("every GPU must belong to a server (a tree node of level SERVER)")
        ordinal = np.searchsorted(servers, gpu_server).astype(np.intp)
        ancestor = np.empty((len(LEVELS), n_gpus), dtype=np.intp)
        ancestor[SERVER] = gpu_server
        for lvl in (RACK, ROW, SITE):
            ancestor[lvl] = self.parent[ancestor[lvl + 1]]
        derived = {
            "level_nodes": level_nodes,
            "level_parent": tuple(self.parent[nodes].astype(np.intp) for nodes in level_nodes),
            "gpu_ancestor": ancestor,
            "server_nodes": servers,
            "gpu_server_ordinal": ordinal,
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)
        for name in (*_NODE_ARRAYS, "parent", *_GPU_ARRAYS):
            getattr(self, name).setflags(write=False)
        for array in (ancestor, servers, ordinal, *level_nodes):
            array.setflags(write=False)

    @property
    def n_nodes(self) -> int:
        return len(self.parent)

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_server)

    @property
    def n_servers(self) -> int:
        return len(self.server_nodes)

    # --- names ---
    @cached_property
    def index(self) -> Mapping[str, int]:
        """Tree index by name (empty for an unnamed tree)."""
        return MappingProxyType({name: i for i, name in enumerate(self.names)})

    @cached_property
    def server_names(self) -> tuple[str, ...]:
        """Names of the servers, by server ordinal."""
        if not self.names:
            return tuple(f"server{k}" for k in range(self.n_servers))
        return tuple(self.names[i] for i in self.server_nodes.tolist())

    @cached_property
    def server_ordinal(self) -> Mapping[str, int]:
        """Server ordinal by server name."""
        return MappingProxyType({name: k for k, name in enumerate(self.server_names)})

    @cached_property
    def gpu_start(self) -> np.ndarray:
        """(n_servers + 1,) offsets: server k owns GPUs gpu_start[k]:gpu_start[k + 1].

        Only for a tree whose GPUs are numbered server by server (every tree from a
        budgets file); ValueError otherwise."""
        if np.any(np.diff(self.gpu_server_ordinal) < 0):
            raise ValueError("this tree's GPUs are not numbered server by server")
        start = np.zeros(self.n_servers + 1, dtype=np.intp)
        np.cumsum(np.bincount(self.gpu_server_ordinal, minlength=self.n_servers), out=start[1:])
        start.setflags(write=False)
        return start

    @cached_property
    def server_gpus(self) -> tuple[range, ...]:
        """Each server's GPU indices (contiguous), by server ordinal (see ``gpu_start``)."""
        start = self.gpu_start.tolist()
        return tuple(range(a, b) for a, b in itertools.pairwise(start))

    # --- sums up the tree ---
    def fold_up(self, per_node: np.ndarray) -> np.ndarray:
        """(n_nodes,) each node's value plus the values of every node below it (a new array)."""
        total = np.array(per_node, dtype=float)
        return fold_levels(self.level_nodes, self.level_parent, total)

    def fold_down(self, per_node: np.ndarray) -> np.ndarray:
        """(n_nodes,) each node's value plus the values of every node above it (a new array)."""
        total = np.array(per_node, dtype=float)
        for lvl in (ROW, RACK, SERVER):
            total[self.level_nodes[lvl]] += total[self.level_parent[lvl]]
        return total

    def node_sum(self, per_gpu: np.ndarray) -> np.ndarray:
        """(n_nodes,) a per-GPU quantity summed under every node (GPUs only, no overhead)."""
        total = np.bincount(self.gpu_ancestor[SERVER], weights=per_gpu, minlength=self.n_nodes)
        return fold_levels(self.level_nodes, self.level_parent, total.astype(float, copy=False))

    def gpus_under(self, node_mask: np.ndarray) -> np.ndarray:
        """(n_gpus,) bool: some node over the GPU (its server included) is in
        ``node_mask`` (n_nodes,)."""
        mask = np.asarray(node_mask, dtype=bool)
        under = np.zeros(self.n_gpus, dtype=bool)
        for ancestors in self.gpu_ancestor:
            under |= mask[ancestors]
        return under

    @cached_property
    def gpu_room_w(self) -> np.ndarray:
        """(n_nodes,) what the GPUs under each node may draw (or be capped at) together:
        its limit less the non-GPU power at and below it (read-only)."""
        room: np.ndarray = np.asarray(self.limit_w, dtype=float) - self.overhead_below_w
        room.setflags(write=False)
        return room

    @cached_property
    def oversubscribed(self) -> np.ndarray:
        """(n_nodes,) bool: the caps under the node may sum beyond its limit (read-only)."""
        over = np.zeros(self.n_nodes, dtype=bool)
        if self.oversubscription_w is not None:
            over = np.asarray(self.oversubscription_w, dtype=float) > 0
        over.setflags(write=False)
        return over

    @cached_property
    def overhead_below_w(self) -> np.ndarray:
        """(n_nodes,) each node's own overhead plus that of every node below it (read-only)."""
        total = self.fold_up(self.overhead_w)
        total.setflags(write=False)
        return total


_NODE_ARRAYS = (
    "level",
    "limit_w",
    "budget_w",
    "cap_threshold_w",
    "cap_target_w",
    "uncap_threshold_w",
    "ramp_w_per_s",
    "overhead_w",
)
_GPU_ARRAYS = ("gpu_server", "cap_min_w", "cap_max_w", "failsafe_cap_w", "comm_clock_mhz")


def fold_levels(
    level_nodes: Sequence[np.ndarray], level_parent: Sequence[np.ndarray], total: np.ndarray
) -> np.ndarray:
    """Add every node's value into all its ancestors, in place, deepest level first.

    The one way powerd sums up a tree (``Tree.fold_up``, ``Tree.node_sum``, the
    policies, the budgets file's checks): one ``bincount`` per level.
    """
    n_nodes = len(total)
    for lvl in (SERVER, RACK, ROW):
        nodes = level_nodes[lvl]
        if len(nodes):
            total += np.bincount(level_parent[lvl], weights=total[nodes], minlength=n_nodes)
    return total


def fold_up(parent: np.ndarray, level: np.ndarray, per_node: np.ndarray) -> np.ndarray:
    """``Tree.fold_up`` for a structure that is no ``Tree`` yet (a budgets file being checked)."""
    level_nodes = [np.flatnonzero(level == lvl) for lvl in range(len(LEVELS))]
    level_parent = [parent[nodes].astype(np.intp) for nodes in level_nodes]
    return fold_levels(level_nodes, level_parent, np.array(per_node, dtype=float))


@dataclass
class ClusterState:
    """What the controller knows this cycle, per GPU (n_gpus,)."""

    power_w: np.ndarray  # measured; silent or offline GPUs at their failsafe cap
    cap_w: np.ndarray  # the caps in force now (read back from acks/telemetry)
    priority: np.ndarray  # int8: LOW, NORMAL, HIGH
    floor_w: np.ndarray  # a job's declared floor per GPU (>= cap_min_w), cap_min_w if none
    phase: np.ndarray  # int8 phase code (PHASE_CODES), "compute" when unknown
    controllable: np.ndarray  # bool: online and following the controller
    # Seconds each GPU's job has been in its announced phase, and how long the wait
    # (``communication``, ``checkpoint``) before it lasted (0: it followed no wait). None, or
    # NaN for a GPU: not known (no job, or a phase inferred from power); rule 4 of
    # policies.capping then counts no rise of its own after a wait.
    phase_s: np.ndarray | None = None
    wait_before_s: np.ndarray | None = None
    # Seconds each GPU's job said its announced phase would last (``PhaseEvent.expected_s``,
    # from the phase's start). None, or NaN for a GPU: not said.
    phase_expected_s: np.ndarray | None = None
    # How many cycles of uncapping each GPU's request stands for (rule 4 of
    # policies.capping): 0, it asks nothing this cycle; k, it asks what k cycles of steps
    # would give. None: 1 for every GPU. A controller that may command only so many raises
    # a cycle (max_raises_per_cycle) serves the nodes wanting watts back in turn, each once
    # every k cycles: with this each turn's command carries k cycles' watts instead of one's.
    uncap_cycles: np.ndarray | None = None
    # Per GPU, whether ``power_w`` was measured (True) or stands in for a GPU the controller
    # does not hear (False: silent, offline or implausible, counted at the caps it may hold).
    # None: every GPU heard. Rules 3b and 3c of policies.capping trust a node's place
    # between its bands only while little of its power is such a guess.
    heard: np.ndarray | None = None
    # Per GPU, whether it may be cut this cycle for a node over its capping threshold but
    # not over its limit (over a budget, not a breaker; rule 3 of policies.capping). None:
    # every GPU. A controller that would otherwise command every node of a site or row a
    # few watts each cycle (a demand-response glide) cuts the nodes in turn, each by a few
    # cycles' watts; what those in turn cannot give waits for the next turns.
    cut_turn: np.ndarray | None = None
    # Per GPU, the cap a command not yet acknowledged asked of it (NaN: none pending; None:
    # none anywhere). ``cap_w`` counts such a GPU at the higher of old and new under safety
    # by caps; the draw its pending cut will take off counts against the site's fall
    # (policies.allocation rule 4): the agent applies it whenever its ack comes back.
    pending_cap_w: np.ndarray | None = None
    # Seconds of the ramp limits (``Tree.ramp_w_per_s``) this cycle may hand back: the time
    # since the last cycle, less what the cycles before it within the ramp's window were
    # given beyond a window's worth (``powerd.controller.ramp_window``). None: ``dt_s``.
    ramp_s: float | None = None
    # Per GPU, whether its own power smoothing hardware ramps every rise of its draw (on, and
    # not carried out in software by its jobs): a job starting on it is no step at once
    # (``policies.rules.may_start_rise_w_per_s``), and a wait on it falls only after its
    # hysteresis (``rising_after_wait``; a software-smoothed GPU's falls at once). None: not
    # known (the controller always knows): a start counts as a step, a wait as held through
    # its hysteresis, as the replays model it.
    ramps_in_hardware: np.ndarray | None = None

    def ramp_seconds(self, dt_s: float) -> float:
        """The seconds of ramp this cycle hands back under (``ramp_s``, or ``dt_s``)."""
        return dt_s if self.ramp_s is None else min(dt_s, self.ramp_s)


def ramp_allowance_w(ramp_w_per_s: np.ndarray | float, seconds: float) -> np.ndarray:
    """What ramp limits (W/s) let the sum of caps rise by in ``seconds``: inf where there is
    no limit, even in no time (NaN, a bad tree, stays NaN)."""
    ramp = np.asarray(ramp_w_per_s, dtype=float)
    finite = np.isfinite(ramp)
    allowed: np.ndarray = np.where(finite, np.where(finite, ramp, 0.0) * seconds, ramp)
    return allowed
