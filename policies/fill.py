"""Water-filling under a tree of limits: the one allocation solver of powerd (pure).

``fill(tree, offset, slope, low, high, room)`` gives each GPU ``x = clip(offset +
theta * slope, low, high)``, where ``theta`` is a level per tree node: the site's is
the largest at which everything under it fits its room, every other node's the
largest, at most its parent's, at which everything under it fits its own. Every
node's sum of ``x`` under it is then within ``room`` (where its GPUs' ``low`` fits at
all), and no GPU can get more without another under a full node getting less.

Two uses, one solver:

- the controller's caps (``policies.allocation``): ``offset = cap_min``, ``slope =
  cap_max - cap_min``: max-min fair on the share of each GPU's range (equal caps for
  GPUs of one model), each up to what it wants;
- the planner's oracle (``planner.oracle``): ``offset = 0``, ``slope = d **
  (-a / (1 - a))`` for demand ``d`` and speed law ``(x / d) ** a``: the optimum of
  ``sum (x / d) ** a`` under the limits (the KKT point: the marginal speed per watt
  is equal for every GPU not at a bound under the same full nodes).

A laminar family of limits (each node's GPUs are its children's) makes the greedy
top-down levels exact: the most a subtree can take at a level, every node in it at
its own best level, is the nested sum ``G_n(theta) = min(room_n, sum_children
G_c(theta))``, monotone and piecewise linear in ``theta``; each level's nodes are
solved together (``_search``: regula falsi, the lower, fitting end kept), each step a
pass over the GPUs under the nodes searched, about ten steps per level that has a full
node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from policies.tree import RACK, ROW, SERVER, SITE, Tree

# The most evaluations of a level's search (Illinois regula falsi, every third step a
# halving): it ends sooner where every node's sum is within TOLERANCE_W of its room.
ITERATIONS = 60
TOLERANCE_W = 1e-3


def nested_sum(tree: Tree, x: np.ndarray, room: np.ndarray, down_to: int) -> np.ndarray:
    """(n_nodes,) the sum of ``x`` under every node, each node below level ``down_to``
    counting at most its ``room`` (the nodes of level ``down_to`` and above: plain)."""
    total = np.bincount(tree.gpu_ancestor[SERVER], weights=x, minlength=tree.n_nodes)
    return _nest(tree, total.astype(float, copy=False), room, down_to)


def _nest(tree: Tree, total: np.ndarray, room: np.ndarray, down_to: int) -> np.ndarray:
    """``nested_sum`` from the servers' own sums (``total``, changed in place)."""
    for lvl in (SERVER, RACK, ROW):
        if lvl <= down_to:
            break
        nodes = tree.level_nodes[lvl]
        if not len(nodes):
            continue
        total[nodes] = np.minimum(total[nodes], room[nodes])
        total += np.bincount(tree.level_parent[lvl], weights=total[nodes], minlength=tree.n_nodes)
    return total


@dataclass(frozen=True)
class _LevelSums:
    """The sums under one level's nodes for a level per node: only the GPUs under the
    nodes searched (``sub``; ``sub_of``: their node's place) move, the rest is ``base``."""

    tree: Tree
    room: np.ndarray
    lvl: int
    nodes: np.ndarray
    base: np.ndarray
    sub: np.ndarray
    sub_of: np.ndarray
    server_sums: Callable[[np.ndarray, np.ndarray], np.ndarray]

    def __call__(self, theta: np.ndarray) -> np.ndarray:
        total = self.base + self.server_sums(theta[self.sub_of], self.sub)
        sums: np.ndarray = _nest(self.tree, total, self.room, self.lvl)[self.nodes]
        return sums


def _search(
    level_sums: Callable[[np.ndarray], np.ndarray],
    over: np.ndarray,
    bottom: float,
    hi: np.ndarray,
    s_hi: np.ndarray,
    need: np.ndarray,
) -> np.ndarray:
    """Per node the largest level at most ``hi`` whose sum fits ``need`` (``over``: the
    nodes whose ``hi`` does not; the others keep it). The sums are monotone and piecewise
    linear in the level, so regula falsi (Illinois: a side kept twice has its value
    halved) converges in a few steps; every third step halves the bracket, so a kinked
    stretch never stalls it. The lower, fitting end is returned."""
    lo = np.where(over, bottom, hi)
    s_lo = level_sums(lo)
    hi = hi.copy()
    open_ = over & (s_lo <= need)  # a node whose GPUs at their lows do not fit: its lows
    w_lo, w_hi = s_lo - need, s_hi - need  # the regula falsi's values, halved in turn
    side = np.zeros(len(hi), dtype=np.int8)  # which end moved last: -1 low, 1 high
    for step in range(ITERATIONS):
        if not open_.any():
            break
        with np.errstate(invalid="ignore", divide="ignore"):
            share = -w_lo / (w_hi - w_lo)
        share = np.where(np.isfinite(share), np.clip(share, 0.0, 1.0), 0.5)
        if step % 3 == 2:
            share = np.full(len(hi), 0.5)
        mid = np.where(open_, lo + share * (hi - lo), hi)
        s_mid = level_sums(mid)
        fits = open_ & (s_mid <= need)
        over_mid = open_ & ~fits
        lo, s_lo = np.where(fits, mid, lo), np.where(fits, s_mid, s_lo)
        hi = np.where(over_mid, mid, hi)
        w_lo = np.where(fits, s_mid - need, w_lo)
        w_hi = np.where(over_mid, s_mid - need, w_hi)
        w_hi = np.where(fits & (side == -1), 0.5 * w_hi, w_hi)  # the high end kept twice
        w_lo = np.where(over_mid & (side == 1), 0.5 * w_lo, w_lo)  # the low end kept twice
        side = np.where(fits, -1, np.where(over_mid, 1, side)).astype(np.int8)
        open_ &= (need - s_lo > TOLERANCE_W) & (hi > lo)
    return np.where(over, lo, hi)


def fill(
    tree: Tree,
    offset: np.ndarray,
    slope: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    room: np.ndarray,
) -> np.ndarray:
    """Per GPU ``clip(offset + theta * slope, low, high)``, each node's level the largest
    whose subtree fits ``room`` (module docstring). ``slope`` > 0 where ``low < high``;
    a node whose GPUs' ``low`` alone is over its room leaves them at ``low``."""
    low = np.asarray(low, dtype=float)
    high = np.maximum(np.asarray(high, dtype=float), low)
    free = high > low
    x = low.copy()
    if not free.any():
        return x
    offset = np.asarray(offset, dtype=float)
    slope = np.where(free, np.asarray(slope, dtype=float), 1.0)
    if np.any(slope[free] <= 0) or not np.all(np.isfinite(slope[free])):
        raise ValueError("fill: every free GPU's slope must be a positive number")
    room = np.where(np.isnan(room), -np.inf, np.asarray(room, dtype=float))
    if np.all(tree.node_sum(high) <= room):  # every GPU at its high fits: no search
        return high.copy()
    # a GPU under a node already full at the lows stays at its low (no level there can
    # rise): it is not searched (make before break's raises, under caps in force that
    # fill their limits, are mostly such)
    free &= ~tree.gpus_under(tree.node_sum(low) >= room)
    if not free.any():
        return x
    bottom = float(np.min(((low - offset) / slope)[free]))  # every GPU at its low
    top = float(np.max(((high - offset) / slope)[free]))  # every GPU at its high
    theta_node = np.full(tree.n_nodes, top)
    idx = np.flatnonzero(free)  # only the free GPUs move: the others' sums are fixed
    server_of = tree.gpu_ancestor[SERVER][idx]
    fixed = np.bincount(
        tree.gpu_ancestor[SERVER], weights=np.where(free, 0.0, low), minlength=tree.n_nodes
    )
    off_f, slope_f, low_f, high_f = offset[idx], slope[idx], low[idx], high[idx]
    all_free = np.arange(len(idx))

    def server_sums(theta_gpu: np.ndarray, sel: np.ndarray) -> np.ndarray:
        xs = np.clip(off_f[sel] + theta_gpu * slope_f[sel], low_f[sel], high_f[sel])
        return np.bincount(server_of[sel], weights=xs, minlength=tree.n_nodes)

    for lvl in (SITE, ROW, RACK, SERVER):
        nodes = tree.level_nodes[lvl]
        if not len(nodes):
            continue
        if lvl != SITE:
            theta_node[nodes] = theta_node[tree.level_parent[lvl]]
        hi = theta_node[nodes].copy()
        where = np.full(tree.n_nodes, 0, dtype=np.intp)
        where[nodes] = np.arange(len(nodes))
        of_gpu = where[tree.gpu_ancestor[lvl][idx]]
        need = room[nodes]
        s_hi = _nest(tree, fixed + server_sums(hi[of_gpu], all_free), room, lvl)[nodes]
        over = s_hi > need
        if not over.any():
            continue
        # only the GPUs under the nodes over their room move in the search: the others
        # stay at their level's top, a constant part of every sum
        moving = over[of_gpu]
        still = np.flatnonzero(~moving)
        base_sums = fixed + server_sums(hi[of_gpu[still]], still)
        sub, sub_of = np.flatnonzero(moving), of_gpu[moving]

        level_sums = _LevelSums(tree, room, lvl, nodes, base_sums, sub, sub_of, server_sums)

        theta_node[nodes] = _search(level_sums, over, bottom, hi, s_hi, need)
    x[idx] = np.clip(off_f + theta_node[server_of] * slope_f, low_f, high_f)
    return x
