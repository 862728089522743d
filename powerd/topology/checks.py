"""The whole-tree checks a budgets file must pass, each a named function over arrays.

``run_all`` runs them in order; the first failure raises ``BudgetError`` naming
the file, the tree node and the number at fault (the first offender in tree
order). Vectorised: the 150 MW site (20,736 nodes) is checked in milliseconds.

``budget_warnings`` is the softer half: a file that loads but whose numbers
are out of proportion to the GPUs under a node (a limit hundreds of times
what they can draw, a budget they exceed at their lowest cap). Such a file
is not refused (a site built for growth, a rack budget meant to idle), but
every command that loads one says so, in the same words as a refusal.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from policies.tree import LEVEL_NAMES, RACK, ROW, SERVER, SITE, fold_up
from powerd.gpu.models import GPU_MODELS, GpuModel
from powerd.protocol import NAME_PATTERN
from powerd.topology.model import BudgetError, Topology, per_node
from powerd.topology.units import (
    PLAUSIBLE_W,
    RAMP_PLAUSIBLE_PER_S,
    Written,
    implausible,
    unit_hint,
)
from powerd.units import fmt_w

_NAME_RE = re.compile(NAME_PATTERN)


class _SpecLike(Protocol):
    """What the checks read of an entry: the numbers as the file wrote them."""

    @property
    def written(self) -> dict[str, Written]: ...


@dataclass(frozen=True)
class Draft:
    """A parsed budgets file before its checks: nodes numbered level by level."""

    source: str
    names: tuple[str, ...]
    level: np.ndarray  # int8 (n_nodes,)
    parent: np.ndarray  # int32 (n_nodes,)
    level_start: tuple[int, ...]
    node_w: dict[str, np.ndarray]  # limit, budget, overhead, ramp, thresholds (n_nodes,)
    specs: list[_SpecLike]  # the entry each node came from (what it wrote)
    server_gpus: np.ndarray  # int32 (n_servers,)
    server_model: tuple[str, ...]
    server_failsafe_cap_w: np.ndarray
    server_failsafe_from: tuple[str, ...]  # where each server's failsafe cap was set
    configured_models: tuple[str, ...]  # the [models.<key>] tables

    def fail(self, node: int, problem: str) -> BudgetError:
        return BudgetError(self.source, self.describe(node), problem)

    def describe(self, node: int) -> str:
        return describe(self.level, self.names, node)

    def subtree_sum(self, per_server: np.ndarray, own: np.ndarray | None = None) -> np.ndarray:
        return fold_up(self.parent, self.level, per_node(self.level_start, per_server, own))

    @property
    def server_cap_max_w(self) -> np.ndarray:
        return np.array([GPU_MODELS[m].cap_max_w for m in self.server_model])


def describe(level: np.ndarray, names: tuple[str, ...], node: int) -> str:
    """How messages name a tree node: ``rack 'row1-k2'``."""
    return f"{LEVEL_NAMES[int(level[node])]} {names[node]!r}"


def run_all(draft: Draft) -> None:
    for check in CHECKS:
        check(draft)


def names_valid_and_unique(draft: Draft) -> None:
    """Every name matches the protocol's name pattern and is unique across the file."""
    names, level = draft.names, draft.level
    for i, name in enumerate(names):
        if not _NAME_RE.match(name):
            raise draft.fail(i, f"invalid name: names must match {NAME_PATTERN} (1-64 characters)")
    if len(set(names)) != len(names):
        seen: dict[str, int] = {}
        for i, name in enumerate(names):
            if name in seen:
                j = seen[name]
                raise draft.fail(
                    i,
                    f"duplicate name: tree node #{i} has the same name as "
                    f"{LEVEL_NAMES[level[j]]} #{j}; names must be unique across the file",
                )
            seen[name] = i


def units_plausible(draft: Draft) -> None:
    """Overheads, limits and budgets inside their level's plausible range; ramps against
    the budget. Only numbers the file wrote (a node's default limit is derived)."""
    level, col = draft.level, draft.node_w
    n = len(level)
    max_draw = draft.subtree_sum(draft.server_gpus * draft.server_cap_max_w, col["overhead"])
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
        written = [i for i in np.flatnonzero(bad).tolist() if quantity in draft.specs[i].written]
        for i in written[:1]:
            what = f"a {LEVEL_NAMES[level[i]]}"
            if quantity == "ramp":
                what = f"budget_w = {budget[i]:g} W"
            raise draft.fail(
                i,
                implausible(
                    draft.specs[i].written[quantity],
                    quantity,
                    what,
                    float(low[i]),
                    float(high[i]),
                    None if expect is None else float(expect[i]),
                ),
            )


def failsafe_out_of_range(cap: float, model: GpuModel, origin: str = "") -> str | None:
    """The problem with a failsafe cap outside its model's cap range (None if inside)."""
    lo, hi = model.cap_min_w, model.cap_max_w
    if lo <= cap <= hi:
        return None
    written = Written("failsafe_cap_w", cap, 1.0)
    hint = unit_hint(written, {"failsafe_cap_w": 1.0}, lo, hi, model.cap_default_w)
    return (
        f"failsafe_cap_w = {cap:g} W{origin} is outside the {model.key}'s cap range "
        f"[{lo:g}, {hi:g}] W{hint}"
    )


def failsafe_caps_in_model_range(draft: Draft) -> None:
    """Every server's failsafe cap (own or inherited) inside its GPU model's cap range."""
    failsafe = draft.server_failsafe_cap_w
    cap_min = np.array([GPU_MODELS[m].cap_min_w for m in draft.server_model])
    bad = (failsafe < cap_min) | (failsafe > draft.server_cap_max_w)
    if bad.any():
        k = int(np.argmax(bad))
        origin = draft.server_failsafe_from[k]
        problem = failsafe_out_of_range(
            float(failsafe[k]),
            GPU_MODELS[draft.server_model[k]],
            f" (set by {origin})" if origin else "",
        )
        assert problem is not None
        server = draft.level_start[SERVER] + k
        raise BudgetError(draft.source, f"node {draft.names[server]!r}", problem)


def budgets_within_limits(draft: Draft) -> None:
    """No node is planned to draw more than its breaker allows."""
    budget, limit = draft.node_w["budget"], draft.node_w["limit"]
    bad = budget > limit
    if bad.any():
        i = int(np.argmax(bad))
        raise draft.fail(i, f"budget_w = {budget[i]:g} W is above its limit_w = {limit[i]:g} W")


def thresholds_ordered(draft: Draft) -> None:
    """0 < uncap_threshold < cap_target < cap_threshold ≤ 1 at every node."""
    thr, tgt, unc = (draft.node_w[k] for k in ("cap_threshold", "cap_target", "uncap_threshold"))
    bad = ~((unc < tgt) & (tgt < thr) & (thr <= 1.0))
    if bad.any():
        i = int(np.argmax(bad))
        raise draft.fail(
            i,
            "thresholds out of order: need 0 < uncap_threshold < cap_target < "
            f"cap_threshold ≤ 1, got uncap_threshold = {unc[i]:g}, cap_target = {tgt[i]:g}, "
            f"cap_threshold = {thr[i]:g} (own or inherited)",
        )


def failsafe_holds(draft: Draft) -> None:
    """The failsafe guarantee: with the controller lost and every GPU at its failsafe cap,
    every node stays under its limit. Reported bottom-up: the server, rack, row or site
    that fails first, with the cap that would hold."""
    gpus, limit = draft.server_gpus, draft.node_w["limit"]
    overhead_w = draft.node_w["overhead"]
    fs_power = draft.subtree_sum(gpus * draft.server_failsafe_cap_w, overhead_w)
    overhead = draft.subtree_sum(np.zeros(len(gpus)), overhead_w)
    n_gpus = draft.subtree_sum(gpus.astype(float))
    over = fs_power > limit * (1 + 1e-12)
    level_start = draft.level_start
    for lvl in (SERVER, RACK, ROW, SITE):
        bad_lvl = np.flatnonzero(over[level_start[lvl] : level_start[lvl + 1]])
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
            raise draft.fail(
                i,
                f"failsafe power {fs_power[i]:g} W ({n_gpus[i]:g} GPUs at their failsafe caps "
                f"+ {overhead[i]:g} W overhead) exceeds limit_w = {limit[i]:g} W: with the "
                f"controller lost this {what} would not hold; {fix}{more}",
            )


def configured_models_used(draft: Draft) -> None:
    """A [models.<key>] table for a model no node has would apply to nothing: a typo."""
    used = sorted(set(draft.server_model))
    dangling = [m for m in draft.configured_models if m not in used]
    if dangling:
        raise BudgetError(
            draft.source,
            f"[models.{dangling[0]}]",
            f"no node uses GPU model {dangling[0]}; the settings would apply to nothing "
            f"(models in use: {', '.join(used)})",
        )


def oversubscription_has_margin(draft: Draft) -> None:
    """An oversubscribed level (``oversubscription_w`` > 0) gives the rise its band keeps
    below its limit (``rise_margin_w`` > 0), a band above its own non-GPU power; a rise
    margin alone, at a level its caps guarantee, would be a number nothing reads."""
    col = draft.node_w
    over, margin, limit = col["oversubscription"], col["rise_margin"], col["limit"]
    overhead = draft.subtree_sum(np.zeros(len(draft.server_gpus)), col["overhead"])
    for i in np.flatnonzero((over > 0) | (margin > 0)).tolist():
        if over[i] > 0 and margin[i] <= 0:
            raise draft.fail(
                i,
                f"oversubscription_w = {over[i]:g} W needs rise_margin_w (the most its draw "
                "may rise within the controller's reaction, `powerplan size` writes it)",
            )
        if over[i] <= 0:
            raise draft.fail(
                i,
                f"rise_margin_w = {margin[i]:g} W without oversubscription_w: the level is "
                "guaranteed by its caps and has no band",
            )
        if limit[i] - margin[i] <= overhead[i]:
            raise draft.fail(
                i,
                f"rise_margin_w = {margin[i]:g} W leaves no band: limit_w = {limit[i]:g} W "
                f"less the margin is within its non-GPU power ({overhead[i]:g} W)",
            )


CHECKS: tuple[Callable[[Draft], None], ...] = (
    names_valid_and_unique,
    units_plausible,
    failsafe_caps_in_model_range,
    budgets_within_limits,
    thresholds_ordered,
    failsafe_holds,
    oversubscription_has_margin,
    configured_models_used,
)


# --- warnings: a file that loads, with numbers out of proportion ------------------------

#: A limit more than this many times what everything under its node can draw (every GPU
#: at its model's maximum cap, every overhead the file gives) is out of proportion. A feed
#: or breaker built for growth (a second phase of racks, denser servers later) is about
#: 1.5-4 x what is installed; 10 x is no plan, and it is where the usual slips land: a
#: value in W written as kW is 1000 x, a row's limit copied onto a rack tens of x. Such a
#: limit protects nothing the planner can see, and every plan sized against it is moot.
LIMIT_OVER_DRAW_MAX = 10.0

#: A budget below this share of what the GPUs under its node draw at their lowest cap
#: (overheads in) is one the controller cannot hold: with every GPU busy it caps them all
#: to cap_min and the node still draws more. Any shortfall counts (1.0): capping cannot
#: close it, however small. (A limit below that draw is refused: the failsafe check.)
BUDGET_UNDER_FLOOR_MIN = 1.0

_UNIT_SLIPS = (1e3, 1e6)  # kW for W, MW for W (or MW for kW)


def budget_warnings(top: Topology) -> list[str]:
    """What is out of proportion in a loaded budgets file, worded as the loader's errors
    are (file, tree node, numbers): per level and kind the worst node and how many more.
    Empty for a file in proportion; ``LIMIT_OVER_DRAW_MAX`` and ``BUDGET_UNDER_FLOOR_MIN``
    say where proportion ends and why."""
    return [warning for warn in WARNINGS for warning in warn(top)]


def log_budget_warnings(top: Topology, log: logging.Logger) -> None:
    """``budget_warnings`` as warnings in a daemon's log (the controller, the coordinator:
    a file out of proportion still runs, and the operator reads why it may be wrong)."""
    for warning in budget_warnings(top):
        log.warning("budgets: %s", warning)


def _per_level(
    top: Topology, bad: np.ndarray, severity: np.ndarray, problem: Callable[[int], str]
) -> list[str]:
    """One message per level with an offender: the worst by ``severity``, and a count."""
    out = []
    for lvl in (SITE, ROW, RACK, SERVER):
        first, end = top.level_start[lvl], top.level_start[lvl + 1]
        found = first + np.flatnonzero(bad[first:end])
        if not len(found):
            continue
        i = int(found[np.argmax(severity[found])])
        more = f"; {len(found) - 1} more {LEVEL_NAMES[lvl]}s too" if len(found) > 1 else ""
        out.append(f"{top.source}: {describe(top.level, top.names, i)}: {problem(i)}{more}")
    return out


def _gpus_under(top: Topology, cap_w: Callable[[GpuModel], float]) -> np.ndarray:
    """(n_nodes,) every GPU under each node at ``cap_w`` of its model, overheads in."""
    count = top.server_gpu_count.astype(float)
    caps = np.array([cap_w(GPU_MODELS[m]) for m in top.server_model])
    return top.subtree_sum(count * caps, top.overhead_w)


def limits_in_proportion(top: Topology) -> list[str]:
    """No limit above ``LIMIT_OVER_DRAW_MAX`` x what everything under its node can draw."""
    draw_w = _gpus_under(top, lambda m: m.cap_max_w)
    gpus = top.subtree_sum(top.server_gpu_count.astype(float))
    limit_w = np.asarray(top.limit_w, dtype=float)
    ratio = limit_w / draw_w

    def problem(i: int) -> str:
        slip = next((f for f in _UNIT_SLIPS if ratio[i] / f <= LIMIT_OVER_DRAW_MAX), None)
        hint = (
            f"; a unit slip? 1/{slip:,.0f} of it, {fmt_w(limit_w[i] / slip)}, would be"
            f" {ratio[i] / slip:.2g} ×"
            if slip
            else ""
        )
        return (
            f"limit_w = {limit_w[i]:,.0f} W is {ratio[i]:,.0f} × what everything under it"
            f" can draw ({draw_w[i]:,.0f} W: {gpus[i]:,.0f} GPUs at their maximum cap,"
            f" overheads in); more than {LIMIT_OVER_DRAW_MAX:g} × is out of proportion{hint}"
        )

    return _per_level(top, ratio > LIMIT_OVER_DRAW_MAX, ratio, problem)


def budgets_above_floor(top: Topology) -> list[str]:
    """No budget below ``BUDGET_UNDER_FLOOR_MIN`` x its GPUs' draw at their lowest cap."""
    floor_w = _gpus_under(top, lambda m: m.cap_min_w)
    gpus = top.subtree_sum(top.server_gpu_count.astype(float))
    budget_w = np.asarray(top.budget_w, dtype=float)

    def problem(i: int) -> str:
        return (
            f"budget_w = {budget_w[i]:,.0f} W is below what its {gpus[i]:,.0f} GPUs draw at"
            f" their lowest cap, overheads in ({floor_w[i]:,.0f} W): with them all busy the"
            " controller cannot bring it within its budget"
        )

    bad = budget_w < BUDGET_UNDER_FLOOR_MIN * floor_w
    return _per_level(top, bad, floor_w / budget_w, problem)


WARNINGS: tuple[Callable[[Topology], list[str]], ...] = (
    limits_in_proportion,
    budgets_above_floor,
)
