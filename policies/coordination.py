"""The site coordinator's policy: one budget per leaf controller, priority-ordered across rows.

A tree of controllers (Dynamo's shape, docs/DOMAIN.md): leaf controllers each run
``policies.capping.decide`` over their own scope (a row or a few rows) under a
root budget; the coordinator re-divides the site's budget among them every
period, slower than the leaves' cycle. Three pure functions:

``summarise(tree, state, decision)``
    What a leaf reports after a cycle (``LeafSummary``): its measured and
    predicted power; ``fixed_w``, what no cut can remove (overheads, the GPUs it
    cannot command at what they are counted, every commandable GPU's minimum
    cap); by priority class, ``demand_w`` (commandable GPUs' predicted power
    above their minimum caps) and ``held_w`` (for GPUs held at their caps, the
    lower of the cap in force and the one decided, the caps' distance to the
    maximum, as far as their racks' and nodes' own bands would hand it back, up
    to their uncapping thresholds: what they would draw more under a larger
    grant).

``allocate(leaves, site)``
    The grants, in *budget* watts: a leaf granted ``B`` caps above
    ``B * cap_threshold`` down to ``B * cap_target`` and hands back below
    ``B * uncap_threshold`` (the site's fractions). A leaf that draws ``W`` and
    wants no more is asked for at ``W / cap_target`` (its target is what it
    draws); watts its held GPUs want more are asked for at ``/ uncap_threshold``,
    so that under the grant the leaf hands them back until it draws them. (Asked
    at ``/ cap_target`` too, a leaf whose power settled between its uncapping
    threshold and its target would hold GPUs below their demand for good, between
    its bands, while the coordinator saw it granted all it wanted: found by
    ``tests/fleet/test_tree_of_controllers.py``.) The rules:

    1. **Pool.** The grants of the leaves sum to at most ``pool_w`` (the site's
       budget less its own overhead at its threshold, ``powerd.topology.scope.
       leaf_pool_w``): the leaves' thresholds plus that overhead stay within the
       site's threshold, as with one controller.
    2. **Silent leaves** (no summary within the grant TTL) are reserved
       ``max(their last budget in force, their file budget)``: they may hold
       either, and are granted their file budget.
    3. **Priority order across rows.** Every heard leaf first gets its
       ``fixed_w``; then the HIGH want (``demand + held``) of every leaf, then
       NORMAL, then LOW, each class scaled down in proportion when the pool
       cannot hold all of it. Low-priority watts anywhere go before
       high-priority watts anywhere. What is left is shared in proportion to the
       file budgets (room to grow between periods). No leaf is granted more than
       ``limit_w / cap_threshold`` (its rows' breakers).
    4. **Make before break.** A leaf's budget may rise only by watts that are
       free even if every lowered leaf still holds its old budget: the raises
       share ``pool - sum(lowered leaves' budgets in force) - reserves -
       sum(raised leaves' budgets in force)``. A lowered leaf gets its new budget
       at once; the raise completes next period, once its summary shows the
       lower budget in force. So at no instant do the budgets in force exceed
       the pool, whatever order the grants arrive in. A leaf under safety by
       caps counts at the higher of its budget and the caps in force it reports
       (``caps_in_force_w``): its cuts to a lowered grant land at its ramp, and
       until they do it may draw up to its caps.
    5. **Ramp shares.** The site's ramp limit is split among the leaves in
       proportion to each one's room to rise (its grant at target less its
       predicted power) plus 5 % of its file budget: the shares sum to the
       site's ramp, so the sum of caps under the site rises no faster than it
       would under one controller.

``with_root_budget(tree, budget_w, ramp_w_per_s, fractions)``
    The leaf's tree under a grant: its root's budget and bands replaced.

A leaf that hears no grant for its TTL holds ``min(grant, file budget)`` for one
more TTL, then its file budget (``powerd.controller.scoping``): every leaf
passes through the lower of the two before any rises to its file budget, and the
file budgets sum within the pool (checked when a scoped budgets file is loaded).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from policies.rules import held_at_cap
from policies.settings import Decision, PolicySettings
from policies.tree import HIGH, LOW, RACK, ROW, SERVER, ClusterState, Tree

# Classes in the order the coordinator serves them (and the wire lists them: PRIORITIES).
SERVED = tuple(range(HIGH, LOW - 1, -1))
# Every leaf's ramp share has at least this share of its file budget in its weight.
RAMP_BASE_FRACTION = 0.05


@dataclass(frozen=True)
class LeafSummary:
    """One leaf's state after a cycle (watts; per class in PRIORITIES order: high first)."""

    measured_w: float
    predicted_w: float
    cap_sum_w: float
    fixed_w: float
    demand_w: tuple[float, float, float]
    held_w: tuple[float, float, float]


def summarise(
    tree: Tree, state: ClusterState, decision: Decision, settings: PolicySettings | None = None
) -> LeafSummary:
    """What a leaf reports of its scope (its tree's root) after ``decision``."""
    settings = settings or PolicySettings()
    cap_min = np.asarray(tree.cap_min_w, dtype=float)
    cap_max = np.asarray(tree.cap_max_w, dtype=float)
    ctl = np.asarray(state.controllable, dtype=bool)
    power = np.nan_to_num(np.asarray(state.power_w, dtype=float), nan=0.0, posinf=0.0)
    np.maximum(power, 0.0, out=power)
    cap = np.asarray(decision.cap_w, dtype=float)
    predicted = np.where(ctl, np.minimum(power, cap), power)
    priority = np.clip(np.asarray(state.priority), LOW, HIGH)
    overhead = float(tree.overhead_below_w[0])
    fixed = overhead + float(predicted[~ctl].sum()) + float(cap_min[ctl].sum())
    above = np.where(ctl, np.maximum(predicted - cap_min, 0.0), 0.0)
    # A GPU drawing at the cap it holds is held even where this decision raises its cap:
    # it has not drawn the watts handed back yet, and reported at what it draws it would
    # seem to want no more (a leaf handing back its caps, or a standby that just took
    # over, would be granted less than its GPUs are about to draw: found by
    # tests/fleet/test_tree_of_controllers.py). Its cap is the lower of the two.
    lower_cap = np.fmin(cap, np.asarray(state.cap_w, dtype=float))
    held = held_at_cap(ctl, power, lower_cap, cap_max, cap_max - cap_min, settings)
    gap = np.where(held, cap_max - lower_cap, 0.0)
    # only what the racks' and nodes' own bands let them be handed back (up to their
    # uncapping thresholds): a grant cannot lift those bands
    for lvl in (SERVER, RACK):
        if not gap.any():
            break
        drawn = tree.node_sum(predicted) + tree.overhead_below_w
        room = np.maximum(tree.uncap_threshold_w - drawn, 0)
        asked = tree.node_sum(gap)
        factor = np.where(asked > room, room / np.where(asked > 0, asked, 1.0), 1.0)
        gap *= factor[tree.gpu_ancestor[lvl]]
    demand = np.bincount(priority, weights=above, minlength=HIGH + 1)
    want_more = np.bincount(priority, weights=gap, minlength=HIGH + 1)
    held_cap = np.where(ctl, cap, power)
    return LeafSummary(
        measured_w=float(decision.node_power_w[0]),
        predicted_w=float(decision.node_predicted_w[0]),
        cap_sum_w=float(held_cap.sum()) + overhead,
        fixed_w=fixed,
        demand_w=(float(demand[HIGH]), float(demand[1]), float(demand[LOW])),
        held_w=(float(want_more[HIGH]), float(want_more[1]), float(want_more[LOW])),
    )


@dataclass(frozen=True)
class SitePool:
    """The site as the coordinator divides it."""

    pool_w: float  # what the leaves' budgets may sum to (leaf_pool_w)
    cap_threshold: float  # the site's band fractions, which every leaf's root uses
    cap_target: float
    uncap_threshold: float
    ramp_w_per_s: float  # the site's ramp limit; inf: none


@dataclass(frozen=True)
class Leaves:
    """The coordinator's view of its leaves, as arrays (n_leaves,), watts; classes (n, 3)
    in PRIORITIES order (high first)."""

    heard: np.ndarray  # bool: a summary within the grant TTL
    fixed_w: np.ndarray
    demand_w: np.ndarray  # (n, 3)
    held_w: np.ndarray  # (n, 3)
    predicted_w: np.ndarray
    budget_w: np.ndarray  # in force, as last reported (file budget if never heard)
    file_budget_w: np.ndarray
    limit_w: np.ndarray
    # under safety by caps, the caps in force plus overheads each leaf reported (NaN: a
    # leaf under the bands, or not reported): it may hold them above its budget while its
    # cuts to a lowered grant land, so they count as in force (rule 4)
    caps_in_force_w: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.heard)


@dataclass(frozen=True)
class Allocation:
    budget_w: np.ndarray  # (n,) the grants
    ramp_w_per_s: np.ndarray  # (n,) inf: no limit
    wanted_w: np.ndarray  # (n,) what rule 3 alone would grant (before make-before-break)
    reserved_w: float  # held back for silent leaves


def allocate(leaves: Leaves, site: SitePool) -> Allocation:
    """The grants for one coordinator period; see the module docstring for the rules."""
    heard = np.asarray(leaves.heard, dtype=bool)
    file_w = np.asarray(leaves.file_budget_w, dtype=float)
    holds_w = np.asarray(leaves.budget_w, dtype=float)
    if leaves.caps_in_force_w is not None:  # a leaf under caps holds its caps, if higher
        holds_w = np.fmax(holds_w, np.asarray(leaves.caps_in_force_w, dtype=float))
    in_force = np.where(heard, holds_w, 0.0)
    silent_reserve = np.where(~heard, np.maximum(holds_w, file_w), 0.0)
    reserved = float(silent_reserve.sum())
    ceiling = np.where(heard, np.asarray(leaves.limit_w, dtype=float) / site.cap_threshold, 0.0)
    tgt, unc = site.cap_target, site.uncap_threshold
    available = site.pool_w - reserved

    # rule 3: fixed watts, then each class, high first
    held_any = np.asarray(leaves.held_w, dtype=float).sum(axis=1) > 0
    per_w = np.where(held_any, 1.0 / unc, 1.0 / tgt)  # budget watts per watt drawn
    fixed_need = np.minimum(np.where(heard, leaves.fixed_w * per_w, 0.0), ceiling)
    total_fixed = float(fixed_need.sum())
    if total_fixed > available:
        alloc = fixed_need * (max(available, 0.0) / total_fixed) if total_fixed > 0 else fixed_need
        available = 0.0
    else:
        alloc = fixed_need.copy()
        available -= total_fixed
    want = (np.asarray(leaves.demand_w, dtype=float) + leaves.held_w) * per_w[:, None]
    for rank in range(want.shape[1]):  # PRIORITIES order: high, normal, low
        request = np.where(heard, np.clip(np.minimum(want[:, rank], ceiling - alloc), 0, None), 0)
        total = float(request.sum())
        if total <= 0.0:
            continue
        give = request if total <= available else request * (max(available, 0.0) / total)
        alloc += give
        available = max(available - float(give.sum()), 0.0)
    if available > 0.0:  # room to grow, in proportion to the file budgets
        room = np.where(heard, np.clip(ceiling - alloc, 0, None), 0.0)
        weight = np.where(room > 0, file_w, 0.0)
        if weight.sum() > 0:
            alloc += np.minimum(room, available * weight / weight.sum())
    wanted = alloc.copy()

    # rule 4: make before break
    raised = heard & (alloc > in_force)
    free = site.pool_w - reserved - float(in_force.sum())
    rise = np.where(raised, alloc - in_force, 0.0)
    total_rise = float(rise.sum())
    if total_rise > 0:
        share = min(1.0, max(free, 0.0) / total_rise)
        alloc = np.where(raised, in_force + rise * share, alloc)
    budget = np.where(heard, alloc, file_w)

    # rule 5: ramp shares
    if np.isfinite(site.ramp_w_per_s):
        room_w = np.maximum(budget * tgt - np.where(heard, leaves.predicted_w, 0.0), 0.0)
        weight = room_w + RAMP_BASE_FRACTION * file_w * tgt
        total_weight = float(weight.sum())
        if total_weight > 0:
            ramp = site.ramp_w_per_s * weight / total_weight
        else:
            ramp = np.full(leaves.n, site.ramp_w_per_s / max(leaves.n, 1))
    else:
        ramp = np.full(leaves.n, np.inf)
    return Allocation(budget_w=budget, ramp_w_per_s=ramp, wanted_w=wanted, reserved_w=reserved)


def with_root_budget(
    tree: Tree, budget_w: float, ramp_w_per_s: float, fractions: tuple[float, float, float]
) -> Tree:
    """``tree`` (a leaf's, with its file budgets) under a grant of ``budget_w``.

    The root's budget, bands (``fractions``: cap threshold, cap target, uncap threshold
    of the budget) and ramp limit are replaced. Its rows' budgets and bands scale by
    ``budget_w`` over the root's file budget, each no higher than its breaker allows
    (``limit_w`` over its threshold fraction): for a scope of one row, the row's budget
    is the grant. Racks and nodes keep theirs: a grant moves watts between rows, never
    past a rack's or a node's own band.
    """
    threshold, target, uncap = fractions
    factor = budget_w / float(tree.budget_w[0])
    arrays: dict[str, Any] = {
        name: np.array(getattr(tree, name), dtype=float)
        for name in ("budget_w", "cap_threshold_w", "cap_target_w", "uncap_threshold_w")
    }
    rows = tree.level_nodes[ROW]
    if len(rows):
        base = np.asarray(tree.budget_w, dtype=float)[rows]
        row_threshold = np.asarray(tree.cap_threshold_w, dtype=float)[rows] / base
        scaled = np.minimum(base * factor, np.asarray(tree.limit_w)[rows] / row_threshold)
        for name in ("cap_threshold_w", "cap_target_w", "uncap_threshold_w"):
            column = arrays[name]
            column[rows] = scaled * (column[rows] / base)
        arrays["budget_w"][rows] = scaled
    for name, value in (
        ("budget_w", budget_w),
        ("cap_threshold_w", budget_w * threshold),
        ("cap_target_w", budget_w * target),
        ("uncap_threshold_w", budget_w * uncap),
    ):
        arrays[name][0] = value
    ramp = np.array(tree.ramp_w_per_s, dtype=float)
    ramp[0] = ramp_w_per_s
    arrays["ramp_w_per_s"] = ramp
    # under safety by caps (policies.allocation) the grant bounds the caps in force
    return dataclasses.replace(tree, **arrays, root_caps_limit_w=budget_w)
