"""``powerplan evaluate``: the work the same site power does under five provisioning strategies."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from planner.commands.options import demand_options, placed_inputs, replay_options, speed_options
from planner.output import emit, format_option
from powerd.click_types import Fraction, Quantity, safety_option

if TYPE_CHECKING:
    import pandas as pd

    from planner.demand import SpeedModel
    from planner.evaluate import Evaluation
    from planner.report_doc import Document
    from powerd.gpu.clock_table import ClockTable
    from powerd.topology import Topology

HELP = """Compare provisioning strategies on the same site power: GPUs hosted, work done, risk.

\b
BUDGETS   a budgets file (docs/BUDGETS.md): the site, its feed (the site's limit_w,
          the power P every strategy gets) and the shape of its racks
PROFILES  profile files (.csv, .parquet, .lp; see `powerplan profiles --help`)
--mix     which jobs run, each as a share of the GPUs (the TOML mix of
          `powerplan size --help`): every strategy hosts a different number

\b
Strategies, each replayed through `powerplan whatif` for --duration-s:
  a  TDP provisioning   as many whole racks as fit P with every GPU at its TDP,
                        overheads in; no caps, no controller
  b  static caps        the same at --static-cap-w (default: the file's failsafe
                        cap, e.g. from `powerplan caps`); no controller
  c  oversubscription   the most whole racks (the file's, with its limits) whose
                        budgets, sized by `powerplan size` at --quantile, keep
                        every rack, row and the site within its limit at that
                        quantile, and never fewer than b; powerd's dynamic capping
  d  c + comm. clock    communication phases at the file's comm_clock_mhz: power
                        and time from the model's clock table (--clock-table);
                        --gpu-bound-share of each wait slows with the clock
  e  c + smoothing      grid smoothing within the file's [site.grid]
  o  oracle             c's site, each GPU's power chosen every step with perfect
                        knowledge of every demand, no delay, priorities ignored
                        (water-filling on the speed law): the most work possible
Per strategy: GPUs hosted; throughput (GPUs at full speed), per MW of P and
against (a) and over (b)'s and (o)'s (vs_b, vs_o); site energy per GPU-hour
of work; the worst node's seconds above its limit; the most-capping node's and
the jobs' held share of steps; the worst site ramps and seconds outside the
grid spec. For d against c: the GPU energy in communication phases, saved, and
the iteration time it costs. The method and its assumptions: planner/evaluate.py,
docs/EVALUATION.md.

\b
-o OUTDIR writes evaluation.md (or evaluation.html with --html) and evaluation.png;
without it the tables go to stdout in --format.

\b
Examples:
  powerplan evaluate powerd/data/budgets/demo.toml tests/data/profiles/telemetry.lp \\
      tests/data/profiles/train.csv --workload untagged --mix examples/planning/mix.toml \\
      --duration-s 120
  powerplan evaluate powerd/data/budgets/demo.toml tests/data/profiles/telemetry.lp \\
      tests/data/profiles/train.csv --workload untagged --mix examples/planning/mix.toml \\
      --duration-s 120 --static-cap-w 450 -o evaluation/ --html
"""


@click.command(help=HELP, short_help="Provisioning strategies compared on the same site power.")
@placed_inputs("budgets")
@replay_options(600.0, "How long to replay each strategy (profiles wrap around).")
@demand_options("(c): size each node for this quantile of its demand (the stated risk).")
@click.option(
    "--static-cap-w",
    type=Quantity("W", 0, min_open=True),
    default=None,
    help="(b)'s cap per GPU [default: the file's failsafe cap per model].",
)
@click.option(
    "--clock-table",
    "clock_table_path",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="(d): a clock table CSV (`powerplan clocks -o`) [default: the one the budgets file "
    "chose its clock from, else the model's shipped one].",
)
@click.option(
    "--gpu-bound-share",
    type=Fraction(0, 1),
    default=1.0,
    show_default=True,
    help="(d): the share of a communication wait that slows with the clock (1: all of it, "
    "the conservative bound).",
)
@safety_option("(c)-(e): how the controller keeps every level within its limit.")
@speed_options("A cap sweep CSV (Zeus columns, as `powerplan caps` reads) for the speed.")
@click.option(
    "-o",
    "--output",
    "outdir",
    metavar="OUTDIR",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write the report and its plot here (created if missing; its parent must exist).",
)
@click.option("--html", "as_html", is_flag=True, help="With -o: evaluation.html, not .md.")
@format_option()
def command(
    budgets: Path,
    profiles: tuple[Path, ...],
    mix_path: Path,
    duration_s: float,
    synchronised: bool,
    quantile: float,
    samples: int,
    static_cap_w: float | None,
    clock_table_path: Path | None,
    gpu_bound_share: float,
    safety: str,
    speed_exponent: float,
    sweep_paths: tuple[Path, ...],
    outdir: Path | None,
    as_html: bool,
    step_s: float,
    seed: int,
    column_pairs: tuple[str, ...],
    workload: str | None,
    capped_demand: str,
    fmt: str,
) -> None:
    from planner.commands.progress import step_progress
    from planner.commands.size import load_inputs
    from planner.evaluate import evaluate
    from planner.evaluate_site import EvaluateError, EvaluateSettings
    from planner.sizing import SizingError
    from planner.whatif import power_law_speed

    if outdir is not None and not outdir.parent.is_dir():
        raise click.BadParameter(f"{outdir.parent}: no such directory", param_hint="--output")
    inputs = load_inputs(budgets, profiles, mix_path, step_s, column_pairs, workload, capped_demand)
    speed = power_law_speed(speed_exponent)
    if sweep_paths:
        speed = _sweep_speed(sweep_paths)
    settings = EvaluateSettings(
        duration_s=duration_s,
        seed=seed,
        synchronised=synchronised,
        quantile=quantile,
        samples=samples,
        static_cap_w=static_cap_w,
        gpu_bound_share=gpu_bound_share,
        safety_by_caps=safety == "caps",
        speed_exponent=speed_exponent,
    )
    tables = _clock_tables(inputs.top, clock_table_path)
    try:
        with step_progress("replaying") as on_step:
            result = evaluate(
                inputs.top, inputs.mix, inputs.traces, settings, tables, speed, on_step
            )
    except (EvaluateError, SizingError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
    if outdir is not None:
        _write_report(result, budgets, profiles, mix_path, outdir, as_html)
        return
    extra = {"budgets": str(budgets), **result.info}
    tables_out = {"strategies": result.table}
    if fmt == "json":  # the notes went to stderr for people; here they are data
        extra["notes"] = result.notes
        extra["communication"] = result.comm
        tables_out["limits"] = result.levels
    elif result.comm:
        tables_out["communication phases, (d) against (c)"] = comm_table(result)
    emit(tables_out, fmt, extra=extra)


def _sweep_speed(paths: tuple[Path, ...]) -> SpeedModel:
    from planner.commands.caps import ZEUS_WORKLOAD_COLS
    from planner.errors import ProfileError
    from planner.sweep import load_sweeps
    from planner.whatif import sweep_speed

    try:
        return sweep_speed(load_sweeps(paths, workload_cols=ZEUS_WORKLOAD_COLS.split(",")))
    except ProfileError as exc:
        raise click.ClickException(str(exc)) from None


def _clock_tables(top: Topology, path: Path | None) -> dict[str, ClockTable]:
    """Per GPU model of the site, its clock table: ``path`` (for its model), else the one
    the budgets file chose its communication clock from, else the model's shipped one."""
    from powerd.gpu.clock_table import ClockTableError, load_clock_table

    out: dict[str, ClockTable] = {}
    try:
        if path is not None:
            table = load_clock_table(path)
            out[table.model] = table
        for model in dict.fromkeys(top.server_model):
            chosen = out.get(model) or top.clock_table(model)
            if chosen is not None:
                out[model] = chosen
    except (ClockTableError, KeyError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    return out


def comm_table(result: Evaluation) -> pd.DataFrame:
    """(d) against (c) as rows people read: what, value."""
    import pandas as pd

    comm = dict(result.comm)
    clocks = comm.pop("clocks")
    assert isinstance(clocks, dict)
    rows: list[tuple[str, object]] = []
    for model, clock in clocks.items():
        rows += [
            (f"{model}: communication clock, MHz", clock["clock_mhz"]),
            (f"{model}: time per unit of GPU work at it, relative", clock["time_rel"]),
            (f"{model}: power at it, relative", clock["power_rel"]),
            (f"{model}: a communication phase lasts, relative", clock["stretch"]),
            (f"{model}: clock table", clock["table"]),
        ]
    rows += list(comm.items())
    return pd.DataFrame(rows, columns=["what", "value"])


def document(
    result: Evaluation, budgets: Path, profiles: tuple[Path, ...], mix_path: Path
) -> Document:
    """The report: the tables, the notes, the assumptions and the plot."""
    from planner.report_doc import Document

    doc = Document(f"powerplan evaluate: {budgets.name}")
    info = result.info
    doc.paragraph(
        f"Budgets `{budgets}`, profiles {', '.join(f'`{p}`' for p in profiles)}, mix "
        f"`{mix_path}`. Every strategy gets the site's {result.site_w / 1e6:,.3g} MW feed; "
        f"each is replayed for {info['duration_s']:g} s (steps of {info['step_s']:g} s, seed "
        f"{info['seed']}{', every job starting together' if info['synchronised'] else ''})."
    )
    doc.heading("Strategies")
    doc.table(result.table, "throughput in GPUs at full speed; energy per GPU-hour of work")
    doc.image(PLOT, "throughput per site MW and site power, per strategy")
    if result.comm:
        doc.heading("Communication phases, (d) against (c)")
        doc.table(comm_table(result))
    doc.heading("Seconds above a limit, the worst node of each level")
    doc.table(result.levels)
    if result.notes:
        doc.heading("Notes")
        doc.bullets(result.notes)
    doc.heading("Assumptions")
    doc.bullets(assumptions(str(info["speed_model"])))
    return doc


PLOT = "evaluation.png"


def assumptions(speed_model: str) -> list[str]:
    """Where the evaluation's model is an assumption, in words (planner/evaluate.py)."""
    return [
        "P is the site's limit; the site's own overhead (cooling) is the file's constant.",
        "Every strategy's site is whole racks of the file's shape; (a) and (b) have no"
        " controller and their nodes are provisioned at their caps, so none is ever over a"
        " limit.",
        "(c) hosts the most racks whose `powerplan size` plan keeps every rack, row and the"
        " site's demand at the quantile within its limit, at least (b)'s; its racks and rows"
        " keep the file's limits, and the search takes that test to be monotone in the racks.",
        f"Speed under a cap: {speed_model}; a synchronous job runs at its slowest GPU's pace.",
        "(d): the clock table of a training step stands for communication; the share of a"
        " wait that slows with the clock is --gpu-bound-share (1: all of it).",
        "A job's profile stands for every one of its GPUs; the replay's duration for the"
        " site's life.",
    ]


def _write_report(
    result: Evaluation,
    budgets: Path,
    profiles: tuple[Path, ...],
    mix_path: Path,
    outdir: Path,
    as_html: bool,
) -> None:
    """The report and its plot, drawn aside and moved in whole, the report last."""
    from planner.plots import plot_evaluation
    from planner.report_doc import to_html, to_markdown

    doc = document(result, budgets, profiles, mix_path)
    name = "evaluation.html" if as_html else "evaluation.md"
    text = to_html(doc) if as_html else to_markdown(doc)
    staging = Path(tempfile.mkdtemp(prefix=f".{outdir.name}.", dir=outdir.parent))
    try:
        step_s = float(result.info["step_s"])  # type: ignore[arg-type]
        power = {key: r.site_power_w for key, r in result.results.items()}
        plot_evaluation(result.table, power, step_s, result.site_w, staging / PLOT)
        (staging / name).write_text(text, encoding="utf-8")
        outdir.mkdir(exist_ok=True)
        for file in (PLOT, name):
            (staging / file).replace(outdir / file)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    click.echo(f"wrote {outdir / name} and {PLOT}")
