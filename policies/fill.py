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
G_c(theta))``, monotone in ``theta``; each level's nodes are solved together by
bisection (``ITERATIONS`` halvings of the level's interval, the lower, feasible end
kept), so the cost is a few dozen passes over the GPUs per level that has a full node.
"""

from __future__ import annotations

import numpy as np

from policies.tree import RACK, ROW, SERVER, SITE, Tree

# Halvings of each level's search interval: 2**-24 of a GPU's range is far below a watt.
ITERATIONS = 24


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


def fill(
    tree: Tree,
    offset: np.ndarray,
    slope: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    room: np.ndarray,
    iterations: int = ITERATIONS,
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
    bottom = float(np.min(((low - offset) / slope)[free]))  # every GPU at its low
    top = float(np.max(((high - offset) / slope)[free]))  # every GPU at its high
    theta_node = np.full(tree.n_nodes, top)
    idx = np.flatnonzero(free)  # only the free GPUs move: the others' sums are fixed
    server_of = tree.gpu_ancestor[SERVER][idx]
    fixed = np.bincount(
        tree.gpu_ancestor[SERVER], weights=np.where(free, 0.0, low), minlength=tree.n_nodes
    )
    off_f, slope_f, low_f, high_f = offset[idx], slope[idx], low[idx], high[idx]

    def level_sums(theta_gpu: np.ndarray, lvl: int, nodes: np.ndarray) -> np.ndarray:
        xs = np.clip(off_f + theta_gpu * slope_f, low_f, high_f)
        total = fixed + np.bincount(server_of, weights=xs, minlength=tree.n_nodes)
        sums: np.ndarray = _nest(tree, total, room, lvl)[nodes]
        return sums

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
        s_hi = level_sums(hi[of_gpu], lvl, nodes)
        over = s_hi > need
        if not over.any():
            continue
        lo = np.where(over, bottom, hi)
        s_lo = np.where(over, -np.inf, s_hi)  # not yet known: the bottom may not fit
        for _ in range(iterations):
            mid = np.where(over, 0.5 * (lo + hi), hi)
            s_mid = level_sums(mid[of_gpu], lvl, nodes)
            fits = s_mid <= need
            lo, s_lo = np.where(over & fits, mid, lo), np.where(over & fits, s_mid, s_lo)
            hi, s_hi = np.where(over & ~fits, mid, hi), np.where(over & ~fits, s_mid, s_hi)
        # the sums are piecewise linear in theta: one secant step closes the last gap
        with np.errstate(invalid="ignore", divide="ignore"):
            share = (need - s_lo) / (s_hi - s_lo)
        known = over & np.isfinite(share) & (share > 0)
        if known.any():
            guess = np.where(known, lo + np.clip(share, 0.0, 1.0) * (hi - lo), lo)
            fits = level_sums(guess[of_gpu], lvl, nodes) <= need
            lo = np.where(known & fits, guess, lo)
        theta_node[nodes] = np.where(over, lo, hi)
    x[idx] = np.clip(off_f + theta_node[server_of] * slope_f, low_f, high_f)
    return x
