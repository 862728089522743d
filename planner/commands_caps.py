"""``powerplan caps``: the GPU power cap that maximises throughput inside a fixed site power."""

from __future__ import annotations

from pathlib import Path

import click
import pandas as pd

from planner.caps import CapsResult, recommend
from planner.output import emit, format_option
from planner.sweep import default_label, load_sweep
from planner.table import ProfileError

ZEUS_WORKLOAD_COLS = "dataset,network,batch_size,optimizer"


def _toml_mix(path: Path) -> dict[str, float]:
    """Weights from a ``powerplan size`` mix file: jobs' ``share`` (or ``gpus``) per workload."""
    import tomllib

    try:
        jobs = tomllib.loads(path.read_text(encoding="utf-8")).get("jobs", [])
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"{path}: {exc}") from None
    keys = {("share" if "share" in job else "gpus") for job in jobs}
    if len(keys) != 1 or any(not isinstance(job.get("workload"), str) for job in jobs):
        raise click.BadParameter(f"{path}: need [[jobs]] with workload and all share or all gpus")
    (key,) = keys
    weights: dict[str, float] = {}
    for job in jobs:
        weights[job["workload"]] = weights.get(job["workload"], 0.0) + float(job.get(key, 0))
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


def plot_caps(result: CapsResult, path: Path) -> None:
    """Throughput per provisioned W (relative to the max cap) against the cap, per GPU."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus = sorted(result.curves["gpu"].unique())
    fig, axes = plt.subplots(
        1, len(gpus), figsize=(5 * len(gpus), 4), squeeze=False, constrained_layout=True
    )
    best = result.per_workload.set_index(["gpu", "workload"])
    for ax, gpu in zip(axes[0], gpus, strict=True):
        curves = result.curves[result.curves["gpu"] == gpu]
        names = sorted(curves["workload"].unique())
        for name in names:
            c = curves[curves["workload"] == name]
            row = best.loc[(gpu, name)]
            ref = row["thr_per_mw_max_cap"]
            label = name if len(names) <= 8 else None
            (line,) = ax.plot(c["cap_w"], c["thr_per_mw"] / ref, lw=0.8, alpha=0.5, label=label)
            ax.plot(row["cap_w"], row["thr_per_mw"] / ref, "o", ms=3, color=line.get_color())
        mc = result.mix_curves[result.mix_curves["gpu"] == gpu]
        if len(mc):
            ref = mc["thr_per_mw"].iat[-1]
            ax.plot(mc["cap_w"], mc["thr_per_mw"] / ref, "k-", lw=2.5, label="mix")
            m = result.mix[result.mix["gpu"] == gpu].iloc[0]
            ax.plot(m["cap_w"], m["thr_per_mw"] / ref, "k*", ms=14, label=f"mix: {m['cap_w']:g} W")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_title(f"{gpu} ({len(names)} workloads), overhead {result.overhead_w:g} W")
        ax.set_xlabel("power cap, W")
        ax.set_ylabel("throughput per provisioned W / same at max cap")
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)
    plt.close(fig)


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--overhead-w",
    type=click.FloatRange(min=0),
    required=True,
    help="Provisioned W per GPU that does not scale with its cap (CPU, NIC, switches, cooling).",
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
    help="Time per unit of work column (throughput = 1/time). [default: time_per_epoch]",
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
    help="GPU name per FILE, in order (default: the file stem's last '_' part).",
)
@click.option(
    "--mix",
    default=None,
    help="Workload shares of the GPUs: 'workload=weight,...', a file of such lines, or a"
    " 'powerplan size' mix .toml. Default: every workload of a GPU, equal weights.",
)
@click.option(
    "--interpolate",
    is_flag=True,
    help="Also consider caps between the measured ones (monotone fit, every --step-w W).",
)
@click.option(
    "--step-w",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Cap grid step for --interpolate, W.",
)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a PNG here.")
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
    fmt: str,
) -> None:
    """Recommend the power cap that maximises cluster throughput inside a fixed site power.

    Each GPU is provisioned at its cap plus OVERHEAD_W, so a site of P watts
    holds P / (cap + overhead) GPUs; the best cap maximises
    throughput(cap) / (cap + overhead). FILE is a cap sweep (one GPU model per
    file): rows of workload, cap, time per unit of work (or throughput) and
    average power. Defaults read the Zeus power-limit sweeps as they are.
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
        sweep = pd.concat(
            [
                load_sweep(
                    f,
                    workload_cols=cols,
                    cap_col=cap_col,
                    time_col=time_col,
                    throughput_col=throughput_col,
                    power_col=power_col or None,
                    label=label,
                )
                for f, label in zip(files, labels, strict=True)
            ],
            ignore_index=True,
        )
    except ProfileError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        result = recommend(sweep, overhead_w, weights, interpolate=interpolate, step_w=step_w)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    if plot_path:
        plot_caps(result, Path(plot_path))
    emit(
        {"caps": result.per_workload, "mix": result.mix},
        fmt,
        extra={
            "overhead_w": overhead_w,
            "interpolated": interpolate,
            "objective": "max throughput / (cap_w + overhead_w); thr_per_mw: work/s per MW",
        },
    )
