"""What several ``powerd`` commands share, declared once: click options and log set-up."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


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


def broker_option() -> Decorator:
    """--broker URL, overriding the config file's."""
    return click.option(
        "--broker", help="Broker URL, mqtt://HOST[:PORT] or mqtts://HOST[:PORT] (TLS)."
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


def cluster_option() -> Decorator:
    """--cluster NAME, overriding the config file's."""
    return click.option("--cluster", help="Cluster name, the topic prefix is powerd/v1/CLUSTER.")


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
