"""Reading a budgets file: TOML → typed, checked entries → a ``Topology``.

Three steps, each in one place: ``Reader`` (module ``reader``) reads one value
of one table with its type and range (every error names the file, the tree node
and the number); the ``[models]`` and ``[site.grid]`` tables have modules of
their own (``models_table``, ``grid_table``); ``_Walker`` walks site → rows →
racks → nodes, expands generators (``count`` and a name template) and fills
per-level columns; ``checks`` runs the whole-tree checks over the columns as
arrays. Nothing is half-loaded: a ``Topology`` comes out only when every check
passed.
"""

from __future__ import annotations

import math
import re
import string
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from policies.tree import LEVEL_NAMES, RACK, ROW, SERVER, SITE
from powerd.gpu.models import GPU_MODELS
from powerd.protocol import MAX_NAME_CHARS
from powerd.topology import checks
from powerd.topology.grid import GridSpec
from powerd.topology.grid_table import read_grid
from powerd.topology.model import BudgetError, Topology
from powerd.topology.models_table import Models, find_model, read_models
from powerd.topology.reader import Reader
from powerd.topology.units import OVERSUBSCRIPTION, QUANTITIES, Written
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

MAX_GPUS_PER_NODE = 1024  # the agent's GPU indices are 0..1023
MAX_COUNT = 100_000  # one generator
# Every tree node of a file together: a 1 GW site is ~130,000 (rows, racks, ~125,000
# nodes). Generators nest, so their counts multiply: without this, a file of a few
# lines could ask for billions of nodes (found beside bench/fuzz.py: 28 s and 4 GB
# before it was refused).
MAX_TREE_NODES = 1_000_000

THRESHOLDS = ("cap_threshold", "cap_target", "uncap_threshold")
_DEFAULT_THRESHOLDS = (DEFAULT_CAP_THRESHOLD, DEFAULT_CAP_TARGET, DEFAULT_UNCAP_THRESHOLD)
_NODE_KEYS = {"name", *THRESHOLDS, *(k for q in QUANTITIES.values() for k in q)}
_GENERATOR_KEYS = {"count", "start"}
_CHILD_KEY = {SITE: "rows", ROW: "racks", RACK: "nodes"}
_KEYS = {
    SITE: _NODE_KEYS | {"grid"},
    ROW: _NODE_KEYS | {"failsafe_cap_w", "racks"},
    RACK: _NODE_KEYS | {"failsafe_cap_w", "nodes"},
    SERVER: _NODE_KEYS | {"failsafe_cap_w", "gpus", "model"},
}
_TOP_KEYS = {"version", "site", "defaults", "models", "rows"}
# name-template fields available at each level ("i" only in generators)
_FIELDS = {ROW: ("site",), RACK: ("site", "row"), SERVER: ("site", "row", "rack")}
_FIELD_OF_LEVEL = {SITE: "site", ROW: "row", RACK: "rack"}


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
    return _build(Reader(source), raw)


# --- one entry of a rows / racks / nodes list ------------------------------------------


@dataclass(frozen=True)
class _Spec:
    """One entry of a rows/racks/nodes list, checked once and reused for every instance."""

    level: int
    desc: str  # how messages name it
    name: str  # a name, or a template
    count: int | None  # None: one node, not a generator
    start: int
    written: dict[str, Written]  # limit, budget, overhead, ramp: those the entry gives
    thresholds: tuple[float | None, ...]
    failsafe: float | None
    gpus: int = 0
    model: str = ""
    fields: tuple[str, ...] = ()  # template fields used

    @property
    def overhead_w(self) -> float:
        written = self.written.get("overhead")
        return 0.0 if written is None else written.watts

    @property
    def ramp_w_per_s(self) -> float:
        written = self.written.get("ramp")
        return math.inf if written is None else written.watts

    def watts_or_zero(self, quantity: str) -> float:
        written = self.written.get(quantity)
        return 0.0 if written is None else written.watts


def _read_spec(
    reader: Reader, entry: Any, level: int, desc: str, position: int, parent_desc: str
) -> _Spec:
    what = LEVEL_NAMES[level]
    if not isinstance(entry, dict):
        raise reader.fail(desc, f"each {what} must be a table, got {entry!r}")
    is_gen = "count" in entry
    name = entry.get("name")
    if not isinstance(name, str):
        node = f"{what} #{position + 1} in {parent_desc}" if level != SITE else desc
        if name is None:
            raise reader.fail(node, f"{what} has no name")
        raise reader.fail(node, f"name must be a string, got {name!r}")
    if is_gen:
        node = f"{what} generator {name!r} in {parent_desc}"
    elif "{" in name or "}" in name:
        node = f"{what} {name!r} in {parent_desc}"
    else:
        node = f"{what} {name!r}"
    known = _KEYS[level] | (_GENERATOR_KEYS if is_gen and level != SITE else set())
    reader.check_keys(entry, known, node)
    count = reader.integer(entry, "count", node, 1, MAX_COUNT) if is_gen else None
    start = reader.integer(entry, "start", node, 0, 10**9) if "start" in entry else 1
    fields = _template_fields(reader, name, level, is_gen, node) if level != SITE else ()
    written: dict[str, Written] = {}
    for quantity in ("limit", "budget", "overhead", "ramp", *OVERSUBSCRIPTION):
        required = quantity in ("limit", "budget") and level != SERVER
        value = reader.watts(entry, quantity, node, required=required)
        if value is not None:
            written[quantity] = value
    if level == SERVER and any(q in written for q in OVERSUBSCRIPTION):
        raise reader.fail(
            node, "oversubscription and rise_margin are for racks, rows and the site, not nodes"
        )
    thresholds = tuple(reader.fraction(entry, k, node) for k in THRESHOLDS)
    failsafe = reader.number(entry, "failsafe_cap_w", node) if "failsafe_cap_w" in entry else None
    gpus, model_key = 0, ""
    if level == SERVER:
        if "gpus" not in entry:
            raise reader.fail(node, "gpus (GPUs per node) is required")
        gpus = reader.integer(entry, "gpus", node, 1, MAX_GPUS_PER_NODE)
        raw_model = entry.get("model")
        if not isinstance(raw_model, str):
            raise reader.fail(node, f"model (a GPU model: {', '.join(GPU_MODELS)}) is required")
        model = find_model(raw_model)
        if model is None:
            raise reader.fail(
                node, f"unknown GPU model {raw_model!r}; known: {', '.join(GPU_MODELS)}"
            )
        model_key = model.key
        if ("limit" in written) != ("budget" in written):
            raise reader.fail(
                node,
                "give both limit_w and budget_w or neither (default for both: what the "
                "node draws at most, GPUs at cap_max plus overhead, / cap_threshold)",
            )
    return _Spec(
        level=level,
        desc=node,
        name=name,
        count=count,
        start=start,
        written=written,
        thresholds=thresholds,
        failsafe=failsafe,
        gpus=gpus,
        model=model_key,
        fields=fields,
    )


def _template_fields(
    reader: Reader, name: str, level: int, is_gen: bool, node: str
) -> tuple[str, ...]:
    allowed = _FIELDS[level] + (("i",) if is_gen else ())
    used: list[str] = []
    try:
        parsed = list(string.Formatter().parse(name))
    except ValueError as exc:
        raise reader.fail(node, f"bad name template {name!r}: {exc}") from None
    # Refused from the template alone, before any name is formatted: a width such as
    # {i:>300000000} took 9.5 s and 2 GB to make names the checks then refuse (issue 12).
    literal = sum(len(text) for text, *_ in parsed)
    if literal > MAX_NAME_CHARS and any(fname is not None for _, fname, *_ in parsed):
        raise reader.fail(
            node,
            f"name template {name!r} has {literal} characters besides its fields; "
            f"names are at most {MAX_NAME_CHARS} characters (powerd.protocol.NAME_PATTERN)",
        )
    for _literal, fname, spec, conv in parsed:
        if fname is None:
            continue
        if spec and "{" in spec:
            raise reader.fail(
                node, f"name template {name!r}: nested fields in a format spec are not allowed"
            )
        # width and precision: every number in the spec (a digit fill is one digit)
        for number in re.findall(r"\d+", spec or ""):
            if len(number.lstrip("0")) > 2 or int(number) > MAX_NAME_CHARS:
                raise reader.fail(
                    node,
                    f"name template {name!r}: {number} in format spec {spec!r} would make names "
                    f"longer than {MAX_NAME_CHARS} characters (powerd.protocol.NAME_PATTERN)",
                )
        if fname not in allowed or conv:
            raise reader.fail(
                node,
                f"name template {name!r} refers to {{{fname}}}, which does not exist here; "
                f"available: {', '.join('{' + f + '}' for f in allowed)}",
            )
        used.append(fname)
    return tuple(used)


# --- the walk: entries → per-level columns ---------------------------------------------


@dataclass
class _Columns:
    """Per-level lists the walk appends to (site, rows, racks, servers), then per server."""

    names: list[list[str]] = field(default_factory=lambda: [[], [], [], []])
    parent: list[list[int]] = field(default_factory=lambda: [[], [], [], []])  # in level above
    specs: list[list[_Spec]] = field(default_factory=lambda: [[], [], [], []])
    watts: dict[str, list[list[float]]] = field(
        default_factory=lambda: {
            k: [[], [], [], []]
            for k in ("limit", "budget", "overhead", "ramp", *OVERSUBSCRIPTION, *THRESHOLDS)
        }
    )
    server_gpus: list[int] = field(default_factory=list)
    server_model: list[str] = field(default_factory=list)
    server_failsafe: list[float] = field(default_factory=list)
    server_failsafe_from: list[str] = field(default_factory=list)


class _Walker:
    """Walks the rows/racks/nodes lists, expanding generators into ``_Columns``."""

    def __init__(self, reader: Reader, models: Models) -> None:
        self.reader = reader
        self.models = models
        self.columns = _Columns()
        self._specs: dict[int, _Spec] = {}  # a generator's entry is read once
        self._named = 0  # tree nodes named so far (MAX_TREE_NODES)

    def spec(self, entry: Any, level: int, desc: str, position: int, parent_desc: str) -> _Spec:
        cached = self._specs.get(id(entry))
        if cached is None:
            cached = _read_spec(self.reader, entry, level, desc, position, parent_desc)
            if level != SITE:
                self._specs[id(entry)] = cached
        return cached

    def append(
        self, spec: _Spec, names: list[str], parent: int, inherited: tuple[float, ...]
    ) -> tuple[float, ...]:
        """Columns for ``names`` (instances of ``spec``); the thresholds they pass down."""
        lvl, n = spec.level, len(names)
        effective = tuple(
            own if own is not None else inh
            for own, inh in zip(spec.thresholds, inherited, strict=True)
        )
        if "limit" in spec.written and "budget" in spec.written:
            limit, budget = spec.written["limit"].watts, spec.written["budget"].watts
        else:  # a node: never caps itself unless told to
            most = spec.gpus * GPU_MODELS[spec.model].cap_max_w + spec.overhead_w
            limit = budget = float(math.ceil(most / effective[0]))
        cols = self.columns
        cols.names[lvl].extend(names)
        cols.parent[lvl].extend([parent] * n)
        cols.specs[lvl].extend([spec] * n)
        per_node = {"limit": limit, "budget": budget, "overhead": spec.overhead_w}
        per_node |= {q: spec.watts_or_zero(q) for q in OVERSUBSCRIPTION}
        per_node |= {"ramp": spec.ramp_w_per_s, **dict(zip(THRESHOLDS, effective, strict=True))}
        for key, value in per_node.items():
            cols.watts[key][lvl].extend([value] * n)
        return effective

    def walk(
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
            spec = self.spec(entry, level, parent_desc, position, parent_desc)
            names = self._names(spec, context)
            first = len(self.columns.names[level])
            thresholds = self.append(spec, names, parent, inherited)
            fs = failsafe if spec.failsafe is None else (spec.failsafe, spec.desc)
            if level == SERVER:
                self._servers(spec, len(names), fs)
                continue
            child_raw = entry.get(_CHILD_KEY[level])
            field_name = _FIELD_OF_LEVEL[level]
            for k, name in enumerate(names):
                self.walk(
                    child_raw,
                    level + 1,
                    first + k,
                    {**context, field_name: name},
                    thresholds,
                    fs,
                    f"{LEVEL_NAMES[level]} {name!r}",
                )

    def _entries(self, raw: Any, level: int, parent_desc: str) -> list[Any]:
        key = _CHILD_KEY[level - 1]
        if raw is None:
            raise self.reader.fail(parent_desc, f"has no {key}")
        entries = [raw] if isinstance(raw, dict) else raw
        if not isinstance(entries, list):
            raise self.reader.fail(parent_desc, f"{key} must be a table or an array of tables")
        if not entries:
            raise self.reader.fail(parent_desc, f"{key} is empty")
        return entries

    def _names(self, spec: _Spec, context: dict[str, str]) -> list[str]:
        self._named += 1 if spec.count is None else spec.count
        if self._named > MAX_TREE_NODES:
            raise self.reader.fail(
                spec.desc,
                f"the file asks for more than {MAX_TREE_NODES:,} tree nodes (generators "
                "multiply: count inside count): is a count too large?",
            )
        if spec.count is None:
            if not spec.fields:
                return [spec.name]
            return [self._format(spec, context)]
        if "i" not in spec.fields and spec.count > 1:
            raise self.reader.fail(
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
            raise self.reader.fail(spec.desc, f"bad name template {spec.name!r}: {exc}") from None

    def _servers(self, spec: _Spec, n: int, failsafe: tuple[float | None, str]) -> None:
        model = spec.model
        cap, origin = failsafe
        if cap is None:
            if model in self.models.failsafe_cap_w:
                cap, origin = self.models.failsafe_cap_w[model], f"[models.{model}]"
            else:
                cap = DEFAULT_FAILSAFE_FRACTION * GPU_MODELS[model].cap_max_w
                origin = f"default {DEFAULT_FAILSAFE_FRACTION:g} × cap_max"
        cols = self.columns
        cols.server_gpus.extend([spec.gpus] * n)
        cols.server_model.extend([model] * n)
        cols.server_failsafe.extend([cap] * n)
        cols.server_failsafe_from.extend([origin] * n)


# --- the file ----------------------------------------------------------------------------


def _build(reader: Reader, raw: dict[str, Any]) -> Topology:
    reader.check_keys(raw, _TOP_KEYS, "top level")
    if "version" in raw:
        version = raw["version"]
        if version != FORMAT_VERSION or isinstance(version, bool):
            raise reader.fail(
                "top level",
                f"version = {version!r}; this powerd reads version {FORMAT_VERSION}",
            )
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise reader.fail("[defaults]", "must be a table")
    reader.check_keys(defaults, set(THRESHOLDS), "[defaults]")
    inherited = tuple(
        d if (v := reader.fraction(defaults, k, "[defaults]")) is None else v
        for k, d in zip(THRESHOLDS, _DEFAULT_THRESHOLDS, strict=True)
    )
    models = read_models(reader, raw.get("models", {}))

    site = raw.get("site")
    if not isinstance(site, dict):
        raise reader.fail("[site]", "a [site] table is required (name, limit_w, budget_w)")
    walker = _Walker(reader, models)
    spec = walker.spec(site, SITE, "[site]", 0, "")
    thresholds = walker.append(spec, [spec.name], -1, inherited)
    walker.walk(raw.get("rows"), ROW, 0, {"site": spec.name}, thresholds, (None, ""), spec.desc)
    draft = _draft(reader.source, walker.columns, models)
    checks.run_all(draft)
    grid = read_grid(reader, site.get("grid"), float(draft.node_w["budget"][0]))
    return _topology(draft, models, grid)


def _draft(source: str, cols: _Columns, models: Models) -> checks.Draft:
    """The walk's columns as flat arrays, nodes numbered level by level."""
    counts = [len(names) for names in cols.names]
    level_start = tuple(int(x) for x in np.concatenate([[0], np.cumsum(counts)]))
    level = np.repeat(np.arange(4, dtype=np.int8), counts)
    offsets = [0, 0, *level_start[1:3]]  # tree index of a level's first node, for children
    parent = np.concatenate(
        [
            np.asarray(cols.parent[lvl], dtype=np.int64) + (offsets[lvl] if lvl else 0)
            for lvl in range(4)
        ]
    ).astype(np.int32)
    return checks.Draft(
        source=source,
        names=tuple(n for level_names in cols.names for n in level_names),
        level=level,
        parent=parent,
        level_start=level_start,
        node_w={
            k: np.concatenate([np.asarray(v, dtype=float) for v in c])
            for k, c in cols.watts.items()
        },
        specs=[spec for level_specs in cols.specs for spec in level_specs],
        server_gpus=np.asarray(cols.server_gpus, dtype=np.int32),
        server_model=tuple(cols.server_model),
        server_failsafe_cap_w=np.asarray(cols.server_failsafe, dtype=float),
        server_failsafe_from=tuple(cols.server_failsafe_from),
        configured_models=tuple(sorted(set(models.failsafe_cap_w) | set(models.comm_clock_mhz))),
    )


def _topology(draft: checks.Draft, models: Models, grid: GridSpec | None = None) -> Topology:
    col = draft.node_w
    frozen = [draft.level, draft.parent, draft.server_gpus, draft.server_failsafe_cap_w]
    for a in (*frozen, *col.values()):
        a.setflags(write=False)
    used = sorted(set(draft.server_model))
    clocks = MappingProxyType({m: models.comm_clock_mhz.get(m, math.nan) for m in used})
    tables = MappingProxyType({m: models.clock_tables[m] for m in used if m in models.clock_tables})
    clock_keys = MappingProxyType(
        {
            m: MappingProxyType(models.comm_clock_keys[m])
            for m in used
            if models.comm_clock_keys.get(m)
        }
    )
    return Topology(
        source=draft.source,
        names=draft.names,
        level=draft.level,
        parent=draft.parent,
        limit_w=col["limit"],
        budget_w=col["budget"],
        cap_threshold=col["cap_threshold"],
        cap_target=col["cap_target"],
        uncap_threshold=col["uncap_threshold"],
        ramp_w_per_s=col["ramp"],
        overhead_w=col["overhead"],
        oversubscription_w=col["oversubscription"],
        rise_margin_w=col["rise_margin"],
        level_start=draft.level_start,
        server_gpu_count=draft.server_gpus,
        server_model=draft.server_model,
        server_failsafe_cap_w=draft.server_failsafe_cap_w,
        comm_clock_mhz=clocks,
        grid=grid,
        clock_tables=tables,
        comm_clock_keys=clock_keys,
    )
