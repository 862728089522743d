"""Why a GPU draws less than its job wants: the cause of every watt of throughput lost.

A specification. A GPU is *held* when it draws less than its demand (what its
phase would draw at the device's max limit, no clock lock). Throughput lost
is then charged to one cause, so that the causes add up to the loss:

- ``clock lock``: its SM clock is locked (the communication clock policy,
  when a lock outlives the phase it was meant for);
- ``grid ramp``: grid power smoothing holds its draw below what its cap
  allows (``policies.smoothing``: the draw climbs at the GPU's ramp share);
- otherwise its cap is below its demand, and the cause is *the rule that last
  lowered that cap* (``cap_causes``), carried while the cap climbs back,
  since what keeps the cap low afterwards is the uncapping ramp that rule
  made necessary; but a stage cut under a budget's cap gives the GPU back to
  that budget once its cap is back where the cut found it (``carry_causes``):
  the stage holds only what it took (``grid_held_w``):
  - ``capping``: a node above its capping threshold cut it (rule 3 of
    ``policies.capping``), or a node between its bands levelled it with the
    other GPUs of its class held at their caps (rule 3c): the budget, shared;
    under safety by caps, a cut to make room under a limit, or, from its
    failsafe start on, a node over it full when it asks (``Decision.short``):
    the limit, shared;
  - ``priority shift``: a node between its bands took its watts for a
    higher-priority GPU (rule 3b);
  - ``staged phase``: its cap was lowered to the staged cap of a job start or
    a checkpoint (rule 2);
  - ``failsafe start``: it has held its failsafe cap since its agent started
    (agents start there; the controller then hands watts back at the ramp).

A job whose speed is set by its slowest GPU (synchronous training) loses
``1 - speed`` each step, charged to the slowest GPU's cause
(``job_causes``). Used by ``planner.whatif`` and ``powerd demo``.

The controller, which knows no demand, charges the same causes to what it sees
(``seen_causes``, recorded per job by ``powerd.controller.job_causes``), and for
``capping`` also the level whose budget cut (``binding_levels``, ``cap_levels``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.rules import STAGED_CODES, held_at_cap
from policies.settings import Decision, PolicySettings
from policies.tree import LEVEL_NAMES, SERVER, SITE, ClusterState, Tree, in_codes, phase_codes

CAUSES = (
    "capping",
    "priority shift",
    "staged phase",
    "failsafe start",
    "clock lock",
    "grid ramp",
)
CAPPING, PRIORITY_SHIFT, STAGED, FAILSAFE, CLOCK_LOCK, GRID_RAMP = range(len(CAUSES))
NOT_HELD = -1
# the causes a budget lowers a cap by: a stage cut under one gives the GPU back to it
BUDGET_CAUSES = (CAPPING, PRIORITY_SHIFT)
_BUDGET_CODES = np.array(BUDGET_CAUSES, dtype=np.int8)
# the causes that hold work back for the site's ramp limits (staged rises, the GPUs' own
# ramp under smoothing): the work lost to a grid spec; the others are the budgets'
GRID_CAUSES = (STAGED, GRID_RAMP)
# what a split of throughput lost reports: every cause, and what no cause explains (a speed
# a hair under 1 from a draw within HELD_TOLERANCE_W of its demand)
LOST_CAUSES = (*CAUSES, "unexplained")
HELD_TOLERANCE_W = 1e-6  # float noise: a draw any further below its demand is held
_LOWERED_W = 1e-6


def initial_causes(n_gpus: int) -> np.ndarray:
    """Every GPU at its failsafe cap, as agents start."""
    return np.full(n_gpus, FAILSAFE, dtype=np.int8)


def cap_causes(
    causes: np.ndarray, old_cap_w: np.ndarray, decision: Decision, phase: np.ndarray
) -> np.ndarray:
    """``causes`` after a cycle: a GPU whose cap the cycle lowered takes the rule that
    lowered it (capping before priority shift before staging, the order they act in);
    every other GPU keeps its cause, but one at its failsafe start that a full node holds
    there (``Decision.short``), which takes ``capping``."""
    new_cap = np.asarray(decision.cap_w)
    lowered = new_cap < np.asarray(old_cap_w) - _LOWERED_W
    out = causes.copy()
    if len(decision.short):  # at its failsafe start, but held there by a full node
        out[(out == FAILSAFE) & decision.short] = CAPPING
    if not lowered.any():
        return out
    out[lowered & in_codes(phase, STAGED_CODES)] = STAGED
    if len(decision.levelled):
        out[lowered & decision.levelled] = CAPPING
    if len(decision.shifted):
        out[lowered & decision.shifted] = PRIORITY_SHIFT
    if len(decision.cut_levels):
        out[lowered & (decision.cut_levels != 0)] = CAPPING
    return out


@dataclass(frozen=True)
class CarriedCauses:
    """Per GPU: the rule that last lowered its cap (``cause``, as ``cap_causes`` carries
    it); for one a staged phase cut under a budget's cap (``BUDGET_CAUSES``), the cap the
    cut found (``staged_from_w``, ``inf`` otherwise) and that budget's cause
    (``before``)."""

    cause: np.ndarray
    staged_from_w: np.ndarray
    before: np.ndarray


def initial_carried(n_gpus: int) -> CarriedCauses:
    """Every GPU at its failsafe start, no stage cut under a budget."""
    cause = initial_causes(n_gpus)
    return CarriedCauses(cause, np.full(n_gpus, np.inf), cause.copy())


def carry_causes(
    carried: CarriedCauses, old_cap_w: np.ndarray, decision: Decision, phase: np.ndarray
) -> CarriedCauses:
    """``carried`` after a cycle: ``cap_causes``, but a GPU a staged phase cut under a
    budget's cap goes back to that budget's cause once its cap climbs back to where the
    cut found it (a cut from any other cause, a failsafe start's, is carried as before:
    what keeps its cap low is the climb that cut made necessary)."""
    old = np.asarray(old_cap_w, dtype=float)
    cap = np.asarray(decision.cap_w, dtype=float)
    cause = cap_causes(carried.cause, old, decision, phase)
    staged = cause == STAGED
    newly = staged & (carried.cause != STAGED) & in_codes(carried.cause, _BUDGET_CODES)
    from_w = np.where(newly, old, np.where(staged, carried.staged_from_w, np.inf))
    before = np.where(newly, carried.cause, carried.before).astype(np.int8)
    back = staged & (cap >= from_w - _LOWERED_W)
    cause = np.where(back, before, cause).astype(np.int8)
    return CarriedCauses(cause, np.where(back, np.inf, from_w), before)


# The level whose budget held a GPU by ``capping``: a level of the tree, or, at its root,
# what bounds the root in force: an operator's site limit, a coordinator's grant to a leaf.
LEVEL_TAGS = (*LEVEL_NAMES, "site limit", "grant")
SITE_LIMIT, GRANT = len(LEVEL_NAMES), len(LEVEL_NAMES) + 1
NO_LEVEL = -1
_WORKING_CODES = phase_codes(("compute", "startup"))


def initial_levels(n_gpus: int) -> np.ndarray:
    """No level: no GPU is held by ``capping`` as agents start."""
    return np.full(n_gpus, NO_LEVEL, dtype=np.int8)


def binding_levels(tree: Tree, decision: Decision, root: int = SITE) -> np.ndarray:
    """Per GPU, the level that binds it this cycle: the nearest node over it that is capping
    (``Decision.node_capping``: above its capping threshold under the bands; under safety by
    caps, its caps at its limit with a GPU under it short of what it asks), else the nearest
    level that cut it (``Decision.cut_levels``), else the nearest node over it between its
    bands (measured above its uncapping threshold: rule 3c levels under it), else
    ``NO_LEVEL``. The root's level reads ``root``: ``SITE``, or ``SITE_LIMIT``/``GRANT``
    when that bounds the root in force."""
    out = np.full(tree.n_gpus, NO_LEVEL, dtype=np.int8)
    power = np.asarray(decision.node_power_w, dtype=float)
    if len(power) == tree.n_nodes:
        with np.errstate(invalid="ignore"):
            between = power > np.asarray(tree.uncap_threshold_w, dtype=float)
        for lvl in range(SITE, SERVER + 1):
            out[between[tree.gpu_ancestor[lvl]]] = lvl
    cut = np.asarray(decision.cut_levels)
    if len(cut):
        for lvl in range(SITE, SERVER + 1):  # the nearest last: it wins
            out[(cut >> lvl) & 1 == 1] = lvl
    capping = np.asarray(decision.node_capping, dtype=bool)
    if len(capping) and capping.any():
        for lvl in range(SITE, SERVER + 1):
            out[capping[tree.gpu_ancestor[lvl]]] = lvl
    out[out == SITE] = root
    return out


def cap_levels(
    levels: np.ndarray,
    causes: np.ndarray,
    new_causes: np.ndarray,
    old_cap_w: np.ndarray,
    decision: Decision,
    bound: np.ndarray,
) -> np.ndarray:
    """``levels`` after a cycle, beside ``cap_causes`` (``causes`` before it, ``new_causes``
    after): a GPU that takes ``capping`` this cycle (its cap lowered by it, or held at its
    failsafe start by a full node) takes the level that binds it (``bound``, from
    ``binding_levels``) and carries it as its cause; a GPU held by any other cause has
    ``NO_LEVEL``. A GPU already held by ``capping`` whose cap reads lowered while no level
    binds it (its cap in force read back before last cycle's cut landed: the same cut)
    keeps the level it had."""
    capping = new_causes == CAPPING
    lowered = np.asarray(decision.cap_w) < np.asarray(old_cap_w) - _LOWERED_W
    took = capping & ((causes != CAPPING) | lowered)
    out: np.ndarray = np.where(capping, levels, NO_LEVEL).astype(np.int8)
    out[took] = np.where(bound[took] != NO_LEVEL, bound[took], out[took])
    return out


def seen_causes(
    tree: Tree,
    state: ClusterState,
    causes: np.ndarray,
    settings: PolicySettings,
    locked: np.ndarray | None = None,
) -> np.ndarray:
    """Per GPU, why it is held as a controller sees it (``NOT_HELD`` if it is not): it knows
    no demand, so a GPU is *held* when its job works (``compute``, ``startup``: a wait is
    not slowed by power) and it is held at its cap (``policies.rules.held_at_cap``:
    controllable, its cap below its max limit, drawing within ``stage_headroom_fraction``
    of its range under the cap: 50 W on a 200-1200 W GB200, the margin under which the
    policies count it as wanting more) or its SM clock is ``locked``. Its cause is
    ``clock lock`` if locked, else the rule that last lowered its cap (``causes``, from
    ``cap_causes``). ``grid ramp`` is not seen: a draw the ramp holds back is under the
    cap, not at it."""
    power = np.asarray(state.power_w, dtype=float)
    cap = np.asarray(state.cap_w, dtype=float)
    cap_max = np.asarray(tree.cap_max_w, dtype=float)
    span = cap_max - np.asarray(tree.cap_min_w, dtype=float)
    ctl = np.asarray(state.controllable, dtype=bool)
    working = in_codes(np.asarray(state.phase), _WORKING_CODES)
    with np.errstate(invalid="ignore"):  # NaN draw: not held
        at_cap = held_at_cap(ctl, power, cap, cap_max, span, settings)
    out = np.where(at_cap & working, causes, NOT_HELD).astype(np.int8)
    if locked is not None:
        out[locked & working] = CLOCK_LOCK
    return out


def held_back_w(tree: Tree, state: ClusterState, cause: np.ndarray) -> np.ndarray:
    """Per GPU, the watts its cause holds back: its max limit less its cap (less its draw for
    a clock lock, which holds it under its cap); 0 where it is not held."""
    cap_max = np.asarray(tree.cap_max_w, dtype=float)
    under = np.where(cause == CLOCK_LOCK, state.power_w, state.cap_w)
    with np.errstate(invalid="ignore"):
        out: np.ndarray = np.where(cause != NOT_HELD, np.maximum(cap_max - under, 0.0), 0.0)
    out[np.isnan(out)] = 0.0
    return out


def held_causes(
    drawn_w: np.ndarray,
    demand_w: np.ndarray,
    capped_w: np.ndarray,
    causes: np.ndarray,
    locked: np.ndarray | None = None,
) -> np.ndarray:
    """Per GPU, why it draws ``drawn_w`` below ``demand_w`` (``NOT_HELD`` if it does not).
    ``capped_w``: what it would draw under its cap alone (``min(demand, cap)``) — a draw
    below that is the grid ramp's; ``locked``: its SM clock is locked."""
    held = drawn_w < demand_w - HELD_TOLERANCE_W
    out = np.where(held, causes, NOT_HELD).astype(np.int8)
    out[held & (drawn_w < capped_w - HELD_TOLERANCE_W)] = GRID_RAMP
    if locked is not None:
        out[held & locked] = CLOCK_LOCK
    return out


def job_causes(gpu_speed: np.ndarray, gpu_cause: np.ndarray, job_start: np.ndarray) -> np.ndarray:
    """Per job (its GPUs contiguous from ``job_start``), the cause of its slowest GPU:
    of the GPUs tied slowest and held, the highest cause code (a fixed order, so the
    split is reproducible); ``NOT_HELD`` when none of them is held."""
    slowest = np.minimum.reduceat(gpu_speed, job_start)
    counts = np.diff(np.append(job_start, len(gpu_speed)))
    is_slowest = gpu_speed <= np.repeat(slowest, counts)
    candidate = np.where(is_slowest, gpu_cause, NOT_HELD)
    out: np.ndarray = np.maximum.reduceat(candidate, job_start).astype(np.int8)
    return out


def lost_column(cause: str) -> str:
    """The table column of throughput lost to ``cause``: ``lost_priority_shift``."""
    return "lost_" + cause.replace(" ", "_")


def lost_index(cause: np.ndarray) -> np.ndarray:
    """Each cause's place in ``LOST_CAUSES``: ``NOT_HELD`` is the last, "unexplained"."""
    index: np.ndarray = np.where(cause == NOT_HELD, len(CAUSES), cause)
    return index


def loss_by_cause(loss: np.ndarray, cause: np.ndarray) -> np.ndarray:
    """Per entry of ``LOST_CAUSES``, the sum of ``loss`` charged to it."""
    index = lost_index(cause)
    return np.bincount(index.ravel(), weights=loss.ravel(), minlength=len(LOST_CAUSES))


def largest_causes(by_cause: dict[str, float], least: float = 0.0005) -> list[tuple[str, float]]:
    """The causes that cost at least ``least`` of the throughput, largest first: what a
    summary line names."""
    return sorted(
        ((c, share) for c, share in by_cause.items() if share >= least),
        key=lambda item: item[1],
        reverse=True,
    )


def grid_held_w(
    drawn_w: np.ndarray,
    demand_w: np.ndarray,
    capped_w: np.ndarray,
    cap_cause: np.ndarray,
    staged_from_w: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """What the grid's rules (``GRID_CAUSES``) hold back of each GPU's demand, W, any
    shape: ``(held, beyond)``. Held: a draw below what its cap allows (``capped_w``: the
    smoothing's ramp) plus, where a staged phase last lowered its cap (``cap_cause``), its
    demand above that cap, up to the budget's cap the stage cut found
    (``staged_from_w``, ``CarriedCauses``; none known: all of it); a cap the budgets
    lowered is theirs, not the grid's. ``beyond``: the staged part alone, the demand a
    capped draw does not show."""
    ramp_w = np.maximum(capped_w - drawn_w, 0.0)
    wanted_w = demand_w if staged_from_w is None else np.minimum(demand_w, staged_from_w)
    beyond: np.ndarray = np.where(cap_cause == STAGED, np.maximum(wanted_w - capped_w, 0.0), 0.0)
    held: np.ndarray = ramp_w + beyond
    return held, beyond
