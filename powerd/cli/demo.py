"""``powerd demo``: the whole loop on this machine (powerd.demo; needs the 'demo' extra)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from powerd.cli.options import old_spelling, record_option, setup_logging
from powerd.click_types import Quantity, safety_option

if TYPE_CHECKING:
    from powerd.topology import Topology


@click.command(
    "demo", short_help="The whole loop on this machine, simulated GPUs, no servers (~45 s)."
)
@click.option(
    "--duration-s",
    "duration_s",
    type=Quantity("s"),
    default=40.0,
    show_default=True,
    help="How long the jobs run (setup and teardown add about 3 s), 20 to 3600.",
)
@old_spelling("--duration", "--duration-s", "duration_s")
@click.option(
    "--summary-json",
    "summary_json",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the summary as JSON to this file.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("demo-power.png"),
    show_default=True,
    help="PNG of power against budget and limit over time (the temp dir if it cannot be written).",
)
@click.option(
    "--budgets",
    "budgets_path",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Another budgets file [default: powerd/data/budgets/demo.toml].",
)
@click.option(
    "--live/--no-live", default=None, help="Live view [default: when the output is a terminal]."
)
@record_option("Also record the controller's telemetry, as `powerd controller --record` does.")
@click.option(
    "--record-demand",
    "demand_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write what each GPU would draw uncapped, every 0.1 s, as a profile CSV for "
    "powerplan: the truth beside a capped --record (docs/PLANNER.md, 'Capped samples').",
)
@click.option(
    "--smoothing",
    is_flag=True,
    help="Grid smoothing: the controller asks every GPU for its share of the budgets file's "
    "[site.grid] ramps and floor; the demo's H100s have no hardware smoothing, so their jobs "
    "fill their waits in software, and the run goes on while they ramp down at the end.",
)
@click.option(
    "--compute-s",
    "compute_s",
    type=Quantity("s"),
    help="The jobs' rhythm: compute per step (the low-priority job's is 0.5 s longer), "
    "0.5 to 600 [default: 3 s].",
)
@click.option(
    "--comm-s",
    "comm_s",
    type=Quantity("s"),
    help="The jobs' rhythm: exposed communication per step, 0.1 to 60 [default: 1.5 s, "
    "compressed: a third of each step waits; a real job waits a small share of its step].",
)
@click.option(
    "--checkpoint-s",
    "checkpoint_s",
    type=Quantity("s"),
    help="How long each job's one checkpoint takes, 0.5 to 600; it begins after half the run "
    "[default: 3 s, compressed: a real one takes tens of seconds].",
)
@safety_option("How the controller keeps every level within its limit.")
def command(
    duration_s: float,
    summary_json: Path | None,
    plot_path: Path,
    budgets_path: Path | None,
    live: bool | None,
    record: str | None,
    demand_path: Path | None,
    smoothing: bool,
    compute_s: float | None,
    comm_s: float | None,
    checkpoint_s: float | None,
    safety: str,
) -> None:
    """The whole loop on this machine, no servers: broker, controller, agents, jobs.

    An embedded MQTT broker, the controller, and a node agent on simulated
    GPUs for every node of the budgets file (2 rows x 4 racks x 8 nodes x 4
    H100), running two synthetic synchronous LLM training jobs (high priority
    on row1, low on row2) that announce start, compute, exposed communication,
    a checkpoint and stop through powerd.jobhook. The budgets are tight: racks,
    rows and the site must be capped. Prints a summary (seconds over budgets
    and limits, peak site ramp, energy, throughput relative to uncapped),
    writes a PNG, and exits 1 if any rack, row, node or the site drew more
    than its limit.

    \b
    Examples:
      powerd demo                                   # 40 s, a live view in a terminal
      powerd demo --duration-s 20 --no-live --summary-json summary.json
      powerd demo --safety bands                    # Dynamo's bands, not safety by caps
      powerd demo --smoothing --budgets powerd/data/budgets/demo.toml --plot smoothing.png
      powerd demo --record 'influx1+http://localhost:8086?db=powerd'   # then Grafana
      powerd demo --smoothing --duration-s 120 --compute-s 9.5 --comm-s 0.5   # a 10 s step
      powerd demo --smoothing --duration-s 300 --compute-s 9.5 --comm-s 0.5 --checkpoint-s 30
    """
    from powerd.extras import MissingExtra, require

    try:
        require("demo", "powerd demo")
        if record is not None and "://" in record:
            require("recorder", "powerd demo --record URL")
    except MissingExtra as exc:
        raise click.ClickException(str(exc)) from None

    from powerd.demo import DemoOptions
    from powerd.demo.console import demo_console, run_in_console
    from powerd.demo.report import print_outcome, save_plot, write_summary_json
    from powerd.topology import BudgetError

    topology = _read_budgets(budgets_path)
    compute_s, comm_s, checkpoint_s = _rhythm(
        duration_s, compute_s, comm_s, checkpoint_s, staged_starts=smoothing
    )
    setup_logging("error")  # the demo shows what happens itself
    console = demo_console()
    options = DemoOptions(
        duration_s=duration_s,
        budgets=budgets_path,
        topology=topology,
        record=record,
        smoothing=smoothing,
        safety_by_caps=safety == "caps",
        compute_s=compute_s,
        comm_s=comm_s,
        checkpoint_s=checkpoint_s,
    )
    try:
        run = run_in_console(options, console, live)
    except (BudgetError, ValueError, RuntimeError, OSError) as exc:
        raise click.ClickException(f"the demo could not run: {exc}") from None
    except KeyboardInterrupt:
        console.print("interrupted: no summary")
        sys.exit(130)
    plot = save_plot(run.trace, plot_path)
    if summary_json is not None:
        write_summary_json(summary_json, run, options, plot)
    print_outcome(console, run, plot, record)
    if demand_path is not None:
        from powerd.demo.demand_profile import write_demand_profile

        rows = write_demand_profile(run.topology, run.trace, demand_path)
        console.print(f"demand: {rows:,} samples written to {demand_path}")
    if run.summary.limit_violated:
        sys.exit(run.summary.exit_code)


def _read_budgets(budgets_path: Path | None) -> Topology | None:
    """The budgets file given, read once (the run takes it as it is), its warnings shown;
    None for the shipped file, which is in proportion (a test says so)."""
    if budgets_path is None:
        return None
    from powerd.topology import BudgetError, load_budgets
    from powerd.topology.checks import budget_warnings

    try:
        topology = load_budgets(budgets_path)
    except BudgetError as exc:
        raise click.ClickException(f"the demo could not run: {exc}") from None
    for warning in budget_warnings(topology):
        click.echo(f"warning: budgets: {warning}", err=True)
    return topology


def _rhythm(
    duration_s: float,
    compute_s: float | None,
    comm_s: float | None,
    checkpoint_s: float | None,
    *,
    staged_starts: bool,
) -> tuple[float, float, float]:
    """The jobs' compute, communication and checkpoint seconds (the scenario's defaults for
    those not given), checked against the run's duration; click.BadParameter if they do
    not fit."""
    from powerd.demo import MIN_DURATION_S
    from powerd.demo.scenario import CHECKPOINT_S, COMM_S, COMPUTE_S, check_checkpoint, check_rhythm

    if not MIN_DURATION_S <= duration_s <= 3600:
        raise click.BadParameter(
            f"at least {MIN_DURATION_S:g} s (to see every phase) and at most 3600 s",
            param_hint="--duration-s",
        )
    compute_s = COMPUTE_S if compute_s is None else compute_s
    comm_s = COMM_S if comm_s is None else comm_s
    checkpoint_s = CHECKPOINT_S if checkpoint_s is None else checkpoint_s
    try:
        check_rhythm(duration_s, compute_s, comm_s)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--compute-s/--comm-s") from None
    try:
        check_checkpoint(duration_s, compute_s, comm_s, checkpoint_s, staged_starts=staged_starts)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--checkpoint-s") from None
    return compute_s, comm_s, checkpoint_s
