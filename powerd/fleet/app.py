"""``powerd fleet``: options in, a model on a runner, the report out."""

from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path
from typing import Any

from powerd.fleet.model import FleetModel, FleetOptions
from powerd.fleet.runner import FleetRunner, RunOptions
from powerd.mqtt.url import parse_broker_url
from powerd.signing import load_verifier
from powerd.topology import load_budgets
from powerd.topology.checks import log_budget_warnings
from powerd.topology.scope import parse_scope, scoped

log = logging.getLogger("powerd.fleet")


def fleet_argv(
    budgets: Path, broker_url: str, cluster: str, report_json: Path, **options: object
) -> list[str]:
    """``python -m powerd fleet`` arguments (after the interpreter) for a scale test:
    ``options`` are the command's long options (``period_s=0.5`` is ``--period-s 0.5``);
    ``log_level`` is warning unless given (info adds the line saying the fleet runs)."""
    log_level = str(options.pop("log_level", "warning"))
    argv = ["-m", "powerd", "fleet", "--budgets", str(budgets), "--broker", broker_url]
    argv += ["--cluster", cluster, "--report-json", str(report_json), "--log-level", log_level]
    for name, value in options.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def run_fleet(
    budgets_path: Path,
    broker: str,
    cluster: str,
    *,
    trust: tuple[Path, ...] = (),
    scope: str | None = None,
    nodes: int | None = None,
    period_s: float = 1.0,
    connections: int = 4,
    control_connections: int = 16,
    duration_s: float | None = None,
    base_load: float = 0.6,
    silent_fraction: float = 0.0,
    offline_fraction: float = 0.0,
    failsafe_after_s: float = 10.0,
    start: str = "fresh",
    jobs: int = 0,
    job_priority: str | None = None,
    compute_s: float = 20.0,
    communication_s: float = 3.0,
    push_every_s: float = 0.0,
    push_hold_s: float = 5.0,
    warmup_s: float = 10.0,
    seed: int = 1,
    verify_every: int = 1,
    report_json: Path | None = None,
) -> dict[str, Any]:
    """Run until ``duration_s`` or SIGTERM/SIGINT; the report's summary.

    ``trust``: the controller public keys the simulated agents obey (KeyFileError, a
    ValueError, if none can be used). ``scope`` (``ROW`` or ``NAME:ROW,ROW``): simulate
    only those rows' nodes, following that scope's leaf controllers.
    """
    topology = load_budgets(budgets_path)
    log_budget_warnings(topology, log)
    verifier = load_verifier(trust)
    scope_name = None
    if scope is not None:
        parsed = parse_scope(scope)
        topology, scope_name = scoped(topology, parsed), parsed.name
    model = FleetModel(
        topology,
        FleetOptions(
            nodes=nodes,
            base_load=base_load,
            silent_fraction=silent_fraction,
            offline_fraction=offline_fraction,
            failsafe_after_s=failsafe_after_s,
            start=start,
            jobs=jobs,
            job_priority=job_priority,
            job_prefix="fleet" if scope_name is None else f"fleet-{scope_name}",
            compute_s=compute_s,
            communication_s=communication_s,
            seed=seed,
            verify_every=verify_every,
        ),
        verifier,
        cluster,
        scope_name,
    )
    runner = FleetRunner(
        model,
        parse_broker_url(broker),
        cluster,
        RunOptions(
            period_s=period_s,
            connections=connections,
            control_connections=control_connections,
            duration_s=duration_s,
            push_every_s=push_every_s,
            push_hold_s=push_hold_s,
            warmup_s=warmup_s,
        ),
        client_id="powerd-fleet" if scope_name is None else f"powerd-fleet-{scope_name}",
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        report = runner.run(stop.is_set)
    except OSError as exc:
        raise ConnectionError(f"broker {runner.broker.display}: {exc.strerror or exc}") from None
    summary = report.summary()
    text = json.dumps(
        {
            "summary": summary,
            "pushes": report.pushes,
            "heartbeat_gaps": report.late_heartbeats(),
            "started_wall": report.started_wall,
            "site_power_w": report.site_power(),
        },
        indent=2,
    )
    if report_json is not None:
        report_json.write_text(text + "\n")
    else:
        print(text)
    return summary
