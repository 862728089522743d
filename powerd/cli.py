"""The ``powerd`` command: ``agent``, ``demo``, ``unit``."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
from importlib import resources
from pathlib import Path

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
    powerd gpus        what the agent reads from this node's GPUs
    powerd demo        the whole loop on this machine, simulated GPUs, no servers
    powerd unit agent  print the systemd unit for the agent

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
    "--duration", "duration_s", type=float, default=24.0, show_default=True, help="Seconds to run."
)
@click.option(
    "--gpus",
    "spec",
    default="4xH100",
    show_default=True,
    help="Simulated GPUs on the demo node, COUNTxMODEL.",
)
@click.option(
    "--live/--no-live", default=None, help="Live table [default: when the output is a terminal]."
)
def demo(duration_s: float, spec: str, live: bool | None) -> None:
    """Run a node agent on simulated GPUs with an embedded broker: no servers needed.

    A scripted controller sends heartbeats, caps the GPUs, locks clocks during
    a communication phase, then goes silent: watch the agent apply, clamp,
    acknowledge, and fall back to its failsafe caps on its own. Exits non-zero
    if any GPU drew more than its cap or the agent did not behave.
    """
    from rich.console import Console

    from powerd.demo import run_demo

    setup_logging("error")  # the demo shows the agent's events itself
    if duration_s < 6:
        raise click.BadParameter("at least 6 s, to see the whole script", param_hint="--duration")
    console = Console()
    result = asyncio.run(
        run_demo(duration_s, spec, console, live_view=console.is_terminal if live is None else live)
    )
    console.print(
        f"\n{result.samples} telemetry samples, {len(result.acks)} acks "
        f"({', '.join(sorted({a.result for a in result.acks}))}), modes "
        f"{' -> '.join(result.modes_seen)}, energy {result.energy_j / 3.6e6 * 1000:.1f} Wh, "
        f"max power above cap {max(0.0, result.max_power_over_cap_w):.1f} W"
    )
    if not result.ok:
        raise click.ClickException("the demo did not show the expected behaviour (see above)")
    console.print("[green]ok[/]: commands applied and clamped, failsafe reached on its own")


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

    from rich.console import Console
    from rich.table import Table

    from powerd.gpu.open import close_gpus, open_gpus

    setup_logging("warning")
    try:
        opened = open_gpus(simulate)
    except GpuError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        rows = []
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
    table = Table(title=", ".join(sorted({str(r.get("name", "?")) for r in rows})))
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
    for header in columns:
        table.add_column(header, justify="right")
    for row in rows:
        if "error" in row:
            table.add_row(str(row["index"]), f"[red]{row['error']}[/]")
            continue
        row["energy_j"] = None if row["energy_j"] is None else row["energy_j"] / 1000
        table.add_row(*[_cell(row[key]) for key in columns.values()])
    Console().print(table)


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


def render_agent_unit(exec_path: str, config_path: str) -> str:
    text = resources.files("powerd.data").joinpath("powerd-agent.service").read_text()
    return text.replace("/usr/local/bin/powerd", exec_path).replace(
        "/etc/powerd/agent.toml", config_path
    )


def _this_executable() -> str:
    found = shutil.which("powerd")
    return str(Path(found).resolve()) if found else str(Path(sys.argv[0]).resolve())


if __name__ == "__main__":
    main()
