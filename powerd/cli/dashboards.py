"""``powerd dashboards``: the Grafana dashboards, built from the telemetry schema."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command("dashboards", short_help="Write or check the Grafana dashboards' JSON.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("grafana/dashboards"),
    show_default=True,
    help="Directory to write the dashboard JSON files to.",
)
@click.option(
    "--check", is_flag=True, help="Write nothing; exit 1 if a file differs from what is built."
)
def command(out_dir: Path, check: bool) -> None:
    """Build the Grafana dashboards from the telemetry schema (grafana/README.md).

    Every measurement, field and tag the dashboards query comes from
    powerd/telemetry_schema.py, so the dashboards and the writer cannot drift
    apart; edit powerd/grafana/dashboards.py, not the JSON.

    \b
    Examples:
      powerd dashboards --check       # in the repository: are grafana/dashboards/ up to date?
      powerd dashboards --out /var/lib/grafana/dashboards/powerd
    """
    from powerd.grafana.dashboards import stale, write_all

    if check:
        differ = stale(out_dir)
        if differ:
            click.echo(f"out of date in {out_dir}: {', '.join(differ)} (run powerd dashboards)")
            sys.exit(1)
        click.echo(f"{out_dir}: up to date")
        return
    for path in write_all(out_dir):
        click.echo(f"wrote {path}")
