"""``powerplan clocks``: the SM clock that saves the most energy within a given slowdown."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import click

from planner.output import emit, format_option, write_whole
from powerd.click_types import Fraction

DEFAULT_MAX_SLOWDOWNS = (0.01, 0.05)

HELP = """Recommend, per GPU model, the SM clock to lock that minimises the energy of a training
step while slowing it down by at most --max-slowdown, from measured frequency sweeps.

\b
Each PROFILE is a Perseus stage profile (SOSP '24): rows of stage, instruction
(forward/backward), frequency (MHz), time (s) and energy (J), every stage at
every frequency. A training step at one clock takes the time of the slowest
stage (the pipeline's pace) and the energy of every stage; both are taken
relative to the highest clock (planner/clocks.py). The recommendation is the
measured clock with the least energy among those at most --max-slowdown slower.

\b
--scale-to adds the same curve on other GPU models, at the same fraction of
each one's maximum SM clock: an assumption, marked as such. -o writes the
tables (clock_mhz, time_rel, power_rel) that the budgets file's clock_table and
the simulated GPUs read (powerd/data/clocks/ holds the shipped ones): a .csv
file for one table, else a directory, one <model>-<workload>.csv per table.

\b
Examples:
  powerplan clocks tests/data/perseus-frequency/gpt3-175b+a100_sxm_bf16.csv
  powerplan clocks tests/data/perseus-frequency/*.csv --max-slowdown 0.02 --format json
  powerplan clocks tests/data/perseus-frequency/*.csv --scale-to H100 --scale-to GB200 \\
      -o clocks
"""


@click.command(
    help=HELP, short_help="The SM clock that saves the most energy within a given slowdown."
)
@click.argument(
    "profiles", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path)
)
@click.option(
    "--gpu",
    default=None,
    help="GPU model the profiles were measured on [default: from the file name after '+', "
    "e.g. a100_sxm_bf16: A100].",
)
@click.option(
    "--max-slowdown",
    "max_slowdowns",
    type=Fraction(0.0, 1.0),
    multiple=True,
    default=DEFAULT_MAX_SLOWDOWNS,
    show_default=True,
    help="Slowdown of a step allowed, a fraction (0.05: 5 %); give it once per value.",
)
@click.option(
    "--scale-to",
    "scale_to",
    multiple=True,
    help="Also give the curve scaled to this GPU model (assumed); once per model.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Write the clock tables: a .csv file (one table) or a directory.",
)
@format_option()
def command(
    profiles: tuple[Path, ...],
    gpu: str | None,
    max_slowdowns: tuple[float, ...],
    scale_to: tuple[str, ...],
    output: Path | None,
    fmt: str,
) -> None:
    from planner.clocks import model_of, read_stage_profile, step_table
    from planner.errors import ProfileError
    from powerd.gpu.clock_table import ClockTable

    targets = [_model_key(m, "--scale-to") for m in scale_to]
    measured_on = None if gpu is None else _model_key(gpu, "--gpu")
    tables: list[tuple[str, ClockTable, bool]] = []
    for path in profiles:
        model = measured_on or model_of(path)
        if model is None:
            raise click.UsageError(f"{path.name}: the file name names no GPU model; give --gpu")
        try:
            profile = read_stage_profile(path)
        except ProfileError as exc:
            raise click.ClickException(str(exc)) from None
        table = step_table(profile, model)
        tables.append((profile.workload, table, True))
        tables += [(profile.workload, table.scaled_to(t), False) for t in targets if t != model]
    if output is not None:
        _write_tables(output, tables, max_slowdowns)
    emit(
        {"clocks": _rows(tables, max_slowdowns)},
        fmt,
        extra={
            "step": "time of the slowest stage, energy of every stage, relative to the highest "
            "clock",
            "scaled": "measured = no: the measured curve at the same fraction of the model's "
            "maximum SM clock (assumed)",
        },
    )


def _model_key(name: str, flag: str) -> str:
    from powerd.gpu.models import gpu_model

    try:
        return gpu_model(name).key
    except KeyError as exc:
        raise click.BadParameter(exc.args[0], param_hint=flag) from None


def _rows(tables: list[tuple[str, Any, bool]], max_slowdowns: tuple[float, ...]) -> Any:
    import pandas as pd

    from planner.clocks import recommend
    from powerd.gpu.models import gpu_model

    rows = []
    for workload, table, measured in tables:
        top_mhz = gpu_model(table.model).sm_clock_max_mhz
        for rec in recommend(table, max_slowdowns):
            rows.append(
                {
                    "workload": workload,
                    "gpu": table.model,
                    "measured": measured,
                    "max_slowdown_pct": 100 * rec.max_slowdown,
                    "clock_mhz": rec.clock_mhz,
                    "clock_pct": 100 * rec.clock_mhz / top_mhz,
                    "slowdown_pct": 100 * rec.slowdown,
                    "power_pct": 100 * rec.power_rel,
                    "energy_saved_pct": 100 * rec.energy_saved,
                }
            )
    return pd.DataFrame(rows)


def table_name(workload: str, model: str) -> str:
    """The file name a table is written under: ``a100-gpt3-175b``."""
    return f"{model.lower()}-{workload}"


def _write_tables(
    output: Path, tables: list[tuple[str, Any, bool]], max_slowdowns: tuple[float, ...]
) -> None:
    from planner.clocks import recommend
    from powerd.gpu.clock_table import clock_table_csv

    if output.suffix.lower() == ".csv":
        if len(tables) != 1:
            raise click.BadParameter(
                f"{len(tables)} tables to write; give a directory, not {output.name}",
                param_hint="-o",
            )
        files = {output: tables[0]}
    else:
        if output.exists() and not output.is_dir():
            raise click.BadParameter(f"{output} is a file; give a directory", param_hint="-o")
        output.mkdir(parents=True, exist_ok=True)
        files = {output / f"{table_name(w, t.model)}.csv": (w, t, m) for w, t, m in tables}
    for path, (workload, table, _) in files.items():
        best = "; ".join(
            f"{100 * r.max_slowdown:g} % slower: {r.clock_mhz:g} MHz saves "
            f"{100 * r.energy_saved:.1f} %"
            for r in recommend(table, max_slowdowns)
        )
        notes = (f"workload: {workload}", f"written by powerplan clocks; {best}")
        write_whole(path, functools.partial(_write_text, clock_table_csv(table, notes)))
        click.echo(f"wrote {path}", err=True)


def _write_text(text: str, path: Path) -> None:
    path.write_text(text, encoding="utf-8")
