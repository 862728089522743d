"""The budgets file: the power tree, its limits, budgets and failsafe caps.

A budgets file (TOML, format reference in ``docs/BUDGETS.md``) describes
site → rows → racks → nodes (servers) → GPUs. Every tree node has a hard
limit (the breaker) and a budget; capping bands as fractions of the budget,
inherited down the tree; a ramp limit; its own non-GPU overhead. Every GPU
has a failsafe cap (per model, overridable per row, rack or node) and a GPU
model with its cap range. Racks and nodes can be listed one by one or
generated compactly (``count`` plus a name template), because the real site
has ~20,750 servers.

``load_budgets`` / ``parse_budgets`` return a validated, read-only
``Topology`` or raise ``BudgetError`` whose message names the file, the tree
node and the number at fault; nothing is half-loaded and nothing global
changes. Per-GPU data lives only in numpy arrays (built by ``np.repeat`` from
per-server columns), so the 83K-GPU site loads in well under a second.
"""

from __future__ import annotations

import math
import re
import string
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from policies.tree import LEVEL_NAMES, RACK, ROW, SERVER, SITE, Tree
from powerd.gpu.models import GPU_MODELS, GpuModel
from powerd.protocol import NAME_PATTERN
from powerd.vocabulary import DEFAULT_FAILSAFE_FRACTION

FORMAT_VERSION = 1

# Dynamo's three bands (ISCA 2016, docs/DOMAIN.md): cap above 98 % of the
# budget, bring the node down to 95 %, hand watts back below 90 %. The 3 %
# between threshold and target is the room one capping step makes; the 5 %
# between target and uncapping is the hysteresis that stops a node that was
# just capped from being uncapped on the next cycle.
DEFAULT_CAP_THRESHOLD = 0.98
DEFAULT_CAP_TARGET = 0.95
DEFAULT_UNCAP_THRESHOLD = 0.90

# A model with no failsafe cap in the file falls back to DEFAULT_FAILSAFE_FRACTION of
# its maximum cap (powerd.vocabulary), as the agent does without a planner.

# Plausible watts per level (limit, budget; overhead up to the upper bound).
# Wide on purpose: they only catch a number in the wrong unit. A 12.6 kW
# Dynamo rack and a ~120 kW GB200 NVL72 rack are both well inside the rack
# range; a 150 MW site inside the site range; a 4-GPU GB200 tray (~6 kW) and
# an 8-GPU H100 server (~10 kW) inside the node range.
PLAUSIBLE_W: dict[int, tuple[float, float]] = {
    SITE: (1e3, 2e9),
    ROW: (1e3, 5e8),
    RACK: (5e2, 5e6),
    SERVER: (5e1, 2e5),
}
# A ramp limit goes from 0 to the budget in 10 ms at the fastest, ~3 h at the slowest.
RAMP_PLAUSIBLE_PER_S = (1e-4, 100.0)

MAX_GPUS_PER_NODE = 1024  # the agent's GPU indices are 0..1023
MAX_COUNT = 100_000  # one generator

_NAME_RE = re.compile(NAME_PATTERN)
_THRESHOLDS = ("cap_threshold", "cap_target", "uncap_threshold")
_DEFAULT_THRESHOLDS = (DEFAULT_CAP_THRESHOLD, DEFAULT_CAP_TARGET, DEFAULT_UNCAP_THRESHOLD)
_POWER_UNITS = {"_w": 1.0, "_kw": 1e3, "_mw": 1e6}
_RAMP_UNITS = {"_w_per_s": 1.0, "_kw_per_s": 1e3, "_mw_per_s": 1e6}
# quantity -> {key: factor to watts}
_QUANTITIES: dict[str, dict[str, float]] = {
    "limit": {f"limit{s}": f for s, f in _POWER_UNITS.items()},
    "budget": {f"budget{s}": f for s, f in _POWER_UNITS.items()},
    "overhead": {f"overhead{s}": f for s, f in _POWER_UNITS.items()},
    "ramp": {f"ramp{s}": f for s, f in _RAMP_UNITS.items()},
}
_NODE_KEYS = {"name", *_THRESHOLDS, *(k for q in _QUANTITIES.values() for k in q)}
_GENERATOR_KEYS = {"count", "start"}
_CHILD_KEY = {SITE: "rows", ROW: "racks", RACK: "nodes"}
_KEYS = {
    SITE: _NODE_KEYS,
    ROW: _NODE_KEYS | {"failsafe_cap_w", "racks"},
    RACK: _NODE_KEYS | {"failsafe_cap_w", "nodes"},
    SERVER: _NODE_KEYS | {"failsafe_cap_w", "gpus", "model"},
}
_TOP_KEYS = {"version", "site", "defaults", "models", "rows"}
_MODEL_KEYS = {"failsafe_cap_w", "comm_clock_mhz"}
# name-template fields available at each level ("i" only in generators)
_FIELDS = {ROW: ("site",), RACK: ("site", "row"), SERVER: ("site", "row", "rack")}
_FIELD_OF_LEVEL = {SITE: "site", ROW: "row", RACK: "rack"}


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
    ascending. Thresholds are fractions of the budget; ``to_tree`` gives watts.
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
    _index: dict[str, int] = field(default_factory=dict, repr=False)

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
            return self._index[name]
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
    def to_tree(self) -> Tree:
        """The flat-array ``Tree`` every policy takes (thresholds in watts)."""
        cap_min = np.array([GPU_MODELS[m].cap_min_w for m in self.server_model], dtype=float)
        cap_max = np.array([GPU_MODELS[m].cap_max_w for m in self.server_model], dtype=float)
        clock = np.array([self.comm_clock_mhz.get(m, np.nan) for m in self.server_model])
        count = self.server_gpu_count
        budget = self.budget_w
        return Tree(
            parent=self.parent.copy(),
            level=self.level.copy(),
            limit_w=self.limit_w.copy(),
            budget_w=budget.copy(),
            cap_threshold_w=budget * self.cap_threshold,
            cap_target_w=budget * self.cap_target,
            uncap_threshold_w=budget * self.uncap_threshold,
            ramp_w_per_s=self.ramp_w_per_s.copy(),
            overhead_w=self.overhead_w.copy(),
            gpu_server=self.gpu_server.copy(),
            cap_min_w=np.repeat(cap_min, count),
            cap_max_w=np.repeat(cap_max, count),
            failsafe_cap_w=np.repeat(self.server_failsafe_cap_w, count),
            comm_clock_mhz=np.repeat(clock, count),
        )

    def subtree_sum(self, per_server: np.ndarray, own: np.ndarray | None = None) -> np.ndarray:
        """(n_nodes,) subtree totals of a per-server quantity, plus a per-node ``own``."""
        return _subtree_sum(self.parent, self.level_start, per_server, own)

    def failsafe_power_w(self) -> np.ndarray:
        """(n_nodes,) power under each node, every GPU at its failsafe cap, overheads in."""
        per_server = self.server_gpu_count * self.server_failsafe_cap_w
        return self.subtree_sum(per_server, self.overhead_w)


# --- loading ---------------------------------------------------------------------


def load_budgets(path: str | Path) -> Topology:
    """Read and validate a budgets file; raise ``BudgetError`` naming the file on any fault."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BudgetError(source, "", "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BudgetError(source, "", f"cannot read: {exc}") from None
    return parse_budgets(text, source=source)


def parse_budgets(text: str, source: str = "<string>") -> Topology:
    """Validate budgets-file text; ``source`` is the name errors give for it."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BudgetError(source, "", f"not valid TOML: {exc}") from None
    return _Builder(source).build(raw)


def _subtree_sum(
    parent: np.ndarray,
    level_start: tuple[int, ...],
    per_server: np.ndarray,
    own: np.ndarray | None = None,
) -> np.ndarray:
    n = len(parent)
    total = np.zeros(n) if own is None else np.asarray(own, dtype=float).copy()
    total[level_start[SERVER] : level_start[SERVER + 1]] += per_server
    for lvl in (SERVER, RACK, ROW):  # fold each level into the one above, bottom up
        sl = slice(level_start[lvl], level_start[lvl + 1])
        total += np.bincount(parent[sl], weights=total[sl], minlength=n)
    return total


@dataclass
class _Spec:
    """One entry of a rows/racks/nodes list, checked once and reused for every instance."""

    level: int
    desc: str  # how messages name it
    name: str  # a name, or a template
    count: int | None  # None: one node, not a generator
    start: int
    limit: float | None  # None (nodes only): what the node can draw / cap_threshold
    budget: float | None
    overhead: float
    ramp: float
    thresholds: tuple[float | None, ...]
    failsafe: float | None
    gpus: int = 0
    model: str = ""
    fields: tuple[str, ...] = ()  # template fields used
    written: dict[str, tuple[str, float]] = field(default_factory=dict)  # quantity: (key, value)


class _Builder:
    def __init__(self, source: str) -> None:
        self.source = source
        self.site = ""
        # per level (SITE..SERVER) columns
        self.names: list[list[str]] = [[], [], [], []]
        self.parent: list[list[int]] = [[], [], [], []]  # index within the level above
        self.cols: dict[str, list[list[float]]] = {
            k: [[], [], [], []] for k in ("limit", "budget", "overhead", "ramp", *_THRESHOLDS)
        }
        self.srv_gpus: list[int] = []
        self.srv_model: list[str] = []
        self.srv_failsafe: list[float] = []
        self.srv_failsafe_from: list[str] = []
        self.model_failsafe: dict[str, float] = {}
        self.model_clock: dict[str, float] = {}
        self.model_used: set[str] = set()
        self._specs: dict[int, _Spec] = {}
        self._written: dict[str, tuple[str, float]] = {}  # filled by _watts for the spec at hand
        self.spec_of: list[list[_Spec]] = [[], [], [], []]  # per tree node, by level

    # --- errors ---
    def fail(self, node: str, problem: str) -> BudgetError:
        return BudgetError(self.source, node, problem)

    # --- typed reads ---
    def _check_keys(self, table: dict, known: set[str], node: str) -> None:
        unknown = sorted(set(table) - known)
        if unknown:
            raise self.fail(
                node,
                f"unknown key(s) {unknown} (a typo?); known: {', '.join(sorted(known))}",
            )

    def _number(self, table: dict, key: str, node: str, *, zero_ok: bool = False) -> float:
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(node, f"{key} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise self.fail(node, f"{key} = {value} must be a finite number")
        if value < 0 or (value == 0 and not zero_ok):
            sign = "negative" if value < 0 else "zero"
            need = "≥ 0" if zero_ok else "> 0"
            raise self.fail(node, f"{key} = {value:g} is {sign}; it must be {need}")
        return float(value)

    def _int(self, table: dict, key: str, node: str, lo: int, hi: int) -> int:
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(node, f"{key} must be an integer, got {value!r}")
        if not lo <= value <= hi:
            raise self.fail(node, f"{key} = {value} is outside {lo}..{hi}")
        return value

    def _watts(
        self, table: dict, quantity: str, node: str, *, required: bool = False
    ) -> float | None:
        given = [k for k in _QUANTITIES[quantity] if k in table]
        if len(given) > 1:
            raise self.fail(node, f"give {quantity} once, not as {' and '.join(given)}")
        if not given:
            if required:
                spellings = " / ".join(_QUANTITIES[quantity])
                raise self.fail(node, f"{quantity} is required ({spellings})")
            return None
        key = given[0]
        value = self._number(table, key, node, zero_ok=quantity == "overhead")
        self._written[quantity] = (key, value)
        return value * _QUANTITIES[quantity][key]

    def _fraction(self, table: dict, key: str, node: str) -> float | None:
        if key not in table:
            return None
        value = self._number(table, key, node)
        if value > 1:
            hint = f"; a percentage? write {value / 100:g}" if 50 <= value <= 100 else ""
            raise self.fail(node, f"{key} = {value:g} must be a fraction of budget in (0, 1]{hint}")
        return value

    # --- the file ---
    def build(self, raw: dict[str, Any]) -> Topology:
        self._check_keys(raw, _TOP_KEYS, "top level")
        if "version" in raw:
            version = raw["version"]
            if version != FORMAT_VERSION or isinstance(version, bool):
                raise self.fail(
                    "top level",
                    f"version = {version!r}; this powerd reads version {FORMAT_VERSION}",
                )
        defaults = raw.get("defaults", {})
        if not isinstance(defaults, dict):
            raise self.fail("[defaults]", "must be a table")
        self._check_keys(defaults, set(_THRESHOLDS), "[defaults]")
        inherited = tuple(
            d if (v := self._fraction(defaults, k, "[defaults]")) is None else v
            for k, d in zip(_THRESHOLDS, _DEFAULT_THRESHOLDS, strict=True)
        )
        self._models(raw.get("models", {}))

        site = raw.get("site")
        if not isinstance(site, dict):
            raise self.fail("[site]", "a [site] table is required (name, limit_w, budget_w)")
        spec = self._spec(site, SITE, "[site]", 0, "")
        self.site = spec.name
        thresholds = self._append(spec, [spec.name], -1, inherited)
        self._walk(raw.get("rows"), ROW, 0, {"site": spec.name}, thresholds, (None, ""), spec.desc)
        return self._finish()

    def _models(self, models: Any) -> None:
        if not isinstance(models, dict):
            raise self.fail("[models]", "must be a table of [models.<GPU model>] tables")
        for key, table in models.items():
            where = f"[models.{key}]"
            model = _find_model(key)
            if model is None:
                raise self.fail(where, f"unknown GPU model {key!r}; known: {', '.join(GPU_MODELS)}")
            if model.key in self.model_failsafe or model.key in self.model_clock:
                raise self.fail(where, f"GPU model {model.key} is configured twice")
            if not isinstance(table, dict):
                raise self.fail(where, "must be a table")
            self._check_keys(table, _MODEL_KEYS, where)
            if "failsafe_cap_w" in table:
                cap = self._number(table, "failsafe_cap_w", where)
                self._check_failsafe(cap, model, where)
                self.model_failsafe[model.key] = cap
            if "comm_clock_mhz" in table:
                clock = self._number(table, "comm_clock_mhz", where)
                lo, hi = model.sm_clock_min_mhz, model.sm_clock_max_mhz
                if not lo <= clock <= hi:
                    hint = ""
                    if lo <= clock * 1e3 <= hi:
                        hint = f"; in GHz? {clock:g} GHz is {clock * 1e3:g} MHz"
                    raise self.fail(
                        where,
                        f"comm_clock_mhz = {clock:g} MHz is outside the {model.key}'s "
                        f"SM clock range [{lo}, {hi}] MHz{hint}",
                    )
                self.model_clock[model.key] = clock
            else:
                self.model_clock.setdefault(model.key, math.nan)

    def _check_failsafe(self, cap: float, model: GpuModel, where: str, origin: str = "") -> None:
        lo, hi = model.cap_min_w, model.cap_max_w
        if lo <= cap <= hi:
            return
        hint = _unit_hint(
            ("failsafe_cap_w", cap), {"failsafe_cap_w": 1.0}, lo, hi, model.cap_default_w
        )
        raise self.fail(
            where,
            f"failsafe_cap_w = {cap:g} W{origin} is outside the {model.key}'s cap range "
            f"[{lo:g}, {hi:g}] W{hint}",
        )

    def _unit_error(
        self,
        node: str,
        written: tuple[str, float],
        quantity: str,
        watts: float,
        lo: float,
        hi: float,
        expect: float | None,
        what: str,
    ) -> BudgetError:
        key, raw = written
        per = "/s" if quantity == "ramp" else ""
        as_written = f"{key} = {raw:g}"
        if _QUANTITIES[quantity][key] != 1.0:
            as_written += f" ({watts:g} W{per})"
        else:
            as_written += f" W{per}"
        hint = _unit_hint(written, _QUANTITIES[quantity], lo, hi, expect)
        return self.fail(
            node,
            f"{as_written} is implausible for {what} "
            f"(expected {_fmt_w(lo)}{per} .. {_fmt_w(hi)}{per}){hint}",
        )

    def _spec(self, entry: Any, level: int, desc: str, position: int, parent_desc: str) -> _Spec:
        cached = self._specs.get(id(entry))
        if cached is not None:
            return cached
        what = LEVEL_NAMES[level]
        if not isinstance(entry, dict):
            raise self.fail(desc, f"each {what} must be a table, got {entry!r}")
        is_gen = "count" in entry
        name = entry.get("name")
        if not isinstance(name, str):
            node = f"{what} #{position + 1} in {parent_desc}" if level != SITE else desc
            if name is None:
                raise self.fail(node, f"{what} has no name")
            raise self.fail(node, f"name must be a string, got {name!r}")
        if is_gen:
            node = f"{what} generator {name!r} in {parent_desc}"
        elif "{" in name or "}" in name:
            node = f"{what} {name!r} in {parent_desc}"
        else:
            node = f"{what} {name!r}"
        known = _KEYS[level] | (_GENERATOR_KEYS if is_gen and level != SITE else set())
        self._check_keys(entry, known, node)
        count = self._int(entry, "count", node, 1, MAX_COUNT) if is_gen else None
        start = self._int(entry, "start", node, 0, 10**9) if "start" in entry else 1
        fields = self._template_fields(name, level, is_gen, node) if level != SITE else ()
        self._written = {}
        spec = _Spec(
            level=level,
            desc=node,
            name=name,
            count=count,
            start=start,
            limit=self._watts(entry, "limit", node, required=level != SERVER),
            budget=self._watts(entry, "budget", node, required=level != SERVER),
            overhead=self._watts(entry, "overhead", node) or 0.0,
            ramp=self._watts(entry, "ramp", node) or math.inf,
            thresholds=tuple(self._fraction(entry, k, node) for k in _THRESHOLDS),
            failsafe=(
                self._number(entry, "failsafe_cap_w", node) if "failsafe_cap_w" in entry else None
            ),
            fields=fields,
            written=self._written,
        )
        if level == SERVER:
            if "gpus" not in entry:
                raise self.fail(node, "gpus (GPUs per node) is required")
            spec.gpus = self._int(entry, "gpus", node, 1, MAX_GPUS_PER_NODE)
            model_key = entry.get("model")
            if not isinstance(model_key, str):
                raise self.fail(node, f"model (a GPU model: {', '.join(GPU_MODELS)}) is required")
            model = _find_model(model_key)
            if model is None:
                raise self.fail(
                    node, f"unknown GPU model {model_key!r}; known: {', '.join(GPU_MODELS)}"
                )
            spec.model = model.key
            if (spec.limit is None) != (spec.budget is None):
                raise self.fail(
                    node,
                    "give both limit_w and budget_w or neither (default for both: what the "
                    "node draws at most, GPUs at cap_max plus overhead, / cap_threshold)",
                )
        if level != SITE:
            self._specs[id(entry)] = spec
        return spec

    def _template_fields(self, name: str, level: int, is_gen: bool, node: str) -> tuple[str, ...]:
        allowed = _FIELDS[level] + (("i",) if is_gen else ())
        used: list[str] = []
        try:
            parsed = list(string.Formatter().parse(name))
        except ValueError as exc:
            raise self.fail(node, f"bad name template {name!r}: {exc}") from None
        for _literal, fname, _spec, conv in parsed:
            if fname is None:
                continue
            if fname not in allowed or conv:
                raise self.fail(
                    node,
                    f"name template {name!r} refers to {{{fname}}}, which does not exist here; "
                    f"available: {', '.join('{' + f + '}' for f in allowed)}",
                )
            used.append(fname)
        return tuple(used)

    def _names(self, spec: _Spec, context: dict[str, str]) -> list[str]:
        if spec.count is None:
            if not spec.fields:
                return [spec.name]
            return [self._format(spec, context)]
        if "i" not in spec.fields and spec.count > 1:
            raise self.fail(
                spec.desc,
                f"count = {spec.count} but the name template has no {{i}}: "
                "every generated name would be the same",
            )
        return [
            self._format(spec, {**context, "i": i})
            for i in range(spec.start, spec.start + spec.count)
        ]

    def _format(self, spec: _Spec, values: dict[str, Any]) -> str:
        try:
            return spec.name.format_map(values)
        except (ValueError, TypeError) as exc:
            raise self.fail(spec.desc, f"bad name template {spec.name!r}: {exc}") from None

    def _entries(self, raw: Any, level: int, parent_desc: str) -> list[Any]:
        key = _CHILD_KEY[level - 1]
        if raw is None:
            raise self.fail(parent_desc, f"has no {key}")
        entries = [raw] if isinstance(raw, dict) else raw
        if not isinstance(entries, list):
            raise self.fail(parent_desc, f"{key} must be a table or an array of tables")
        if not entries:
            raise self.fail(parent_desc, f"{key} is empty")
        return entries

    def _append(
        self, spec: _Spec, names: list[str], parent: int, inherited: tuple[float, ...]
    ) -> tuple[float, ...]:
        lvl, n = spec.level, len(names)
        effective = tuple(
            own if own is not None else inh
            for own, inh in zip(spec.thresholds, inherited, strict=True)
        )
        limit, budget = spec.limit, spec.budget
        if limit is None or budget is None:  # a node: never caps itself unless told to
            most = spec.gpus * GPU_MODELS[spec.model].cap_max_w + spec.overhead
            limit = budget = float(math.ceil(most / effective[0]))
        self.names[lvl].extend(names)
        self.parent[lvl].extend([parent] * n)
        self.spec_of[lvl].extend([spec] * n)
        cols = self.cols
        cols["limit"][lvl].extend([limit] * n)
        cols["budget"][lvl].extend([budget] * n)
        cols["overhead"][lvl].extend([spec.overhead] * n)
        cols["ramp"][lvl].extend([spec.ramp] * n)
        for k, value in zip(_THRESHOLDS, effective, strict=True):
            cols[k][lvl].extend([value] * n)
        return effective

    def _walk(
        self,
        raw: Any,
        level: int,
        parent: int,
        context: dict[str, str],
        inherited: tuple[float, ...],
        failsafe: tuple[float | None, str],
        parent_desc: str,
    ) -> None:
        for position, entry in enumerate(self._entries(raw, level, parent_desc)):
            spec = self._spec(entry, level, parent_desc, position, parent_desc)
            names = self._names(spec, context)
            first = len(self.names[level])
            thresholds = self._append(spec, names, parent, inherited)
            fs = failsafe if spec.failsafe is None else (spec.failsafe, spec.desc)
            if level == SERVER:
                self._servers(spec, len(names), fs)
                continue
            child_raw = entry.get(_CHILD_KEY[level])
            field_name = _FIELD_OF_LEVEL[level]
            for k, name in enumerate(names):
                self._walk(
                    child_raw,
                    level + 1,
                    first + k,
                    {**context, field_name: name},
                    thresholds,
                    fs,
                    f"{LEVEL_NAMES[level]} {name!r}",
                )

    def _servers(self, spec: _Spec, n: int, failsafe: tuple[float | None, str]) -> None:
        model = spec.model
        self.model_used.add(model)
        cap, origin = failsafe
        if cap is None:
            if model in self.model_failsafe:
                cap, origin = self.model_failsafe[model], f"[models.{model}]"
            else:
                cap = DEFAULT_FAILSAFE_FRACTION * GPU_MODELS[model].cap_max_w
                origin = f"default {DEFAULT_FAILSAFE_FRACTION:g} × cap_max"
        self.srv_gpus.extend([spec.gpus] * n)
        self.srv_model.extend([model] * n)
        self.srv_failsafe.extend([cap] * n)
        self.srv_failsafe_from.extend([origin] * n)

    # --- whole-tree checks, vectorised ---
    def _finish(self) -> Topology:
        counts = [len(names) for names in self.names]
        level_start = tuple(int(x) for x in np.concatenate([[0], np.cumsum(counts)]))
        names = tuple(n for level_names in self.names for n in level_names)
        n = len(names)
        level = np.repeat(np.arange(4, dtype=np.int8), counts)
        offsets = [0, 0, *level_start[1:3]]  # tree index of a level's first node, for children
        parent = np.concatenate(
            [
                np.asarray(self.parent[lvl], dtype=np.int64) + (offsets[lvl] if lvl else 0)
                for lvl in range(4)
            ]
        ).astype(np.int32)
        col = {
            k: np.concatenate([np.asarray(v, dtype=float) for v in c]) for k, c in self.cols.items()
        }

        for i, name in enumerate(names):
            if not _NAME_RE.match(name):
                raise self.fail(
                    f"{LEVEL_NAMES[level[i]]} {name!r}",
                    f"invalid name: names must match {NAME_PATTERN} (1-64 characters)",
                )
        index = dict(zip(names, range(n), strict=True))
        if len(index) != n:
            seen: dict[str, int] = {}
            for i, name in enumerate(names):
                if name in seen:
                    j = seen[name]
                    raise self.fail(
                        f"{LEVEL_NAMES[level[i]]} {name!r}",
                        f"duplicate name: tree node #{i} has the same name as "
                        f"{LEVEL_NAMES[level[j]]} #{j}; names must be unique across the file",
                    )
                seen[name] = i

        gpus = np.asarray(self.srv_gpus, dtype=np.int32)
        failsafe = np.asarray(self.srv_failsafe, dtype=float)
        cap_max = np.array([GPU_MODELS[m].cap_max_w for m in self.srv_model])
        max_draw = _subtree_sum(parent, level_start, gpus * cap_max, col["overhead"])

        # units: overheads, limits and budgets per level; ramps against the budget
        specs = [spec for level_specs in self.spec_of for spec in level_specs]
        lo = np.array([PLAUSIBLE_W[lvl][0] for lvl in range(4)])[level]
        hi = np.array([PLAUSIBLE_W[lvl][1] for lvl in range(4)])[level]
        budget = col["budget"]
        ramp_lo, ramp_hi = budget * RAMP_PLAUSIBLE_PER_S[0], budget * RAMP_PLAUSIBLE_PER_S[1]
        for quantity, low, high, expect in (
            ("overhead", np.zeros(n), hi, None),
            ("limit", lo, hi, max_draw),
            ("budget", lo, hi, max_draw),
            ("ramp", ramp_lo, ramp_hi, budget / 30),
        ):
            v = col[quantity]
            bad = np.isfinite(v) & ((v < low) | (v > high))
            # a node's default limit/budget is derived, not written: not a unit mistake
            written = [i for i in np.flatnonzero(bad).tolist() if quantity in specs[i].written]
            for i in written[:1]:
                raise self._unit_error(
                    f"{LEVEL_NAMES[level[i]]} {names[i]!r}",
                    specs[i].written[quantity],
                    quantity,
                    float(v[i]),
                    float(low[i]),
                    float(high[i]),
                    None if expect is None else float(expect[i]),
                    f"a {LEVEL_NAMES[level[i]]}"
                    if quantity != "ramp"
                    else f"budget_w = {budget[i]:g} W",
                )

        # failsafe caps inside each model's cap range
        server0 = level_start[SERVER]
        cap_min = np.array([GPU_MODELS[m].cap_min_w for m in self.srv_model])
        bad = (failsafe < cap_min) | (failsafe > cap_max)
        if bad.any():
            k = int(np.argmax(bad))
            origin = self.srv_failsafe_from[k]
            self._check_failsafe(
                failsafe[k],
                GPU_MODELS[self.srv_model[k]],
                f"node {names[server0 + k]!r}",
                f" (set by {origin})" if origin else "",
            )

        limit = col["limit"]
        bad = budget > limit
        if bad.any():
            i = int(np.argmax(bad))
            raise self.fail(
                f"{LEVEL_NAMES[level[i]]} {names[i]!r}",
                f"budget_w = {budget[i]:g} W is above its limit_w = {limit[i]:g} W",
            )

        thr, tgt, unc = (col[k] for k in _THRESHOLDS)
        bad = ~((unc < tgt) & (tgt < thr) & (thr <= 1.0))
        if bad.any():
            i = int(np.argmax(bad))
            raise self.fail(
                f"{LEVEL_NAMES[level[i]]} {names[i]!r}",
                "thresholds out of order: need 0 < uncap_threshold < cap_target < "
                f"cap_threshold ≤ 1, got uncap_threshold = {unc[i]:g}, cap_target = {tgt[i]:g}, "
                f"cap_threshold = {thr[i]:g} (own or inherited)",
            )

        # the failsafe guarantee: with every GPU at its failsafe cap, every node holds
        fs_power = _subtree_sum(parent, level_start, gpus * failsafe, col["overhead"])
        overhead = _subtree_sum(parent, level_start, np.zeros(len(gpus)), col["overhead"])
        n_gpus = _subtree_sum(parent, level_start, gpus.astype(float))
        over = fs_power > limit * (1 + 1e-12)
        for lvl in (SERVER, RACK, ROW, SITE):
            sl = slice(level_start[lvl], level_start[lvl + 1])
            bad_lvl = np.flatnonzero(over[sl])
            if len(bad_lvl):
                i = level_start[lvl] + int(bad_lvl[0])
                what = LEVEL_NAMES[lvl]
                room = (limit[i] - overhead[i]) / n_gpus[i]
                more = f"; {len(bad_lvl) - 1} more {what}s fail too" if len(bad_lvl) > 1 else ""
                fix = (
                    f"lower failsafe_cap_w to ≤ {math.floor(room):g} W per GPU or raise limit_w"
                    if room > 0
                    else "its overheads alone exceed limit_w; raise limit_w"
                )
                raise self.fail(
                    f"{what} {names[i]!r}",
                    f"failsafe power {fs_power[i]:g} W ({n_gpus[i]:g} GPUs at their failsafe caps "
                    f"+ {overhead[i]:g} W overhead) exceeds limit_w = {limit[i]:g} W: with the "
                    f"controller lost this {what} would not hold; {fix}{more}",
                )

        configured = sorted(set(self.model_failsafe) | set(self.model_clock))
        dangling = [m for m in configured if m not in self.model_used]
        if dangling:
            raise self.fail(
                f"[models.{dangling[0]}]",
                f"no node uses GPU model {dangling[0]}; the settings would apply to nothing "
                f"(models in use: {', '.join(sorted(self.model_used))})",
            )

        arrays = col
        frozen: list[np.ndarray] = [level, parent, gpus, failsafe, *arrays.values()]
        for a in frozen:
            a.setflags(write=False)
        clocks = MappingProxyType(
            {m: self.model_clock.get(m, math.nan) for m in sorted(self.model_used)}
        )
        return Topology(
            source=self.source,
            names=names,
            level=level,
            parent=parent,
            limit_w=arrays["limit"],
            budget_w=arrays["budget"],
            cap_threshold=arrays["cap_threshold"],
            cap_target=arrays["cap_target"],
            uncap_threshold=arrays["uncap_threshold"],
            ramp_w_per_s=arrays["ramp"],
            overhead_w=arrays["overhead"],
            level_start=level_start,
            server_gpu_count=gpus,
            server_model=tuple(self.srv_model),
            server_failsafe_cap_w=failsafe,
            comm_clock_mhz=clocks,
            _index=index,
        )


def _find_model(key: str) -> GpuModel | None:
    for known, model in GPU_MODELS.items():
        if known.lower() == key.lower():
            return model
    return None


_UNIT_NAMES = {1e-6: "µW", 1e-3: "mW", 1.0: "W", 1e3: "kW", 1e6: "MW", 1e9: "GW"}


def _unit_hint(
    written: tuple[str, float],
    spellings: dict[str, float],
    lo: float,
    hi: float,
    expect: float | None,
) -> str:
    """'; did you mean limit_kw = 120 (120000 W)?' when another unit makes the value plausible."""
    key, raw = written
    given = spellings[key]
    watts = raw * given
    per = "/s" if key.endswith("_per_s") else ""
    candidates = [f for f in (1e3, 1e6, 1e-3) if lo <= watts * f <= hi]
    if not candidates:
        return ""
    if expect and expect > 0:
        candidates.sort(key=lambda f: abs(math.log(watts * f / expect)))
    factor = candidates[0]
    meant = given * factor
    then = f"{watts * factor:g} W{per}"
    for spelling, unit in spellings.items():
        if math.isclose(unit, meant):
            return f"; did you mean {spelling} = {raw:g} ({then})?"
    unit_name = next((u for f, u in _UNIT_NAMES.items() if math.isclose(f, meant)), "")
    return f"; a value in {unit_name}{per}? {raw:g} {unit_name}{per} would be {then}"


def _fmt_w(watts: float) -> str:
    for factor, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if watts >= factor:
            return f"{watts / factor:g} {prefix}W"
    return f"{watts:g} W"
