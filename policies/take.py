"""Taking watts under nodes: what rules 3 and 3b of ``policies.capping`` cut, and how.

A node of one level that needs ``need[node]`` watts takes them from the controllable GPUs
under it that are above their floors (a per-GPU ``floor``, how low this cycle may cut
each), each able to give ``spare = pred - floor``: all of LOW first, then NORMAL, then
HIGH, and inside the class that gives the last watts high-bucket-first, by water-filling:
every GPU above a level ``L`` comes down to ``L`` where ``sum(max(spare - L, 0))`` is what
the class gives. A cut GPU's cap becomes its new predicted power (``floor`` plus what it
kept), and every node's predicted power loses what was taken under it. All nodes of a
level are served at once, vectorised; a need below ``NEGLIGIBLE_W`` is rounding, no cut.
"""

from __future__ import annotations

import numpy as np

from policies.rules import N_PRIORITIES, NEGLIGIBLE_W, ratio
from policies.tree import Tree


def cut(
    tree: Tree,
    lvl: int,
    need: np.ndarray,
    pred: np.ndarray,
    cap: np.ndarray,
    node_pred: np.ndarray,
    floor: np.ndarray,
    priority: np.ndarray,
    ctl: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Take ``need[node]`` under the nodes of level ``lvl`` (:func:`_take`) and apply it in
    place: the cut GPUs' predicted power and caps come down to what they keep, and every
    node's predicted power loses what was taken under it. Returns the GPUs cut and, per
    tree node, the watts taken under it (for the level's nodes: what each took)."""
    idx, spare, spare_after, took = _take(need, tree.gpu_ancestor[lvl], pred, floor, priority, ctl)
    was_cut = spare_after < spare
    idx = idx[was_cut]
    pred[idx] = floor[idx] + spare_after[was_cut]
    cap[idx] = np.minimum(cap[idx], pred[idx])
    taken = tree.fold_up(took)  # in place: the level's own values stay, ancestors gain
    node_pred -= taken  # ancestors (and the nodes) lose what was taken
    return idx, taken


def _take(
    need: np.ndarray,
    group: np.ndarray,
    pred: np.ndarray,
    floor: np.ndarray,
    priority: np.ndarray,
    ctl: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Take ``need[node]`` watts under every node of one level at once.

    Returns the GPUs that can give (controllable, above their floor, under a
    node that needs watts), what each had and has left above its floor, and
    the watts each node took. Priority classes are emptied in order (LOW,
    NORMAL, HIGH); the class that gives the last watts is water-filled.
    """
    needy = np.flatnonzero(need > 0)
    sel = need[group] > 0
    sel &= ctl
    sel &= pred > floor
    idx = np.flatnonzero(sel)
    spare = pred[idx]
    spare -= floor[idx]  # what each can give
    seg = group[idx]
    seg *= N_PRIORITIES
    seg += priority[idx]  # (node, class) segments
    n_seg = len(need) * N_PRIORITIES
    have = np.bincount(seg, weights=spare, minlength=n_seg).astype(float, copy=False)
    have = have.reshape(-1, N_PRIORITIES)[needy]
    before = np.cumsum(have, axis=1)
    before -= have  # what the classes taken earlier hold
    needy_take = np.clip(need[needy, None] - before, 0.0, have)
    needy_take[needy_take <= NEGLIGIBLE_W] = 0.0  # rounding left by an earlier class: no cut
    node_took = np.zeros(len(need))
    node_took[needy] = needy_take.sum(axis=1)
    take_by_class = np.zeros((len(need), N_PRIORITIES))
    take_by_class[needy] = needy_take
    take = take_by_class.ravel()
    full_class = np.zeros((len(need), N_PRIORITIES), dtype=bool)
    full_class[needy] = (needy_take >= have) & (have > 0)
    seg_take = take[seg]
    full = full_class.ravel()[seg]  # the whole class goes to its floor
    spare_after = spare.copy()
    spare_after[full] = 0.0
    part = seg_take > 0
    part &= ~full
    n_part = np.count_nonzero(part)
    if 0 < n_part == len(idx):  # every GPU is water-filled (one class per node): no gathers
        spare_after = _water_fill(spare, seg, take)
    elif n_part:
        part = np.flatnonzero(part)
        spare_after[part] = _water_fill(spare[part], seg[part], take)
    return idx, spare, spare_after, node_took


def _water_fill(spare: np.ndarray, seg: np.ndarray, take: np.ndarray) -> np.ndarray:
    """``min(spare, L)``, with per segment the level ``L``: ``sum(max(spare - L, 0)) == take[seg]``.

    One sort by (segment, spare descending) of an int64 key: the segment id in
    the high bits, the spare's float bits below it (positive floats order like
    their bit patterns; the dropped low bits only matter for near-ties, which
    the correction step absorbs). Segments are then contiguous runs, and every
    per-segment sum is an ``np.add.reduceat``. In a segment with sorted spares
    ``s_1 >= s_2 >= ...`` and running sums ``C_j``, cutting down to ``s_j``
    removes ``D_j = C_j - j s_j`` (non-decreasing in j). With ``k`` the number
    of positions with ``D_j < take``, the level is ``(C_k - take) / k``, which
    lies in ``[s_{k+1}, s_k]``. A final Newton step on the piecewise linear
    ``sum(max(spare - L, 0))`` makes the sum exact to rounding.
    """
    n = len(spare)
    seg_bits = max(1, int(seg.max()).bit_length())
    low_bits = 63 - seg_bits
    key = spare.view(np.int64) >> seg_bits  # spare > 0: order-preserving
    np.subtract(np.int64((1 << low_bits) - 1), key, out=key)  # descending spare
    key |= seg << low_bits
    order = np.argsort(key, kind="stable")  # stable sort: fast (runs) when GPUs come grouped
    del key
    s = spare[order]
    s_seg = seg[order]
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(s_seg[1:], s_seg[:-1], out=first[1:])
    start = np.flatnonzero(first)
    count = np.diff(np.append(start, n))
    seg_take = take[s_seg[start]]
    del s_seg, first
    running = np.cumsum(s)
    running -= np.repeat(running[start] - s[start], count)  # running sum inside each segment
    work = np.arange(1.0, n + 1.0)
    work -= np.repeat(start.astype(float), count)  # position j inside the segment
    work *= s
    np.subtract(running, work, out=work)  # D_j
    short = work < np.repeat(seg_take, count)
    k = np.maximum(np.add.reduceat(short, start, dtype=np.intp), 1)  # k >= 1 (D_1 = 0 < take)
    level = (running[start + k - 1] - seg_take) / k
    # Newton step: absorbs rounding and near-tie misordering
    np.subtract(s, np.repeat(level, count), out=work)
    above = work > 0
    np.maximum(work, 0.0, out=work)
    removed = np.add.reduceat(work, start)
    n_above = np.add.reduceat(above, start, dtype=np.intp)
    level += ratio(removed - seg_take, n_above, cap=False)
    np.maximum(level, 0.0, out=level)
    np.minimum(s, np.repeat(level, count), out=work)
    out = np.empty(n)
    out[order] = work
    return out
