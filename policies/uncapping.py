"""Rule 4 of the bands (``policies.capping``): uncapping, ramp-limited at every level,
HIGH first. It runs last, on the caps rules 2, 3, 3b and 3c left; a GPU rule 3b shifted or
rule 3c levelled this cycle does not ask.

4. **Uncapping.** A controllable GPU that is neither in a staged phase nor
   waiting (``communication``: it draws little now and all of a job's GPUs
   rise together when compute resumes, so watts handed back now overshoot the
   budget then; found by ``powerd demo``), nor shifted this cycle, and whose
   every ancestor is below its ``uncap_threshold_w`` asks for
   ``min(gap, max(uncap_step_fraction * gap, uncap_min_step_w))``, with
   ``gap = cap_max - cap``; where ``uncap_cycles`` gives it k cycles, what k
   such steps would give, ``min(gap, max((1 - (1 - uncap_step_fraction)^k) * gap,
   k * uncap_min_step_w))``, and with 0 nothing (its node is not served a raise
   this cycle: a controller bounds raises per cycle and serves nodes in turn, so
   a node's one command in k cycles carries their watts instead of one
   cycle's; the grants below bound the total as ever, and of a node's room to
   its capping target and its limit a turn gets only its share, what its GPUs
   ask over what every GPU that could ask would ask for k cycles, so the first
   turns under a breaker do not take what the later ones' share). Every node grants at most
   ``min(ramp_w_per_s * ramp_s, cap_target_w - predicted)`` in total (0 if it
   is not below its uncapping threshold; ``ramp_w_per_s`` less
   ``startup_rise_w_per_s`` for every controllable GPU in a staged phase under
   it, which rises on its own under software grid smoothing: a start fills up
   to its caps, and a checkpoint ends filling back up to them before compute
   resumes, ``powerd.jobhook.FillFollower``; and for every controllable GPU in
   ``communication`` for longer than ``wait_rise_after_s``, and a share of it for every one
   in ``compute`` up to that long after such a wait, the share its step back up takes of a
   window's rise (``rising_after_wait``): past the smoothing profile's hysteresis its draw
   fell, and it comes back up as compute resumes, filling back up first when it fell far;
   never below 0):
   the ramp limit, and the headroom
   that keeps a node from being uncapped into capping again (that assumes
   every granted watt is drawn, so it is conservative). It also grants at
   most ``limit_w - cap_sum``, ``cap_sum`` being the sum of the caps under the
   node (uncontrollable GPUs at what they draw) plus its overhead: watts are
   never handed back beyond what the breaker takes with every GPU at its cap.
   Without it, a job's GPUs waiting on a collective (drawing little) are
   handed watts back, and when they all rise together the node overshoots its
   limit for a cycle before capping catches it (found by ``powerplan whatif``
   replaying a compute/communication rhythm). Classes are served in order,
   HIGH, NORMAL, LOW: each gets what the budgets left after the classes
   before it, and under a node where a higher class is still held after its
   grant the lower classes get nothing (it would be shifted back next cycle),
   unless a node between them has nothing left: that node holds the GPU,
   and watts from above could not reach it.
   With ``uncap_within_caps`` the headroom is ``cap_target_w - cap_sum``
   instead (GPUs in ``idle`` at what they draw: a job starting on them
   announces ``startup``, whose caps are staged): under grid power smoothing
   a GPU's draw climbs to its cap over seconds, so a node uncapped on what it
   draws now would climb across its threshold and be cut at once, a step the
   grid's ramp-down limit forbids
   (found by ``powerplan whatif --smoothing`` on the 150 MW site: every rack
   cut 3 kW in one cycle, 3.6 MW for the site).
   Within a class requests are reconciled exactly: bottom-up every node can pass on
   ``A = min(budget, sum of its children's A)``; top-down each child gets its
   share of the parent's grant in proportion to its ``A``; each GPU gets its
   request scaled by its server's grant over the server's demand. Every
   ancestor's grant limit holds and no node is starved by a sibling's limit.
   Between the bands (not above the threshold, not below the uncapping
   threshold) caps stay as they are, unless GPUs under the node are held at
   their caps (rule 3b's test) and ``uncap_between_bands``: then the node
   hands back too, within the same limits, so at most up to its capping
   target. That keeps the hysteresis (a node cut to its target has no
   headroom left, and nothing is handed back beyond the target, below the
   threshold that cuts) without leaving a node between its bands with GPUs
   that want more and room to give it: a synchronous start staged the caps,
   the GPUs climbed back until the node crossed its uncapping threshold, and
   there they would stay.
"""

from __future__ import annotations

import numpy as np

from policies.rules import (
    IDLE_CODE,
    LEVELS_BOTTOM_UP,
    NEGLIGIBLE_W,
    STAGED_CODES,
    WAITING_CODES,
    Sanitised,
    own_rise_w_per_s,
    ratio,
)
from policies.settings import PolicySettings
from policies.tree import (
    HIGH,
    LOW,
    RACK,
    ROW,
    SERVER,
    SITE,
    ClusterState,
    Tree,
    in_codes,
    ramp_allowance_w,
)


def may_ask_to_uncap(tree: Tree, state: ClusterState) -> np.ndarray:
    """Per GPU, whether rule 4 could hand it watts back at all: controllable, below its
    maximum cap, neither staged nor waiting (what its nodes, under their thresholds, might
    give it is the policy's to decide). A controller serving hand-backs in turn offers
    its turns to these (``ClusterState.uncap_cycles``)."""
    phase = np.asarray(state.phase)
    below = np.asarray(state.cap_w, dtype=float) < np.asarray(tree.cap_max_w, dtype=float)
    settled = ~in_codes(phase, STAGED_CODES) & ~in_codes(phase, WAITING_CODES)
    return np.asarray(np.asarray(state.controllable, dtype=bool) & below & settled)


def uncap(
    tree: Tree,
    state: ClusterState,
    s: Sanitised,
    node_power: np.ndarray,
    node_pred: np.ndarray,
    capping: np.ndarray,
    pressed: np.ndarray,
    staged: np.ndarray,
    quiet: np.ndarray,
    level_rise_w: np.ndarray,
    ramp_s: float,
    settings: PolicySettings,
) -> None:
    """Rule 4, in place on ``s.cap``. ``pressed``: the GPUs held at their caps (rule 3b's
    test) not cut this cycle; ``quiet``: those that do not ask (waiting, shifted, levelled);
    ``level_rise_w``: what rule 3c raised the caps under each node by (the ramp has less)."""
    room, may_ask = _who_may_ask(tree, state, node_power, capping, pressed, settings)
    asking = s.ctl & ~staged & ~quiet & may_ask & (s.cap < s.cap_max)
    cycles = None if state.uncap_cycles is None else np.asarray(state.uncap_cycles, dtype=float)
    everyone = asking  # with turns: every GPU that would ask, its turn or not
    if cycles is not None:
        asking = asking & (cycles > 0)
    if not asking.any():
        return
    i = np.flatnonzero(asking)
    request = _uncap_request(
        s.cap_max[i] - s.cap[i], None if cycles is None else cycles[i], settings
    )
    cap_room = _cap_room_w(tree, s, node_pred, settings)
    if cycles is not None:  # a turn takes its share of the room, the others' turns come
        cap_room = cap_room * _turn_share(tree, s, i, request, everyone, cycles, settings)
    ramp = np.asarray(tree.ramp_w_per_s, dtype=float)
    own = own_rise_w_per_s(tree, state, s.phase, s.ctl, staged, settings)
    with np.errstate(invalid="ignore"):  # no limit stays none, whatever rises on its own
        ramp = np.where(np.isinf(ramp), ramp, np.maximum(ramp - own, 0))
    budget = np.minimum(ramp_allowance_w(ramp, ramp_s) - level_rise_w, cap_room)
    budget = np.where(room & (budget > NEGLIGIBLE_W), budget, 0.0)  # NaN (bad tree): none
    _grant_by_class(tree, s, i, request, budget, pressed)


def _who_may_ask(
    tree: Tree,
    state: ClusterState,
    node_power: np.ndarray,
    capping: np.ndarray,
    pressed: np.ndarray,
    settings: PolicySettings,
) -> tuple[np.ndarray, np.ndarray]:
    """(n_nodes,) bool: the node may hand back, it and every ancestor below its uncapping
    threshold or between its bands with GPUs held under it; (n_gpus,) bool: the GPU may
    ask, every one under nodes all below their uncapping thresholds, and where some are
    between their bands only the GPUs held at their caps."""
    below = node_power < tree.uncap_threshold_w
    between = np.zeros(tree.n_nodes, dtype=bool)  # between the bands with GPUs held under it
    held = np.zeros(tree.n_gpus, dtype=bool)  # ... and those GPUs
    if settings.uncap_between_bands and pressed.any():
        # held on a measured draw: a GPU whose power is unknown (read as its failsafe cap,
        # rule 1) is not known to want more
        held = pressed & np.isfinite(np.asarray(state.power_w, dtype=float))
        between = ~capping & ~below & (tree.node_sum(held.astype(float)) > 0)
    room = below | between
    for lvl in (ROW, RACK, SERVER):  # a node hands back only if all its ancestors do too
        below[tree.level_nodes[lvl]] &= below[tree.level_parent[lvl]]
        room[tree.level_nodes[lvl]] &= room[tree.level_parent[lvl]]
    server_of = tree.gpu_ancestor[SERVER]
    may_ask = below[server_of] | (room[server_of] & held)
    return room, may_ask


def _cap_room_w(
    tree: Tree, s: Sanitised, node_pred: np.ndarray, settings: PolicySettings
) -> np.ndarray:
    """(n_nodes,) the headroom to the capping target (on predicted power, or with
    ``uncap_within_caps`` on the caps) and to the limit with every GPU at its cap."""
    cap, power, ctl = s.cap, s.power, s.ctl
    overhead = tree.overhead_below_w
    # what every GPU under a node could draw at its cap (the others at what they draw)
    at_cap = np.where(ctl, cap, power) if not ctl.all() else cap
    node_cap_sum = tree.node_sum(at_cap) + overhead
    drawn = node_pred
    if settings.uncap_within_caps:  # GPUs at their caps; idle ones at what they draw
        drawn = tree.node_sum(np.where(s.phase == IDLE_CODE, power, at_cap)) + overhead
    room: np.ndarray = np.minimum(tree.cap_target_w - drawn, tree.limit_w - node_cap_sum)
    return room


def _turn_share(
    tree: Tree,
    s: Sanitised,
    i: np.ndarray,
    request: np.ndarray,
    everyone: np.ndarray,
    cycles: np.ndarray,
    settings: PolicySettings,
) -> np.ndarray:
    """(n_nodes,) the share of a node's room this turn takes: what the GPUs ``i`` in turn
    ask over what ``everyone`` that could ask would ask for as many cycles."""
    server_of = tree.gpu_ancestor[SERVER]
    j = np.flatnonzero(everyone)
    k_all = np.full(len(j), float(cycles[i].max()))
    wanted = np.bincount(
        server_of[j],
        weights=_uncap_request(s.cap_max[j] - s.cap[j], k_all, settings),
        minlength=tree.n_nodes,
    )
    asked = np.bincount(server_of[i], weights=request, minlength=tree.n_nodes)
    return ratio(tree.fold_up(asked), tree.fold_up(wanted))


def _grant_by_class(
    tree: Tree,
    s: Sanitised,
    i: np.ndarray,
    request: np.ndarray,
    budget: np.ndarray,
    pressed: np.ndarray,
) -> None:
    """Grant the ``request`` of GPUs ``i`` within every node's ``budget``, in place on
    ``s.cap``: HIGH, then NORMAL, then LOW, each from what the classes before it left."""
    cap, cap_max, n_nodes = s.cap, s.cap_max, tree.n_nodes
    server = tree.gpu_ancestor[SERVER][i]
    classes = s.priority[i]
    for prio in range(HIGH, LOW - 1, -1):  # what HIGH leaves goes to NORMAL, then LOW
        mine = classes == prio
        if not mine.any():
            continue
        given = request[mine] * _ramp_grants(tree, server[mine], request[mine], budget)
        cap[i[mine]] = np.minimum(cap[i[mine]] + given, cap_max[i[mine]])
        used = np.bincount(server[mine], weights=given, minlength=n_nodes)
        budget = budget - tree.fold_up(used.astype(float, copy=False))
        # rounding residue (1e-14 W) is nothing left: whether a node "has nothing left"
        # must not depend on the order the GPUs' grants were summed in
        budget[budget <= NEGLIGIBLE_W] = 0.0
        # nothing for lower classes under a node where this class is still held at
        # its caps: those watts would be shifted back to it next cycle (churn); but a
        # node below it with nothing left is what holds the GPU, and its ancestors'
        # watts could not reach it: they stay for the other GPUs under them
        still = i[mine][pressed[i[mine]] & (cap[i[mine]] < cap_max[i[mine]])]
        if len(still):
            _close_for_lower_classes(tree, budget, still)


def _close_for_lower_classes(tree: Tree, budget: np.ndarray, still: np.ndarray) -> None:
    """Rule 4, in place: no budget left for lower classes under the nodes whose watts could
    reach a GPU of ``still`` (held after its class's grant): bottom-up from its server,
    every ancestor up to, not including, the first with nothing left, which holds it. Node
    by node (a few per rack), not GPU by GPU: every cycle of a 150 MW replay runs it."""
    reach = np.zeros(tree.n_nodes, dtype=bool)
    reach[tree.gpu_ancestor[SERVER][still]] = True
    for lvl in LEVELS_BOTTOM_UP:
        nodes = tree.level_nodes[lvl]
        if lvl != SERVER:  # reached from a child that let it through
            children = tree.level_nodes[lvl + 1]
            reach[tree.level_parent[lvl + 1][reach[children]]] = True
        through = reach[nodes] & (budget[nodes] > 0)
        budget[nodes[through]] = 0.0
        reach[nodes] = through


def _ramp_grants(
    tree: Tree, server: np.ndarray, request: np.ndarray, budget: np.ndarray
) -> np.ndarray:
    """Per request, the fraction of it granted so every ancestor's budget holds.

    Bottom-up each node can pass on ``A = min(budget, demand)``, demand being
    the sum of its children's ``A`` (for a server, of its GPUs' requests);
    top-down a child gets ``A_child * grant_parent / demand_parent``, and a
    GPU its request times ``grant_server / demand_server``.
    """
    n_nodes = len(budget)
    demand = np.bincount(server, weights=request, minlength=n_nodes).astype(float, copy=False)
    allowed = np.zeros(n_nodes)
    for lvl in LEVELS_BOTTOM_UP:
        nodes = tree.level_nodes[lvl]
        allowed[nodes] = np.minimum(budget[nodes], demand[nodes])
        if lvl != SITE and len(nodes):
            demand += np.bincount(tree.level_parent[lvl], weights=allowed[nodes], minlength=n_nodes)
    grant = np.zeros(n_nodes)
    roots = tree.level_nodes[SITE]
    grant[roots] = allowed[roots]
    for lvl in (ROW, RACK, SERVER):
        nodes, parent = tree.level_nodes[lvl], tree.level_parent[lvl]
        grant[nodes] = allowed[nodes] * ratio(grant[parent], demand[parent])
    share: np.ndarray = ratio(grant, demand)[server]
    return share


def _uncap_request(
    gap_w: np.ndarray, cycles: np.ndarray | None, settings: PolicySettings
) -> np.ndarray:
    """Rule 4's request of GPUs ``gap_w`` below their maximum: one cycle's step, or with
    ``cycles`` (k per GPU) what k such steps would give."""
    fraction, least_w = settings.uncap_step_fraction, settings.uncap_min_step_w
    if cycles is None:
        step = np.maximum(fraction * gap_w, least_w)
    else:
        step = np.maximum((1.0 - (1.0 - fraction) ** cycles) * gap_w, cycles * least_w)
    return np.asarray(np.minimum(gap_w, step), dtype=float)
