"""Putting a coordinator together: budgets file + configuration -> a runnable service."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from powerd.coordinator.config import CoordinatorConfig
from powerd.coordinator.core import CoordinatorCore
from powerd.coordinator.service import CoordinatorService
from powerd.metrics.serving import Endpoint, serving
from powerd.signing import Signer
from powerd.topology import Topology, load_budgets
from powerd.topology.checks import log_budget_warnings

log = logging.getLogger("powerd.coordinator")


def build_coordinator(
    config: CoordinatorConfig, topology: Topology, signer: Signer | None = None
) -> CoordinatorService:
    """BudgetError if the scopes do not cover the file's rows once each, or the rows' budgets
    are not safe together (powerd.topology.scope)."""
    core = CoordinatorCore(
        topology, config.parsed_scopes(topology), config.name, config.grant_ttl_s
    )
    return CoordinatorService(config, core, signer=signer)


async def run_coordinator(config: CoordinatorConfig, budgets_path: Path) -> None:
    """Load the budgets, run until SIGTERM/SIGINT."""
    topology = load_budgets(budgets_path)
    log_budget_warnings(topology, log)
    service = build_coordinator(config, topology)
    core = service.core
    log.info(
        "powerd coordinator %s: cluster %s, %s, %d leaves, pool %.0f kW of site budget "
        "%.0f kW, period %g s, grant ttl %g s, broker %s",
        config.name,
        config.cluster,
        budgets_path,
        len(core.specs),
        core.site.pool_w / 1e3,
        topology.budget_w[0] / 1e3,
        config.period_s,
        config.grant_ttl_s,
        config.broker.display,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def start_metrics(listen: str) -> Endpoint | None:
        from powerd.coordinator.metrics_feed import serve_coordinator

        return serve_coordinator(service, listen)

    with serving(config.metrics_listen, start_metrics):
        await service.run(stop)
