"""The coordinator's series: leadership, the site's power and operator limit, silent
leaves, refusals. The period's values come from the last period (``on_period``); the
leadership and counts are read at each scrape."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from powerd.metrics.readings import LeaderReading


@dataclass(frozen=True)
class CoordinatorPeriod:
    site_power_w: float  # the heard leaves' measured power and the site's overhead
    leaves_stale: int  # leaves whose summary is too old to count (silent)


class CoordinatorMetrics(Collector):
    def __init__(self, coordinator: str, live: Callable[[], LeaderReading]) -> None:
        self.coordinator = coordinator
        self._live = live
        self._period: CoordinatorPeriod | None = None

    def on_period(self, period: CoordinatorPeriod) -> None:
        self._period = period

    def collect(self) -> Iterator[Metric]:
        return iter(coordinator_families(self.coordinator, self._live(), self._period))


def coordinator_families(
    coordinator: str, live: LeaderReading, period: CoordinatorPeriod | None
) -> list[Metric]:
    """The contract's coordinator series (docs/OPERATIONS.md, "Metrics"); the period's
    only while leading, NaN before the first period."""
    out: list[Metric] = []
    leading = period if live.leader else None

    def add(family: GaugeMetricFamily | CounterMetricFamily, value: float | None) -> None:
        family.add_metric([coordinator], math.nan if value is None else float(value))
        out.append(family)

    labels = ["coordinator"]
    add(GaugeMetricFamily("powerd_coordinator_leader", "1 while leading", labels=labels),
        float(live.leader))  # fmt: skip
    add(GaugeMetricFamily("powerd_coordinator_epoch", "Its leadership epoch", labels=labels),
        live.epoch)  # fmt: skip
    add(
        GaugeMetricFamily(
            "powerd_coordinator_site_power_watts",
            "The site's measured power: heard leaves and the site's overhead",
            labels=labels,
        ),
        None if leading is None else leading.site_power_w,
    )
    add(
        GaugeMetricFamily(
            "powerd_coordinator_site_limit_watts",
            "The operator's site limit in force (NaN: none)",
            labels=labels,
        ),
        live.site_limit_w,
    )
    add(
        GaugeMetricFamily(
            "powerd_coordinator_leaves_stale",
            "Leaf controllers whose summary is too old to count",
            labels=labels,
        ),
        None if leading is None else leading.leaves_stale,
    )
    add(
        CounterMetricFamily(
            "powerd_coordinator_rejected_signatures",
            "Payloads refused: unsigned, forged or malformed",
            labels=labels,
        ),
        live.rejected_signatures,
    )
    add(
        CounterMetricFamily(
            "powerd_coordinator_site_limits_refused",
            "Signed site limits refused (stale, replayed, from the future)",
            labels=labels,
        ),
        live.site_limits_refused,
    )
    return out
