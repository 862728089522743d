"""``powerd fleet``: simulated agents in bulk against a real broker (powerd.fleet.app)."""

from __future__ import annotations

from pathlib import Path

import click

from powerd.cli.options import log_level_option, setup_logging
from powerd.click_types import Fraction, Quantity
from powerd.vocabulary import PRIORITIES


@click.command(
    "fleet", short_help="Thousands of simulated agents against a real broker (scale tests)."
)
@click.option(
    "--budgets",
    "budgets_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Budget tree (TOML): the nodes to simulate, their GPUs, racks and thresholds.",
)
@click.option("--broker", default="mqtt://localhost", show_default=True, help="Broker URL.")
@click.option(
    "--trust",
    multiple=True,
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Public key (PEM) of the controller the simulated agents obey, as an agent's "
    "--trust; repeatable.",
)
@click.option("--cluster", default="default", show_default=True, help="Topic prefix cluster.")
@click.option(
    "--scope",
    metavar="ROW|NAME:ROW,ROW",
    help="Simulate only these rows' nodes, following that scope's leaf controllers "
    "(`powerd controller --scope`); one fleet per scope for a tree of controllers.",
)
@click.option("--nodes", type=click.IntRange(min=1), help="Only the first N nodes [default: all].")
@click.option(
    "--period-s",
    default=1.0,
    show_default=True,
    type=Quantity("s", 0.01),
    help="Every node's telemetry period (agents' period_s).",
)
@click.option(
    "--connections",
    default=4,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Connections carrying the telemetry.",
)
@click.option(
    "--control-connections",
    default=16,
    show_default=True,
    type=click.IntRange(1, 1024),
    help="Connections taking the nodes' commands (a share of the nodes each) and sending acks.",
)
@click.option(
    "--duration-s",
    type=Quantity("s", 0),
    help="Stop after this long [default: run until stopped, Ctrl-C].",
)
@click.option(
    "--base-load",
    default=0.6,
    show_default=True,
    type=Fraction(0, 1),
    help="What every GPU wants to draw, as a share of its maximum cap.",
)
@click.option(
    "--silent-fraction",
    default=0.0,
    type=Fraction(0, 1),
    show_default=True,
    help="Share of the nodes that never report (the controller counts them stale).",
)
@click.option(
    "--offline-fraction",
    default=0.0,
    type=Fraction(0, 1),
    show_default=True,
    help="Share of the nodes with a retained offline status and no telemetry.",
)
@click.option(
    "--failsafe-after-s",
    default=10.0,
    show_default=True,
    type=Quantity("s", 0.1),
    help="The agents' failsafe_after_s: no live heartbeat this long, every node to failsafe.",
)
@click.option(
    "--start",
    default="fresh",
    show_default=True,
    type=click.Choice(["fresh", "running"]),
    help="fresh: agents just started (failsafe caps until a controller leads); running: a "
    "site already under control (caps at their maximum), as when a controller is replaced.",
)
@click.option(
    "--push-every-s",
    default=0.0,
    show_default=True,
    type=Quantity("s", 0),
    help="Push a rack to full power this often and time the controller's reaction (0: never).",
)
@click.option(
    "--push-hold-s",
    default=5.0,
    show_default=True,
    type=Quantity("s", 0.1),
    help="How long a pushed rack stays at full power.",
)
@click.option(
    "--jobs",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Training jobs (whole racks each) announcing startup, then compute and communication "
    "in turn; a long node list is announced as a Slurm-style host list.",
)
@click.option(
    "--job-priority",
    type=click.Choice(PRIORITIES),
    help="Every job's priority [default: high, normal, low in turn].",
)
@click.option(
    "--compute-s",
    default=20.0,
    show_default=True,
    type=Quantity("s", 0.1),
    help="With --jobs: how long each compute phase lasts.",
)
@click.option(
    "--communication-s",
    default=3.0,
    show_default=True,
    type=Quantity("s", 0.1),
    help="With --jobs: how long each communication phase lasts (GPUs draw a third).",
)
@click.option(
    "--warmup-s",
    default=10.0,
    show_default=True,
    type=Quantity("s", 0),
    help="No rack is pushed before this.",
)
@click.option("--seed", default=1, show_default=True, type=int, help="Noise, order, failures.")
@click.option(
    "--verify-every",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Check the signature of one command in this many; the others are refused only if "
    "unsigned or signed by an unknown key. Each real agent checks its own on its own CPU "
    "(~120 us); one process playing 20,736 of them may sample, to measure the controller "
    "rather than itself.",
)
@click.option(
    "--report-json",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write what was measured here as JSON (else it is printed).",
)
@log_level_option()
def command(
    budgets_path: Path, broker: str, cluster: str, log_level: str, **options: object
) -> None:
    """Simulate every node of a budgets file in one process, against a real broker.

    Each simulated node publishes protocol-valid telemetry every PERIOD (spread
    over the period), follows the controller's heartbeat, applies and acks
    its commands as an agent does (caps clamped into the GPU's range, the
    next telemetry shows them) and falls to its failsafe caps when the
    heartbeat stops. Options add silent and offline nodes and racks pushed to
    full power, whose reaction time (push, until the acks that bring the rack
    back under its capping threshold) is reported with the heartbeat gaps the
    nodes saw. For scale tests and bench/bench_scale.py; no GPU is touched.

    \b
    Examples:
      powerd keys generate /tmp/ctl                   # the controller's key pair
      powerd controller --budgets powerd/data/budgets/site-150mw.toml --signing-key /tmp/ctl.key &
      powerd fleet --budgets powerd/data/budgets/site-150mw.toml --trust /tmp/ctl.pub \\
        --duration-s 120 --push-every-s 30 --jobs 4 --report-json fleet.json
    """
    from powerd.fleet.app import run_fleet

    setup_logging(log_level)
    try:
        run_fleet(budgets_path, broker, cluster, **options)  # type: ignore[arg-type]
    except (ValueError, OSError, ConnectionError) as exc:
        raise click.ClickException(str(exc)) from None
