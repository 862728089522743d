"""The coordinator's ``/metrics`` (``powerd.metrics.coordinator``) fed from its service:
once a period, and leadership and counts at each scrape."""

from __future__ import annotations

from powerd.coordinator.core import Period
from powerd.coordinator.service import CoordinatorService
from powerd.metrics.coordinator import CoordinatorMetrics, CoordinatorPeriod
from powerd.metrics.readings import LeaderReading
from powerd.metrics.server import MetricsServer, serve


class CoordinatorFeed:
    """Hands ``metrics`` each period of ``service`` (a period listener)."""

    def __init__(self, service: CoordinatorService) -> None:
        self.service = service
        self.metrics = CoordinatorMetrics(service.config.name, self.live)
        self._site_limit_w: float | None = None  # in force at the last period
        service.period_listeners.append(self.on_period)

    def live(self) -> LeaderReading:
        service = self.service
        return LeaderReading(
            leader=service.leadership.leading,
            epoch=service.leadership.epoch,
            rejected_signatures=service.rejected,
            site_limit_w=self._site_limit_w if service.leadership.leading else None,
            site_limits_refused=service.site_limits.refused,
        )

    def on_period(self, period: Period) -> None:
        service = self.service
        self._site_limit_w = service.site_limits.active_w(service._monotonic())
        self.metrics.on_period(
            CoordinatorPeriod(period.site_measured_w, period.counters.leaves_silent)
        )


def serve_coordinator(service: CoordinatorService, listen: str) -> MetricsServer | None:
    """The coordinator's ``/metrics`` on ``listen`` (None if it cannot be bound: logged)."""
    return serve(CoordinatorFeed(service).metrics, listen, "coordinator")
