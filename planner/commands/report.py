"""``powerplan report``: a Markdown or HTML report with PNG plots on a budgets file."""

from __future__ import annotations

import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import click

from planner.commands.options import (
    OVERHEAD_W_HELP,
    OVERHEAD_W_NEEDED,
    demand_options,
    placed_inputs,
    speed_options,
)
from powerd.click_types import Quantity

HELP = """Write a report on a budgets file: demand against budgets, capping, cap curves.

\b
BUDGETS   the budgets file to review (docs/BUDGETS.md), e.g. one `powerplan size` wrote
PROFILES  profile files (.csv, .parquet, .lp; see `powerplan profiles --help`)
--mix     which jobs run (the TOML mix of `powerplan size --help`)

\b
-o OUTDIR gets report.md (or report.html with --html) and its PNG plots:
  power_distributions.png  per-GPU power CDF per workload; job traces over time
  budget_vs_demand.png     per level: limit, budget, median and quantile demand
  capping.png              from a whatif replay: how often and how deep capping bites
  cap_curves.png           with --sweep: throughput per provisioned W against the cap
The report's numbers are those of `powerplan size` (demand, at the median and
at --quantile, with the file's overheads), `powerplan whatif` (the file's
budgets, --whatif-s seconds) and `powerplan caps` (--sweep, --overhead-w).
Files are written whole, plots first and the report last; on any error
OUTDIR is left as it was.

\b
Examples:
  powerplan report powerd/data/budgets/demo.toml tests/data/profiles/telemetry.lp \\
      tests/data/profiles/train.csv --workload untagged --mix examples/planning/mix.toml \\
      -o review/
  powerplan report powerd/data/budgets/demo.toml tests/data/profiles/telemetry.lp \\
      tests/data/profiles/train.csv --workload untagged --mix examples/planning/mix.toml \\
      -o review-html/ --html --sweep tests/data/zeus-power-limit/summary_power_a40.csv \\
      --overhead-w 150
"""


@click.command(help=HELP, short_help="A Markdown or HTML report with plots on a budgets file.")
@placed_inputs("budgets")
@click.option(
    "-o",
    "--output",
    "outdir",
    metavar="OUTDIR",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the report and its plots (created if missing; its parent must exist).",
)
@click.option("--html", "as_html", is_flag=True, help="Write report.html instead of report.md.")
@demand_options("The high quantile of demand shown against each budget.")
@click.option(
    "--whatif-s",
    type=Quantity("s", 0),
    default=600.0,
    show_default=True,
    help="How long to replay through the controller's policy (0: no replay).",
)
@speed_options("A cap sweep CSV (Zeus columns, as `powerplan caps` reads): cap curves.")
@click.option(
    "--overhead-w",
    type=Quantity("W", 0),
    default=None,
    help=f"{OVERHEAD_W_HELP} Required with --sweep (the cap curves), unused without.",
)
def command(
    budgets: Path,
    profiles: tuple[Path, ...],
    mix_path: Path,
    outdir: Path,
    as_html: bool,
    quantile: float,
    samples: int,
    step_s: float,
    whatif_s: float,
    speed_exponent: float,
    sweep_paths: tuple[Path, ...],
    overhead_w: float | None,
    seed: int,
    column_pairs: tuple[str, ...],
    workload: str | None,
    capped_demand: str,
) -> None:
    from planner.commands.caps import ZEUS_WORKLOAD_COLS
    from planner.commands.size import echo_warnings, load_inputs
    from planner.errors import ProfileError
    from planner.report import ReportSettings, build
    from planner.report_doc import to_html, to_markdown
    from planner.sizing import SizingError
    from planner.sweep import load_sweeps
    from planner.whatif import power_law_speed
    from powerd import __version__

    if not outdir.parent.is_dir():
        raise click.BadParameter(f"{outdir.parent}: no such directory", param_hint="--output")
    if outdir.exists() and not outdir.is_dir():
        raise click.BadParameter(f"{outdir}: not a directory", param_hint="--output")
    if sweep_paths and overhead_w is None:
        raise click.UsageError(f"--sweep needs --overhead-w: {OVERHEAD_W_NEEDED}")
    inputs = load_inputs(budgets, profiles, mix_path, step_s, column_pairs, workload, capped_demand)
    sweep = None
    if sweep_paths:
        try:
            sweep = load_sweeps(sweep_paths, workload_cols=ZEUS_WORKLOAD_COLS.split(","))
        except ProfileError as exc:
            raise click.ClickException(str(exc)) from None
    settings = ReportSettings(
        quantile=quantile,
        samples=samples,
        seed=seed,
        whatif_s=whatif_s,
        overhead_w=overhead_w,
    )
    sources = {
        "Budgets": str(budgets),
        "Profiles": ", ".join(str(p) for p in profiles),
        "Mix": str(mix_path),
        "Written": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        + f" by powerplan {__version__}",
    }
    from planner.commands.progress import step_progress

    try:
        with step_progress("replaying") as on_step:
            report = build(
                top=inputs.top,
                placement=inputs.placement,
                traces=inputs.traces,
                profiles=inputs.profiles,
                sources=sources,
                settings=settings,
                speed=power_law_speed(speed_exponent),
                sweep=sweep,
                on_step=on_step,
            )
    except (SizingError, ValueError) as exc:
        raise click.ClickException(f"{budgets}: {exc}") from None
    echo_warnings(report.warnings)  # the budgets file's were echoed as it loaded

    name = "report.html" if as_html else "report.md"
    text = to_html(report.document) if as_html else to_markdown(report.document)
    staging = Path(tempfile.mkdtemp(prefix=f".{outdir.name}.", dir=outdir.parent))
    try:
        for file, draw in report.figures.items():
            draw(staging / file)
        (staging / name).write_text(text, encoding="utf-8")
        outdir.mkdir(exist_ok=True)
        for file in [*report.figures, name]:  # the report last: it never names a missing plot
            (staging / file).replace(outdir / file)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    click.echo(f"wrote {outdir / name} and {len(report.figures)} plots")
