"""The coordinator's bookkeeping and decisions, with no I/O: summaries in, grants out.

Each leaf controller (``powerd controller --scope``) reports a ``Summary`` of its
scope every cycle; every ``period_s`` the coordinator turns the newest of each
into the arrays ``policies.coordination.allocate`` takes and sends each leaf a
``Grant`` valid ``grant_ttl_s``. A leaf is *heard* while its newest summary was
received within ``grant_ttl_s`` (and, if retained, is no older than that by its
own ``ts``: a live one's age by ``ts`` would be the clocks' skew; one whose ``ts``
runs more than ``max_clock_skew_s`` ahead is refused, a clock alarm); a leaf not
heard is reserved the larger of its last budget in force and its file budget (it
may hold either). Summaries are verified by the service; here they
are only ordered: per scope, by the leaf's ``(epoch, seq)``, so a replayed or
deposed leader's summary changes nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from policies.coordination import Allocation, Leaves, SitePool, allocate
from powerd.clock_skew import DEFAULT_MAX_CLOCK_SKEW_S
from powerd.protocol import Grant, Summary
from powerd.site_limits.limits import glide_ramp_w_per_s
from powerd.topology import Topology
from powerd.topology.scope import Scope, check_scopes, leaf_pool_w, scoped
from powerd.vocabulary import PROTOCOL_VERSION

log = logging.getLogger("powerd.coordinator")


@dataclass
class CoordinatorCounters:
    summaries: int = 0  # taken
    summaries_stale: int = 0  # older, by (epoch, seq) or ts, than what we hold
    summaries_unknown: int = 0  # for a scope we do not coordinate
    clock_alarms: int = 0  # summaries refused: their ts ran ahead of this clock
    grants_sent: int = 0
    leaves_heard: int = 0
    leaves_silent: int = 0


@dataclass
class Period:
    """One coordination period's outcome."""

    grants: list[Grant]
    allocation: Allocation
    site_measured_w: float  # the heard leaves' measured power + the site's own overhead
    cycle_s: float  # CPU time of the decision
    counters: CoordinatorCounters = field(default_factory=CoordinatorCounters)


@dataclass(frozen=True)
class LeafSpec:
    """What the budgets file says of one leaf's scope."""

    scope: Scope
    file_budget_w: float
    limit_w: float


def leaf_specs(topology: Topology, scopes: Sequence[Scope]) -> list[LeafSpec]:
    """Every scope's file budget and limit (BudgetError unless the scopes cover every row of
    the file once and the rows' budgets are safe together)."""
    check_scopes(topology, list(scopes), whole=True)
    specs = []
    for scope in scopes:
        part = scoped(topology, scope)
        specs.append(LeafSpec(scope, float(part.budget_w[0]), float(part.limit_w[0])))
    return specs


class CoordinatorCore:
    def __init__(
        self,
        topology: Topology,
        scopes: Sequence[Scope],
        name: str,
        grant_ttl_s: float,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.specs = leaf_specs(topology, scopes)
        self.index = {spec.scope.name: k for k, spec in enumerate(self.specs)}
        self.site = SitePool(
            pool_w=leaf_pool_w(topology),
            cap_threshold=float(topology.cap_threshold[0]),
            cap_target=float(topology.cap_target[0]),
            uncap_threshold=float(topology.uncap_threshold[0]),
            ramp_w_per_s=float(topology.ramp_w_per_s[0]),
        )
        self.site_overhead_w = float(topology.overhead_w[0])
        self.site_limit_w = float(topology.limit_w[0])
        # how fast an operator's site limit brings the pool down, as a single controller
        self.glide_ramp_w_per_s = glide_ramp_w_per_s(topology.grid, self.site.ramp_w_per_s)
        self.grant_ttl_s = grant_ttl_s
        self.max_clock_skew_s = DEFAULT_MAX_CLOCK_SKEW_S
        self._monotonic = monotonic
        self._wall = wall
        n = len(self.specs)
        self.summaries: list[Summary | None] = [None] * n
        self.received_mono = np.full(n, -math.inf)
        self.file_budget_w = np.array([s.file_budget_w for s in self.specs])
        self.limit_w = np.array([s.limit_w for s in self.specs])
        self.epoch = 0
        self.seq = 0
        self.counters = CoordinatorCounters()

    @property
    def scopes(self) -> list[str]:
        return [spec.scope.name for spec in self.specs]

    def on_summary(self, summary: Summary, live: bool = True) -> bool:
        """Take a verified summary, delivered ``live`` or retained; False if it is for no
        scope of ours, not the newest, from the future or (retained) too old."""
        k = self.index.get(summary.scope)
        if k is None:
            self.counters.summaries_unknown += 1
            return False
        last = self.summaries[k]
        if last is not None and (summary.epoch, summary.seq) <= (last.epoch, last.seq):
            self.counters.summaries_stale += 1
            return False
        age_s = self._wall() - summary.ts
        if -age_s > self.max_clock_skew_s:
            self.counters.clock_alarms += 1
            return False
        if not live and age_s > self.grant_ttl_s:  # retained from a leaf long gone
            self.counters.summaries_stale += 1
            return False
        self.summaries[k] = summary
        self.received_mono[k] = self._monotonic()
        self.counters.summaries += 1
        return True

    def new_epoch(self, epoch: int) -> None:
        self.epoch, self.seq = epoch, 0

    def heard(self) -> np.ndarray:
        """(n_leaves,) bool: a summary taken within the grant TTL."""
        return (self._monotonic() - self.received_mono) <= self.grant_ttl_s

    def leaves(self) -> Leaves:
        """The allocation's view of the leaves now."""
        n = len(self.specs)
        heard = self.heard()
        fixed, predicted = np.zeros(n), np.zeros(n)
        demand, held = np.zeros((n, 3)), np.zeros((n, 3))
        budget = self.file_budget_w.copy()
        caps = np.full(n, np.nan)  # a leaf under the bands reports none
        for k, summary in enumerate(self.summaries):
            if summary is None:
                continue
            budget[k] = summary.budget_w  # in force as last reported, heard or not
            if summary.caps_in_force_w is not None:
                caps[k] = summary.caps_in_force_w
            if heard[k]:
                fixed[k], predicted[k] = summary.fixed_w, summary.predicted_w
                demand[k], held[k] = summary.demand_w, summary.held_w
        return Leaves(
            heard=heard,
            fixed_w=fixed,
            demand_w=demand,
            held_w=held,
            predicted_w=predicted,
            budget_w=budget,
            file_budget_w=self.file_budget_w,
            limit_w=self.limit_w,
            caps_in_force_w=caps,
        )

    def site_measured_w(self) -> float:
        """The heard leaves' measured power plus the site's own overhead (the newest)."""
        measured = sum(
            s.measured_w
            for s, h in zip(self.summaries, self.heard().tolist(), strict=True)
            if s is not None and h
        )
        return measured + self.site_overhead_w

    def pool_under(self, site_threshold_w: float | None) -> SitePool:
        """The site as divided this period: the leaf pool, or less under an operator's site
        limit: the leaves' budgets plus the site's own overhead within ``site_threshold_w``
        where a leaf runs to its budget (safety by caps: it reports its caps in force),
        their thresholds where every leaf runs the bands (they stop at their thresholds)."""
        if site_threshold_w is None:
            return self.site
        under_caps = any(s is not None and s.caps_in_force_w is not None for s in self.summaries)
        share = 1.0 if under_caps else self.site.cap_threshold
        limited = (site_threshold_w - self.site_overhead_w) / share
        return dataclasses.replace(self.site, pool_w=max(0.0, min(self.site.pool_w, limited)))

    def period(self, site_threshold_w: float | None = None) -> Period:
        """Allocate and build every leaf's grant; ``site_threshold_w``: an operator's site
        limit in force, as the site's capping threshold this period (None: the file's)."""
        started = time.perf_counter()
        leaves = self.leaves()
        allocation = allocate(leaves, self.pool_under(site_threshold_w))
        ts = self._wall()
        self.seq += 1
        grants = [
            Grant(
                v=PROTOCOL_VERSION,
                scope=spec.scope.name,
                coordinator=self.name,
                epoch=self.epoch,
                seq=self.seq,
                ts=ts,
                ttl_s=self.grant_ttl_s,
                budget_w=max(float(budget), 1.0),
                ramp_w_per_s=float(ramp) if math.isfinite(ramp) else None,
            )
            for spec, budget, ramp in zip(
                self.specs,
                allocation.budget_w.tolist(),
                allocation.ramp_w_per_s.tolist(),
                strict=True,
            )
        ]
        counters, self.counters = self.counters, CoordinatorCounters()
        counters.grants_sent = len(grants)
        counters.leaves_heard = int(leaves.heard.sum())
        counters.leaves_silent = len(grants) - counters.leaves_heard
        return Period(
            grants=grants,
            allocation=allocation,
            site_measured_w=self.site_measured_w(),
            cycle_s=time.perf_counter() - started,
            counters=counters,
        )
