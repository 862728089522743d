"""A leaf controller's side of the tree of controllers, with no I/O: grants in, summaries out.

A controller started with a scope (``--scope``) manages the nodes of its rows
under a root of its own (``powerd.topology.scope.scoped``). ``LeafGrants`` keeps
what that root may draw:

- **a grant** from the site coordinator, once verified (``Grant``): in force for
  its ``ttl_s`` from when it was received (this controller's monotonic clock, so
  clock skew does not shorten or stretch it); refused if older, by its
  ``(epoch, seq)``, than the newest taken, if its ``ts`` runs more than
  ``max_clock_skew_s`` ahead of this clock (a clock alarm: a coordinator ahead
  would otherwise make grants replayable for as long), or, retained (delivered on
  subscribe, not sent now), if its ``ts`` is more than its ``ttl_s`` in the past
  (a replay). A live one's age by ``ts`` is not judged: it would be the clocks'
  skew, and its ``(epoch, seq)`` orders it;
- **then** ``min(grant, file budget)`` for one more ``ttl_s``: every leaf passes
  through the lower of the two before any of them goes back to its file budget,
  whatever order their grants expire in (policies/coordination.py);
- **then the file budget**: the rows' budgets, which sum within the site's
  (checked when the scoped file was loaded).

Under grid smoothing the root's ramp is also at most ``max_ramp_w_per_s``: the sum
of its GPUs' shares of the grid's ramp-up (``powerd.controller.smoothing.
grid_ramp_w_per_s``), so the leaves' caps together rise within the grid's limit
whatever the coordinator splits.

``tree_for`` gives the core's tree under what is in force (``policies.in_force``);
``summary`` builds the leaf's report for the coordinator after a cycle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from policies import ClusterState, Decision, PolicySettings, Tree
from policies.coordination import summarise
from policies.in_force import RootBudget, tree_in_force
from powerd.clock_skew import DEFAULT_MAX_CLOCK_SKEW_S
from powerd.protocol import Grant, Summary
from powerd.topology import Topology
from powerd.vocabulary import PROTOCOL_VERSION

Source = Literal["grant", "expiring", "file"]


@dataclass(frozen=True)
class InForce:
    """What the scope's root may draw now, and why."""

    budget_w: float
    ramp_w_per_s: float  # inf: no limit
    source: Source  # a live grant, min(grant, file) after it expired, or the file's budget
    grant: Grant | None  # the grant it comes from (for "grant" and "expiring")


class LeafGrants:
    def __init__(
        self,
        scope: str,
        topology: Topology,
        base_tree: Tree | None = None,
        max_ramp_w_per_s: float = math.inf,
        max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S,
    ) -> None:
        """``topology``: the scoped budgets (``scoped``); its root's budget is the file budget.
        ``max_ramp_w_per_s``: the most the root's ramp may be, whatever is in force."""
        self.scope = scope
        self.max_ramp_w_per_s = max_ramp_w_per_s
        self.base_tree = base_tree if base_tree is not None else topology.tree
        self.file_budget_w = float(topology.budget_w[0])
        self.file_ramp_w_per_s = float(topology.ramp_w_per_s[0])
        self.limit_w = float(topology.limit_w[0])
        self.fractions = (
            float(topology.cap_threshold[0]),
            float(topology.cap_target[0]),
            float(topology.uncap_threshold[0]),
        )
        self.grant: Grant | None = None
        self.received_mono = -math.inf
        self.grants_taken = 0
        self.grants_refused = 0
        self.max_clock_skew_s = max_clock_skew_s
        self.clock_alarms = 0  # grants refused: their ts ran ahead of this clock
        # the coordinator's current round as its heartbeat says, (epoch, seq): a grant of an
        # older round is a replay, however new to a leaf that restarted and holds none
        self.round_floor: tuple[int, int] | None = None
        self._tree_key: tuple[float, float] | None = None
        self._tree = self.base_tree

    def rebased(self, topology: Topology, max_ramp_w_per_s: float = math.inf) -> LeafGrants:
        """These grants over a reloaded scoped budgets file (its file budget, limits, bands
        and grid spec may have changed): the grant in force stays in force."""
        moved = LeafGrants(
            self.scope,
            topology,
            max_ramp_w_per_s=max_ramp_w_per_s,
            max_clock_skew_s=self.max_clock_skew_s,
        )
        moved.grant, moved.received_mono = self.grant, self.received_mono
        moved.grants_taken, moved.grants_refused = self.grants_taken, self.grants_refused
        moved.clock_alarms = self.clock_alarms
        moved.round_floor = self.round_floor
        return moved

    def on_grant(self, grant: Grant, now_mono: float, wall: float, live: bool = True) -> str | None:
        """Take a verified grant for this scope, delivered ``live`` or retained; why it was
        refused, or None if taken."""
        why = self._refusal(grant, wall, live)
        if why is not None:
            self.grants_refused += 1
            return why
        self.grant = grant
        self.received_mono = now_mono
        self.grants_taken += 1
        return None

    def on_coordinator_round(self, epoch: int, seq: int) -> None:
        """A verified coordinator heartbeat: its epoch and the seq of its last grant round,
        the floor below which a grant is a replay."""
        if self.round_floor is None or (epoch, seq) > self.round_floor:
            self.round_floor = (epoch, seq)

    def _refusal(self, grant: Grant, wall: float, live: bool) -> str | None:
        if grant.scope != self.scope:
            return f"a grant for scope {grant.scope}, not {self.scope}"
        if grant.ts - wall > self.max_clock_skew_s:
            self.clock_alarms += 1
            return (
                f"clock alarm: grant ts is {grant.ts - wall:.1f} s ahead of this clock "
                f"(max_clock_skew_s {self.max_clock_skew_s:g})"
            )
        if self.grant is not None and (grant.epoch, grant.seq) <= (
            self.grant.epoch,
            self.grant.seq,
        ):
            return (
                f"grant (epoch {grant.epoch}, seq {grant.seq}) is not newer than the one "
                f"taken (epoch {self.grant.epoch}, seq {self.grant.seq})"
            )
        floor = self.round_floor
        if floor is not None and (grant.epoch, grant.seq) < floor:
            return (
                f"grant (epoch {grant.epoch}, seq {grant.seq}) is older than the coordinator's "
                f"current round (epoch {floor[0]}, seq {floor[1]}): a replay"
            )
        if not live and wall - grant.ts > grant.ttl_s:
            return f"retained grant is {wall - grant.ts:.1f} s old, past its ttl_s {grant.ttl_s:g}"
        return None

    def in_force(self, now_mono: float) -> InForce:
        force = self._in_force(now_mono)
        if force.ramp_w_per_s <= self.max_ramp_w_per_s:
            return force
        return InForce(force.budget_w, self.max_ramp_w_per_s, force.source, force.grant)

    def _in_force(self, now_mono: float) -> InForce:
        grant = self.grant
        if grant is not None:
            age_s = now_mono - self.received_mono
            ramp = math.inf if grant.ramp_w_per_s is None else grant.ramp_w_per_s
            if age_s <= grant.ttl_s:
                return InForce(min(grant.budget_w, self.granted_max_w), ramp, "grant", grant)
            if age_s <= 2 * grant.ttl_s:
                budget = min(grant.budget_w, self.file_budget_w)
                return InForce(budget, min(ramp, self.file_ramp_w_per_s), "expiring", grant)
        return InForce(self.file_budget_w, self.file_ramp_w_per_s, "file", None)

    @property
    def granted_max_w(self) -> float:
        """The most a grant can give: the root's threshold at its rows' breakers."""
        return self.limit_w / self.fractions[0]

    def tree_for(self, now_mono: float) -> Tree:
        """The core's tree under what is in force now (rebuilt only when that changes)."""
        force = self.in_force(now_mono)
        key = (force.budget_w, force.ramp_w_per_s)
        if key != self._tree_key:
            self._tree_key = key
            budget = RootBudget(force.budget_w, force.ramp_w_per_s, self.fractions)
            self._tree = tree_in_force(self.base_tree, root_budget=budget)
        return self._tree

    def summary(
        self,
        tree: Tree,
        state: ClusterState,
        decision: Decision,
        *,
        controller: str,
        epoch: int,
        seq: int,
        ts: float,
        now_mono: float,
        stale_nodes: int,
        policy: PolicySettings | None = None,
    ) -> Summary:
        leaf = summarise(tree, state, decision, policy)
        force = self.in_force(now_mono)
        return Summary(
            v=PROTOCOL_VERSION,
            scope=self.scope,
            controller=controller,
            epoch=epoch,
            seq=seq,
            ts=ts,
            measured_w=max(leaf.measured_w, 0.0),
            predicted_w=max(leaf.predicted_w, 0.0),
            cap_sum_w=max(leaf.cap_sum_w, 0.0),
            fixed_w=max(leaf.fixed_w, 0.0),
            demand_w=list(leaf.demand_w),
            held_w=list(leaf.held_w),
            budget_w=force.budget_w,
            file_budget_w=self.file_budget_w,
            limit_w=self.limit_w,
            ramp_w_per_s=force.ramp_w_per_s if math.isfinite(force.ramp_w_per_s) else None,
            nodes=tree.n_servers,
            stale_nodes=stale_nodes,
            grant_epoch=None if force.grant is None else force.grant.epoch,
            grant_seq=None if force.grant is None else force.grant.seq,
            caps_in_force_w=(
                float(np.sum(state.cap_w)) + float(tree.overhead_below_w[0])
                if policy is not None and policy.safety_by_caps
                else None
            ),
        )
