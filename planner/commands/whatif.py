"""``powerplan whatif``: replay profiles through the controller's policy at given budgets."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import click

from planner.commands.options import placed_inputs, replay_options, speed_options
from planner.commands.progress import step_progress
from planner.output import emit, format_option
from powerd.click_types import Fraction, Quantity, safety_option

if TYPE_CHECKING:
    from planner.demand import SpeedModel
    from planner.whatif import WhatifResult
    from planner.whatif_storage import StorageSizing

HELP = """Replay profiles through the controller's own policy at the budgets of BUDGETS.

\b
BUDGETS   a budgets file (docs/BUDGETS.md), e.g. one `powerplan size` wrote
PROFILES  profile files (.csv, .parquet, .lp; see `powerplan profiles --help`)
--mix     which jobs run (the TOML mix of `powerplan size --help`)

\b
Every --step-s (the controller's cycle) each GPU of a job demands its job's
profile, from a random offset per job (jobs are not synchronised with each
other; the GPUs of one job are), and draws min(demand, the cap set the step
before); policies.decide, the function the controller runs, then sets the
next caps, with the job's priority and profiled phases (--safety: by the caps
in force, the default, or by the bands on measured power). GPUs start at their
failsafe caps, as agents do. Idle GPUs draw their model's idle power.

\b
Per site, row and rack (and summed per level):
  capping_share          share of steps above the capping threshold: how often
  cut_mean_w, cut_max_w  watts the node itself took when it capped: how deep
  withheld_mean_w        GPU watts held below demand under the node
  s_above_budget         seconds the node's power was above its budget
  s_above_limit          seconds above its limit (the breaker), under control
  s_above_limit_uncapped the same for the uncapped demand, for comparison
Per site, as the grid sees its measured power (docs/BUDGETS.md, "The grid
spec"; the budgets file's [site.grid], else the defaults and "no grid spec"):
  ramp up / down         max and p99 of the rise / fall over the spec's window, W/s
  oscillation share      share of the power's variance in the band (the part of
                         it the step sees: 1 s steps see up to 0.5 Hz), worst window
                         and whole replay; peak-to-peak, worst window
  s_outside              seconds outside each limit of the spec
  floor energy           what holding the spec's floor would burn: kWh, and as a
                         share of the jobs' energy; with --smoothing, what the
                         floors and ramp-downs did burn
With --smoothing every GPU of the site gets 0.9 x the spec's ramp limits / the
site's GPUs, W/s each way, and a floor of floor_fraction x its cap while its job
runs (policies/smoothing.py): the site then moves within the spec. Power it
holds above demand is burnt; power the ramp-up holds below demand slows the job
(ramp_held_share per job). --synchronised starts every job at its profile's
start, together: with `powerplan rhythm` profiles, the grid's worst case.
With --storage-kj-per-rack and --storage-kw-per-rack, rack energy storage
(NVIDIA's GB300 NVL72 power supplies) is dispatched over the replayed site
power (policies/storage.py): every rack's storage as one pool, the grid draw
heading for the demand's mean over the last --storage-horizon-s (default 20 s)
plus a pull back to half charge, moved within 0.9 x [site.grid]'s ramp limits;
storage takes what the draw holds above demand and gives what it lacks, at a
--storage-efficiency round trip (default 0.9, assumed). What it cannot take is
burnt (a floor), what it cannot give is held back (GPUs capped): the grid draw
keeps the spec. Reported under "storage": the grid draw measured as the site
is, energy burnt, lost in conversion and held back (kWh, share of the jobs'
energy), beside the least floor without storage, and the charge's range. The
replay itself is unchanged; --smoothing is its alternative, not a companion.
With a ramp limit, "frontier" says where the site sits against `powerplan frontier`'s
frontier at its storage: the energy it burns above its demand with no floor held and
the demand it leaves unserved, per day, against the least any schedule within the
ramp limits loses at that burn (lost_over_bound: 1 is on the frontier).
Per job: held_share (steps with any GPU drawing below its demand),
gpus_held_share (the mean share of its GPUs held), throughput_lost, and the
loss split by cause, adding up to it (policies/causes.py): capping (a node over
its threshold cut the cap), priority shift (watts taken for a higher-priority
job), staged phase (a start's or checkpoint's staged caps), failsafe start (the
climb from the failsafe caps agents start at), clock lock, grid ramp (smoothing
held the draw below its cap). A cap climbing back keeps the cause that lowered
it. A synchronous job runs at its slowest GPU's pace; a
GPU held to r = power/demand runs at r^--speed-exponent (default 0.28: Meta's
GB200, 1200 -> 1000 W cost ~5 %, docs/DOMAIN.md), or, with --sweep, at the
relative throughput a measured cap sweep gives (Zeus CSV columns by default).
On a terminal, a run that takes more than a few seconds shows a progress bar
on stderr.

\b
Examples:
  powerplan whatif powerd/data/budgets/demo.toml tests/data/profiles/telemetry.lp \\
      tests/data/profiles/train.csv --workload untagged --mix examples/planning/mix.toml
  powerplan whatif powerd/data/budgets/demo.toml tests/data/profiles/train.csv \\
      tests/data/profiles/telemetry.lp --workload untagged --mix examples/planning/mix.toml \\
      --duration-s 600 --synchronised --smoothing --format json
  powerplan whatif powerd/data/budgets/demo.toml tests/data/profiles/train.csv \\
      tests/data/profiles/telemetry.lp --workload untagged --mix examples/planning/mix.toml \\
      --duration-s 600 --synchronised --storage-kj-per-rack 30 --storage-kw-per-rack 5
"""

STORAGE_ONLY_WITH = "--storage-efficiency and --storage-horizon-s need --storage-kj-per-rack"
STORAGE_NOT_WITH_SMOOTHING = (
    "--storage-* and --smoothing are alternatives in this model: storage is dispatched over "
    "the site's power as replayed without smoothing (a floor held under storage is not "
    "modelled); run one, then the other"
)


@click.command(
    help=HELP, short_help="Replay profiles through the controller's policies at given budgets."
)
@placed_inputs("budgets")
@replay_options(3600.0, "How long to replay (profiles wrap around).")
@click.option(
    "--smoothing",
    is_flag=True,
    help="Every GPU moves within its share of [site.grid]'s ramp limits and holds its floor "
    "(hardware power smoothing, or the software floor): reports the energy it burns.",
)
@safety_option("How the controller's policy keeps every level within its limit.")
@click.option(
    "--storage-kj-per-rack",
    type=Quantity("kJ", min=0),
    default=None,
    help="Rack energy storage, kJ per rack, dispatched over the replayed site power to keep "
    "[site.grid]'s ramp limits: reports what the grid then sees and what it costs.",
)
@click.option(
    "--storage-kw-per-rack",
    type=Quantity("kW", min=0),
    default=None,
    help="The storage's power, kW per rack, charge and discharge (needed with "
    "--storage-kj-per-rack).",
)
@click.option(
    "--storage-efficiency",
    type=Fraction(0, 1, min_open=True),
    default=None,
    help="The storage's round-trip efficiency (default 0.9, assumed).",
)
@click.option(
    "--storage-horizon-s",
    type=Quantity("s", 0, min_open=True),
    default=None,
    help="The grid draw heads for the demand's mean over this many seconds (default 20: "
    "two periods of the oscillation band's 0.1 Hz).",
)
@speed_options("A cap sweep CSV (as `powerplan caps` reads) for the speed under a cap.")
@click.option(
    "--sweep-workload-cols",
    default="dataset,network,batch_size,optimizer",
    show_default=True,
    help="Sweep columns that name a workload.",
)
@format_option()
def command(
    budgets: Path,
    profiles: tuple[Path, ...],
    mix_path: Path,
    duration_s: float,
    synchronised: bool,
    smoothing: bool,
    safety: str,
    storage_kj_per_rack: float | None,
    storage_kw_per_rack: float | None,
    storage_efficiency: float | None,
    storage_horizon_s: float | None,
    step_s: float,
    seed: int,
    speed_exponent: float,
    sweep_paths: tuple[Path, ...],
    sweep_workload_cols: str,
    column_pairs: tuple[str, ...],
    workload: str | None,
    capped_demand: str,
    fmt: str,
) -> None:

    from planner.commands.size import load_inputs
    from planner.whatif import WhatifSettings, replay
    from planner.whatif_storage import check_storage, storage_report
    from policies.settings import PolicySettings

    sizing = storage_sizing(
        storage_kj_per_rack, storage_kw_per_rack, storage_efficiency, storage_horizon_s
    )
    if sizing is not None and smoothing:
        raise click.UsageError(STORAGE_NOT_WITH_SMOOTHING)
    inputs = load_inputs(budgets, profiles, mix_path, step_s, column_pairs, workload, capped_demand)
    if sizing is not None:
        try:
            check_storage(inputs.top, sizing)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
    speed = _speed(speed_exponent, sweep_paths, sweep_workload_cols)
    settings = WhatifSettings(
        duration_s=duration_s,
        seed=seed,
        synchronised=synchronised,
        smoothing=smoothing,
        policy=PolicySettings(safety_by_caps=safety == "caps"),
    )
    try:
        with step_progress("replaying") as on_step:
            result = replay(
                inputs.top, inputs.placement, inputs.traces, settings, speed, on_step=on_step
            )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if sizing is not None:
        result.info["storage"] = storage_report(inputs.top, result, sizing)
    from planner.frontier import replay_position

    where = replay_position(inputs.top, result, sizing)
    if where is not None:  # where the site sits against `powerplan frontier`'s frontier
        result.info["frontier"] = where
    _emit_whatif(result, budgets, fmt)


def _speed(
    speed_exponent: float, sweep_paths: tuple[Path, ...], sweep_workload_cols: str
) -> SpeedModel:
    """How fast a GPU runs under a cap: the cap sweeps' curves, else the power law."""
    from planner.errors import ProfileError
    from planner.whatif import power_law_speed, sweep_speed

    if not sweep_paths:
        return power_law_speed(speed_exponent)
    from planner.sweep import load_sweeps

    cols = [c.strip() for c in sweep_workload_cols.split(",") if c.strip()]
    try:
        sweep = load_sweeps(sweep_paths, workload_cols=cols)
    except ProfileError as exc:
        raise click.ClickException(str(exc)) from None
    return sweep_speed(sweep)


def _emit_whatif(result: WhatifResult, budgets: Path, fmt: str) -> None:
    """The replay as people read it (levels, site and rows, the racks that capped most,
    jobs, losses by cause, the grid, the storage), or whole."""
    from planner.whatif import grid_table, lost_table, site_limit_w
    from planner.whatif_storage import storage_table
    from policies.causes import LOST_CAUSES, lost_column

    extra = {"budgets": str(budgets), **result.info}
    if fmt != "table":
        emit(
            {"nodes": result.nodes, "levels": result.levels, "jobs": result.jobs}, fmt, extra=extra
        )
        return
    extra.pop("throughput_lost_site_by_cause")  # its own table below
    grid = extra.pop("grid")
    assert isinstance(grid, dict)
    nodes = result.nodes
    site_w = site_limit_w(result)  # the site's scale, for the grid's tables
    storage = extra.pop("storage", None)
    stored: dict[str, object] = {}
    if isinstance(storage, dict):
        extra["storage assumptions"] = "; ".join(storage["assumptions"])
        stored = {
            "rack energy storage (policies/storage.py)": storage_table(storage),
            "grid draw with the storage vs the grid spec": grid_table(storage["grid"], site_w),
        }
    extra["grid spec"] = grid["spec"]
    where = extra.pop("frontier", None)
    if isinstance(where, dict):
        from planner.frontier import position_line

        extra["on the frontier (powerplan frontier)"] = position_line(where)
    if grid["oscillation_note"]:
        extra["grid band"] = grid["oscillation_note"]
    shown = nodes[nodes["level"] != "rack"]
    racks = nodes[nodes["level"] == "rack"]
    worst = racks.sort_values(["capping_share", "withheld_mean_w"], ascending=False).head(10)
    emit(
        {
            "levels": result.levels,
            "site and rows": shown,
            "racks that capped most": worst,
            "jobs": result.jobs.drop(columns=[lost_column(c) for c in LOST_CAUSES]),
            "throughput lost, by cause (of each job's throughput)": lost_table(result),
            "site power vs the grid spec": grid_table(grid, site_w),
            **stored,
        },
        fmt,
        extra=extra,
    )


def storage_sizing(
    kj_per_rack: float | None,
    kw_per_rack: float | None,
    round_trip: float | None,
    horizon_s: float | None,
) -> StorageSizing | None:
    """The storage the options ask for; None without --storage-kj-per-rack."""
    from planner.whatif_storage import StorageSizing

    if kj_per_rack is None:
        if kw_per_rack is not None:
            raise click.UsageError("--storage-kw-per-rack needs --storage-kj-per-rack")
        if round_trip is not None or horizon_s is not None:
            raise click.UsageError(STORAGE_ONLY_WITH)
        return None
    if kw_per_rack is None:
        raise click.UsageError(
            "--storage-kj-per-rack needs --storage-kw-per-rack: the storage's power per rack"
        )
    sizing = StorageSizing(kj_per_rack, kw_per_rack)
    if round_trip is not None:
        sizing = dataclasses.replace(sizing, round_trip=round_trip)
    if horizon_s is not None:
        sizing = dataclasses.replace(sizing, horizon_s=horizon_s)
    return sizing
