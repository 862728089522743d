"""Scopes: the part of a budgets file one leaf controller of a tree of controllers manages.

A scope is a name and one or more rows of the budgets file. Its controller
manages the nodes under those rows exactly as a single controller manages the
site (same policy, same commands), under a root of its own that stands for the
scope's share of the site: ``scoped`` builds that ``Topology``. The root's
budget is the rows' budgets summed (the *file budget*, what the leaf holds when
no site coordinator grants it another), its limit the rows' limits summed, its
bands the site's fractions, its ramp limit the site's in proportion to the
scope's budget.

The file budgets must be safe together: with every leaf at its file budget
(coordinator lost), the leaves' capping thresholds plus the site's own overhead
stay within the site's capping threshold:
``sum(row budget_w) <= site budget_w - site overhead_w / site cap_threshold``
(``leaf_pool_w``). ``scoped`` refuses a file that breaks it; ``powerplan size``
sizes rows within it. docs/CONTROLLER.md, "A tree of controllers".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from policies.tree import RACK, ROW, SERVER
from powerd.protocol import ProtocolError, check_name
from powerd.topology.model import BudgetError, Topology


@dataclass(frozen=True)
class Scope:
    """A leaf controller's part of the site: a name (in its topics) and its rows."""

    name: str
    rows: tuple[str, ...]

    def __post_init__(self) -> None:
        try:
            check_name(self.name, "scope")
        except ProtocolError as exc:
            raise ValueError(str(exc)) from None
        if not self.rows:
            raise ValueError(f"scope {self.name!r} names no rows")
        if len(set(self.rows)) != len(self.rows):
            raise ValueError(f"scope {self.name!r} names a row twice: {', '.join(self.rows)}")

    def __str__(self) -> str:
        if self.rows == (self.name,):
            return self.name
        return f"{self.name}:{','.join(self.rows)}"


def parse_scope(text: str) -> Scope:
    """``ROW`` (a scope of one row, named after it) or ``NAME:ROW,ROW,...``; ValueError."""
    text = text.strip()
    name, sep, rows = text.partition(":")
    if not sep:
        return Scope(name, (name,))
    return Scope(name.strip(), tuple(r.strip() for r in rows.split(",") if r.strip()))


def leaf_pool_w(topology: Topology) -> float:
    """What the leaves' budgets may sum to: the site's budget less its own overhead at the
    site's capping threshold (the leaves' thresholds plus that overhead stay within it)."""
    return float(topology.budget_w[0] - topology.overhead_w[0] / topology.cap_threshold[0])


def rows_budget_w(topology: Topology) -> float:
    """The rows' file budgets, summed."""
    start, stop = topology.level_start[ROW], topology.level_start[ROW + 1]
    return float(topology.budget_w[start:stop].sum())


def rows_within_site(topology: Topology) -> str | None:
    """Why the rows' file budgets are not safe together as leaves' fallbacks; None if they are."""
    total, pool = rows_budget_w(topology), leaf_pool_w(topology)
    if total <= pool * (1 + 1e-12):
        return None
    return (
        f"the rows' budget_w sum to {total / 1e3:,.1f} kW, above the {pool / 1e3:,.1f} kW the "
        "leaves of a tree of controllers may hold together on their file budgets (site "
        f"budget_w {topology.budget_w[0] / 1e3:,.1f} kW less its own overhead_w "
        f"{topology.overhead_w[0] / 1e3:,.1f} kW / cap_threshold {topology.cap_threshold[0]:g}): "
        "with the coordinator lost, the site could pass its capping threshold. Lower the rows' "
        "budgets (`powerplan size` sizes them within it) or run one controller for the site"
    )


def check_scopes(topology: Topology, scopes: list[Scope], whole: bool = False) -> None:
    """Scopes name rows of this file, no row twice; with ``whole``, every row once (a
    coordinator's leaves). BudgetError naming the scope otherwise."""
    rows = set(topology.rows)
    seen: dict[str, str] = {}
    for scope in scopes:
        unknown = [r for r in scope.rows if r not in rows]
        if unknown:
            raise BudgetError(
                topology.source,
                "",
                f"scope {scope.name}: no row named {', '.join(map(repr, unknown))} "
                f"(rows: {', '.join(topology.rows[:8])}{' ...' if len(rows) > 8 else ''})",
            )
        for row in scope.rows:
            if row in seen:
                raise BudgetError(
                    topology.source, "", f"row {row} is in scopes {seen[row]} and {scope.name}"
                )
            seen[row] = scope.name
    if len({s.name for s in scopes}) != len(scopes):
        raise BudgetError(topology.source, "", "two scopes have the same name")
    missing = [r for r in topology.rows if r not in seen]
    if whole and missing:
        raise BudgetError(
            topology.source,
            "",
            f"rows in no scope: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''} "
            "(every row needs a leaf controller, or its power is nobody's)",
        )


def scoped(topology: Topology, scope: Scope) -> Topology:
    """The ``Topology`` a leaf controller manages: a root for the scope, its rows, their racks
    and nodes (BudgetError if a row is unknown or the rows' budgets are not safe together)."""
    check_scopes(topology, [scope])
    problem = rows_within_site(topology)
    if problem is not None:
        raise BudgetError(topology.source, topology.site, problem)
    index = topology.tree.index
    wanted = {index[r] for r in scope.rows}
    keep = np.zeros(topology.n_nodes, dtype=bool)
    keep[0] = True
    parent = topology.parent
    for lvl in (ROW, RACK, SERVER):
        start, stop = topology.level_start[lvl], topology.level_start[lvl + 1]
        nodes = np.arange(start, stop)
        if lvl == ROW:
            keep[start:stop] = np.isin(nodes, list(wanted))
        else:
            keep[start:stop] = keep[parent[start:stop]]
    old = np.flatnonzero(keep)
    new_of_old = np.full(topology.n_nodes, -1, dtype=np.int32)
    new_of_old[old] = np.arange(len(old), dtype=np.int32)
    new_parent = np.where(parent[old] < 0, -1, new_of_old[np.maximum(parent[old], 0)])
    level = topology.level[old]
    level_start = tuple(int(np.searchsorted(level, lvl)) for lvl in range(SERVER + 2))
    first_server = topology.level_start[SERVER]
    servers = old[level == SERVER] - first_server

    def pick(column: np.ndarray) -> np.ndarray:
        return np.array(column[old], dtype=column.dtype)

    rows = old[level == ROW]
    budget, limit = pick(topology.budget_w), pick(topology.limit_w)
    budget[0] = topology.budget_w[rows].sum()
    limit[0] = topology.limit_w[rows].sum()
    ramp, overhead = pick(topology.ramp_w_per_s), pick(topology.overhead_w)
    if math.isfinite(topology.ramp_w_per_s[0]):
        ramp[0] = topology.ramp_w_per_s[0] * budget[0] / max(rows_budget_w(topology), 1e-9)
    overhead[0] = 0.0  # the site's own overhead is the coordinator's to account for
    names = list(topology.names[i] for i in old)
    names[0] = f"{topology.site}.{scope.name}"
    arrays: dict[str, Any] = {
        "parent": new_parent.astype(np.int32),
        "level": level,
        "budget_w": budget,
        "limit_w": limit,
        "ramp_w_per_s": ramp,
        "overhead_w": overhead,
        "cap_threshold": pick(topology.cap_threshold),
        "cap_target": pick(topology.cap_target),
        "uncap_threshold": pick(topology.uncap_threshold),
        "server_gpu_count": np.array(topology.server_gpu_count[servers]),
        "server_failsafe_cap_w": np.array(topology.server_failsafe_cap_w[servers]),
    }
    for key in ("oversubscription_w", "rise_margin_w"):
        column = getattr(topology, key)
        if column is not None:  # the site's is the coordinator's, as its overhead
            arrays[key] = pick(column)
            arrays[key][0] = 0.0
    for value in arrays.values():
        value.setflags(write=False)  # as every Topology column
    return dataclasses.replace(
        topology,
        # the grid's limits are on the site's measured power, which the coordinator and the
        # site's meter see, not a leaf's root: a leaf neither records nor enforces them
        # (its GPUs' grid smoothing profile is computed from the whole file, before scoping)
        grid=None,
        source=f"{topology.source} [scope {scope}]",
        names=tuple(names),
        level_start=level_start,
        server_model=tuple(topology.server_model[k] for k in servers.tolist()),
        **arrays,
    )


__all__ = [
    "Scope",
    "check_scopes",
    "leaf_pool_w",
    "parse_scope",
    "rows_budget_w",
    "rows_within_site",
    "scoped",
]
