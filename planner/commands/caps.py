"""``powerplan caps``: the GPU power cap that maximises throughput inside a fixed site power."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from planner.caps import recommend
from planner.commands.options import OVERHEAD_W_HELP, OVERHEAD_W_NEEDED
from planner.errors import ProfileError
from planner.mix import load_mix
from planner.output import emit, format_option
from planner.sweep import default_label, load_sweeps, sweep_label_warnings
from powerd.click_types import Quantity

if TYPE_CHECKING:
    import pandas as pd

ZEUS_WORKLOAD_COLS = "dataset,network,batch_size,optimizer"


def _toml_mix(path: Path) -> dict[str, float]:
    """Weights from a ``powerplan size`` mix file: jobs' ``share`` (or ``gpus``) per workload."""
    try:
        jobs = load_mix(path).jobs
    except ProfileError as exc:
        raise click.BadParameter(str(exc)) from None
    by_share = {job.share is not None for job in jobs}
    if len(by_share) != 1:
        raise click.BadParameter(f"{path}: need [[jobs]] with all share or all gpus")
    weights: dict[str, float] = {}
    for job in jobs:
        amount = job.share if job.share is not None else job.gpus
        weights[job.workload] = weights.get(job.workload, 0.0) + float(amount or 0)
    return weights


def parse_mix(value: str) -> dict[str, float]:
    """``name=weight,...``, a file of ``name=weight`` / ``name,weight`` lines (``#``
    comments), or a ``powerplan size`` mix file (``.toml``: ``[[jobs]]`` shares)."""
    path = Path(value)
    if path.is_file() and path.suffix == ".toml":
        return _toml_mix(path)
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        items = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
        source = str(path)
    else:
        items = [part.strip() for part in value.split(",")]
        source = "--mix"
    weights: dict[str, float] = {}
    for number, item in enumerate(items, start=1):
        if not item or item.replace(" ", "") == "workload,weight":
            continue
        sep = "=" if "=" in item else ","
        name, _, raw = item.rpartition(sep)
        where = f"{source}:{number}" if source != "--mix" else source
        try:
            weight = float(raw)
        except ValueError:
            raise click.BadParameter(f"{where}: {item!r} is not workload=weight") from None
        if not name.strip():
            raise click.BadParameter(f"{where}: {item!r} has no workload name")
        if name.strip() in weights:
            raise click.BadParameter(f"{where}: workload {name.strip()!r} given twice")
        weights[name.strip()] = weight
    if not weights:
        raise click.BadParameter(f"{source}: no workload=weight entries")
    return weights


@click.command(short_help="The GPU power cap that maximises throughput inside a fixed site power.")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--overhead-w",
    type=Quantity("W", 0),
    required=True,
    help=f"{OVERHEAD_W_HELP} Required: {OVERHEAD_W_NEEDED}.",
)
@click.option(
    "--workload-cols",
    default=ZEUS_WORKLOAD_COLS,
    show_default=True,
    help="Comma-separated columns that name a workload (joined by '/').",
)
@click.option("--cap-col", default="power_limit", show_default=True, help="Power cap column, W.")
@click.option(
    "--time-col",
    default=None,
    help="Time per unit of work column (throughput = 1/time) [default: time_per_epoch].",
)
@click.option("--throughput-col", default=None, help="Throughput column (instead of --time-col).")
@click.option(
    "--power-col",
    default="average_power",
    show_default=True,
    help="Average GPU power column, W ('' for none).",
)
@click.option(
    "--gpu-label",
    multiple=True,
    help="GPU name per FILE, in order [default: the file stem's last '_' part].",
)
@click.option(
    "--mix",
    default=None,
    help="Workload shares of the GPUs: 'workload=weight,...', a file of such lines, or a"
    " 'powerplan size' mix .toml [default: every workload of a GPU, equal weights].",
)
@click.option(
    "--interpolate",
    is_flag=True,
    help="Also consider caps between the measured ones (monotone fit, every --step-w W).",
)
@click.option(
    "--step-w",
    type=Quantity("W", 0, min_open=True),
    default=1.0,
    show_default=True,
    help="Cap grid step for --interpolate, W.",
)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a PNG here.")
@click.option(
    "--per-workload",
    is_flag=True,
    help="Also print each workload's own best cap, after the answer (--format json and csv "
    "always have them).",
)
@format_option()
def command(
    files: tuple[str, ...],
    overhead_w: float,
    workload_cols: str,
    cap_col: str,
    time_col: str | None,
    throughput_col: str | None,
    power_col: str,
    gpu_label: tuple[str, ...],
    mix: str | None,
    interpolate: bool,
    step_w: float,
    plot_path: str | None,
    per_workload: bool,
    fmt: str,
) -> None:
    """Recommend the power cap that maximises cluster throughput inside a fixed site power.

    Each GPU is provisioned at its cap plus OVERHEAD_W, so a site of P watts
    holds P / (cap + overhead) GPUs; the best cap maximises
    throughput(cap) / (cap + overhead). FILE is a cap sweep (one GPU model per
    file): rows of workload, cap, time per unit of work (or throughput) and
    average power. Defaults read the Zeus power-limit sweeps as they are.

    \b
    The table format prints the answer first: the best cap per GPU model for
    the mix, then the mix's table; --per-workload adds each workload's own.

    \b
    Examples:
      powerplan caps tests/data/zeus-power-limit/summary_power_a40.csv --overhead-w 150
      powerplan caps tests/data/zeus-power-limit/summary_power_a40.csv --overhead-w 150 \\
          --per-workload
      powerplan caps tests/data/zeus-power-limit/summary_power_*.csv --overhead-w 360 \\
          --interpolate --plot caps.png --format json
      powerplan caps tests/data/zeus-power-limit/summary_power_a40.csv --overhead-w 360 \\
          --mix imagenet/resnet50/256/adadelta=3,imagenet/resnet50/32/adadelta=1
    """
    if time_col is not None and throughput_col is not None:
        raise click.UsageError("give --time-col or --throughput-col, not both")
    if time_col is None and throughput_col is None:
        time_col = "time_per_epoch"
    if gpu_label and len(gpu_label) != len(files):
        raise click.UsageError(f"{len(gpu_label)} --gpu-label for {len(files)} files")
    labels = list(gpu_label) or [default_label(f) for f in files]
    if len(set(labels)) != len(labels):
        raise click.UsageError(f"two files have the same GPU label ({labels}); use --gpu-label")
    cols = [c.strip() for c in workload_cols.split(",") if c.strip()]
    if not cols:
        raise click.UsageError("--workload-cols names no column")
    weights = parse_mix(mix) if mix is not None else None
    try:
        sweep = load_sweeps(
            files,
            workload_cols=cols,
            cap_col=cap_col,
            time_col=time_col,
            throughput_col=throughput_col,
            power_col=power_col or None,
            labels=labels,
        )
    except ProfileError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        result = recommend(sweep, overhead_w, weights, interpolate=interpolate, step_w=step_w)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    for warning in [*sweep_label_warnings(sweep), *result.warnings]:
        click.echo(f"warning: {warning}", err=True)
    if plot_path:
        from planner.plots import plot_caps

        plot_caps(result, Path(plot_path))
    extra: dict[str, object] = {
        "overhead_w": overhead_w,
        "interpolated": interpolate,
        "objective": "max throughput / (cap_w + overhead_w); thr_per_mw: work/s per MW",
    }
    if fmt != "table":
        emit({"caps": result.per_workload, "mix": result.mix}, fmt, extra=extra)
        return
    for line in answer_lines(result.mix):
        click.echo(line)
    tables = {"mix": result.mix}
    if per_workload:
        tables["caps, per workload"] = result.per_workload
    else:
        extra["per workload"] = (
            f"{len(result.per_workload)} workloads' own best caps: --per-workload "
            "(--format json and csv have them)"
        )
    emit(tables, fmt, extra=extra)


def answer_lines(mix: pd.DataFrame) -> list[str]:
    """'a40: best cap 200 W of 300 W, +24.1 % throughput per MW over the maximum cap (each
    GPU at 0.966 of its speed) for 53 workloads': one line per GPU model, what the
    command is for, before any table."""
    lines = []
    for row in mix.itertuples(index=False):
        line = (
            f"{row.gpu}: best cap {row.cap_w:g} W of {row.max_cap_w:g} W, "
            f"{row.gain_pct:+.1f} % throughput per MW over the maximum cap (each GPU at "
            f"{row.speed_vs_max:.3f} of its speed) for {row.workloads} workloads"
        )
        if row.at_min_cap:
            line += "; the lowest cap measured: a lower one may be better (measure lower)"
        lines.append(line)
    return lines
