"""The controller's ``/metrics`` (``powerd.metrics.controller``) fed from its service:
once a cycle, from what the core and the cycle already hold; leadership and counts read
at each scrape."""

from __future__ import annotations

from powerd.controller.core import CycleResult
from powerd.controller.service import ControllerService
from powerd.metrics.controller import ControllerCycle, ControllerMetrics, level_index
from powerd.metrics.readings import LeaderReading
from powerd.metrics.server import MetricsServer, serve


class ControllerFeed:
    """Hands ``metrics`` each cycle of ``service`` (a cycle listener)."""

    def __init__(self, service: ControllerService) -> None:
        self.service = service
        scope = "site" if service.leaf is None else service.leaf.scope
        self.metrics = ControllerMetrics(service.config.name, scope, self.live)
        self._dropped_total = 0
        service.cycle_listeners.append(self.on_cycle)

    def live(self) -> LeaderReading:
        service = self.service
        core = service.core
        return LeaderReading(
            leader=service.leadership.leading,
            epoch=service.leadership.epoch,
            rejected_signatures=core.rejected_total,
            site_limit_w=core.site_limit_w,
            site_limits_refused=service.site_limits.refused,
            clock_alarms=core.clock_alarms,
        )

    def on_cycle(self, result: CycleResult) -> None:
        self.metrics.on_cycle(self.cycle(result))

    def cycle(self, result: CycleResult) -> ControllerCycle:
        service = self.service
        core, views = service.core, service.core.views
        tree = core.tree
        now = service._monotonic()
        self._dropped_total += result.counters.telemetry_dropped
        index = level_index(tree.level)
        names = tree.names
        return ControllerCycle(
            nodes_by_mode=views.by_mode(now, service.config.stale_after_s),
            level=tree.level[index],
            name=tuple(names[i] for i in index.tolist()) if names else tuple(map(str, index)),
            power_w=result.decision.node_power_w[index],
            limit_w=tree.limit_w[index],
            budget_w=tree.cap_threshold_w[index],
            cycle_s=result.cycle_s,
            ingest_dropped_total=self._dropped_total,
            clock_skew_s=core.node_clocks.skew_s,
            nodes_skewed=core.node_clocks.skewed,
        )


def serve_controller(service: ControllerService, listen: str) -> MetricsServer | None:
    """The controller's ``/metrics`` on ``listen`` (None if it cannot be bound: logged)."""
    return serve(ControllerFeed(service).metrics, listen, "controller")
