"""``powerplan rhythm``: the profile of a synchronous training job, phase by phase."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import click

from planner.commands.profiles import OUT_SUFFIXES, write_table
from powerd.click_types import Quantity

HELP = """Write the power profile of a synchronous training job: every GPU idle, starting,
computing with a communication wait every --period-s, pausing for checkpoints, then
stopped, all together (planner/rhythm.py).

\b
Each phase draws the GPU's idle power plus its share of the rise to --compute-w
(the simulated GPU's loads: compute 1.0, communication 0.2, startup and
checkpoint 0.05, stopped 0); a phase shorter than a step is averaged into it.
The file is a profile like any measured one: replay it with
`powerplan whatif --synchronised` to see the grid's worst case.

\b
Examples:
  powerplan rhythm rhythm.parquet --gpu GB200 --run-s 3600 --checkpoints 2
  # the shipped mix's llm-7b job as a rhythm, replayed with its other jobs under
  # grid smoothing, every job starting together:
  powerplan rhythm rhythm.csv --gpu H100 --workload llm-7b --run-s 600 --comm-s 0.5
  powerplan whatif powerd/data/budgets/demo.toml rhythm.csv tests/data/profiles/telemetry.lp \\
      --workload untagged --mix examples/planning/mix.toml --step-s 0.5 \\
      --duration-s 750 --synchronised --smoothing
"""


# the schedule's options: (Rhythm field, help, whether 0 is refused); defaults from Rhythm
SCHEDULE = (
    ("idle_s", "Idle before the job starts.", False),
    ("startup_s", "Starting (loading data, compiling).", True),
    ("run_s", "Training, checkpoint pauses included.", True),
    ("period_s", "One communication wait every this many seconds.", True),
    ("comm_s", "How long each communication wait lasts (exposed communication).", False),
    ("checkpoint_s", "How long each checkpoint pauses the job.", False),
    ("tail_s", "Stopped, after the run (to see the ramp down).", False),
    ("step_s", "One sample per GPU every this many seconds.", True),
)


def schedule_options(f: Callable[..., None]) -> Callable[..., None]:
    """A --NAME-s option per SCHEDULE entry, its default the Rhythm field's."""
    from planner.rhythm import Rhythm

    defaults = {f.name: f.default for f in dataclasses.fields(Rhythm)}
    for name, text, positive in reversed(SCHEDULE):
        f = click.option(
            "--" + name.replace("_", "-"),
            type=Quantity("s", 0, min_open=positive),
            default=defaults[name],
            show_default=True,
            help=text,
        )(f)
    return click.option(
        "--checkpoints",
        type=click.IntRange(min=0),
        default=defaults["checkpoints"],
        show_default=True,
        help="Checkpoint pauses, evenly spread in the run.",
    )(f)


@click.command(
    help=HELP, short_help="The power profile of a synchronous training job, phase by phase."
)
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--workload", default="rhythm", show_default=True, help="The workload's name.")
@click.option("--gpu", default="GB200", show_default=True, help="GPU model (idle power, TDP).")
@click.option(
    "--compute-w",
    type=Quantity("W", 0, min_open=True),
    default=None,
    help="Per-GPU power while computing [default: 90 % of the model's max limit].",
)
@click.option(
    "--gpus",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="GPUs in the profile (one node).",
)
@schedule_options
def command(out: Path, workload: str, gpus: int, **schedule: float) -> None:
    from planner.rhythm import Rhythm, rhythm_profile

    if out.suffix.lower() not in OUT_SUFFIXES:
        raise click.BadParameter(
            f"write {', '.join(OUT_SUFFIXES)}, not {out.name}", param_hint="OUT"
        )
    try:
        rhythm = Rhythm(**schedule)  # type: ignore[arg-type]
    except (ValueError, KeyError) as exc:
        raise click.ClickException(str(exc).strip("'\"")) from None
    table = rhythm_profile(rhythm, workload, gpus)
    write_table(table, out)
    click.echo(
        f"{out}: {gpus} GPUs × {len(table) // gpus} steps of {rhythm.step_s:g} s "
        f"({rhythm.duration_s:g} s), workload {workload!r}"
    )
