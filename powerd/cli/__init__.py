"""The ``powerd`` command: ``agent``, ``controller``, ``gpus``, ``demo``, ``fleet``, ...

Each subcommand lives in its own module (``powerd/cli/*.py``): it parses its
options, calls its component and turns errors into click exits. This file
only groups them; ``powerd --help`` lists them from the group itself (click's
Commands section, each command's ``short_help``), so the list cannot drift.
A command that needs an extra (demo, recorder) imports it inside its function,
so ``powerd --help`` and ``powerd agent`` run on the core install.
"""

from __future__ import annotations

import click

from powerd import __version__
from powerd.cli.agent import command as agent_command
from powerd.cli.controller import command as controller_command
from powerd.cli.coordinator import command as coordinator_command
from powerd.cli.dashboards import command as dashboards_command
from powerd.cli.demo import command as demo_command
from powerd.cli.fleet import command as fleet_command
from powerd.cli.gpus import command as gpus_command
from powerd.cli.job import group as job_group
from powerd.cli.keys import group as keys_group
from powerd.cli.limit import group as limit_group
from powerd.cli.reference import group as reference_group
from powerd.cli.site import group as site_group
from powerd.cli.status import command as status_command
from powerd.cli.unit import group as unit_group


@click.group(
    context_settings={
        "help_option_names": ["-h", "--help"],
        "max_content_width": 100,
        "show_default": True,  # every subcommand's options show their defaults
    }
)
@click.version_option(__version__, prog_name="powerd")
def main() -> None:
    """powerd: power management for GPU training clusters.

    Commands lists every subcommand; `powerd COMMAND --help` explains one,
    with examples. The wire protocol is in docs/PROTOCOL.md.

    \b
    Examples:
      powerd demo                          # the whole loop on this machine, no servers
      powerd gpus --simulate 4xH100        # what the agent would read
      powerd unit agent > /etc/systemd/system/powerd-agent.service
      powerd controller --help
    """


main.add_command(agent_command)
main.add_command(controller_command)
main.add_command(coordinator_command)
main.add_command(demo_command)
main.add_command(fleet_command)
main.add_command(dashboards_command)
main.add_command(gpus_command)
main.add_command(unit_group)
main.add_command(keys_group)
main.add_command(limit_group)
main.add_command(status_command)
main.add_command(reference_group)
main.add_command(site_group)
main.add_command(job_group)

__all__ = ["main"]
