"""Turns: the nodes a cycle decides for when more want a command than one cycle may send.

A controller sends at most ``max_raises`` commands a cycle that only hand watts back
(cuts for a breaker go at once, whatever their number). Deciding as if every node could
be served would give each node in its turn one cycle's step (ten commands or more for a
node to climb back from a staged start), and a glide cut every cycle would reach every
node of a site. So the decision itself takes turns, whole racks round robin (a rack's
breaker is shared: its nodes take it together; racks interleaved a row at a time, so a
turn spreads over the rows):

1. **Watts handed back in turn** (``uncap_in_turn``, the bands only): when more nodes than
   ``UNCAP_TURN_SHARE`` of ``max_raises`` could be handed watts back
   (``policies.uncapping.may_ask_to_uncap``), only that many nodes' racks are, each asking
   what the cycles until its next turn would give, within its share of the room above it
   (``ClusterState.uncap_cycles``). The rest of the bound is left to other raises
   (smoothing profiles, clock locks, levelling). Not under safety by caps: a synchronous
   job runs at its slowest GPU, so raising the GPUs of some racks in turn raises no job's
   speed (``powerplan evaluate``'s (c) did exactly (b)'s work on the 150 MW site with
   raises in turn by racks); its raises are bounded by the site's ramp instead, all of a
   job's GPUs together, and their commands by the window (rule 3).
2. **Cuts for a budget in turn** (``cut_in_turn``; under safety by caps
   ``invariant_cut_in_turn``, the cuts that restore the invariant): a node over its capping
   threshold and under its limit (a site gliding down to an operator's limit at the grid's
   ramp, say) is cut every cycle by what it passed its target by, shared over every GPU
   under it: on the 150 MW site 0.9 MW a second, 11 W a GPU, a command to every one of its
   20,736 nodes every cycle (found by ``bench_scale --site-limit-mw``). When more nodes than
   ``CUT_TURN_SHARE`` of ``max_raises`` are under such nodes, the policy cuts them in turn
   (``ClusterState.cut_turn``, rule 3 of ``policies.capping``): as many racks as give each
   GPU in turn about ``cut_turn_max_fraction`` of its range (from what the cycle's cut would
   give each GPU shared evenly), no fewer than that share of nodes a ``cycle_s`` and no more
   than ``max_raises`` (an early cycle takes a turn as long as its time since the last).
   What the GPUs in turn cannot give waits for the next turns: the node stays over its
   budget a little longer, and the commands stay bounded when the need is inflated by nodes
   not heard (counted at the caps they may hold), which more commands would only make more
   (found on the same bench, 13,000 nodes unheard). Under a node over its limit every GPU
   gives at once.
3. **The commands served** (``serve_raises``): of the nodes with a command that is not
   urgent, at most the window's room: resends first, then the nodes whose GPUs still need
   the grid smoothing profile, then those in their turn (1), then the rest round robin.

``decide_in_turn`` runs 1, 2 and ``policies.decide``: what the controller's core and the
replay call every cycle. The cursors (where each round robin goes on) are the caller's
to keep (``Turns``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from policies.allocation import caps_room_w, node_draw_w
from policies.capping import decide
from policies.rules import sanitised_power
from policies.settings import Decision, PolicySettings
from policies.tree import RACK, ClusterState, Tree
from policies.uncapping import may_ask_to_uncap

# The share of max_raises that nodes handed watts back in turn take (whole racks, so a
# little more or less); the rest is left to other raises (a smoothing profile, a clock
# lock, levelling)
UNCAP_TURN_SHARE = 0.75
# Nodes cut for a budget (not a breaker) take turns when more than this share of
# max_raises would be cut in one cycle
CUT_TURN_SHARE = 0.75
CAP_TOLERANCE_W = 1.0  # smaller cap changes are not worth a command
# The controller's default bound on commands that may wait (controller.max_raises_per_s)
MAX_RAISES_PER_S = 2000.0


def interleaved_rack_order(tree: Tree) -> np.ndarray:
    """Per tree node, a rack's place when racks are taken a row at a time in turn (the
    first rack of each row, then the second ...); -1 for nodes that are not racks."""
    place = np.full(tree.n_nodes, -1, dtype=np.int64)
    racks = tree.level_nodes[RACK]
    rows = tree.level_parent[RACK]
    rank = np.zeros(len(racks), dtype=np.int64)  # its place among its row's racks
    seen: dict[int, int] = {}
    for k, row in enumerate(rows.tolist()):
        rank[k] = seen.get(row, 0)
        seen[row] = rank[k] + 1
    place[racks[np.lexsort((rows, rank))]] = np.arange(len(racks))
    return place


@dataclass
class Turns:
    """Where each round robin goes on, and this cycle's turns: the caller keeps it."""

    rack_of: np.ndarray  # per server, its rack's place in turn order
    uncap_cursor: int = 0
    cut_cursor: int = 0
    raise_cursor: int = 0
    uncap_turn: np.ndarray | None = None  # per server: its turn this cycle (rule 1)
    uncap_waiting: int = 0  # nodes that wanted watts back and wait (rule 1)
    cut_waiting: int = 0  # nodes under a node over its threshold that wait (rule 2)

    @classmethod
    def of(cls, tree: Tree) -> Turns:
        return cls(rack_of=interleaved_rack_order(tree)[tree.parent[tree.server_nodes]])


def racks_in_turn(
    rack_of: np.ndarray, wants: np.ndarray, nodes: int, cursor: int
) -> tuple[np.ndarray, int]:
    """Per server, whether it takes its turn this cycle: of the servers that ``wants``
    one, those of whole racks in turn order from ``cursor`` on, about ``nodes`` of them
    (at least one rack); and where the next turn starts."""
    racks, per_rack = np.unique(rack_of[wants], return_counts=True)
    first = int(np.searchsorted(racks, cursor))
    racks = np.concatenate([racks[first:], racks[:first]])
    per_rack = np.concatenate([per_rack[first:], per_rack[:first]])
    n_racks = max(1, int(np.searchsorted(np.cumsum(per_rack), nodes, side="right")))
    turn: np.ndarray = wants & np.isin(rack_of, racks[:n_racks])
    return turn, int(racks[n_racks - 1]) + 1


def uncap_in_turn(
    tree: Tree, state: ClusterState, live: np.ndarray, max_raises: int, turns: Turns
) -> ClusterState:
    """Rule 1: ``state`` with ``uncap_cycles`` set when racks take turns; ``turns`` updated."""
    turns.uncap_turn, turns.uncap_waiting = None, 0
    ordinal = tree.gpu_server_ordinal
    could = may_ask_to_uncap(tree, state)
    if state.uncap_cycles is not None:  # a raise in flight: not before it is answered
        could &= np.asarray(state.uncap_cycles) > 0
    could &= np.asarray(state.cap_w) < tree.cap_max_w - CAP_TOLERANCE_W
    wants = live & (np.bincount(ordinal, weights=could, minlength=tree.n_servers) > 0)
    n_wanting = int(wants.sum())
    share = max(1, int(UNCAP_TURN_SHARE * max_raises))
    if n_wanting <= share:
        return state
    turn, turns.uncap_cursor = racks_in_turn(turns.rack_of, wants, share, turns.uncap_cursor)
    cycles = np.where(turn, math.ceil(n_wanting / int(turn.sum())), 0.0)
    turns.uncap_turn = turn
    turns.uncap_waiting = n_wanting - int(turn.sum())
    return dataclasses.replace(state, uncap_cycles=cycles[ordinal])


def _cut_share(max_raises: int) -> int:
    return max(1, int(CUT_TURN_SHARE * max_raises))


def _under_too_many(
    tree: Tree, over: np.ndarray, live: np.ndarray, max_raises: int
) -> np.ndarray | None:
    """Per server, live and under a node ``over``; None when they are too few to take
    turns (no more than ``CUT_TURN_SHARE`` of ``max_raises``)."""
    if not over.any():
        return None
    cand: np.ndarray = live & (tree.fold_down(over) > 0)[tree.server_nodes]
    return cand if int(cand.sum()) > _cut_share(max_raises) else None


def cut_in_turn(
    tree: Tree,
    state: ClusterState,
    live: np.ndarray,
    max_raises: int,
    turns: Turns,
    dt_s: float,
    cycle_s: float,
    settings: PolicySettings,
) -> ClusterState:
    """Rule 2: ``state`` with ``cut_turn`` set when nodes are cut in turn; ``turns``
    updated. ``dt_s``: the time since the last cycle; ``cycle_s``: a cycle's period."""
    turns.cut_waiting = 0
    power = np.asarray(state.power_w, dtype=float)
    power = np.where(np.isfinite(power), power, tree.failsafe_cap_w)
    node_power = tree.node_sum(power) + tree.overhead_below_w
    over = node_power > tree.cap_threshold_w
    cand = _under_too_many(tree, over, live, max_raises)
    if cand is None:
        return state
    n_cand, share = int(cand.sum()), _cut_share(max_raises)
    # each GPU's even share of the cuts of the nodes over it (their need over their
    # controllable GPUs), and how many cycles' of it a turn may carry
    ctl = np.asarray(state.controllable, dtype=bool)
    pred = np.where(ctl, np.minimum(power, np.asarray(state.cap_w, dtype=float)), power)
    need = np.maximum(tree.node_sum(pred) + tree.overhead_below_w - tree.cap_target_w, 0)
    need_per_gpu = np.where(over, need, 0.0) / np.maximum(tree.node_sum(ctl * 1.0), 1.0)
    even_w = tree.fold_down(need_per_gpu)[tree.server_nodes][cand]
    # per second, not per cycle: an early cycle (a rack pushed over its threshold
    # elsewhere) takes a turn as long as its time, not a whole cycle's
    dt_s = max(dt_s, 1e-3)
    rate_w_per_s = float(np.median(even_w)) / dt_s  # a GPU's even share, W/s
    span_w = float(np.median(tree.cap_max_w - tree.cap_min_w))
    step_w = settings.cut_turn_max_fraction * span_w
    # a round of turns lasts as long as the share of commands a second needs, but no
    # longer than a GPU in turn may carry its cut (step_w); and never more nodes a
    # second than max_raises a cycle: what they cannot give waits (a need inflated by
    # nodes not heard, counted at the caps they may hold, cuts no more)
    round_s = n_cand / share * cycle_s
    if rate_w_per_s > 0:
        round_s = min(round_s, step_w / rate_w_per_s)
    if round_s <= dt_s:
        return state
    most = max_raises * dt_s / cycle_s
    nodes = max(1, math.ceil(min(n_cand * dt_s / round_s, most)))
    turn, turns.cut_cursor = racks_in_turn(turns.rack_of, cand, nodes, turns.cut_cursor)
    turns.cut_waiting = n_cand - int(turn.sum())
    in_turn = turn | ~cand  # GPUs under no node over its threshold: none of this
    return dataclasses.replace(state, cut_turn=in_turn[tree.gpu_server_ordinal])


def invariant_cut_in_turn(
    tree: Tree, state: ClusterState, live: np.ndarray, max_raises: int, turns: Turns
) -> ClusterState:
    """Rule 2 under safety by caps: when more nodes than ``CUT_TURN_SHARE`` of
    ``max_raises`` are under a node whose caps in force exceed what they may sum to (a
    limit lowered, an operator's line gliding down, caps taken over from the bands), only
    that many nodes' racks take the cut that restores it this cycle
    (``ClusterState.cut_turn``: the others keep their caps, ``policies.allocation``), so a
    cut is a command to few nodes, not a watt or two to every node of the site. Under a node
    that draws above its limit every GPU gives at once (the allocation's rule)."""
    turns.cut_waiting = 0
    cap = np.asarray(state.cap_w, dtype=float)
    over = (
        tree.node_sum(np.where(np.isfinite(cap), cap, tree.failsafe_cap_w))
        > caps_room_w(tree, _draw_if_oversubscribed(tree, state)) + 1e-9
    )
    cand = _under_too_many(tree, over, live, max_raises)
    if cand is None:
        return state
    n_cand = int(cand.sum())
    turn, turns.cut_cursor = racks_in_turn(
        turns.rack_of, cand, _cut_share(max_raises), turns.cut_cursor
    )
    turns.cut_waiting = n_cand - int(turn.sum())
    in_turn = turn | ~cand
    return dataclasses.replace(state, cut_turn=in_turn[tree.gpu_server_ordinal])


def decide_in_turn(
    tree: Tree,
    state: ClusterState,
    live: np.ndarray,
    dt_s: float,
    settings: PolicySettings,
    turns: Turns,
    max_raises: int,
    cycle_s: float,
) -> tuple[Decision, ClusterState]:
    """One cycle: rules 1 and 2 under the bands (``uncap_in_turn``, ``cut_in_turn``), rule 2
    alone under safety by caps (``invariant_cut_in_turn``), then ``policies.decide`` (the
    bands, or safety by caps); the decision and the state it was made on. ``live``: per
    server, whether it can be commanded (heard, believed)."""
    if settings.safety_by_caps:
        turns.uncap_turn, turns.uncap_waiting = None, 0
        state = invariant_cut_in_turn(tree, state, live, max_raises, turns)
    else:
        state = uncap_in_turn(tree, state, live, max_raises, turns)
        state = cut_in_turn(tree, state, live, max_raises, turns, dt_s, cycle_s, settings)
    return decide(tree, state, dt_s, settings), state


def serve_raises(
    raises: np.ndarray,
    late: np.ndarray,
    profile: np.ndarray,
    budget: int,
    turns: Turns,
) -> tuple[np.ndarray, int]:
    """Rule 3: of the servers ``raises`` (sorted) with a command that may wait, the ones
    sent this cycle, at most ``budget``: ``late`` (a resend due) first, then ``profile``
    (a smoothing profile to send), then those in their turn, then the rest round robin
    from ``turns.raise_cursor``; and how many wait."""
    if len(raises) <= budget:
        return raises, 0
    profile = profile & ~late  # the grid's protection first
    turn = np.zeros(len(raises), dtype=bool)
    if turns.uncap_turn is not None:
        turn = turns.uncap_turn[raises] & ~late & ~profile
    others = raises[~late & ~profile & ~turn]
    first = int(np.searchsorted(others, turns.raise_cursor))
    others = np.concatenate([others[first:], others[:first]])
    ahead = int(late.sum() + profile.sum() + turn.sum())
    served = np.concatenate([raises[late], raises[profile], raises[turn], others])[:budget]
    if len(served) > ahead:  # some of the others: the round robin goes on after them
        turns.raise_cursor = int(served[-1]) + 1
    return served, len(raises) - len(served)


def _draw_if_oversubscribed(tree: Tree, state: ClusterState) -> np.ndarray | None:
    """Each node's draw where an oversubscribed level's allowance depends on it; None (no
    allowance anywhere) on a tree whose caps guarantee every level."""
    if not tree.oversubscribed.any():
        return None
    return node_draw_w(tree, sanitised_power(tree, state))
