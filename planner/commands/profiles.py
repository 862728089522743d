"""``powerplan profiles``: read power profiles, check them, print a summary per workload."""

from __future__ import annotations

from pathlib import Path

import click
import pandas as pd

from planner.censored import CensoredError, resolve
from planner.commands.options import capped_demand_option, profile_format_options
from planner.errors import ProfileError
from planner.output import column_mapping, emit, format_option, write_whole
from planner.profiles import read_influx, read_profiles, summarise
from powerd.recorder import read_token

OUT_SUFFIXES = (".parquet", ".pq", ".csv")


def write_table(table: pd.DataFrame, path: Path) -> None:
    """Write the normalised table whole or not at all."""
    if path.suffix.lower() == ".csv":
        write_whole(path, lambda tmp: table.to_csv(tmp, index=False))
    else:
        write_whole(path, lambda tmp: table.to_parquet(tmp, index=False))


@click.command(
    short_help="Read power profiles (CSV, Parquet, line protocol, InfluxDB), summarise them.",
    help="""Read GPU power profiles, check them, and summarise them per workload.

\b
Inputs (any mix; one table results):
  FILE.csv             a header line, then one row per GPU sample
  FILE.parquet, .pq    the same columns in Parquet
  FILE.lp, .line       InfluxDB line protocol as powerd records it (measurement gpu)
  --influx URL --query Q   InfluxQL via URL/query (--database), or Flux (a query
                       starting with from( or import; --org); the token is read from
                       --token-file, else $INFLUX_TOKEN (user:password for InfluxDB 1.x)

\b
Columns: time_s (Unix seconds or ISO-8601; no offset = UTC), node, gpu (index),
workload, power_w (W), and if present cap_w, cap_max_w, clock_mhz, phase, throughput.
powerd's own names are understood (time, job, sm_clock_mhz); map any other
with --column NAME=COLUMN (repeat it); --workload NAME names the workload of
rows without one.

\b
Checks (the error names the file and line; nothing is printed or written):
missing columns, numbers that do not parse, time in ms or finer, a GPU's
samples out of time order, power empty, NaN, infinite or negative, a GPU
whose median power is above 5000 W (mW?) or non-zero below 5 W (kW?), an empty
file, the same sample in two files.

\b
Summary, one row per workload:
  gpus, nodes, samples, duration_s
  mean_w p50_w p90_w p99_w max_w   over every GPU sample
  step_s             sampling period: median gap between a GPU's samples
  agg_*_w            the workload's total power: its GPUs summed on a step_s
                     grid (nearest bin; a GPU missing one bin keeps its value;
                     only bins where every GPU reports)
  peak_to_mean       agg p99 / agg mean: headroom a budget needs over the mean
  swings             steps where the total moves by more than 30% of its mean
                     in one step_s: synchronised swings the grid sees
  max_swing_w_per_s  the largest move of the total, W per second
  share_<phase>      share of the samples (with a known phase) in each phase
  capped_share       share of the samples capped below the GPU's maximum
  censored_share     share held at the cap (draw within 10% of it): their
                     draw only bounds demand, so every figure above is of the
                     estimated demand (--capped-demand; a warning says so)

\b
Examples:
  powerplan profiles tests/data/profiles/telemetry.lp tests/data/profiles/train.csv \\
      --workload untagged
  powerplan profiles tests/data/profiles/vendor.csv --column time_s=timestamp \\
      --column node=host --column gpu=gpu_index --column power_w=gpu_power \\
      --workload vendor --normalised-out vendor.parquet --format json
  powerplan profiles --influx http://localhost:8086 --database powerd \\
      --query 'SELECT * FROM gpu WHERE time > now() - 1d'     # what powerd recorded
""",
)
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--column",
    "column_pairs",
    multiple=True,
    metavar="NAME=COLUMN",
    help="Read normalised column NAME from the input's COLUMN (e.g. power_w=gpu_power).",
)
@click.option("--workload", help="Workload name for rows that have none.")
@profile_format_options()
@click.option("--influx", "influx_url", metavar="URL", help="InfluxDB base URL to query.")
@click.option("--query", help="InfluxQL or Flux query (with --influx).")
@click.option("--database", help="InfluxQL database (InfluxDB 1.x; a DBRP-mapped bucket in 2.x).")
@click.option("--org", help="Flux organisation (InfluxDB 2.x).")
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="File whose first line is the InfluxDB token (default: $INFLUX_TOKEN).",
)
@click.option(
    "--normalised-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the normalised table (.parquet, .pq or .csv).",
)
@capped_demand_option()
@format_option()
def command(
    files: tuple[Path, ...],
    column_pairs: tuple[str, ...],
    workload: str | None,
    influx_url: str | None,
    query: str | None,
    database: str | None,
    org: str | None,
    token_file: Path | None,
    normalised_out: Path | None,
    capped_demand: str,
    fmt: str,
) -> None:
    columns = column_mapping(column_pairs)
    if (influx_url is None) != (query is None):
        raise click.UsageError("give --influx URL and --query Q together")
    if not files and influx_url is None:
        raise click.UsageError("give profile FILEs, or --influx URL --query Q")
    if normalised_out is not None and normalised_out.suffix.lower() not in OUT_SUFFIXES:
        raise click.BadParameter(
            f"{normalised_out}: give a .parquet, .pq or .csv path", param_hint="--normalised-out"
        )
    try:
        tables = []
        if files:
            tables.append(read_profiles(files, columns=columns, workload=workload))
        if influx_url is not None and query is not None:
            token = read_token(token_file)
            tables.append(
                read_influx(
                    influx_url,
                    query,
                    token=token,
                    org=org,
                    database=database,
                    columns=columns,
                    workload=workload,
                )
            )
    except (ProfileError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    table = pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]
    table = table.sort_values(["workload", "node", "gpu", "time_s"], ignore_index=True)
    sources = [str(f) for f in files] + ([influx_url] if influx_url else [])
    try:
        resolved = resolve(table, capped_demand)
    except CensoredError as exc:
        raise click.ClickException(f"{', '.join(sources)}: {exc}") from None
    for warning in resolved.warnings:
        click.echo(f"warning: {warning}", err=True)
    summary = summarise(resolved.table).merge(
        resolved.shares[["workload", "capped_share", "censored_share"]], on="workload"
    )
    if normalised_out is not None:
        write_table(table, normalised_out)  # as read: the draw, not the estimate
    extra = {"sources": sources, "samples": len(table), "capped_demand": capped_demand}
    emit({"profiles": summary}, fmt, extra=extra)
