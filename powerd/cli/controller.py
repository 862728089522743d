"""``powerd controller``: the cluster controller (powerd.controller.app runs it)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import click

from powerd.cli.options import (
    broker_option,
    budgets_option,
    cluster_option,
    config_option,
    log_level_option,
    metrics_listen_option,
    record_option,
    setup_logging,
    signing_key_option,
)
from powerd.click_types import Quantity
from powerd.configfile import ConfigError


@click.command(
    "controller",
    short_help="The cluster controller: keeps every rack, row and the site in budget.",
)
@config_option("Controller config file (TOML). Without it: defaults (broker mqtt://localhost).")
@budgets_option("Budget tree (TOML, docs/BUDGETS.md): site, rows, racks, nodes and their budgets.")
@broker_option()
@cluster_option()
@click.option("--name", help="This controller's name [default: short hostname].")
@click.option(
    "--scope",
    metavar="ROW|NAME:ROW,ROW",
    help="Run as a leaf of a tree of controllers: manage only these rows of the budgets file "
    "(their agents set controller_scope = NAME), under budgets granted by `powerd "
    "coordinator` (--coordinator-key), falling back to the rows' file budgets. Replaces "
    "controller.scope.",
)
@click.option(
    "--cycle-s",
    type=Quantity("s"),  # the config checks the range
    help="Control period. Replaces controller.cycle_s [default: 1].",
)
@record_option("Record telemetry here, instead of the config's [recorder].")
@signing_key_option(
    "The controller role's private key (PEM; `powerd keys generate`): every command and "
    "heartbeat is signed with it. Replaces trust.signing_key."
)
@click.option(
    "--coordinator-key",
    "coordinator_keys",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --scope: the site coordinator's public key (PEM), the only kind whose grants "
    "count; repeatable. Replaces trust.coordinator_keys.",
)
@click.option(
    "--grid-smoothing/--no-grid-smoothing",
    default=None,
    help="Ask every GPU with power smoothing (hardware, or software on agents with "
    "agent.software_smoothing) for its share of the budgets file's [site.grid] ramps and "
    "floor. Replaces controller.grid_smoothing [default: off].",
)
@click.option(
    "--no-record",
    is_flag=True,
    help="Record nothing [default: record, to --record, else the config's [recorder], else "
    "telemetry.lp in the state directory].",
)
@metrics_listen_option(9471)
@log_level_option()
def command(
    config_path: Path | None,
    budgets_path: Path,
    broker: str | None,
    cluster: str | None,
    name: str | None,
    scope: str | None,
    cycle_s: float | None,
    record: str | None,
    signing_key: Path | None,
    coordinator_keys: tuple[Path, ...],
    grid_smoothing: bool | None,
    no_record: bool,
    metrics_listen: str | None,
    log_level: str,
) -> None:
    """Run the cluster controller.

    Every cycle it sums the agents' telemetry up the budget tree (node, rack,
    row, site), caps the GPUs of any tree node above its capping threshold
    down to its target (low-priority jobs first, then the GPUs drawing most),
    hands watts back gradually below the uncapping threshold within every
    level's ramp limit, locks SM clocks during communication phases, and sends
    each node a command only when its caps change. A silent or offline node
    counts at its failsafe power.

    It leads with an epoch one above the highest it finds in the retained
    heartbeat, and steps down when it sees a newer one: a second controller
    started with the same settings is a standby that takes over when the
    leader goes silent.

    Every command and heartbeat is signed with the role's private key
    (--signing-key); agents obey only keys they trust.

    With --scope it is a leaf of a tree of controllers (sites past one
    process): it manages the nodes of its rows only, heartbeats on the scope's
    topic, reports a summary to the site coordinator every cycle and holds the
    budget the coordinator grants it (verified with trust.coordinator_keys), or
    its rows' file budgets when no grant is live. Grants count only when
    signed by a coordinator key (--coordinator-key, trust.coordinator_keys).
    docs/CONTROLLER.md, "A tree of controllers".

    \b
    Examples:
      powerd controller --config /etc/powerd/controller.toml --budgets /etc/powerd/budgets.toml
      powerd keys generate /tmp/ctl && powerd controller --signing-key /tmp/ctl.key \\
        --budgets powerd/data/budgets/demo.toml --broker mqtt://localhost --record /tmp/ctl.lp
      powerd controller --signing-key /tmp/ctl.key --budgets powerd/data/budgets/tiny.toml \\
        --record 'influx1+http://localhost:8086?db=powerd'       # InfluxDB 1.x
      powerd controller --signing-key /tmp/ctl.key --budgets powerd/data/budgets/tree-3rows.toml \\
        --scope row1 --coordinator-key /tmp/coord.pub           # a leaf of a tree
    """
    from powerd.controller.app import run_controller
    from powerd.controller.config import load_controller_config
    from powerd.extras import MissingExtra
    from powerd.topology import BudgetError

    setup_logging(log_level)
    try:
        config = load_controller_config(config_path).with_overrides(
            broker=broker,
            cluster=cluster,
            name=name,
            scope=scope,
            cycle_s=cycle_s,
            signing_key=None if signing_key is None else str(signing_key),
            coordinator_keys=tuple(str(p) for p in coordinator_keys) or None,
            grid_smoothing=grid_smoothing,
            metrics_listen=metrics_listen,
        )
        config.verifier(config.signer())  # an unusable key, or one in two roles, stops us
        config.grant_verifier()  # and an unreadable coordinator key
        if record is not None and no_record:
            raise ConfigError("give --record or --no-record, not both")
        if record is not None:
            is_url = "://" in record
            config = config.with_overrides(
                recorder=dataclasses.replace(
                    config.recorder,
                    enabled=True,
                    url=record if is_url else None,
                    file=None if is_url else record,
                )
            )
        if no_record:
            config = config.with_overrides(
                recorder=dataclasses.replace(config.recorder, enabled=False)
            )
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        asyncio.run(run_controller(config, budgets_path))
    except (BudgetError, OSError, ValueError, MissingExtra) as exc:
        raise click.ClickException(str(exc)) from None
