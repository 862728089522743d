"""``powerd gpus``: what the agent reads from this node's GPUs (powerd.gpu.listing)."""

from __future__ import annotations

import click

from powerd.cli.options import setup_logging, simulate_option
from powerd.gpu import GpuError


@click.command(
    "gpus", short_help="What the agent reads from this node's GPUs; --check its controls."
)
@simulate_option("Simulated GPUs instead of NVML, e.g. 4xH100.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per GPU instead of a table.")
@click.option(
    "--check",
    is_flag=True,
    help="Try every control the agent uses on each GPU (a cap, a clock lock, power smoothing, "
    "a module limit) and put each back as found; exit 1 if one the agent needs fails. "
    "Changes the GPUs for about a second each: run it before the agent, as root.",
)
def command(simulate: str | None, as_json: bool, check: bool) -> None:
    """Show what the agent reads from each GPU: power, energy, limits, clocks.

    Read-only without --check: a quick look on a new node that NVML answers and
    which power reading (instantaneous or 1 s average) the agent will publish.
    With --check, each control is tried and put back: how long the device takes
    to enforce a new cap, and how long the agent's reads take (docs/HARDWARE.md).

    \b
    Examples:
      powerd gpus                          # this node's GPUs, through NVML
      powerd gpus --simulate 4xH100 --json
      sudo powerd gpus --check             # before the agent manages the node
    """
    from powerd.gpu.listing import json_lines, read_gpus, table_lines

    setup_logging("warning")
    if check:
        _check(simulate, as_json)
        return
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


def _check(simulate: str | None, as_json: bool) -> None:
    import json

    from powerd.gpu.check import check_gpu, report_lines
    from powerd.gpu.open import close_gpus, open_gpus

    try:
        gpus = open_gpus(simulate)
    except (GpuError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    try:
        checks = [check_gpu(gpu) for gpu in gpus]
    finally:
        close_gpus(gpus)
    for line in [json.dumps(c.as_dict()) for c in checks] if as_json else report_lines(checks):
        click.echo(line)
    if not all(c.ok for c in checks):
        raise SystemExit(1)
