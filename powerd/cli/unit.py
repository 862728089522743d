"""``powerd unit agent|controller``: print the systemd units (powerd.systemd renders them)."""

from __future__ import annotations

import click

from powerd.cli.options import exec_option
from powerd.systemd import render_agent_unit, render_controller_unit, this_executable


@click.group("unit")
def group() -> None:
    """Print systemd units shipped with powerd."""


@group.command("agent")
@exec_option()
@click.option("--config", "config_path", default="/etc/powerd/agent.toml", show_default=True)
def agent(exec_path: str | None, config_path: str) -> None:
    """Print the agent's unit file, ExecStart pointing at this installation.

    \b
    powerd unit agent > /etc/systemd/system/powerd-agent.service
    systemctl daemon-reload && systemctl enable --now powerd-agent
    """
    click.echo(render_agent_unit(exec_path or this_executable(), config_path), nl=False)


@group.command("controller")
@exec_option()
@click.option("--config", "config_path", default="/etc/powerd/controller.toml", show_default=True)
@click.option("--budgets", "budgets_path", default="/etc/powerd/budgets.toml", show_default=True)
@click.option(
    "--signing-key",
    "key_path",
    default="/etc/powerd/controller.key",
    show_default=True,
    help="The role's private key (root-only): passed to the service as a systemd credential.",
)
def controller(exec_path: str | None, config_path: str, budgets_path: str, key_path: str) -> None:
    """Print the controller's unit file, ExecStart pointing at this installation.

    \b
    powerd unit controller > /etc/systemd/system/powerd-controller.service
    systemctl daemon-reload && systemctl enable --now powerd-controller
    """
    click.echo(
        render_controller_unit(exec_path or this_executable(), config_path, budgets_path, key_path),
        nl=False,
    )
