"""Safety by caps: every level within its limit by the caps in force, the caps where the work is.

``allocate(tree, state, dt_s, settings)`` is the cycle ``policies.decide`` runs with
``PolicySettings.safety_by_caps``. Pure, vectorised; the solver is ``policies.fill``. One
function per rule below: ``_roles`` (the terms), ``_bases`` (1), ``_target`` (2 and 3),
``_make_before_break`` (4), ``_decision`` (what is reported, and 5).

The invariant
-------------
For every tree node (server, rack, row, site) the sum of the caps in force of the GPUs
under it plus the node's non-GPU power (``Tree.overhead_below_w``) is within its
``limit_w``. A GPU enforces its cap in hardware within ~0.1 s (docs/HARDWARE.md), so
while the invariant holds no demand, however sudden, can take a node over its limit,
and the level may run to its limit: no band below it (the capping thresholds and
targets of ``policies.capping`` are not used). *In force* is the controller's to
count: a GPU with a command not yet acknowledged counts at the higher of its old and
new cap (``ClusterState.cap_w``), a GPU it cannot command at the cap it may hold (its
failsafe cap, or higher last caps), and the failsafe caps of a sized plan fit every
limit (``planner.sizing.failsafe_caps``), so an agent left alone keeps it too.

Oversubscription
----------------
A plan may bet that a level never draws all its caps (``powerplan size --oversubscribe``):
its caps may then sum beyond its limit by its ``Tree.oversubscription_w``, and a band on
measured power guards it: ``band = limit_w - rise_margin_w``, the margin the plan's
quantile of the level's rise within the controller's reaction (a rise measured to its
cut in force). Below its band by ``d`` the level's caps may sum to its room plus
``min(d, oversubscription_w)`` (``allowance_w``: continuous in the draw, so a level
near its band is not cut and raised in turn); in its band, to its room alone, and its
GPUs are cut at once, as under a node drawing above its limit. Safe at the bet: a level
at most ``d`` under its band rises within the reaction to at most ``limit - d``, and by
then its caps are within its limit. The failsafe caps still fit every limit. Every level
without an oversubscription is guaranteed by its caps.

The rules, in order
-------------------
Terms: ``span = cap_max - cap_min``, ``h = stage_headroom_fraction * span`` (50 W on a
GB200). A controllable GPU is *working* in ``compute`` or ``startup``; it *asks* when
working, drawing within ``h`` of its cap (``policies.rules.held_at_cap``'s test), below
``cap_max``, and not told to wait (``ClusterState.uncap_cycles`` 0: a command in flight,
or not its turn); it is *held back* when it would ask but waits. A controllable GPU
*lends* when it is in ``checkpoint``, ``idle`` or ``shutdown``, in ``communication`` for
longer than ``lend_after_s`` (a short wait keeps its cap: its job resumes before a loan
could be taken back), or working and drawing more than ``3 h`` under its cap; it may
give down to ``power + 2 h`` (its floor at least), from where it neither lends nor asks:
a GPU whose draw is steady is not commanded back and forth. A job may say how long a
phase lasts (``PhaseEvent.expected_s``, ``ClusterState.phase_expected_s``): a
``communication`` said to last longer than ``lend_after_s`` lends from its start, and a
GPU that would lend in a phase said to end within ``return_ahead_s`` is *returning*: it
asks for its entitlement (below) instead, so the cut that pays for it and its raise are
made before its job resumes.

1. **Bases.** A GPU that lends starts at what it may give down to, one that asks, is held
   back or is returning at its floor, every other at its cap in force (kept: nothing needs
   its watts taken). Under a node where even the bases do not fit (the invariant broken: a
   limit lowered, an operator's limit gliding down, caps read back higher than counted), the
   kept GPUs start at their floors and join their classes below; only where that does not
   fit either do the lenders start at their floors, below their draw: a gliding limit takes
   the watts GPUs do not draw first.
2. **The target.** First every GPU that asks, is held back, is returning or holds more than
   its entitlement (a loan it asks no more for; and every kept one, under a node whose bases
   did not fit), whatever its class, rises towards its *entitlement*, its failsafe cap (the
   plan's static allocation, which fits every limit), all to one share of their ranges
   (``policies.fill``, max-min fair: equal caps for GPUs of one model, which a synchronous
   job needs) within every node's limit less what is already placed. Then class by class
   (HIGH, NORMAL, LOW) those held back and those holding more than their entitlement rise
   back towards their cap in force, then the GPUs that ask rise on towards ``cap_max`` (the
   askers of a class do not level its GPUs whose raise is in flight, nor its borrowers: the
   same watts would go back and forth, a command each). So a GPU that works gets its static
   cap back before any other gets more (a loan is returned when its lender works again,
   whatever their classes), a class takes the loans, the free room and the watts above their
   entitlements of the classes below it, and levels its own GPUs; a class above is never cut
   for one below, and no class below its entitlement for one above.
3. **Loans last.** What is left goes back to the lenders, up to their caps in force:
   a lender gives only what a GPU that asks takes. Under grid smoothing
   (``startup_rise_w_per_s`` > 0) a GPU in a staged phase (``startup``, ``checkpoint``)
   then holds at most its draw plus ``policies.rules.stage_headroom_w`` (``h`` and what its
   fill rises by in two cycles; its floor at least), as ``policies.capping``'s
   rule 2: a start fills up within the site's ramp instead of jumping to its entitlement
   at its first step of compute.
4. **Make before break.** Cuts (target below the cap in force, by at least
   ``uncap_min_step_w``) go at once, but those that only restore a broken invariant under
   nodes that all draw within their limits (``Decision.levelled``: the controller sends
   them in turn with its raises, as the bands' levelling). Raises (target above it by as
   much) are granted, class by class and max-min fair again, only within each node's limit
   less the caps in force, the GPUs being cut counted at their old caps: the watts a cut
   frees are raised on once it is acknowledged, the next cycle. At the site the raises are
   also within ``ramp_w_per_s * ramp_s`` (``ClusterState.ramp_seconds``: ``dt_s``, less
   what the window's cycles before it had; less, under grid smoothing, what GPUs rise by on
   their own: ``policies.rules.own_rise_w_per_s``, and the headroom a start draws at once
   when its compute begins, whose raise to its stage cap is its own, granted first and not
   room for another GPU's) plus the draw the cycle's cuts take
   off (the grid sees the site's draw: a GPU that asks draws a raise at once, while a cut
   of a lender's headroom moves none; a reallocation between racks or rows that moves draw
   moves none at the site; the rows' ramps are left to ``policies.capping``'s bands). While
   the site's caps are within its breaker, a cycle's cuts take off no more draw than
   ``ramp_w_per_s * dt_s`` (the window bounds raises only) less what the cuts still in
   flight will (``ClusterState.pending_cap_w``), spread over the GPUs cut: a limit gliding
   down, and a reallocation too (its cuts go a cycle before the raises they pay for, a dip
   the grid sees); headroom nobody draws goes at once, and under a node drawing over its limit, or
   whose caps are over its breaker (a limit lowered, caps read back higher than counted:
   the guarantee before the grid), every watt. A cut in flight stands (a GPU kept at its
   cap in force is not raised back to it). While the site's caps are over what they may sum
   to (an operator's limit, a lowered grant), only the racks in turn are cut
   (``policies.turns.invariant_cut_in_turn``, ``ClusterState.cut_turn``; the others keep
   their caps). Moves smaller than ``uncap_min_step_w`` are not made (commands are not
   worth it), except to restore the invariant.
5. **Clocks and the floor's cost** as rules 5 and 6 of ``policies.rules``.

Why it does at least a static cap's work: a static cap is one allocation within every
limit, the failsafe caps another (a planner's static cap is its failsafe cap). Every GPU
that works is given its failsafe cap back first (rule 2), and only watts a GPU does not
draw move to GPUs held at their caps, so between phase changes every GPU holds at least
what the static plan gives it, and the level may use its whole limit; what a change of
phase costs is the cycle a returned loan waits for its cut (rule 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from policies.fill import fill
from policies.rules import (
    COMM_CODE,
    Sanitised,
    clocks_and_floor,
    own_rise_w_per_s,
    sanitised,
    stage_headroom_w,
    staged_gpus,
    under_a_passed_limit,
)
from policies.settings import Decision, PolicySettings
from policies.tree import (
    HIGH,
    LOW,
    SERVER,
    SITE,
    ClusterState,
    Tree,
    in_codes,
    phase_codes,
    ramp_allowance_w,
)

# Phases whose GPUs do no work and lend their headroom at once.
LENDING_PHASES = ("checkpoint", "idle", "shutdown")
# Phases whose GPUs may ask for more (their draw is their work).
WORKING_PHASES = ("compute", "startup")
_LENDING_CODES = phase_codes(LENDING_PHASES)
_WORKING_CODES = phase_codes(WORKING_PHASES)
_FULL_W = 1.0  # a node within a watt of its limit is full


def allocate(tree: Tree, state: ClusterState, dt_s: float, settings: PolicySettings) -> Decision:
    """One cycle under the invariant (module docstring); ``policies.decide`` calls it."""
    s = sanitised(tree, state)
    node_power = node_draw_w(tree, s.power)
    allowance = allowance_w(tree, node_power)
    room = _room_w(tree, allowance)
    r = _roles(tree, state, s, settings, room, node_power, allowance, dt_s)
    base, ranked = _bases(tree, s, r, room)
    target, want = _target(tree, s, r, base, ranked, room)
    new, cut = _make_before_break(tree, state, s, r, target, room, dt_s, settings)
    return _decision(tree, state, s, r, new, cut, want, dt_s, settings)


@dataclass(frozen=True)
class _Roles:
    """The rules' terms for one cycle (module docstring), per GPU unless said."""

    slope: np.ndarray  # the fill's slope: the GPU's range
    asks: np.ndarray
    held_back: np.ndarray
    lends: np.ndarray
    returning: np.ndarray
    asking: np.ndarray  # asks, held back or returning, and in its turn: ranked from its floor
    borrowing: np.ndarray  # holds more than its entitlement, neither asks nor lends
    frozen: np.ndarray  # out of its turn under a broken invariant: keeps its cap
    give_to: np.ndarray  # how far a lender may give
    staged: np.ndarray  # in a staged phase under grid smoothing: its cap follows its draw
    stage_cap: np.ndarray  # the most a staged GPU asks for: its draw plus one headroom
    entitled: np.ndarray  # its failsafe cap, within its floor and maximum
    over: np.ndarray  # per node: the invariant broken (caps in force over its room)
    under_over: np.ndarray
    passed: np.ndarray  # under a node drawing above its limit
    node_power_w: np.ndarray  # per node: measured, overheads in
    allowance_w: np.ndarray  # per node: an oversubscribed one's, at that draw


def _roles(
    tree: Tree,
    state: ClusterState,
    s: Sanitised,
    settings: PolicySettings,
    room: np.ndarray,
    node_power: np.ndarray,
    allowance: np.ndarray,
    dt_s: float,
) -> _Roles:
    """Who asks, waits, lends, returns, borrows, is out of turn (the rules' terms)."""
    power, cap, ctl = s.power, s.cap, s.ctl
    span = s.cap_max - s.cap_min
    h = settings.stage_headroom_fraction * span
    working = ctl & in_codes(s.phase, _WORKING_CODES)
    may_ask = (
        np.ones(len(cap), dtype=bool)
        if state.uncap_cycles is None
        else np.asarray(state.uncap_cycles, dtype=float) > 0
    )
    wants_more = _wants_more(s, state, h)
    long_comm, ends_soon = _announced(state, s.phase, settings)
    staged = _staged_for_the_grid(s, settings)
    lends = ctl & ~wants_more
    lends &= in_codes(s.phase, _LENDING_CODES) | long_comm | (working & (power + 3 * h < cap))
    returning = lends & ends_soon  # a wait about to end: its entitlement back ahead of it
    over = tree.node_sum(cap) > room + 1e-9  # the invariant broken: every watt cut counts
    under_over = tree.gpus_under(over)
    passed = under_a_passed_limit(tree, node_power) | tree.gpus_under(in_band(tree, node_power))
    # out of turn (policies.turns.invariant_cut_in_turn): held at its cap in force, neither
    # cut nor raised, unless a node over it draws above its limit
    frozen = np.zeros(len(cap), dtype=bool)
    if state.cut_turn is not None:
        frozen = ctl & under_over & ~np.asarray(state.cut_turn, dtype=bool) & ~passed
    lends &= ~returning & ~frozen
    asks, held_back = wants_more & may_ask, wants_more & ~may_ask
    entitled = np.clip(np.asarray(tree.failsafe_cap_w, dtype=float), s.floor, s.cap_max)
    asking = (asks | held_back | returning) & ~frozen
    # a GPU holding more than its entitlement (a loan, asking no more: at its maximum, or
    # drawing a little under its cap) gives it back to those that ask for theirs
    borrowing = ctl & ~lends & ~asking & ~frozen & (cap > entitled + 1e-9)
    give_to = _give_to(power, h, s.floor, cap)
    return _Roles(
        slope=np.where(span > 0, span, 1.0),
        asks=asks,
        held_back=held_back,
        lends=lends,
        returning=returning,
        asking=asking,
        borrowing=borrowing,
        frozen=frozen,
        give_to=give_to,
        staged=staged,
        stage_cap=np.maximum(power + stage_headroom_w(span, dt_s, settings), s.floor),
        entitled=entitled,
        over=over,
        under_over=under_over,
        passed=passed,
        node_power_w=node_power,
        allowance_w=allowance,
    )


def _bases(tree: Tree, s: Sanitised, r: _Roles, room: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rule 1: each GPU's base, and the GPUs whose class's share is worked out."""
    cap, floor, ctl = s.cap, s.floor, s.ctl
    base = cap.copy()
    base[r.lends] = r.give_to[r.lends]
    ranked = r.asking.copy()
    base[ranked] = np.minimum(floor[ranked], cap[ranked])
    base[r.borrowing] = r.entitled[r.borrowing]
    ranked |= r.borrowing
    broken = tree.node_sum(base) > room + 1e-6
    if broken.any():  # the kept GPUs under it join their classes, from their floors ...
        kept = tree.gpus_under(broken) & ctl & ~r.lends & ~r.frozen
        base[kept] = np.minimum(floor[kept], cap[kept])
        ranked = ranked | kept
        broken = tree.node_sum(base) > room + 1e-6
        if broken.any():  # ... and where that is not enough, the lenders below their draw
            low = tree.gpus_under(broken) & r.lends
            base[low] = np.minimum(floor[low], cap[low])
    return base, ranked


def _target(
    tree: Tree, s: Sanitised, r: _Roles, base: np.ndarray, ranked: np.ndarray, room: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rules 2 and 3: the caps each GPU would have, and what each wants."""
    cap, cap_min, priority = s.cap, s.cap_min, s.priority
    want = cap.copy()
    want[r.asks] = s.cap_max[r.asks]
    want[r.returning] = np.maximum(cap[r.returning], r.entitled[r.returning])
    want[r.staged & r.asks] = np.minimum(want, r.stage_cap)[r.staged & r.asks]
    # every GPU that asks up to its entitlement, then class by class
    x = fill(
        tree, cap_min, r.slope, base, np.where(ranked, np.minimum(want, r.entitled), base), room
    )
    for prio in range(HIGH, LOW - 1, -1):
        mine = ranked & (priority == prio)
        if mine.any():
            waits = mine & (r.held_back | r.borrowing)  # its class's askers do not level it
            if waits.any():
                x = fill(tree, cap_min, r.slope, x, np.where(waits, want, x), room)
            x = fill(tree, cap_min, r.slope, x, np.where(mine, want, x), room)
    if r.lends.any():  # loans last
        if not r.over.any() and np.all(x[ranked] <= cap[ranked] + 1e-9):
            # nobody took more than it holds, and the caps in force fit: every loan stays
            # (what the fill would give, without its search)
            x = np.where(r.lends, cap, x)
        else:
            x = fill(tree, cap_min, r.slope, x, np.where(r.lends, cap, x), room)
    # under grid smoothing a staged GPU holds no more than its draw plus a headroom
    x = np.where(r.staged, np.minimum(x, r.stage_cap), x)
    return x, want


def _make_before_break(
    tree: Tree,
    state: ClusterState,
    s: Sanitised,
    r: _Roles,
    target: np.ndarray,
    room: np.ndarray,
    dt_s: float,
    settings: PolicySettings,
) -> tuple[np.ndarray, np.ndarray]:
    """Rule 4: the caps to command, and which GPUs are cut."""
    power, cap, ctl = s.power, s.cap, s.ctl
    step = settings.uncap_min_step_w
    cut = ctl & (target < cap - step)
    cut |= ctl & (target < cap - 1e-9) & r.under_over
    rise = ctl & (target > cap + step)
    new = cap.copy()
    new[cut] = target[cut]
    # raises within the window's seconds of ramp (ClusterState.ramp_seconds); cuts paced
    # by the time since the last cycle (an early cycle after a full window still cuts)
    ramp_w = float(ramp_allowance_w(tree.ramp_w_per_s[SITE], state.ramp_seconds(dt_s)))
    fall_w = float(ramp_allowance_w(tree.ramp_w_per_s[SITE], dt_s))
    # the breakers' invariant broken (a limit lowered, caps read back higher than counted):
    # its cuts go at once, whatever the grid's ramp; an operator's line and a grant
    # (Tree.root_caps_limit_w) glide
    breakers = tree.gpu_room_w + r.allowance_w
    broken = tree.node_sum(cap) > breakers + 1e-9
    within_breaker = not broken[SITE]
    if within_breaker and np.isfinite(fall_w):  # the site's draw falls no faster than its
        # ramp (a limit gliding down, a reallocation: a cut made before the raise it pays
        # for is a dip the grid sees), save under a node drawing above its limit or whose
        # caps are over its breaker; headroom nobody draws goes at once
        drawn = _after_pending(state, np.minimum(power, cap))
        paced = cut & ~r.passed & ~tree.gpus_under(broken)
        fall = np.where(paced, np.maximum(drawn - target, 0.0), 0.0)
        total_w = float(fall.sum())
        landing_w = float(np.sum(np.where(ctl & ~r.passed, np.minimum(power, cap) - drawn, 0.0)))
        budget_w = max(fall_w - landing_w, 0.0)
        if total_w > budget_w:
            new = np.where(fall > 0, np.maximum(target, drawn - fall * (budget_w / total_w)), new)
    if rise.any():
        raise_room = room.copy()
        # (GPUs that rise, what the site's ramp lets them take: inf without a ramp limit)
        groups: list[tuple[np.ndarray, float]] = [(rise, math.inf)]
        if np.isfinite(ramp_w):  # the draw the cuts take off pays for raises beyond it
            drawn = np.minimum(power[cut], cap[cut])
            freed_w = float(np.sum(drawn - np.minimum(drawn, target[cut])))
            own_w = own_rise_w_per_s(tree, state, s.phase, ctl, r.staged, settings)[SITE] * dt_s
            # and a staged GPU's headroom, which it draws at once when its compute begins
            own_w += float(np.sum(np.where(r.staged, r.stage_cap - power, 0.0)))
            # a staged GPU's raise up to its stage cap is in own_w already (its headroom):
            # its own, not room for another GPU's raise (that GPU would draw it at once,
            # uncounted, and the headroom counted would go ungranted)
            staged_rise = rise & r.staged
            staged_w = float(np.sum(np.where(staged_rise, target - cap, 0.0)))
            allowed_w = max(ramp_w - own_w, 0.0) + freed_w
            groups = [(staged_rise, staged_w), (rise & ~r.staged, allowed_w)]
        y = cap.copy()
        for group, ramp_room_w in groups:
            if math.isfinite(ramp_room_w):
                raise_room[SITE] = min(room[SITE], tree.node_sum(y)[SITE] + ramp_room_w)
            for prio in range(HIGH, LOW - 1, -1):
                mine = group & (s.priority == prio)
                if mine.any():
                    y = fill(tree, s.cap_min, r.slope, y, np.where(mine, target, y), raise_room)
        granted = rise & (y > cap + 1e-9)
        new[granted] = y[granted]
    if state.pending_cap_w is not None:  # a cut in flight stands: kept, it is not undone
        pending = np.asarray(state.pending_cap_w, dtype=float)
        with np.errstate(invalid="ignore"):  # NaN: nothing pending
            new = np.where(pending < cap, np.minimum(new, pending), new)
    return np.where(ctl, np.clip(new, s.cap_min, s.cap_max), cap), cut


def _decision(
    tree: Tree,
    state: ClusterState,
    s: Sanitised,
    r: _Roles,
    new: np.ndarray,
    cut: np.ndarray,
    want: np.ndarray,
    dt_s: float,
    settings: PolicySettings,
) -> Decision:
    """The caps with what the controller reports of them, and rule 5 (clocks, floors)."""
    power, cap, ctl = s.power, s.cap, s.ctl
    overhead = tree.overhead_below_w
    pred = np.where(ctl, np.minimum(power, new), power)
    node_caps = tree.node_sum(new) + overhead
    short = r.asks & (new < want - 1e-9)
    capping = (node_caps >= np.asarray(tree.limit_w, dtype=float) - _FULL_W) & (
        tree.node_sum(short * 1.0) > 0
    )
    node_cut = np.bincount(
        tree.gpu_ancestor[SERVER], weights=np.where(cut, cap - new, 0.0), minlength=tree.n_nodes
    )
    cut_levels = np.where(cut, np.uint8(1 << SITE), np.uint8(0)).astype(np.uint8)
    # cuts that restore the invariant where no node over them draws above its limit: no
    # breaker needs them this instant, so they may wait their turn with the raises (a site
    # taken over from the bands with every cap at its maximum: 20,736 nodes to cut)
    may_wait = cut & r.under_over & ~r.passed
    if state.cut_turn is not None:  # in turn: the cuts that restore it go at once
        may_wait &= ~np.asarray(state.cut_turn, dtype=bool)
    clock, floor_energy = clocks_and_floor(tree, power, s.phase, ctl, dt_s, settings)
    return Decision(
        cap_w=new,
        max_sm_clock_mhz=clock,
        node_power_w=r.node_power_w,
        node_predicted_w=tree.node_sum(pred) + overhead,
        node_capping=capping,
        floor_hold_energy_j=floor_energy,
        node_cut_w=node_cut,
        cut_levels=cut_levels,
        node_shift_w=np.zeros(tree.n_nodes),
        shifted=np.zeros(len(new), dtype=bool),
        levelled=may_wait,
        short=short & tree.gpus_under(capping),
    )


def _after_pending(state: ClusterState, drawn: np.ndarray) -> np.ndarray:
    """Each GPU's draw once the cuts sent and not yet acknowledged land: they count against
    this cycle's fall (found by ``bench_scale --site-limit-mw 110 --safety caps`` over a
    broker: with acks a cycle late, the next racks in turn were cut as well, 1.56 MW/s
    against 1 MW/s)."""
    if state.pending_cap_w is None:
        return drawn
    pending = np.asarray(state.pending_cap_w, dtype=float)
    after: np.ndarray = np.where(np.isfinite(pending), np.minimum(drawn, pending), drawn)
    return after


def _announced(
    state: ClusterState, phase: np.ndarray, settings: PolicySettings
) -> tuple[np.ndarray, np.ndarray]:
    """Per GPU, from its job's announcements: in a ``communication`` longer than
    ``lend_after_s`` (announced so, or lasted so), and in a phase said to end within
    ``return_ahead_s``. Times not known (no job, a phase inferred from power): neither."""
    n = len(phase)
    if state.phase_s is None:
        return np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    phase_s = np.asarray(state.phase_s, dtype=float)
    expected = (
        np.full(n, np.nan)
        if state.phase_expected_s is None
        else np.asarray(state.phase_expected_s, dtype=float)
    )
    comm = phase == COMM_CODE
    with np.errstate(invalid="ignore"):  # NaN: not known
        left_s = expected - phase_s
        long_comm = comm & ((phase_s > settings.lend_after_s) | (left_s > settings.return_ahead_s))
        ends_soon = left_s <= settings.return_ahead_s
    return long_comm, ends_soon


def _wants_more(s: Sanitised, state: ClusterState, h: np.ndarray) -> np.ndarray:
    """Working (``compute``, ``startup``), drawing within ``h`` of its cap, below its
    maximum, and measured (a draw not measured, read as the failsafe cap, is not known to
    want more): a GPU that asks unless told to wait (the rules' terms)."""
    working = s.ctl & in_codes(s.phase, _WORKING_CODES)
    measured = np.isfinite(np.asarray(state.power_w, dtype=float))
    wants: np.ndarray = working & (s.power >= s.cap - h) & measured & (s.cap < s.cap_max - 1e-9)
    return wants


def _staged_for_the_grid(s: Sanitised, settings: PolicySettings) -> np.ndarray:
    """Under grid smoothing (``startup_rise_w_per_s`` > 0), the GPUs in a staged phase
    (``startup``, ``checkpoint``): their caps follow their draw up by one headroom, so a
    start fills up within the site's ramp and its first step of compute does not jump to
    its entitlement (``policies.capping``'s rule 2, for the same reason)."""
    if not settings.startup_rise_w_per_s > 0:
        return np.zeros(len(s.cap), dtype=bool)
    return staged_gpus(s)


def _give_to(power: np.ndarray, h: np.ndarray, floor: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """How far a GPU that lends may give: two headrooms over its draw (rule 1's terms)."""
    given: np.ndarray = np.clip(power + 2 * h, floor, cap)
    return given


def caps_room_w(tree: Tree, node_power_w: np.ndarray | None = None) -> np.ndarray:
    """(n_nodes,) what the caps of the GPUs under each node may sum to: its limit less its
    overheads, plus an oversubscribed node's allowance at its draw ``node_power_w``
    (``allowance_w``; None: none), the root's also within ``Tree.root_caps_limit_w`` less
    the site's."""
    allowance = np.zeros(tree.n_nodes) if node_power_w is None else allowance_w(tree, node_power_w)
    return _room_w(tree, allowance)


def _room_w(tree: Tree, allowance: np.ndarray) -> np.ndarray:
    """``caps_room_w`` for an allowance already worked out (``allowance_w``)."""
    room: np.ndarray = tree.gpu_room_w + allowance
    room[0] = min(room[0], tree.root_caps_limit_w - tree.overhead_below_w[0])
    return room


def node_draw_w(tree: Tree, power_w: np.ndarray) -> np.ndarray:
    """(n_nodes,) each node's measured draw: its GPUs' power plus its overheads."""
    drawn: np.ndarray = tree.node_sum(power_w) + tree.overhead_below_w
    return drawn


def band_w(tree: Tree) -> np.ndarray:
    """(n_nodes,) an oversubscribed node's band, ``limit_w - rise_margin_w``: drawing at
    most this, it stays within its limit for the controller's reaction time at the plan's
    quantile. inf where the node is guaranteed by its caps."""
    band = np.full(tree.n_nodes, np.inf)
    if tree.rise_margin_w is not None:
        over = tree.oversubscribed
        band[over] = (np.asarray(tree.limit_w, dtype=float) - tree.rise_margin_w)[over]
    return band


def in_band(tree: Tree, node_power_w: np.ndarray) -> np.ndarray:
    """(n_nodes,) bool: an oversubscribed node draws above its band."""
    inside: np.ndarray = np.asarray(node_power_w, dtype=float) > band_w(tree)
    return inside


def allowance_w(tree: Tree, node_power_w: np.ndarray) -> np.ndarray:
    """(n_nodes,) how far the caps under each node may sum beyond its limit this cycle:
    an oversubscribed node's ``oversubscription_w``, less as its draw comes within that of
    its band, 0 in it; 0 at every other node. Continuous in the draw, so a node near its
    band is not cut and raised in turn."""
    if tree.oversubscription_w is None or not tree.oversubscribed.any():
        return np.zeros(tree.n_nodes)
    below = band_w(tree) - np.asarray(node_power_w, dtype=float)
    with np.errstate(invalid="ignore"):  # inf - inf at a guaranteed node: 0 below
        allowed = np.clip(below, 0.0, tree.oversubscription_w)
    return np.where(tree.oversubscribed, allowed, 0.0)


def caps_at_draw_w(tree: Tree, state: ClusterState, settings: PolicySettings) -> float:
    """The site's caps in force, each no higher than what a GPU that lends may give down
    to, plus the site's overheads: where the caps could be without moving any draw (where
    an operator's line on the caps starts, ``powerd.controller.site_limit``)."""
    s = sanitised(tree, state)
    h = settings.stage_headroom_fraction * (s.cap_max - s.cap_min)
    at_draw = np.where(s.ctl, _give_to(s.power, h, s.floor, s.cap), s.cap)
    return float(np.sum(at_draw)) + float(tree.overhead_below_w[SITE])


def caps_in_force_fit(
    tree: Tree,
    cap_w: np.ndarray,
    tolerance_w: float = 1e-6,
    node_power_w: np.ndarray | None = None,
) -> np.ndarray:
    """(n_nodes,) whether each node's caps in force plus its overheads are within its
    limit (an oversubscribed node's: plus its allowance at ``node_power_w``): the
    invariant, as a check (tests, the replay, the controller's health)."""
    room = tree.gpu_room_w
    if node_power_w is not None:
        room = room + allowance_w(tree, node_power_w)
    fits: np.ndarray = tree.node_sum(np.asarray(cap_w, dtype=float)) <= room + tolerance_w
    return fits
