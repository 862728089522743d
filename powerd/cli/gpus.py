"""``powerd gpus``: what the agent reads from this node's GPUs (powerd.gpu.listing)."""

from __future__ import annotations

import click

from powerd.cli.options import setup_logging, simulate_option
from powerd.gpu import GpuError


@click.command("gpus", short_help="What the agent reads from this node's GPUs (read-only).")
@simulate_option("Simulated GPUs instead of NVML, e.g. 4xH100.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per GPU instead of a table.")
def command(simulate: str | None, as_json: bool) -> None:
    """Show what the agent reads from each GPU: power, energy, limits, clocks.

    Read-only: a quick check on a new node that NVML answers and which power
    reading (instantaneous or 1 s average) the agent will publish.

    \b
    Examples:
      powerd gpus                          # this node's GPUs, through NVML
      powerd gpus --simulate 4xH100 --json
    """
    from powerd.gpu.listing import json_lines, read_gpus, table_lines

    setup_logging("warning")
    try:
        rows = read_gpus(simulate)
    except (GpuError, ValueError) as exc:  # ValueError: a --simulate spec that does not parse
        raise click.ClickException(str(exc)) from None
    if as_json:
        for line in json_lines(rows):
            click.echo(line)
        return
    table, errors = table_lines(rows)
    for line in table:
        click.echo(line)
    for error in errors:
        click.echo(error, err=True)
