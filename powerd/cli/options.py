"""What the ``powerd`` commands share, declared once: click options and log set-up. The
parameter types of quantities, which ``powerplan`` shares too, are ``powerd.click_types``'."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

from powerd.click_types import Decorator


def setup_logging(level: str) -> None:
    """One line per event. Under systemd the journal adds the time, so we don't."""
    fmt = "%(levelname)s %(name)s: %(message)s"
    if not os.environ.get("JOURNAL_STREAM"):
        fmt = "%(asctime)s " + fmt
    logging.basicConfig(level=level.upper(), format=fmt, stream=sys.stderr, force=True)
    # paho and aiomqtt are chatty at INFO about things the agent already logs
    logging.getLogger("aiomqtt").setLevel(logging.WARNING)


def log_level_option() -> Decorator:
    """--log-level for ``setup_logging`` [default: info]."""
    return click.option(
        "--log-level",
        default="info",
        show_default=True,
        type=click.Choice(["debug", "info", "warning", "error"]),
    )


def config_option(help: str) -> Decorator:
    """--config FILE (TOML), passed as ``config_path``."""
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help=help,
    )


def broker_option(default: str = "broker.url of --config, else mqtt://localhost") -> Decorator:
    """--broker URL, overriding the config file's."""
    return click.option(
        "--broker",
        metavar="URL",
        help=f"Broker URL, mqtt://HOST[:PORT] or mqtts://HOST[:PORT] (TLS) [default: {default}].",
    )


def metrics_listen_option(port: int) -> Decorator:
    """--metrics-listen HOST:PORT: serve Prometheus /metrics there (powerd.metrics)."""
    return click.option(
        "--metrics-listen",
        metavar="HOST:PORT",
        help=f"Serve Prometheus metrics at http://HOST:PORT/metrics, for example 0.0.0.0:{port} "
        '(docs/OPERATIONS.md, "Metrics"). Replaces metrics.listen [default: off].',
    )


def trust_option(only: str, default: str) -> Decorator:
    """``--trust PUB`` (repeatable, into ``trust_paths``): the leaders' public keys."""
    return click.option(
        "--trust",
        "trust_paths",
        multiple=True,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help=f"A controller's (or coordinator's) public key: {only} (repeat for several) "
        f"[default: {default}].",
    )


def budgets_option(help: str) -> Decorator:
    """--budgets FILE (required), passed as ``budgets_path``."""
    return click.option(
        "--budgets",
        "budgets_path",
        required=True,
        type=click.Path(dir_okay=False, path_type=Path),
        help=help,
    )


def signing_key_option(help: str) -> Decorator:
    """--signing-key FILE: the role's private key (PEM)."""
    return click.option("--signing-key", type=click.Path(dir_okay=False, path_type=Path), help=help)


def cluster_option(default: str = "the config's, else default") -> Decorator:
    """--cluster NAME, overriding the config file's."""
    return click.option(
        "--cluster",
        metavar="NAME",
        help=f"Cluster name, the topic prefix is powerd/v1/CLUSTER [default: {default}].",
    )


def simulate_option(help: str) -> Decorator:
    """--simulate SPEC: simulated GPUs (``4xH100``) instead of NVML."""
    return click.option("--simulate", metavar="SPEC", help=help)


def exec_option() -> Decorator:
    """--exec PATH of the powerd executable a systemd unit runs, passed as ``exec_path``."""
    return click.option(
        "--exec",
        "exec_path",
        help="Path of the powerd executable for ExecStart [default: this one].",
    )


RECORD_FORMS = (
    "A line-protocol file (a path, or file:///PATH.lp), "
    "InfluxDB 2.x: influx+http://HOST:8086?org=ORG&bucket=BUCKET (influx+https:// for TLS; "
    "plain http:// and https:// too), "
    "InfluxDB 1.x: influx1+http://HOST:8086?db=DB[&rp=POLICY] (influx1+https:// for TLS); "
    "the token from $INFLUX_TOKEN (grafana/README.md)."
)


def record_option(help: str) -> Decorator:
    """--record URL|FILE: where the controller's telemetry goes (powerd.recorder.open_recorder
    takes every form listed here)."""
    return click.option("--record", metavar="URL|FILE", help=f"{help} {RECORD_FORMS}")


def old_spelling(old: str, new: str, dest: str) -> Decorator:
    """``old``, what option ``new`` (parameter ``dest``) was called before: hidden from the
    help, still working, with a one-line note on stderr. Its value becomes ``new``'s default
    (so it goes through ``new``'s type and checks); ``new`` itself, if also given, wins."""

    def take(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is None:
            return
        click.echo(f"note: {old} is now {new}; {old} still works but will go", err=True)
        ctx.default_map = {**(ctx.default_map or {}), dest: value}

    return click.option(
        old,
        f"{dest}_as_{old.lstrip('-').replace('-', '_')}",
        hidden=True,
        is_eager=True,  # before ``new`` looks up its default
        expose_value=False,
        callback=take,
    )
