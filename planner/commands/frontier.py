"""``powerplan frontier``: what a site's grid spec costs in energy burnt, work lost and storage."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from planner.commands.options import placed_inputs, replay_options
from planner.commands.progress import step_progress
from planner.output import emit, format_option
from powerd.click_types import Quantity

if TYPE_CHECKING:
    import pandas as pd

TABLE_POINTS = 15  # a frontier's points in the table; JSON and the plot have every one

HELP = """Price a grid spec's ramp limits for a site and its jobs: the cheapest combinations
of energy burnt (a floor held above demand), work lost (rises held back below it) and
rack storage, each in its own unit.

\b
BUDGETS   a budgets file with a [site.grid] ramp limit (docs/BUDGETS.md)
PROFILES  profile files (as `powerplan whatif` takes them)
--mix     which jobs run (the TOML mix of `powerplan size --help`)

\b
The profiles are replayed once through the controller's policy, without smoothing
(`powerplan whatif`, same options): the site's power is the demand the grid would
see. Its frontier (policies/grid_frontier.py) is, for every amount of energy burnt,
the least demand energy any schedule within the ramp limits leaves unserved:
convex, from "least loss" (the least floor that loses nothing,
policies.grid.least_ramp_floor) to "least burn" (no floor, every rise held back).
The knee is the point where a kWh burnt saves a kWh of work (the least of the two
summed). With --storage-kj-per-rack (one or more sizes, each at
--storage-kw-per-rack), the storage is dispatched over that power as `whatif
--storage-kj-per-rack` does (policies/storage.py), the grid sees the demand plus
what the storage takes less what it gives, and the frontier is that series'; its
conversion losses count as burnt at every point. No storage is always the first.

\b
Units: a replay's joules times 86,400 / its duration, a day's. burnt_kwh_per_day:
floor_kwh_per_day + conversion_loss_kwh_per_day. lost_gpu_hours_per_day: demand
energy not served over the jobs' mean draw per GPU (their energy / their GPUs /
the duration) / 3,600 s: work counted pro rata to energy (the speed model would
say a held GPU loses less).

\b
The answer first (per storage size: least loss, knee, least burn), then every
point of each frontier; --plot FILE draws them (PNG). `powerplan whatif` says
where a replayed site sits against the same frontier.

\b
Examples:
  powerplan frontier powerd/data/budgets/demo.toml tests/data/profiles/train.csv \\
      tests/data/profiles/telemetry.lp --workload untagged --mix examples/planning/mix.toml \\
      --duration-s 300 --synchronised
  powerplan frontier powerd/data/budgets/demo.toml tests/data/profiles/train.csv \\
      tests/data/profiles/telemetry.lp --workload untagged --mix examples/planning/mix.toml \\
      --duration-s 300 --synchronised --storage-kj-per-rack 10 --storage-kj-per-rack 30 \\
      --storage-kw-per-rack 5 --plot frontier.png --format json
"""


@click.command(
    help=HELP,
    short_help="Price a grid spec: energy burnt, work lost and rack storage, their frontier.",
)
@placed_inputs("budgets")
@replay_options(3600.0, "How long to replay (profiles wrap around).")
@click.option(
    "--storage-kj-per-rack",
    "storage_kj",
    type=Quantity("kJ", min=0),
    multiple=True,
    help="A rack storage size to price, kJ per rack (repeat for several); no storage is "
    "always priced.",
)
@click.option(
    "--storage-kw-per-rack",
    type=Quantity("kW", min=0, min_open=True),
    default=None,
    help="The storage's power, kW per rack, charge and discharge (needed with "
    "--storage-kj-per-rack).",
)
@click.option(
    "--points",
    type=click.IntRange(min=3, max=101),
    default=9,
    show_default=True,
    help="At least this many points of each frontier, from least loss to least burn "
    "(every vertex is one; segments are split to make up the number).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Draw the frontiers to this PNG file.",
)
@format_option()
def command(
    budgets: Path,
    profiles: tuple[Path, ...],
    mix_path: Path,
    duration_s: float,
    synchronised: bool,
    storage_kj: tuple[float, ...],
    storage_kw_per_rack: float | None,
    points: int,
    plot_path: Path | None,
    step_s: float,
    seed: int,
    column_pairs: tuple[str, ...],
    workload: str | None,
    capped_demand: str,
    fmt: str,
) -> None:
    from planner.commands.size import load_inputs
    from planner.frontier import (
        NO_STORAGE,
        answer_table,
        frontier_table,
        site_frontiers,
        units_of,
    )
    from planner.whatif import WhatifSettings, replay
    from planner.whatif_storage import StorageSizing, check_storage, ramp_spec

    if storage_kj and storage_kw_per_rack is None:
        raise click.UsageError(
            "--storage-kj-per-rack needs --storage-kw-per-rack: the storage's power per rack"
        )
    if storage_kw_per_rack is not None and not storage_kj:
        raise click.UsageError("--storage-kw-per-rack needs --storage-kj-per-rack")
    inputs = load_inputs(budgets, profiles, mix_path, step_s, column_pairs, workload, capped_demand)
    sizings = [NO_STORAGE]
    sizings += [StorageSizing(kj, storage_kw_per_rack or 0.0) for kj in storage_kj if kj > 0]
    try:
        spec = ramp_spec(inputs.top, "the frontier")
        for sizing in sizings[1:]:
            check_storage(inputs.top, sizing)
        with step_progress("replaying") as on_step:
            result = replay(
                inputs.top,
                inputs.placement,
                inputs.traces,
                WhatifSettings(duration_s=duration_s, seed=seed, synchronised=synchronised),
                on_step=on_step,
            )
        units = units_of(result)
        step = float(result.info["step_s"])  # type: ignore[arg-type]
        frontiers = site_frontiers(inputs.top, result.site_power_w, step, sizings, points)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if plot_path is not None:
        from planner.frontier_plot import plot_frontier

        plot_frontier(frontiers, units, plot_path)
    extra: dict[str, object] = {
        "budgets": str(budgets),
        "grid spec": spec.describe(),
        "duration_s": units.duration_s,
        "step_s": step,
        "synchronised": synchronised,
        "w_per_gpu": units.w_per_gpu,
        "gpu_hours": "demand energy not served / w_per_gpu / 3600 s, per day",
        "per_day": f"x 86400 / {units.duration_s:g} s",
    }
    if plot_path is not None:
        extra["plot"] = str(plot_path)
    answer, curve = answer_table(frontiers, units), frontier_table(frontiers, units)
    if fmt == "table":
        tables = {
            "the answer: per storage size, least loss, knee, least burn": answer,
            f"the frontiers, floor descending (at most {TABLE_POINTS} points a size; "
            "JSON: every vertex)": _thinned(curve, TABLE_POINTS),
        }
    else:
        tables = {"answer": answer, "frontier": curve}
    emit(tables, fmt, extra=extra)


def _thinned(curve: pd.DataFrame, most: int) -> pd.DataFrame:
    """At most ``most`` rows per storage size, evenly spread by index, both ends kept."""
    import numpy as np

    keep: list[int] = []
    for _, rows in curve.groupby(["storage_kj_per_rack", "storage_kw_per_rack"], sort=False):
        picks = np.unique(np.linspace(0, len(rows) - 1, min(most, len(rows))).round())
        keep += [int(rows.index[int(k)]) for k in picks]
    return curve.loc[keep]
