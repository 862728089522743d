"""Putting a controller together: budgets file + configuration -> a runnable service."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from pathlib import Path

from powerd.controller.config import ControllerConfig
from powerd.controller.core import ControllerCore
from powerd.controller.records import Records
from powerd.controller.scoping import LeafGrants
from powerd.controller.service import ControllerService
from powerd.controller.smoothing import file_tree_in_force, grid_ramp_w_per_s, grid_smoothing
from powerd.metrics.serving import Endpoint, serving
from powerd.protocol import GpuSmoothing
from powerd.recorder import Recorder, open_recorder
from powerd.signing import Signer
from powerd.topology import BudgetError, Topology, load_budgets
from powerd.topology.checks import log_budget_warnings
from powerd.topology.scope import scoped

log = logging.getLogger("powerd.controller")


def open_configured_recorder(config: ControllerConfig) -> Recorder | None:
    """The recorder the configuration names: InfluxDB URL, a file, the default file, or none.

    With neither ``recorder.url`` nor ``recorder.file`` set, points go to
    ``telemetry.lp`` in the state directory (``powerd.recorder.default_file_path``),
    which ``powerplan profiles`` reads; ``recorder.enabled = false`` records nothing.
    """
    rec = config.recorder
    if not rec.enabled:
        return None
    if rec.url:
        return open_recorder(rec.url, token_file=rec.token_file)
    return open_recorder(
        Path(rec.file).expanduser() if rec.file else None,
        max_bytes=round(rec.file_max_mb * 1e6) if rec.file_max_mb > 0 else None,
        keep=int(rec.file_keep),
    )


def build_service(
    config: ControllerConfig,
    topology: Topology,
    recorder: Recorder | None = None,
    signer: Signer | None = None,
) -> ControllerService:
    """``signer``: the role's key; by default ``config.signing_key``'s. With a scope in
    ``config``, ``topology`` is the whole budgets file and the controller manages its scope
    (``scoped``: BudgetError if the scope or the rows' budgets do not fit the file)."""
    scope = config.parsed_scope()
    settings = config.settings()
    if topology.grid is not None:
        settings = dataclasses.replace(settings, ramp_window_s=float(topology.grid.window_s))
    if config.grid_smoothing:  # the share of the whole site's GPUs, before any scope
        settings = dataclasses.replace(settings, smoothing=grid_smoothing(topology))
    leaf = None
    tree = topology.tree
    if scope is not None:
        topology = scoped(topology, scope)
        bound = grid_ramp_w_per_s(settings.smoothing, topology.tree.n_gpus)
        leaf = LeafGrants(
            scope.name,
            topology,
            max_ramp_w_per_s=bound,
            max_clock_skew_s=config.max_clock_skew_s,
        )
        tree = leaf.tree_for(0.0)  # no grant yet: the file's budget, at most its ramp bound
    else:  # the site's single controller: the grid's ramp where the caps bound the rise
        tree = file_tree_in_force(topology, config.grid_smoothing, settings.policy.safety_by_caps)
    core = ControllerCore(tree, settings)
    records = None
    if recorder is not None:
        records = Records(
            config.cluster, topology, config.name, fine_every_s=config.recorder.fine_every_s
        )
    return ControllerService(
        config,
        core,
        recorder=recorder,
        records=records,
        signer=signer,
        leaf=leaf,
        topology=topology,
    )


def load_for(config: ControllerConfig, budgets_path: Path) -> tuple[Topology, GpuSmoothing | None]:
    """The budgets file as this controller manages it: whole, or its scope; and the grid
    smoothing profile it asks for, if any (BudgetError)."""
    topology = load_budgets(budgets_path)
    log_budget_warnings(topology, log)
    smoothing = grid_smoothing(topology) if config.grid_smoothing else None
    scope = config.parsed_scope()
    return (topology if scope is None else scoped(topology, scope)), smoothing


async def reload_budgets(service: ControllerService, budgets_path: Path) -> str | None:
    """SIGHUP: load the budgets file again and put it in force; why not, if it cannot be
    (a file that does not load, or changes what only a restart may). Loaded in a thread:
    the 150 MW file takes ~0.3 s, and the control loop must not wait for it."""
    try:
        new, smoothing = await asyncio.to_thread(load_for, service.config, budgets_path)
    except (BudgetError, OSError) as exc:
        why = str(exc) if isinstance(exc, BudgetError) else f"{budgets_path}: {exc}"
        log.error("budgets reload refused: %s; the running budgets stay in force", why)
        return why
    return service.reload(new, smoothing)


async def run_controller(config: ControllerConfig, budgets_path: Path) -> None:
    """Load the budgets, run until SIGTERM/SIGINT (reloading the budgets on SIGHUP), close
    the recorder."""
    topology = load_budgets(budgets_path)
    log_budget_warnings(topology, log)
    scope = config.parsed_scope()
    if scope is not None:
        scoped(topology, scope)  # a scope that does not fit fails before the recorder opens
    recorder = open_configured_recorder(config)
    service = build_service(config, topology, recorder)
    managed = service.core.tree
    log.info(
        "powerd controller %s: cluster %s, %s%s (%d nodes, %d GPUs, %s budget %.0f kW), "
        "broker %s, recorder %s",
        config.name,
        config.cluster,
        budgets_path,
        "" if scope is None else f", scope {scope}",
        managed.n_servers,
        managed.n_gpus,
        "site" if scope is None else "file",
        managed.budget_w[0] / 1e3,
        config.broker.display,
        "none" if recorder is None else type(recorder).__name__,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reloads: set[asyncio.Task[str | None]] = set()  # held until done (asyncio keeps weak refs)

    def on_sighup() -> None:
        log.info("SIGHUP: reloading %s", budgets_path)
        task = loop.create_task(reload_budgets(service, budgets_path))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, on_sighup)

    def start_metrics(listen: str) -> Endpoint | None:
        from powerd.controller.metrics_feed import serve_controller

        return serve_controller(service, listen)

    with serving(config.metrics_listen, start_metrics):
        await service.run(stop)
