"""``powerd unit agent|controller|coordinator``: print the systemd units (powerd.systemd)."""

from __future__ import annotations

from collections.abc import Callable

import click

from powerd.cli.options import exec_option
from powerd.systemd import (
    HIDDEN_FROM_UNITS,
    hidden_install_paths,
    render_agent_unit,
    render_controller_unit,
    render_coordinator_unit,
    this_executable,
)


def allow_hidden_option() -> Callable[[Callable[..., None]], Callable[..., None]]:
    return click.option(
        "--allow-hidden-path",
        is_flag=True,
        help="Print the unit even when ExecStart lies where its hardening hides it "
        f"({', '.join(HIDDEN_FROM_UNITS)}): for a unit edited by hand afterwards.",
    )


def reachable_exec(exec_path: str | None, allow_hidden: bool) -> str:
    """The ExecStart path (--exec, else this installation), refused where the unit's
    ProtectHome/PrivateTmp hide it from the service."""
    path = exec_path or this_executable()
    hidden = hidden_install_paths(path)
    if hidden and not allow_hidden:
        raise click.ClickException(
            f"ExecStart would be {path}, and the unit cannot reach {' nor '.join(hidden)}: "
            "its hardening (ProtectHome=yes hides /home, /root and /run/user; "
            "PrivateTmp=yes empties /tmp and /var/tmp) makes the service fail with "
            "'No such file or directory' at start. "
            "Install powerd where services can reach it (python3 -m venv /opt/powerd && "
            "/opt/powerd/bin/pip install powerd, then /opt/powerd/bin/powerd unit ...), or "
            "pass --exec PATH of such an install; --allow-hidden-path prints the unit anyway."
        )
    return path


@click.group(
    "unit", short_help="Print the systemd unit of the agent, the controller or the coordinator."
)
def group() -> None:
    """Print systemd units shipped with powerd, ExecStart pointing at this installation.

    An install under /home, /root, /run/user or /tmp is refused: the units' ProtectHome
    and PrivateTmp hide it from the service (install under /opt or /usr/local).

    \b
    Examples:
      powerd unit agent > /etc/systemd/system/powerd-agent.service
      powerd unit controller --scoped > /etc/systemd/system/powerd-controller@.service
    """


@group.command("agent", short_help="The agent's unit (powerd-agent.service).")
@exec_option()
@allow_hidden_option()
@click.option("--config", "config_path", default="/etc/powerd/agent.toml", show_default=True)
def agent(exec_path: str | None, allow_hidden_path: bool, config_path: str) -> None:
    """Print the agent's unit file, ExecStart pointing at this installation.

    \b
    Examples:
      powerd unit agent > /etc/systemd/system/powerd-agent.service
      systemctl daemon-reload && systemctl enable --now powerd-agent
    """
    exec_path = reachable_exec(exec_path, allow_hidden_path)
    click.echo(render_agent_unit(exec_path, config_path), nl=False)


@group.command(
    "controller",
    short_help="The controller's unit (powerd-controller.service, or @.service: --scoped).",
)
@exec_option()
@allow_hidden_option()
@click.option("--config", "config_path", default="/etc/powerd/controller.toml", show_default=True)
@click.option("--budgets", "budgets_path", default="/etc/powerd/budgets.toml", show_default=True)
@click.option(
    "--signing-key",
    "key_path",
    default="/etc/powerd/controller.key",
    show_default=True,
    help="The role's private key (root-only): passed to the service as a systemd credential.",
)
@click.option(
    "--scoped",
    is_flag=True,
    help="The template unit of the leaf controllers of a tree of controllers "
    "(powerd-controller@.service: the instance is the scope).",
)
def controller(
    exec_path: str | None,
    allow_hidden_path: bool,
    config_path: str,
    budgets_path: str,
    key_path: str,
    scoped: bool,
) -> None:
    """Print the controller's unit file, ExecStart pointing at this installation.

    \b
    Examples:
      powerd unit controller > /etc/systemd/system/powerd-controller.service
      systemctl daemon-reload && systemctl enable --now powerd-controller
      # a leaf controller per scope (a tree of controllers):
      powerd unit controller --scoped > /etc/systemd/system/powerd-controller@.service
      systemctl daemon-reload && systemctl enable --now powerd-controller@row01
    """
    exec_path = reachable_exec(exec_path, allow_hidden_path)
    unit = render_controller_unit(exec_path, config_path, budgets_path, key_path, scoped=scoped)
    click.echo(unit, nl=False)


@group.command(
    "coordinator", short_help="The site coordinator's unit (powerd-coordinator.service)."
)
@exec_option()
@allow_hidden_option()
@click.option("--config", "config_path", default="/etc/powerd/coordinator.toml", show_default=True)
@click.option("--budgets", "budgets_path", default="/etc/powerd/budgets.toml", show_default=True)
@click.option(
    "--signing-key",
    "key_path",
    default="/etc/powerd/coordinator.key",
    show_default=True,
    help="The coordinator's private key (root-only): passed as a systemd credential.",
)
def coordinator(
    exec_path: str | None,
    allow_hidden_path: bool,
    config_path: str,
    budgets_path: str,
    key_path: str,
) -> None:
    """Print the site coordinator's unit file, ExecStart pointing at this installation.

    \b
    Examples:
      powerd unit coordinator > /etc/systemd/system/powerd-coordinator.service
      systemctl daemon-reload && systemctl enable --now powerd-coordinator
    """
    exec_path = reachable_exec(exec_path, allow_hidden_path)
    click.echo(render_coordinator_unit(exec_path, config_path, budgets_path, key_path), nl=False)
