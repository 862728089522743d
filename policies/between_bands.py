"""Rules 3b and 3c of the bands (``policies.capping``): what moves under a node between its
bands, neither capping nor handing back. Both run after rule 3's cuts and before rule 4,
bottom-up, on the caps and predicted power rule 3 left, and never cut below how low rule 3
may cut a GPU this cycle (``lowest``: its floor; ``cut_fall_w_per_s``).

3b. **Priority shift, between the bands** (``priority_shift``). A GPU is *held*
   when it is controllable, not staged, not waiting, below ``cap_max``, not cut
   this cycle, and draws within ``stage_headroom_fraction`` of its range below
   its cap: it wants more than it may have. Bottom-up, a node known to be between
   its (finite) bands (see below) under which a GPU of class ``p`` is held (counting only GPUs
   no node between them blocks, i.e. every one is below its uncapping
   threshold) takes, from the classes below ``p`` only and in rule 3's order,
   ``min(predicted - uncap_threshold_w + margin, gaps of the held GPUs of class
   p less what the levels below took for them, what the lower classes hold
   above their floors)``. The node drops just under its uncapping threshold, so
   next cycle rule 4 hands watts back, to ``p`` first. Without it a high-priority
   job leaving a checkpoint (staged caps) while a low-priority job filled the
   room would stay at its staged caps indefinitely: the node is neither above
   its threshold (capping) nor below its uncapping threshold (uncapping).
   A node is *known* to be between its bands only while the power it counts for
   GPUs the controller does not hear (``ClusterState.heard``: silent, offline or
   implausible, at the caps they may hold) is at most ``GUESSED_BAND_SHARE``
   (a quarter) of its band, ``cap_threshold_w - uncap_threshold_w``; rules 3b
   and 3c act only under such nodes. Beyond it, the guess is what puts the node
   there: heard again, at what they draw, it is below its uncapping threshold,
   rule 4 hands the moved watts back, and the next guess moves them again (found
   by ``bench_scale --jobs 2`` on a machine that lost half the controller's
   telemetry: three quarters of ~2,000 cuts a second were such moves). Rule 4's
   hand-back between the bands is not bound by it: counting the unheard at their
   caps leaves a node less room, never more, and it cuts nobody.
3c. **Levelling within a class, between the bands** (``level_within_class``).
   Bottom-up, under a node known to be between its (finite) bands, the GPUs of one class
   held at their caps (rule 3b's test; not cut or shifted this cycle, and
   counting only GPUs no node between them blocks) move towards one level: the
   same share ``tau`` of each GPU's range, ``cap_min + tau * (cap_max -
   cap_min)``, with ``tau`` such that their caps keep their sum. A GPU within
   ``max(uncap_min_step_w, 1 % of its range)`` of its level does not move; the
   others move by ``max(uncap_step_fraction * distance, uncap_min_step_w)``,
   at most the distance, a donor never below how low rule 3 may cut it (its
   floor; ``cut_fall_w_per_s``). What the receivers gain (and will draw:
   they are held) is at most what the donors' predicted power loses, so the
   levelling node's predicted power does not rise; and at most the room of
   every node between them and the levelling node (``cap_target_w``,
   ``limit_w`` with every GPU at its cap, and ``ramp_w_per_s * ramp_s``, which
   rule 4 then has that much less of). A GPU moves at most once a cycle: one
   levelled does not ask in rule 4 that cycle. Why:
   capping water-fills from the top and uncapping hands back in proportion
   to each gap, but between the bands nothing moves, so caps set when a
   node's GPUs were seen at different times stay unequal for as long as the
   node stays there. A synchronous job runs at its slowest GPU's pace, so
   watts on its other GPUs are wasted (found by the failover test under load:
   a new leader's first cycle heard one node late, counted it at its failsafe
   cap and cut its rack sibling for it; the two nodes of one rack stayed at
   508 W and 342 W caps).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.rules import (
    LEVELS_BOTTOM_UP,
    N_PRIORITIES,
    NEGLIGIBLE_W,
    Sanitised,
    ratio,
)
from policies.settings import PolicySettings
from policies.take import cut
from policies.tree import HIGH, LOW, SERVER, ClusterState, Tree, ramp_allowance_w

# Rules 3b and 3c move watts under a node between its bands only while the power it counts
# for GPUs it did not hear (silent, offline or implausible: at the caps they may hold) is at
# most this share of its band (cap_threshold_w - uncap_threshold_w). Beyond it, where the
# node stands between its bands is the guess's: hearing them again (at what they draw)
# puts it below, rule 4 hands the watts back, and the next guess shifts them again (found by
# bench_scale with two 10,368-node jobs on a 2-vCPU machine that lost half the telemetry: of
# ~2,000 cuts a second, three quarters were such shifts and levellings, each undone).
GUESSED_BAND_SHARE = 0.25


@dataclass(frozen=True)
class BetweenBands:
    """What rules 3b and 3c did this cycle."""

    node_shift_w: np.ndarray  # (n_nodes,) watts each node took for a higher class (3b)
    shifted: np.ndarray  # (n_gpus,) bool: cut by rule 3b
    levelled: np.ndarray  # (n_gpus,) bool: caps moved by rule 3c
    level_rise_w: np.ndarray  # (n_nodes,) how much rule 3c raised the caps under each node


def move_between_bands(
    tree: Tree,
    state: ClusterState,
    s: Sanitised,
    node_power: np.ndarray,
    node_pred: np.ndarray,
    pred: np.ndarray,
    lowest: np.ndarray,
    pressed: np.ndarray,
    ramp_s: float,
    settings: PolicySettings,
) -> BetweenBands:
    """Rules 3b then 3c, in place on ``s.cap``, ``pred`` and ``node_pred``, for the GPUs
    ``pressed`` (held at their caps, not staged, waiting or cut this cycle)."""
    n_nodes, n_gpus = tree.n_nodes, tree.n_gpus
    moves_between = settings.priority_shift or settings.level_within_class
    # what each node counts for GPUs it did not hear (3b and 3c), worked out only if needed
    node_guessed_w = np.zeros(n_nodes)
    if state.heard is not None and moves_between and pressed.any():
        unheard = ~np.asarray(state.heard, dtype=bool)
        node_guessed_w = tree.node_sum(np.where(unheard, s.power, 0.0))
    node_shift = np.zeros(n_nodes)
    shifted = np.zeros(n_gpus, dtype=bool)
    if settings.priority_shift and pressed.any():
        _shift(
            tree,
            node_power,
            node_guessed_w,
            node_pred,
            node_shift,
            shifted,
            s.cap,
            pred,
            lowest,
            s.cap_max,
            s.priority,
            s.ctl,
            pressed,
        )
    levelled = np.zeros(n_gpus, dtype=bool)
    level_rise = np.zeros(n_nodes)
    if settings.level_within_class and pressed.any():
        levelled, level_rise = _level(
            tree,
            node_power,
            node_guessed_w,
            node_pred,
            s.cap,
            pred,
            s.power,
            lowest,
            s.cap_min,
            s.cap_max,
            s.priority,
            s.ctl,
            pressed & ~shifted,
            ramp_s,
            settings,
        )
    return BetweenBands(node_shift, shifted, levelled, level_rise)


def _shift(
    tree: Tree,
    node_power: np.ndarray,
    guessed_w: np.ndarray,
    node_pred: np.ndarray,
    node_shift: np.ndarray,
    shifted: np.ndarray,
    cap: np.ndarray,
    pred: np.ndarray,
    floor: np.ndarray,
    cap_max: np.ndarray,
    priority: np.ndarray,
    ctl: np.ndarray,
    pressed: np.ndarray,
) -> None:
    """Rule 3b, in place: bottom-up, a node between its bands under which a GPU of class p
    is held at its cap takes from the classes below p (LOW first, water-filled, never below
    a floor) what brings it just under its uncapping threshold, at most the held GPUs'
    gaps less what the levels below already took for them. ``pred``/``cap`` of the cut
    GPUs, ``node_pred``, ``node_shift`` and ``shifted`` are updated."""
    n_nodes = len(node_pred)
    between = _between_bands(tree, node_power, guessed_w)
    p_idx = np.flatnonzero(pressed)
    taken_below = np.zeros(n_nodes)
    # a held GPU counts for a node only if no node between them blocks its uncapping
    # (every one is below its uncapping threshold): otherwise that node shifts first
    below = node_power < tree.uncap_threshold_w
    clear = np.ones(len(p_idx), dtype=bool)
    for lvl in LEVELS_BOTTOM_UP:
        nodes = tree.level_nodes[lvl]
        group = tree.gpu_ancestor[lvl]
        if lvl != SERVER:
            clear &= below[tree.gpu_ancestor[lvl + 1][p_idx]]
        held = p_idx[clear]
        # the highest class held at its cap under each node, and the gaps of that class
        top = np.full(n_nodes, -1)
        for prio in range(LOW, HIGH + 1):  # ascending: the highest class present wins
            top[group[held[priority[held] == prio]]] = prio
        in_top = held[priority[held] == top[group[held]]]
        gaps = np.bincount(group[in_top], weights=cap_max[in_top] - cap[in_top], minlength=n_nodes)
        # what the classes below it can give
        donor = ctl & (pred > floor) & (priority < top[group])
        spare = np.bincount(group[donor], weights=pred[donor] - floor[donor], minlength=n_nodes)
        need = np.zeros(n_nodes)
        want = nodes[between[nodes] & (top[nodes] > LOW)]
        if not len(want):
            continue
        margin = np.maximum(1.0, 1e-3 * np.abs(tree.uncap_threshold_w[want]))
        need[want] = np.minimum.reduce(
            [
                node_pred[want] - tree.uncap_threshold_w[want] + margin,
                gaps[want] - taken_below[want],
                spare[want],
            ]
        )
        need[~np.isfinite(need)] = 0.0
        if not np.any(need[want] > NEGLIGIBLE_W):
            continue
        need[need <= NEGLIGIBLE_W] = 0.0
        idx, taken = cut(tree, lvl, need, pred, cap, node_pred, floor, priority, ctl)
        shifted[idx] = True
        node_shift[nodes] += taken[nodes]
        taken_below += taken


def _between_bands(tree: Tree, node_power: np.ndarray, guessed_w: np.ndarray) -> np.ndarray:
    """(n_nodes,) bool: neither capping nor handing back, and known to be: the power counted
    for its unheard GPUs (``guessed_w``) is at most ``GUESSED_BAND_SHARE`` of its band. A
    node that never uncaps (a non-finite uncapping threshold) is not: a shift or a
    levelling cannot unblock it."""
    between: np.ndarray = (node_power <= tree.cap_threshold_w) & (
        node_power >= tree.uncap_threshold_w
    )
    between &= np.isfinite(tree.uncap_threshold_w)
    with np.errstate(invalid="ignore"):  # inf - inf: not between anyway
        band_w = tree.cap_threshold_w - tree.uncap_threshold_w
        between &= guessed_w <= GUESSED_BAND_SHARE * band_w
    return between


# Rule 3c: a GPU this close to its class's level (a share of its range) does not move,
# whatever uncap_min_step_w is, so levelling settles instead of trading watts for ever.
LEVEL_TOLERANCE_FRACTION = 0.01


def _level(
    tree: Tree,
    node_power: np.ndarray,
    guessed_w: np.ndarray,
    node_pred: np.ndarray,
    cap: np.ndarray,
    pred: np.ndarray,
    power: np.ndarray,
    lowest: np.ndarray,
    cap_min: np.ndarray,
    cap_max: np.ndarray,
    priority: np.ndarray,
    ctl: np.ndarray,
    held: np.ndarray,
    ramp_s: float,
    settings: PolicySettings,
) -> tuple[np.ndarray, np.ndarray]:
    """Rule 3c, in place on ``cap``, ``pred`` and ``node_pred``: bottom-up, under every node
    between its bands, the ``held`` GPUs of each class move towards one share of their
    ranges (see the module docstring). Returns the GPUs whose caps it moved, and per tree
    node how much the sum of the caps under it rose (what rule 4's ramp has left less)."""
    n_nodes, n_gpus = tree.n_nodes, tree.n_gpus
    risen = np.zeros(n_nodes)  # how much the sum of the caps under each node has risen
    # the sum of the caps under each node (uncontrollable GPUs at their draw) plus its
    # overheads, kept up to date once a level above the servers first needs it
    cap_sum: np.ndarray | None = None
    between = _between_bands(tree, node_power, guessed_w)
    below = node_power < tree.uncap_threshold_w
    span = cap_max - cap_min
    step_min = settings.uncap_min_step_w
    h_idx = np.flatnonzero(held)
    clear = np.ones(len(h_idx), dtype=bool)  # no node between it and this level blocks it
    moved = np.zeros(n_gpus, dtype=bool)
    for lvl in LEVELS_BOTTOM_UP:
        if lvl != SERVER:
            clear &= below[tree.gpu_ancestor[lvl + 1][h_idx]]
        if not between[tree.level_nodes[lvl]].any():
            continue
        group = tree.gpu_ancestor[lvl]
        g = h_idx[clear & ~moved[h_idx]]
        g = g[between[group[g]]]
        if len(g) < 2:
            continue
        share = (cap[g] - cap_min[g]) / np.maximum(span[g], NEGLIGIBLE_W)
        if share.max() - share.min() <= LEVEL_TOLERANCE_FRACTION:
            continue  # no GPU can be further than that from its class's level: all settled
        seg = group[g] * N_PRIORITIES + priority[g]  # (node, class); dense: no sort
        n_seg = n_nodes * N_PRIORITIES
        sum_cap = np.bincount(seg, weights=cap[g] - cap_min[g], minlength=n_seg)
        tau = ratio(sum_cap, np.bincount(seg, weights=span[g], minlength=n_seg))
        distance = cap_min[g] + tau[seg] * span[g] - cap[g]
        far = np.abs(distance) > np.maximum(step_min, LEVEL_TOLERANCE_FRACTION * span[g])
        if not far.any():
            continue
        step = np.minimum(
            np.abs(distance), np.maximum(settings.uncap_step_fraction * np.abs(distance), step_min)
        )
        step[~far] = 0.0
        up = np.where(distance > 0, np.minimum(step, cap_max[g] - cap[g]), 0.0)
        down = np.where(distance < 0, np.clip(np.minimum(step, cap[g] - lowest[g]), 0.0, None), 0.0)
        if lvl != SERVER:  # every node between a receiver and this level has room for it
            if cap_sum is None:
                cap_sum = tree.node_sum(np.where(ctl, cap, power)) + tree.overhead_below_w
            room = np.minimum.reduce(
                [
                    tree.cap_target_w - node_pred,
                    tree.limit_w - cap_sum,
                    ramp_allowance_w(tree.ramp_w_per_s, ramp_s) - np.maximum(risen, 0.0),
                ]
            )
            room = np.nan_to_num(np.maximum(room, 0.0), nan=0.0)
            for inner in range(lvl + 1, SERVER + 1):
                node = tree.gpu_ancestor[inner][g]
                gain = np.bincount(node, weights=up, minlength=n_nodes)
                up *= ratio(room[node], gain[node])
        # donors give no more than receivers can take; receivers take no more than the
        # donors' predicted power loses (a donor drawing below its cap loses less)
        gained = np.bincount(seg, weights=up, minlength=n_seg)
        down *= ratio(gained, np.bincount(seg, weights=down, minlength=n_seg))[seg]
        relief = np.maximum(pred[g] - (cap[g] - down), 0.0)
        up *= ratio(np.bincount(seg, weights=relief, minlength=n_seg), gained)[seg]
        changed = (up > 0) | (down > 0)
        if not changed.any():
            continue
        g, up, down = g[changed], up[changed], down[changed]
        cap[g] += up - down
        # a receiver is held at its cap: it will draw what it gained
        new_pred = np.minimum(pred[g], cap[g]) + up
        node_pred += _sum_up(tree, g, new_pred - pred[g])
        pred[g] = new_pred
        cap_change = _sum_up(tree, g, up - down)
        risen += cap_change
        if cap_sum is not None:
            cap_sum += cap_change
        moved[g] = True
    return moved, np.maximum(risen, 0.0)


def _sum_up(tree: Tree, gpus: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(n_nodes,) ``values`` of a few ``gpus`` summed under every tree node."""
    server = tree.gpu_ancestor[SERVER][gpus]
    return tree.fold_up(np.bincount(server, weights=values, minlength=tree.n_nodes))
