"""Replays of one demand trace under one controller and under a tree of controllers.

``planner.whatif`` replays measured profiles through ``policies.decide`` over
the whole site. Here the same kind of replay runs twice on one GPU demand
trace (``demand_w``, steps × GPUs, in the site's GPU order), so the two can be
compared step by step:

- ``replay_single``: one controller, ``decide`` over the site's tree;
- ``replay_tree``: one leaf per scope (``powerd.topology.scope.scoped``),
  each running ``decide`` over its own tree under the budget in force
  (``with_root_budget``), and a coordinator that every ``period_steps``
  steps takes each leaf's ``summarise`` and grants budgets with
  ``allocate``, as ``powerd coordinator`` does. A grant lands at the next
  step (no message is lost here; the TTL fallback is the leaves' business,
  tested in ``tests/controller/test_controller_leaf_grants.py``).

Every GPU draws ``min(demand, cap)`` with the cap set the step before, and
starts at its failsafe cap, as agents do. The result is per step: the power
of every node of the *site's* tree (so limits are checked in one place) and
every GPU's cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from policies import ClusterState, PolicySettings, decide
from policies.coordination import (
    LeafSummary,
    Leaves,
    SitePool,
    allocate,
    summarise,
    with_root_budget,
)
from policies.tree import PHASE_CODES
from powerd.topology import Topology
from powerd.topology.scope import Scope, leaf_pool_w, scoped


@dataclass
class Replay:
    node_power_w: np.ndarray  # (n_steps, site tree nodes): measured, overheads in
    cap_w: np.ndarray  # (n_steps, n_gpus): caps in force during each step
    power_w: np.ndarray  # (n_steps, n_gpus): what each GPU drew
    budget_w: np.ndarray | None = None  # (n_steps, n_leaves): leaves' budgets in force


def _state(
    power_w: np.ndarray, cap_w: np.ndarray, priority: np.ndarray, floor_w: np.ndarray
) -> ClusterState:
    n = len(power_w)
    return ClusterState(
        power_w=power_w,
        cap_w=cap_w,
        priority=priority,
        floor_w=floor_w,
        phase=np.full(n, PHASE_CODES["compute"], dtype=np.int8),
        controllable=np.ones(n, dtype=bool),
    )


def replay_single(
    site: Topology,
    demand_w: np.ndarray,
    priority: np.ndarray,
    step_s: float = 1.0,
    policy: PolicySettings | None = None,
) -> Replay:
    tree = site.tree
    n_steps = len(demand_w)
    cap = tree.failsafe_cap_w.astype(float).copy()
    out = Replay(
        np.zeros((n_steps, tree.n_nodes)), np.zeros_like(demand_w), np.zeros_like(demand_w)
    )
    for t in range(n_steps):
        power = np.minimum(demand_w[t], cap)
        out.cap_w[t], out.power_w[t] = cap, power
        out.node_power_w[t] = tree.node_sum(power) + tree.overhead_below_w
        decision = decide(tree, _state(power, cap, priority, tree.cap_min_w.copy()), step_s, policy)
        cap = decision.cap_w
    return out


def _gpu_map(site: Topology, part: Topology) -> np.ndarray:
    """The site GPU index of each of ``part``'s GPUs."""
    return np.concatenate([np.arange(r.start, r.stop) for r in map(site.server_gpus, part.servers)])


def replay_tree(
    site: Topology,
    scopes: Sequence[Scope],
    demand_w: np.ndarray,
    priority: np.ndarray,
    period_steps: int = 5,
    step_s: float = 1.0,
    policy: PolicySettings | None = None,
) -> Replay:
    parts = [scoped(site, scope) for scope in scopes]
    maps = [_gpu_map(site, part) for part in parts]
    base = [part.tree for part in parts]
    fractions = tuple(
        (float(p.cap_threshold[0]), float(p.cap_target[0]), float(p.uncap_threshold[0]))
        for p in parts
    )
    file_w = np.array([float(p.budget_w[0]) for p in parts])
    limit_w = np.array([float(p.limit_w[0]) for p in parts])
    pool = SitePool(
        pool_w=leaf_pool_w(site),
        cap_threshold=float(site.cap_threshold[0]),
        cap_target=float(site.cap_target[0]),
        uncap_threshold=float(site.uncap_threshold[0]),
        ramp_w_per_s=float(site.ramp_w_per_s[0]),
    )
    in_force = file_w.copy()
    ramp = np.array([float(p.ramp_w_per_s[0]) for p in parts])
    by_caps = (policy or PolicySettings()).safety_by_caps
    # every leaf under the budget in force from the start, its file budget, as a leaf's
    # core runs (LeafGrants.tree_for): under safety by caps it bounds the leaf's caps
    # (Tree.root_caps_limit_w), where the file's rows would let them fill their breakers
    trees = [
        with_root_budget(b, float(w), float(r), f)
        for b, w, r, f in zip(base, in_force, ramp, fractions, strict=True)
    ]
    n_steps, n_leaves = len(demand_w), len(parts)
    tree = site.tree
    cap = tree.failsafe_cap_w.astype(float).copy()
    out = Replay(
        np.zeros((n_steps, tree.n_nodes)),
        np.zeros_like(demand_w),
        np.zeros_like(demand_w),
        np.zeros((n_steps, n_leaves)),
    )
    for t in range(n_steps):
        power = np.minimum(demand_w[t], cap)
        out.cap_w[t], out.power_w[t] = cap, power
        out.node_power_w[t] = tree.node_sum(power) + tree.overhead_below_w
        assert out.budget_w is not None
        out.budget_w[t] = in_force
        new_cap = cap.copy()
        summaries: list[LeafSummary] = []
        caps_w = np.zeros(n_leaves)  # each leaf's caps in force plus its overheads
        for k, (leaf_tree, gpus) in enumerate(zip(trees, maps, strict=True)):
            state = _state(power[gpus], cap[gpus], priority[gpus], leaf_tree.cap_min_w.copy())
            decision = decide(leaf_tree, state, step_s, policy)
            new_cap[gpus] = decision.cap_w
            summaries.append(summarise(leaf_tree, state, decision, policy))
            caps_w[k] = float(state.cap_w.sum()) + float(leaf_tree.overhead_below_w[0])
        cap = new_cap
        if (t + 1) % period_steps == 0:  # the coordinator's period
            got = allocate(
                Leaves(
                    heard=np.ones(n_leaves, dtype=bool),
                    fixed_w=np.array([s.fixed_w for s in summaries]),
                    demand_w=np.array([s.demand_w for s in summaries]),
                    held_w=np.array([s.held_w for s in summaries]),
                    predicted_w=np.array([s.predicted_w for s in summaries]),
                    budget_w=in_force,
                    file_budget_w=file_w,
                    limit_w=limit_w,
                    # a leaf under caps reports them (powerd.controller.scoping), and the
                    # coordinator counts it at them until its cuts land
                    caps_in_force_w=caps_w if by_caps else None,
                ),
                pool,
            )
            in_force = np.minimum(got.budget_w, limit_w / np.array([f[0] for f in fractions]))
            ramp = got.ramp_w_per_s
            trees = [
                with_root_budget(b, float(w), float(r), f)
                for b, w, r, f in zip(base, in_force, ramp, fractions, strict=True)
            ]
    return out
