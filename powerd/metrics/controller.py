"""The controller's series: leadership, nodes by mode, each site/row/rack's power, limit
and budget, what it dropped and refused, clocks, the cycle's length.

No per-node series: at the 150 MW site (20,736 nodes, ~2,600 racks) a node's own are on
its agent's endpoint. Each cycle the service's listener hands ``on_cycle`` a
``ControllerCycle`` (a few numpy reductions and copies: bench/bench_metrics.py); a scrape
builds the families from the last one, in the server's thread. A controller that does not
lead shows only its leadership and counts: its view of the site is not acted on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from policies.tree import LEVEL_NAMES, SERVER, over_limit_by_level
from powerd.metrics.readings import LeaderReading
from powerd.vocabulary import STALE


@dataclass(frozen=True)
class ControllerCycle:
    """One cycle, as the endpoint shows it. The level arrays are by tree node of the
    site, row and rack levels (``level_index``), in the tree's order."""

    nodes_by_mode: Mapping[str, int]  # MODES and STALE
    level: np.ndarray  # level codes: SITE, ROW or RACK (policies.tree)
    name: tuple[str, ...]
    power_w: np.ndarray
    limit_w: np.ndarray
    budget_w: np.ndarray  # the capping threshold in force
    cycle_s: float
    ingest_dropped_total: int
    clock_skew_s: float | None
    nodes_skewed: int


def level_index(level: np.ndarray) -> np.ndarray:
    """The tree nodes above the servers: the site, its rows and racks."""
    index: np.ndarray = np.flatnonzero(level < SERVER)
    return index


class ControllerMetrics(Collector):
    """The controller's collector: ``live`` read at each scrape, the cycle's series from
    the last ``on_cycle``."""

    def __init__(self, controller: str, scope: str, live: Callable[[], LeaderReading]) -> None:
        self.labels = {"controller": controller, "scope": scope}
        self._live = live
        self._cycle: ControllerCycle | None = None

    def on_cycle(self, cycle: ControllerCycle) -> None:
        self._cycle = cycle  # one reference swapped: a scrape sees the old or the new whole

    def collect(self) -> Iterator[Metric]:
        return iter(controller_families(self.labels, self._live(), self._cycle))


def controller_families(
    labels: Mapping[str, str], live: LeaderReading, cycle: ControllerCycle | None
) -> list[Metric]:
    """The contract's controller series (docs/OPERATIONS.md, "Metrics")."""
    keys, values = list(labels), list(labels.values())
    out: list[Metric] = []

    def gauge(name: str, doc: str, value: float | None) -> None:
        family = GaugeMetricFamily(name, doc, labels=keys)
        family.add_metric(values, math.nan if value is None else float(value))
        out.append(family)

    def counter(name: str, doc: str, value: int) -> None:
        family = CounterMetricFamily(name, doc, labels=keys)
        family.add_metric(values, float(value))
        out.append(family)

    gauge("powerd_controller_leader", "1 while this controller leads", float(live.leader))
    gauge("powerd_controller_epoch", "The leadership epoch it leads or follows", live.epoch)
    gauge(
        "powerd_controller_site_limit_watts",
        "The operator's site limit in force (NaN: none)",
        live.site_limit_w,
    )
    counter(
        "powerd_controller_rejected_signatures",
        "Payloads refused: unsigned, forged or malformed",
        live.rejected_signatures,
    )
    counter(
        "powerd_controller_site_limits_refused",
        "Signed site limits refused (stale, replayed, from the future)",
        live.site_limits_refused,
    )
    counter(
        "powerd_controller_clock_alarms",
        "Messages refused because their ts ran ahead of this clock",
        live.clock_alarms,
    )
    if cycle is None or not live.leader:
        return out
    counter(
        "powerd_controller_ingest_dropped",
        "Telemetry samples replaced by a newer one before they were decoded",
        cycle.ingest_dropped_total,
    )
    gauge("powerd_controller_cycle_seconds", "The last control cycle's CPU time", cycle.cycle_s)
    gauge(
        "powerd_controller_clock_skew_seconds",
        "The largest node clock skew, signed: this clock minus the node's (NaN: none heard)",
        cycle.clock_skew_s,
    )
    gauge(
        "powerd_controller_nodes_skewed",
        "Nodes whose clock is more than max_clock_skew_s off",
        cycle.nodes_skewed,
    )
    gauge(
        "powerd_controller_nodes_stale",
        "Nodes not heard for stale_after_s, or offline",
        cycle.nodes_by_mode[STALE],
    )
    by_mode = GaugeMetricFamily(
        "powerd_controller_nodes",
        "Nodes by the mode they report; stale: not heard (or offline)",
        labels=[*keys, "mode"],
    )
    for mode, count in cycle.nodes_by_mode.items():
        by_mode.add_metric([*values, mode], float(count))
    out.append(by_mode)
    out += level_families(keys, values, cycle)
    return out


def level_families(keys: list[str], values: list[str], cycle: ControllerCycle) -> list[Metric]:
    """Per site, row and rack: power, breaker limit and budget; and the count over limit."""
    level_keys = [*keys, "level", "name"]
    families: list[Metric] = []
    for metric, doc, array in (
        ("powerd_controller_level_power_watts", "Measured power", cycle.power_w),
        ("powerd_controller_level_limit_watts", "The breaker limit", cycle.limit_w),
        ("powerd_controller_level_budget_watts", "The capping threshold in force", cycle.budget_w),
    ):
        family = GaugeMetricFamily(metric, doc, labels=level_keys)
        for code, name, value in zip(cycle.level.tolist(), cycle.name, array.tolist(), strict=True):
            family.add_metric([*values, LEVEL_NAMES[code], name], value)
        families.append(family)
    over = GaugeMetricFamily(
        "powerd_controller_levels_over_limit",
        "Sites, rows or racks drawing more than their breaker limit",
        labels=[*keys, "level"],
    )
    counts = over_limit_by_level(cycle.level, cycle.power_w, cycle.limit_w)
    for level, count in zip(LEVEL_NAMES[:SERVER], counts, strict=True):
        over.add_metric([*values, level], float(count))
    families.append(over)
    return families
