"""One control cycle: Dynamo-style three-band capping at every level of the power tree.

``decide(tree, state, dt_s, settings)`` is pure: arrays in, a :class:`Decision`
out. The controller calls it every cycle; the planner replays profiles through
it. Every step is vectorised over all GPUs and all tree nodes of a level; the
only Python loops run over the four levels. Each rule below is one step of
:func:`decide`; rules 1, 5 and 6, shared with safety by caps (``policies.allocation``),
are ``policies.rules``'; 3b and 3c are ``policies.between_bands``', 4 is
``policies.uncapping``', and the taking of rules 3 and 3b is ``policies.take``'.

The rules, in the order they are applied
----------------------------------------
Terms: a GPU's *predicted power* is ``min(power_w, cap)`` if it is
controllable, else its measured ``power_w`` (an offline or silent GPU does not
follow the controller; the controller already reports it at its failsafe cap).
A node's measured power is the measured power of every GPU under it plus its
``overhead_below_w``; its predicted power is the same with predicted GPU power.

1. **Sanitise** (``policies.rules``). Non-finite power or caps read as the GPU's
   failsafe cap; negative power as 0; caps and floors are clipped into
   ``[cap_min_w, cap_max_w]``.
2. **Staged phases** (``startup`` and ``checkpoint``; docs/DOMAIN.md, Llama 3:
   job start and checkpoints are the synchronised swings that hurt the site
   ramp). A controllable GPU in one of them has its cap *lowered* (never
   raised) to ``max(stage_cap, power_w + headroom, floor_w)`` with
   ``stage_cap = cap_min + startup_cap_fraction * (cap_max - cap_min)`` and
   ``headroom = stage_headroom_fraction * (cap_max - cap_min)`` (under software grid
   smoothing, plus what its fill rises by in two cycles:
   ``policies.rules.stage_headroom_w``), and it is not handed watts back while it
   stays in that phase. So during a start or a checkpoint the caps sit just above
   what the GPU draws (never below the staged start cap), and when the phase ends
   the GPUs climb back through step 4, whose ramp limits hold at every level: the
   job's rise is bounded by the site, row, rack and server ramps. The rule is stateless: "entering
   startup" is every cycle spent in it.
3. **Capping, bottom-up** (servers, racks, rows, site). A node whose measured
   power is above ``cap_threshold_w`` must come down to ``cap_target_w``: it
   takes ``R = predicted - target`` (predicted after the cuts of the levels
   below, so a parent takes only what its children left) from the
   controllable GPUs under it: all of LOW first, then NORMAL, then HIGH, and
   inside the class that gives the last watts high-bucket-first, i.e. by
   water-filling ``a = predicted - floor_w``: every GPU above a level ``L``
   comes down to ``L`` where ``sum(max(a - L, 0)) = R``. Never below
   ``floor_w``, never from an uncontrollable GPU. A cut GPU's cap becomes its
   new predicted power (``min(power_w, cap) - cut``), so a cap that the GPU
   has not yet followed counts as watts already taken.
   With a finite ``cut_fall_w_per_s`` (grid power smoothing: each GPU's share
   of the grid's ramp-down), a GPU no node over which draws above its
   ``limit_w`` is cut no lower this cycle than ``min(power_w, cap) -
   cut_fall_w_per_s * dt_s``: a node between its capping threshold and its
   limit is over a budget, not a breaker, and comes down over several cycles
   no faster than the grid allows, where at once its GPUs' floors would show
   the whole cut as one step (found by ``bench_tree --grid-smoothing`` on the
   150 MW site: racks pushed across their thresholds by the 80 % floor cut
   3 kW each at once, 73-208 kW a row in the same second). A GPU in a waiting
   phase (``communication``, ``checkpoint``) is then not cut below what it
   draws: its smoothing lets its draw fall on its own at that same rate, and
   a cut would add to the fall (found by
   ``tests/controller/test_site_limit_under_smoothing.py``: a demand-response
   glide that began as a job waited fell 35 kW/s against the GPUs' 18 kW/s
   share). Above a limit the cut is whole, at once, as without smoothing.
   Rules 3b and 3c keep to the same bounds.
   **In turn** (``ClusterState.cut_turn``): under a node over its capping threshold and
   no node over its limit (a budget, not a breaker), only the GPUs in turn give, each at
   most ``cut_turn_max_fraction`` of its range (within the bounds above), class by class
   as above; what they could not give waits for later turns, and a class with watts left
   out of turn holds it back (the classes above it give nothing for it first). So a level
   takes at most what it took without turns, from fewer nodes, and a node over a budget
   may stay over it a few cycles: a budget is not a breaker. Why: a glide that cut the
   150 MW site's 82,944 GPUs by 11 W each every second (an operator's site limit at the
   grid's 1 MW/s) commanded all 20,736 nodes every cycle, ten times the controller's own
   bound on raises a second; and a need inflated by nodes it does not hear (counted at the
   caps they may hold) cut more nodes still, which fell behind, went unheard, and inflated
   it further (found by ``bench_scale --site-limit-mw``). Under a node over its limit every
   GPU gives at once, as without turns.
3b. **Priority shift, between the bands** (``priority_shift``; ``policies.between_bands``).
   Under a node known to be between its bands (not capping, not handing back, and not
   put there by the power it counts for GPUs it does not hear), under which a GPU of
   class ``p`` is held at its cap, the classes below ``p`` give what brings the node just
   under its uncapping threshold, so rule 4 hands it back to ``p`` first next cycle.
3c. **Levelling within a class, between the bands** (``level_within_class``;
   ``policies.between_bands``). Under such a node, the caps of one class's GPUs held at
   them move towards one share of their ranges, keeping their sum: a synchronous job
   runs at its slowest GPU's pace.
4. **Uncapping** (``policies.uncapping``). Under nodes below their uncapping thresholds
   (or between their bands, with GPUs held at their caps, under
   ``uncap_between_bands``), controllable GPUs neither staged nor waiting ask for a step
   of their gap to ``cap_max``; every node grants at most its ramp, its headroom to its
   capping target and to its limit with every GPU at its cap, HIGH first.
5. **Clocks** and 6. **Power floor cost** (``policies.rules``): ``communication`` locks
   the SM clock to ``tree.comm_clock_mhz`` when ``comm_clock_lock``; with
   ``hold_floor_w_per_gpu``, the energy holding that floor would cost is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.between_bands import BetweenBands, move_between_bands
from policies.rules import (
    LEVELS_BOTTOM_UP,
    NEGLIGIBLE_W,
    WAITING_CODES,
    Sanitised,
    clocks_and_floor,
    held_at_cap,
    sanitised,
    stage_headroom_w,
    staged_gpus,
    under_a_passed_limit,
)
from policies.settings import Decision, PolicySettings
from policies.take import cut
from policies.tree import HIGH, LOW, ClusterState, Tree, in_codes
from policies.uncapping import uncap


def decide(
    tree: Tree, state: ClusterState, dt_s: float, settings: PolicySettings | None = None
) -> Decision:
    """One control cycle over the whole tree; see the module docstring for the rules."""
    if settings is None:
        settings = PolicySettings()
    if not (np.isfinite(dt_s) and dt_s > 0):
        raise ValueError(f"dt_s must be a positive number of seconds, not {dt_s}")
    if settings.safety_by_caps:
        from policies.allocation import allocate  # the default cycle, on the shared rules

        return allocate(tree, state, dt_s, settings)
    s = sanitised(tree, state)  # 1. (s.cap is the cycle's caps, updated in place)
    node_power = tree.node_sum(s.power) + tree.overhead_below_w
    capping = node_power > tree.cap_threshold_w
    staged = _stage(s, dt_s, settings)  # 2.
    # held at its cap (rule 3b): judged on the caps before this cycle's cuts
    waiting = in_codes(s.phase, WAITING_CODES)
    span = s.cap_max - s.cap_min
    pressed = ~staged & ~waiting & held_at_cap(s.ctl, s.power, s.cap, s.cap_max, span, settings)
    cuts = _cap_bottom_up(tree, state, s, node_power, capping, pressed, waiting, dt_s, settings)
    pressed &= cuts.levels == 0  # cut this cycle: held by a node over its threshold
    ramp_s = state.ramp_seconds(dt_s)  # 3c's levelling and 4's raises share these seconds
    moved = move_between_bands(  # 3b. and 3c.
        tree,
        state,
        s,
        node_power,
        cuts.node_pred,
        cuts.pred,
        cuts.lowest,
        pressed,
        ramp_s,
        settings,
    )
    quiet = waiting | moved.shifted | moved.levelled
    uncap(  # 4.
        tree,
        state,
        s,
        node_power,
        cuts.node_pred,
        capping,
        pressed,
        staged,
        quiet,
        moved.level_rise_w,
        ramp_s,
        settings,
    )
    return _decision(tree, s, node_power, capping, cuts, moved, dt_s, settings)  # 5. and 6.


def _stage(s: Sanitised, dt_s: float, settings: PolicySettings) -> np.ndarray:
    """Rule 2, in place on ``s.cap``: a controllable GPU in a staged phase has its cap
    lowered to ``max(stage_cap, power + headroom, floor)`` (the headroom:
    ``policies.rules.stage_headroom_w``). Returns the staged GPUs."""
    staged = staged_gpus(s)
    if staged.any():
        i = np.flatnonzero(staged)
        span = s.cap_max[i] - s.cap_min[i]
        stage_cap = np.maximum(s.cap_min[i] + settings.startup_cap_fraction * span, s.floor[i])
        np.maximum(stage_cap, s.power[i] + stage_headroom_w(span, dt_s, settings), out=stage_cap)
        s.cap[i] = np.minimum(s.cap[i], stage_cap)
    return staged


@dataclass(frozen=True)
class _Cuts:
    """What rule 3 left: predicted power per GPU and per node (updated in place by the
    rules after it), how low rules 3, 3b and 3c may cut each GPU, and what was cut."""

    pred: np.ndarray  # (n_gpus,)
    node_pred: np.ndarray  # (n_nodes,)
    lowest: np.ndarray  # (n_gpus,)
    node_cut_w: np.ndarray  # (n_nodes,) watts each node itself took
    levels: np.ndarray  # (n_gpus,) uint8: bit ``level`` set if that level cut the GPU


def _predicted(tree: Tree, s: Sanitised) -> tuple[np.ndarray, np.ndarray]:
    """Predicted power per GPU (``min(power, cap)``; uncontrollable: ``power``) and per node."""
    pred = np.minimum(s.power, s.cap)
    if not s.ctl.all():
        pred[~s.ctl] = s.power[~s.ctl]
    return pred, tree.node_sum(pred) + tree.overhead_below_w


def _cap_bottom_up(
    tree: Tree,
    state: ClusterState,
    s: Sanitised,
    node_power: np.ndarray,
    capping: np.ndarray,
    pressed: np.ndarray,
    waiting: np.ndarray,
    dt_s: float,
    settings: PolicySettings,
) -> _Cuts:
    """Rule 3, in place on ``s.cap``: every node above its capping threshold, servers
    first, takes what brings its predicted power to its capping target."""
    cap, floor, priority, ctl = s.cap, s.floor, s.priority, s.ctl
    n_nodes = tree.n_nodes
    pred, node_pred = _predicted(tree, s)
    node_cut = np.zeros(n_nodes)
    cut_levels = np.zeros(tree.n_gpus, dtype=np.uint8)
    lowest = floor  # how low rules 3 and 3b may cut: only worked out when one may
    moves_between = settings.priority_shift or settings.level_within_class
    if capping.any() or (moves_between and pressed.any()):
        fall_w = settings.cut_fall_w_per_s * dt_s
        lowest = _lowest_cut(tree, node_power, pred, floor, fall_w, waiting)
    in_turn = None  # rule 3 in turn: how low each GPU may be cut before the others give
    class_gpus: list[np.ndarray] = []
    if state.cut_turn is not None and capping.any():
        span = s.cap_max - s.cap_min
        in_turn = _lowest_in_turn(tree, node_power, pred, lowest, span, state.cut_turn, settings)
        class_gpus = [ctl & (priority == p) for p in range(LOW, HIGH + 1)]
        class_gpus = [mine for mine in class_gpus if mine.any()]
    for lvl in LEVELS_BOTTOM_UP:
        nodes = tree.level_nodes[lvl]
        over = nodes[capping[nodes]]
        if not len(over):
            continue
        need = np.zeros(n_nodes)
        need[over] = node_pred[over] - tree.cap_target_w[over]
        if not np.any(need[over] > NEGLIGIBLE_W):
            continue
        if in_turn is None:
            idx, taken = cut(tree, lvl, need, pred, cap, node_pred, lowest, priority, ctl)
            cut_levels[idx] |= np.uint8(1 << lvl)
            node_cut[nodes] += taken[nodes]
            continue
        # in turn: class by class (LOW first), its GPUs in turn; a class with watts left
        # out of turn holds the rest of a budget's need back for later turns (the classes
        # above it give nothing first); under a node over its limit, every GPU is in turn
        for mine in class_gpus:
            idx, taken = cut(tree, lvl, need, pred, cap, node_pred, in_turn, priority, mine)
            cut_levels[idx] |= np.uint8(1 << lvl)
            node_cut[nodes] += taken[nodes]
            need[over] -= taken[over]
            need[need <= NEGLIGIBLE_W] = 0.0
            if not need[over].any():
                break
            left = tree.node_sum(np.where(mine, np.maximum(pred - lowest, 0.0), 0.0))
            need[over[left[over] > NEGLIGIBLE_W]] = 0.0
    return _Cuts(pred, node_pred, lowest, node_cut, cut_levels)


def _lowest_cut(
    tree: Tree,
    node_power: np.ndarray,
    pred: np.ndarray,
    floor: np.ndarray,
    fall_w: float,
    waiting: np.ndarray,
) -> np.ndarray:
    """How low rules 3, 3b and 3c may cut each GPU this cycle: its floor; with a finite
    ``fall_w`` (``cut_fall_w_per_s × dt_s``), also no lower than ``pred - fall_w``, and a
    ``waiting`` GPU no lower than ``pred`` (it falls on its own), unless a node over it
    (its server included) draws above its limit."""
    if not np.isfinite(fall_w):
        return floor
    urgent = under_a_passed_limit(tree, node_power)
    glide = np.maximum(floor, pred - np.where(waiting, 0.0, fall_w))
    lowest: np.ndarray = np.where(urgent, floor, glide)
    return lowest


def _lowest_in_turn(
    tree: Tree,
    node_power: np.ndarray,
    pred: np.ndarray,
    lowest: np.ndarray,
    span: np.ndarray,
    cut_turn: np.ndarray,
    settings: PolicySettings,
) -> np.ndarray:
    """How low rule 3 may cut each GPU before the GPUs out of turn give (rule 3, "in
    turn"): under a node over its limit, ``lowest``; else in turn, no more than
    ``cut_turn_max_fraction`` of its range under what it draws; out of turn, nothing."""
    urgent = under_a_passed_limit(tree, node_power)
    step = np.where(np.asarray(cut_turn, dtype=bool), settings.cut_turn_max_fraction * span, 0.0)
    out: np.ndarray = np.where(urgent, lowest, np.maximum(lowest, pred - step))
    return out


def _decision(
    tree: Tree,
    s: Sanitised,
    node_power: np.ndarray,
    capping: np.ndarray,
    cuts: _Cuts,
    moved: BetweenBands,
    dt_s: float,
    settings: PolicySettings,
) -> Decision:
    """The cycle's caps, what they predict, and rules 5 (clocks) and 6 (the floor's cost)."""
    _, node_predicted = _predicted(tree, s)
    clock, floor_energy = clocks_and_floor(tree, s.power, s.phase, s.ctl, dt_s, settings)
    return Decision(
        cap_w=s.cap,
        max_sm_clock_mhz=clock,
        node_power_w=node_power,
        node_predicted_w=node_predicted,
        node_capping=capping,
        floor_hold_energy_j=floor_energy,
        node_cut_w=cuts.node_cut_w,
        cut_levels=cuts.levels,
        node_shift_w=moved.node_shift_w,
        shifted=moved.shifted,
        levelled=moved.levelled,
    )
