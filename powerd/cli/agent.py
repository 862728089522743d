"""``powerd agent``: the node agent (powerd.agent.startup runs it)."""

from __future__ import annotations

from pathlib import Path

import click

from powerd.agent.config import AgentConfig, load_config
from powerd.cli.options import (
    broker_option,
    cluster_option,
    config_option,
    log_level_option,
    metrics_listen_option,
    setup_logging,
    simulate_option,
)
from powerd.click_types import Quantity
from powerd.configfile import ConfigError
from powerd.gpu import GpuError


@click.command("agent", short_help="The node agent (a systemd service on every GPU node).")
@config_option("Agent config file (TOML). Without it: defaults, node name from the hostname.")
@broker_option()
@cluster_option()
@click.option("--node", help="This node's name [default: short hostname].")
@click.option(
    "--controller-scope",
    metavar="NAME",
    help="Follow the leaf controllers of this scope (a tree of controllers: `powerd controller "
    "--scope NAME:ROWS`) instead of the site's single controller. Replaces "
    "agent.controller_scope.",
)
@simulate_option("Simulated GPUs instead of NVML, for example 4xH100, 8xGB200, 2xA100.")
@click.option(
    "--period-s",
    type=Quantity("s"),  # the config checks the range
    help="Telemetry and safety-check period. Replaces agent.period_s "
    f"[default: {AgentConfig.period_s:g}].",
)
@click.option(
    "--failsafe-after-s",
    type=Quantity("s"),  # the config checks the range
    help="Failsafe caps after this long without a controller heartbeat. Replaces "
    f"agent.failsafe_after_s [default: {AgentConfig.failsafe_after_s:g}].",
)
@click.option(
    "--on-exit",
    type=click.Choice(["keep", "restore"]),
    help="On stop, keep the current caps (safe on an oversubscribed site) or restore defaults. "
    f"Replaces agent.on_exit [default: {AgentConfig.on_exit}].",
)
@click.option(
    "--trust",
    "trust",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Public key file (PEM) of a controller to obey; repeat while a key rotates. "
    "Replaces trust.controller_keys. Commands and heartbeats signed by no trusted key "
    "are rejected.",
)
@click.option(
    "--software-smoothing/--no-software-smoothing",
    default=None,
    help="GPUs without hardware power smoothing take the controller's grid smoothing profile "
    "in software: the jobs on this node fill their waits as told (powerd.jobhook.FillFollower)."
    " Replaces agent.software_smoothing [default: off].",
)
@click.option(
    "--local",
    "local_mode",
    is_flag=True,
    default=None,
    help="No controller: hold the failsafe caps and publish telemetry only.",
)
@metrics_listen_option(9470)
@log_level_option()
def command(
    config_path: Path | None,
    broker: str | None,
    cluster: str | None,
    node: str | None,
    controller_scope: str | None,
    simulate: str | None,
    period_s: float | None,
    failsafe_after_s: float | None,
    on_exit: str | None,
    trust: tuple[Path, ...],
    software_smoothing: bool | None,
    local_mode: bool | None,
    metrics_listen: str | None,
    log_level: str,
) -> None:
    """Run the node agent.

    At start, before connecting anywhere, it applies the failsafe caps. Then it
    publishes telemetry every period, applies the caps and clock locks the
    controller sends (clamped to each GPU's range, acknowledged with read-back
    values), and falls back to the failsafe caps when the controller's
    heartbeat or the last command's TTL runs out. SIGTERM or SIGINT stops it
    cleanly: offline status published, caps kept or restored (--on-exit).

    It obeys only commands and heartbeats signed by a controller key it trusts
    (--trust or trust.controller_keys; `powerd keys generate` makes a pair).

    Run it as root on a GPU node: NVML only lets root set power limits and
    lock clocks.

    \b
    Examples:
      powerd agent --config /etc/powerd/agent.toml
      powerd keys generate /tmp/ctl && \\
        powerd agent --simulate 4xH100 --broker mqtt://localhost --trust /tmp/ctl.pub
      powerd agent --simulate 2xA100 --local      # telemetry only, failsafe caps held
    """
    from powerd.agent.startup import start_agent

    setup_logging(log_level)
    try:
        config = load_config(config_path).with_overrides(
            broker=broker,
            cluster=cluster,
            node=node,
            controller_scope=controller_scope,
            simulate=simulate,
            period_s=period_s,
            failsafe_after_s=failsafe_after_s,
            on_exit=on_exit,
            mode="local" if local_mode else None,
            software_smoothing=software_smoothing,
            controller_keys=tuple(str(p) for p in trust) or None,
            metrics_listen=metrics_listen,
        )
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        start_agent(config)
    except (GpuError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
