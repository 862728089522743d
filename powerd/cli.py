"""The ``powerd`` command: ``agent``, ``demo``, ``unit``."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import signal
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import click

from powerd import __version__
from powerd.agent.config import AgentConfig, ConfigError, load_config
from powerd.gpu import GpuError

log = logging.getLogger("powerd")


def setup_logging(level: str) -> None:
    """One line per event. Under systemd the journal adds the time, so we don't."""
    fmt = "%(levelname)s %(name)s: %(message)s"
    if not os.environ.get("JOURNAL_STREAM"):
        fmt = "%(asctime)s " + fmt
    logging.basicConfig(level=level.upper(), format=fmt, stream=sys.stderr, force=True)
    # paho and aiomqtt are chatty at INFO about things the agent already logs
    logging.getLogger("aiomqtt").setLevel(logging.WARNING)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="powerd")
def main() -> None:
    """powerd: power management for GPU training clusters.

    \b
    powerd agent       the node agent (systemd service on every GPU node)
    powerd controller  the cluster controller: keeps every rack, row and the site in budget
    powerd gpus        what the agent reads from this node's GPUs
    powerd demo        the whole loop on this machine, simulated GPUs, no servers
    powerd fleet       thousands of simulated agents against a real broker (scale tests)
    powerd unit agent  print the systemd unit for the agent (unit controller: the controller)

    The wire protocol is in docs/PROTOCOL.md.
    """


@main.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Agent config file (TOML). Without it: defaults, node name from the hostname.",
)
@click.option("--broker", help="Broker URL, mqtt://HOST[:PORT] or mqtts://HOST[:PORT] (TLS).")
@click.option("--cluster", help="Cluster name, the topic prefix is powerd/v1/CLUSTER.")
@click.option("--node", help="This node's name [default: short hostname].")
@click.option(
    "--simulate",
    metavar="SPEC",
    help="Simulated GPUs instead of NVML, for example 4xH100, 8xGB200, 2xA100.",
)
@click.option("--period-s", type=float, help="Telemetry and safety-check period [default: 1].")
@click.option(
    "--failsafe-after-s",
    type=float,
    help="Failsafe caps after this long without a controller heartbeat [default: 10].",
)
@click.option(
    "--on-exit",
    type=click.Choice(["keep", "restore"]),
    help="On stop, keep the current caps (safe on an oversubscribed site) or restore defaults.",
)
@click.option(
    "--local",
    "local_mode",
    is_flag=True,
    default=None,
    help="No controller: hold the failsafe caps and publish telemetry only.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def agent(
    config_path: Path | None,
    broker: str | None,
    cluster: str | None,
    node: str | None,
    simulate: str | None,
    period_s: float | None,
    failsafe_after_s: float | None,
    on_exit: str | None,
    local_mode: bool | None,
    log_level: str,
) -> None:
    """Run the node agent.

    At start, before connecting anywhere, it applies the failsafe caps. Then it
    publishes telemetry every period, applies the caps and clock locks the
    controller sends (clamped to each GPU's range, acknowledged with read-back
    values), and falls back to the failsafe caps when the controller's
    heartbeat or the last command's TTL runs out. SIGTERM or SIGINT stops it
    cleanly: offline status published, caps kept or restored (--on-exit).

    Run it as root on a GPU node: NVML only lets root set power limits and
    lock clocks.
    """
    setup_logging(log_level)
    try:
        config = load_config(config_path).with_overrides(
            broker=broker,
            cluster=cluster,
            node=node,
            simulate=simulate,
            period_s=period_s,
            failsafe_after_s=failsafe_after_s,
            on_exit=on_exit,
            mode="local" if local_mode else None,
        )
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        asyncio.run(run_agent(config))
    except (GpuError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


async def run_agent(config: AgentConfig) -> None:
    """Open the GPUs, run the daemon until SIGTERM/SIGINT, close the GPUs."""
    from powerd.agent.daemon import AgentDaemon
    from powerd.gpu.open import close_gpus, open_gpus

    gpus = open_gpus(config.simulate, config.gpu_indices)
    if not gpus:
        raise GpuError("no GPUs to manage (check agent.gpu_indices and the driver)")
    log.info(
        "powerd agent %s: node %s, cluster %s, %d GPU(s) (%s), broker %s, mode %s",
        __version__,
        config.node,
        config.cluster,
        len(gpus),
        gpus[0].name,
        config.broker.display,
        config.mode,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await AgentDaemon(config, gpus).run(stop)
    finally:
        close_gpus(gpus)


@main.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Controller config file (TOML). Without it: defaults (broker mqtt://localhost).",
)
@click.option(
    "--budgets",
    "budgets_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Budget tree (TOML, docs/BUDGETS.md): site, rows, racks, nodes and their budgets.",
)
@click.option("--broker", help="Broker URL, mqtt://HOST[:PORT] or mqtts://HOST[:PORT] (TLS).")
@click.option("--cluster", help="Cluster name, the topic prefix is powerd/v1/CLUSTER.")
@click.option("--name", help="This controller's name [default: short hostname].")
@click.option("--cycle-s", type=float, help="Control period [default: 1].")
@click.option(
    "--record",
    metavar="URL|FILE",
    help="Record telemetry: influx+http://HOST:PORT?org=O&bucket=B, or a line-protocol file.",
)
@click.option(
    "--no-record",
    is_flag=True,
    help="Record nothing (default: the configured recorder, else telemetry.lp in the state dir).",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def controller(
    config_path: Path | None,
    budgets_path: Path,
    broker: str | None,
    cluster: str | None,
    name: str | None,
    cycle_s: float | None,
    record: str | None,
    no_record: bool,
    log_level: str,
) -> None:
    """Run the cluster controller.

    Every cycle it sums the agents' telemetry up the budget tree (node, rack,
    row, site), caps the GPUs of any tree node above its capping threshold
    down to its target (low-priority jobs first, then the GPUs drawing most),
    hands watts back gradually below the uncapping threshold within every
    level's ramp limit, locks SM clocks during communication phases, and sends
    each node a command only when its caps change. A silent or offline node
    counts at its failsafe power.

    It leads with an epoch one above the highest it finds in the retained
    heartbeat, and steps down when it sees a newer one: a second controller
    started with the same settings is a standby that takes over when the
    leader goes silent.
    """
    from powerd.controller.app import run_controller
    from powerd.controller.config import load_controller_config
    from powerd.extras import MissingExtra
    from powerd.topology import BudgetError

    setup_logging(log_level)
    try:
        config = load_controller_config(config_path).with_overrides(
            broker=broker, cluster=cluster, name=name, cycle_s=cycle_s
        )
        if record is not None and no_record:
            raise ConfigError("give --record or --no-record, not both")
        if record is not None:
            is_url = "://" in record
            config = config.with_overrides(
                recorder=dataclasses.replace(
                    config.recorder,
                    enabled=True,
                    url=record if is_url else None,
                    file=None if is_url else record,
                )
            )
        if no_record:
            config = config.with_overrides(
                recorder=dataclasses.replace(config.recorder, enabled=False)
            )
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        asyncio.run(run_controller(config, budgets_path))
    except (BudgetError, OSError, ValueError, MissingExtra) as exc:
        raise click.ClickException(str(exc)) from None


@main.command()
@click.option(
    "--duration",
    "duration_s",
    type=float,
    default=40.0,
    show_default=True,
    help="Seconds the jobs run (setup and teardown add about 3 s). At least 20.",
)
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
@click.option(
    "--record",
    metavar="FILE|URL",
    default=None,
    help="Also record the controller's telemetry, as `powerd controller` does: a .lp file,"
    " influx+http://HOST:8086?org=ORG&bucket=BUCKET (v2 API) or"
    " influx1+http://HOST:8086?db=DB (InfluxDB 1.x); see grafana/README.md.",
)
def demo(
    duration_s: float,
    summary_json: Path | None,
    plot_path: Path,
    budgets_path: Path | None,
    live: bool | None,
    record: str | None,
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
    """
    import json
    import tempfile

    from powerd.extras import MissingExtra, require

    try:
        require("demo", "powerd demo")
        if record is not None and "://" in record:
            require("recorder", "powerd demo --record URL")
    except MissingExtra as exc:
        raise click.ClickException(str(exc)) from None

    from rich.console import Console
    from rich.live import Live

    from powerd.demo import MIN_DURATION_S, DemoOptions, run_demo
    from powerd.demo.view import EventLog, LiveView, print_summary
    from powerd.topology import BudgetError

    if not MIN_DURATION_S <= duration_s <= 3600:
        raise click.BadParameter(
            f"at least {MIN_DURATION_S:g} s (to see every phase) and at most 3600 s",
            param_hint="--duration",
        )
    setup_logging("error")  # the demo shows what happens itself
    console = Console()
    if not console.is_terminal:  # a log or a pipe: no reason to wrap at 80 columns
        console = Console(width=110)
    live = console.is_terminal if live is None else live
    options = DemoOptions(duration_s=duration_s, budgets=budgets_path, record=record)
    console.print(
        f"powerd demo: {duration_s:g} s on {budgets_path or 'powerd/data/budgets/demo.toml'}, "
        "embedded broker, controller, one agent per node, two training jobs",
        highlight=False,
    )
    try:
        if live:
            view = LiveView()
            with Live(console=console, auto_refresh=False, transient=False) as screen:
                run = asyncio.run(
                    run_demo(options, lambda state: screen.update(view.render(state), refresh=True))
                )
        else:
            run = asyncio.run(run_demo(options, EventLog(console)))
    except (BudgetError, ValueError, RuntimeError, OSError) as exc:
        raise click.ClickException(f"the demo could not run: {exc}") from None
    except KeyboardInterrupt:
        console.print("interrupted: no summary")
        sys.exit(130)
    summary = run.summary

    from powerd.demo.plot import plot_trace

    try:
        written = plot_trace(run.trace, plot_path)
    except OSError:
        written = plot_trace(run.trace, Path(tempfile.gettempdir()) / plot_path.name)
    if summary_json is not None:
        top = run.topology
        report = summary.to_dict() | {
            "setup_s": run.setup_s,
            "wall_s": run.wall_s,
            "budgets": top.source,
            "topology": {
                "rows": len(top.rows),
                "racks": len(top.racks),
                "nodes": len(top.servers),
                "gpus": top.n_gpus,
            },
            "agent_period_s": options.agent_period_s,
            "cycle_s": options.cycle_s,
            "sample_s": options.sample_s,
        }
        report["plot"] = str(written.resolve())
        if run.recorded is not None:
            report["recorded"] = run.recorded
        summary_json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    console.print()
    print_summary(console, summary, str(written.resolve()))
    if run.recorded is not None:
        r = run.recorded
        console.print(
            f"telemetry: {r['written']:,} points recorded to {record}"
            + (
                f", {r['dropped']:,} dropped ({r['write_errors']} write errors)"
                if r["dropped"]
                else ""
            ),
            highlight=False,
        )
    if summary.limit_violated:
        for v in summary.limit_violations:
            console.print(
                f"[bold red]LIMIT VIOLATED[/]: {v['level']} {v['name']} drew up to "
                f"{v['peak_w'] / 1e3:.1f} kW, above its {v['limit_w'] / 1e3:g} kW limit, "
                f"for {v['seconds']:.1f} s (first at {v['first_at_s']:.1f} s)",
                highlight=False,
            )
        sys.exit(summary.exit_code)
    console.print("[green]ok[/]: no rack, row, node or the site went over its limit")


@main.command()
@click.option(
    "--budgets",
    "budgets_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Budget tree (TOML): the nodes to simulate, their GPUs, racks and thresholds.",
)
@click.option("--broker", default="mqtt://localhost", show_default=True, help="Broker URL.")
@click.option("--cluster", default="default", show_default=True, help="Topic prefix cluster.")
@click.option("--nodes", type=click.IntRange(min=1), help="Only the first N nodes [default: all].")
@click.option(
    "--period-s",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.01),
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
@click.option("--duration-s", type=click.FloatRange(min=0), help="Stop after this long.")
@click.option(
    "--base-load",
    default=0.6,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="What every GPU wants to draw, as a share of its maximum cap.",
)
@click.option(
    "--silent-fraction",
    default=0.0,
    type=click.FloatRange(0, 1),
    show_default=True,
    help="Share of the nodes that never report (the controller counts them stale).",
)
@click.option(
    "--offline-fraction",
    default=0.0,
    type=click.FloatRange(0, 1),
    show_default=True,
    help="Share of the nodes with a retained offline status and no telemetry.",
)
@click.option(
    "--failsafe-after-s",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
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
    type=click.FloatRange(min=0),
    help="Push a rack to full power this often and time the controller's reaction (0: never).",
)
@click.option(
    "--push-hold-s",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="How long a pushed rack stays at full power.",
)
@click.option(
    "--jobs",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Training jobs (whole racks each) announcing startup, then compute and communication "
    "in turn; a job's node list must fit one announcement (~3,000 nodes).",
)
@click.option(
    "--compute-s",
    default=20.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="With --jobs: how long each compute phase lasts.",
)
@click.option(
    "--communication-s",
    default=3.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="With --jobs: how long each communication phase lasts (GPUs draw a third).",
)
@click.option(
    "--warmup-s",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="No rack is pushed before this.",
)
@click.option("--seed", default=1, show_default=True, type=int, help="Noise, order, failures.")
@click.option(
    "--report-json",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write what was measured here as JSON (else it is printed).",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def fleet(budgets_path: Path, broker: str, cluster: str, log_level: str, **options: object) -> None:
    """Simulate every node of a budgets file in one process, against a real broker.

    Each simulated node publishes protocol-valid telemetry every PERIOD (spread
    over the period), follows the controller's heartbeat, applies and acks
    its commands as an agent does (caps clamped into the GPU's range, the
    next telemetry shows them) and falls to its failsafe caps when the
    heartbeat stops. Options add silent and offline nodes and racks pushed to
    full power, whose reaction time (push, until the acks that bring the rack
    back under its capping threshold) is reported with the heartbeat gaps the
    nodes saw. For scale tests and bench/bench_scale.py; no GPU is touched.
    """
    from powerd.fleet.app import run_fleet

    setup_logging(log_level)
    try:
        run_fleet(budgets_path, broker, cluster, **options)  # type: ignore[arg-type]
    except (ValueError, OSError, ConnectionError) as exc:
        raise click.ClickException(str(exc)) from None


@main.command()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("grafana/dashboards"),
    show_default=True,
    help="Directory to write the dashboard JSON files to.",
)
@click.option(
    "--check", is_flag=True, help="Write nothing; exit 1 if a file differs from what is built."
)
def dashboards(out_dir: Path, check: bool) -> None:
    """Build the Grafana dashboards from the telemetry schema (grafana/README.md).

    Every measurement, field and tag the dashboards query comes from
    powerd/telemetry_schema.py, so the dashboards and the writer cannot drift
    apart; edit powerd/grafana/dashboards.py, not the JSON.
    """
    from powerd.grafana.dashboards import stale, write_all

    if check:
        differ = stale(out_dir)
        if differ:
            click.echo(f"out of date in {out_dir}: {', '.join(differ)} (run powerd dashboards)")
            sys.exit(1)
        click.echo(f"{out_dir}: up to date")
        return
    for path in write_all(out_dir):
        click.echo(f"wrote {path}")


@main.command()
@click.option("--simulate", metavar="SPEC", help="Simulated GPUs instead of NVML, e.g. 4xH100.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per GPU instead of a table.")
def gpus(simulate: str | None, as_json: bool) -> None:
    """Show what the agent reads from each GPU: power, energy, limits, clocks.

    Read-only: a quick check on a new node that NVML answers and which power
    reading (instantaneous or 1 s average) the agent will publish.
    """
    import dataclasses
    import json

    from powerd.gpu.open import close_gpus, open_gpus

    setup_logging("warning")
    try:
        opened = open_gpus(simulate)
    except GpuError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        rows: list[dict[str, Any]] = []
        for gpu in opened:
            try:
                sample, limits = gpu.sample(), gpu.power_limit_range()
            except GpuError as exc:
                rows.append({"index": gpu.index, "error": str(exc)})
                continue
            rows.append(
                {
                    **dataclasses.asdict(sample),
                    "name": gpu.name,
                    "cap_min_w": limits.min_w,
                    "cap_max_w": limits.max_w,
                    "cap_default_w": limits.default_w,
                }
            )
    finally:
        close_gpus(opened)
    if as_json:
        for row in rows:
            click.echo(json.dumps(row, default=str))
        return
    # plain text: a GPU node has the agent's dependencies only (no terminal-table library)
    columns = {
        "GPU": "index",
        "W": "power_w",
        "reading": "power_reading",
        "kJ": "energy_j",
        "cap W": "cap_w",
        "min W": "cap_min_w",
        "max W": "cap_max_w",
        "SM MHz": "sm_clock_mhz",
        "lock": "max_sm_clock_mhz",
        "util %": "util_pct",
        "°C": "temp_c",
    }
    lines = [list(columns)]
    errors = []
    for row in rows:  # row: dict[str, Any]
        if "error" in row:
            errors.append(f"GPU {row['index']}: {row['error']}")
            continue
        row["energy_j"] = None if row["energy_j"] is None else row["energy_j"] / 1000
        lines.append([_cell(row[key]) for key in columns.values()])
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    click.echo(", ".join(sorted({str(r.get("name", "?")) for r in rows})))
    for line in lines:
        click.echo("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
    for error in errors:
        click.echo(error, err=True)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.0f}"
    return "-" if value is None else str(value)


@main.group()
def unit() -> None:
    """Print systemd units shipped with powerd."""


@unit.command("agent")
@click.option(
    "--exec",
    "exec_path",
    help="Path of the powerd executable for ExecStart [default: this one].",
)
@click.option("--config", "config_path", default="/etc/powerd/agent.toml", show_default=True)
def unit_agent(exec_path: str | None, config_path: str) -> None:
    """Print the agent's unit file, ExecStart pointing at this installation.

    \b
    powerd unit agent > /etc/systemd/system/powerd-agent.service
    systemctl daemon-reload && systemctl enable --now powerd-agent
    """
    click.echo(render_agent_unit(exec_path or _this_executable(), config_path), nl=False)


@unit.command("controller")
@click.option(
    "--exec",
    "exec_path",
    help="Path of the powerd executable for ExecStart [default: this one].",
)
@click.option("--config", "config_path", default="/etc/powerd/controller.toml", show_default=True)
@click.option("--budgets", "budgets_path", default="/etc/powerd/budgets.toml", show_default=True)
def unit_controller(exec_path: str | None, config_path: str, budgets_path: str) -> None:
    """Print the controller's unit file, ExecStart pointing at this installation.

    \b
    powerd unit controller > /etc/systemd/system/powerd-controller.service
    systemctl daemon-reload && systemctl enable --now powerd-controller
    """
    click.echo(
        render_controller_unit(exec_path or _this_executable(), config_path, budgets_path),
        nl=False,
    )


def _render_unit(file_name: str, replacements: dict[str, str]) -> str:
    text = resources.files("powerd.data").joinpath(file_name).read_text()
    for default, value in replacements.items():
        text = text.replace(default, value)
    return text


def render_agent_unit(exec_path: str, config_path: str) -> str:
    return _render_unit(
        "powerd-agent.service",
        {"/usr/local/bin/powerd": exec_path, "/etc/powerd/agent.toml": config_path},
    )


def render_controller_unit(exec_path: str, config_path: str, budgets_path: str) -> str:
    return _render_unit(
        "powerd-controller.service",
        {
            "/usr/local/bin/powerd": exec_path,
            "/etc/powerd/controller.toml": config_path,
            "/etc/powerd/budgets.toml": budgets_path,
        },
    )


def _this_executable() -> str:
    found = shutil.which("powerd")
    return str(Path(found).resolve()) if found else str(Path(sys.argv[0]).resolve())


if __name__ == "__main__":
    main()
