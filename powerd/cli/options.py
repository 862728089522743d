"""What the ``powerd`` and ``powerplan`` commands share, declared once: click options, the
parameter types of quantities (a number in the unit the option's name ends in, with a hint in
plain words for a value written with a unit or as a percentage) and log set-up."""

from __future__ import annotations

import logging
import os
import re
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


def broker_option(default: str = "broker.url of --config, else mqtt://localhost") -> Decorator:
    """--broker URL, overriding the config file's."""
    return click.option(
        "--broker",
        metavar="URL",
        help=f"Broker URL, mqtt://HOST[:PORT] or mqtts://HOST[:PORT] (TLS) [default: {default}].",
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


SAFETY_CHOICES = ("caps", "bands")


def safety_option(what: str) -> Decorator:
    """``--safety caps|bands`` (default caps): how the controller's policy keeps every level
    within its limit; ``what`` says what it applies to. The command gets ``safety``."""
    return click.option(
        "--safety",
        type=click.Choice(SAFETY_CHOICES),
        default=SAFETY_CHOICES[0],
        show_default=True,
        help=f"{what} caps: every rack, row and the site within its limit by the caps in "
        "force, the caps moved to the GPUs held at theirs (policies/allocation.py, "
        "docs/CONTROLLER.md 'Safety by caps'); bands: Dynamo's bands on measured power, a "
        "node drawing above its cap_threshold capped down to its cap_target "
        "(policies/capping.py).",
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


# What a quantity may be written in, as factors to the option's unit: the values of
# `powerd limit` (120MW, 15m) and the hints for options named for their unit.
WATTS_PER: dict[str, float] = {"w": 1.0, "kw": 1e3, "mw": 1e6, "gw": 1e9}
SECONDS_PER: dict[str, float] = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
KILOWATTS_PER: dict[str, float] = {unit: w / 1e3 for unit, w in WATTS_PER.items()}
KILOJOULES_PER: dict[str, float] = {"j": 1e-3, "kj": 1.0, "mj": 1e3, "kwh": 3600.0}
UNITS: dict[str, tuple[str, dict[str, float]]] = {
    "W": ("watts", WATTS_PER),
    "s": ("seconds", SECONDS_PER),
    "kW": ("kilowatts", KILOWATTS_PER),
    "kJ": ("kilojoules", KILOJOULES_PER),
}
_NUMBER_AND_UNIT = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*")


def split_quantity(text: str, factors: dict[str, float]) -> tuple[float, str] | None:
    """``1.2kW`` with ``WATTS_PER`` -> (1200.0, "kW"); ``90`` -> (90.0, ""); None when ``text``
    is no non-negative number or its unit is not one of ``factors`` (case-insensitive)."""
    found = _NUMBER_AND_UNIT.fullmatch(text)
    if found is None:
        return None
    number, unit = float(found[1]), found[2]
    if not unit:
        return number, ""
    factor = factors.get(unit.lower())
    return None if factor is None else (number * factor, unit)


def plain_number(value: float) -> str:
    """1200.0 -> "1200", 1.2e6 -> "1200000", 0.999 -> "0.999": what a person would type."""
    return format(value, ".12g")


def option_name(param: click.Parameter | None) -> str:
    """The name people type: ``--overhead-w`` for an option, ``TOPOLOGY`` for an argument."""
    if param is None:
        return "the value"
    if isinstance(param, click.Option):
        return next((o for o in param.opts if o.startswith("--")), param.opts[0])
    return param.human_readable_name


class Quantity(click.FloatRange):
    """A number in the unit the option's name ends in (``--overhead-w``: watts,
    ``--duration-s``: seconds, ``--storage-kj-per-rack``: kilojoules), optionally within a
    range. A value written with a unit (``1.2kW``, ``15m``) is refused with the number to
    write instead, in plain words."""

    def __init__(
        self,
        unit: str,
        min: float | None = None,
        max: float | None = None,
        *,
        min_open: bool = False,
        max_open: bool = False,
    ) -> None:
        super().__init__(min, max, min_open=min_open, max_open=max_open)
        self.unit = unit
        self.name = UNITS[unit][0]  # the metavar: WATTS, SECONDS

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            value = self._number(value, param, ctx)
        return super().convert(value, param, ctx)

    def _describe_range(self) -> str:
        """No range, no "[x<=None]" in the help."""
        return "" if self.min is None and self.max is None else super()._describe_range()

    def _number(self, text: str, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            return float(text)
        except ValueError:
            pass
        words, factors = UNITS[self.unit]
        flag = option_name(param)
        parsed = split_quantity(text, factors)
        if parsed is not None:
            fix = f"write {plain_number(parsed[0])} for {text.strip()}"
            raise click.UsageError(f"{flag} takes {words} as a number: {fix}", ctx)
        raise click.UsageError(f"{flag} takes {words} as a number, not {text!r}", ctx)


class Fraction(click.FloatRange):
    """A share or a quantile, as a fraction of 1 (``0.999``), optionally within a range. A
    percentage (``99.9`` where at most 1 fits, or ``99.9%``) is refused with the fraction to
    write instead, in plain words."""

    name = "fraction"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            value = self._number(value, param, ctx)
        return super().convert(value, param, ctx)

    def _number(self, text: str, param: click.Parameter | None, ctx: click.Context | None) -> float:
        flag, shown = option_name(param), text.strip()
        try:
            number = float(shown.removesuffix("%"))
        except ValueError:
            raise click.UsageError(f"{flag} is a fraction (0.95), not {text!r}", ctx) from None
        if shown.endswith("%") or (not self.holds(number) and self.holds(number / 100)):
            percent = shown if shown.endswith("%") else f"{shown} %"
            fix = f"write {plain_number(number / 100)} for {percent}"
            raise click.UsageError(f"{flag} is a fraction, not a percentage: {fix}", ctx)
        return number

    def holds(self, number: float) -> bool:
        """Whether ``number`` is within the range."""
        low = self.min is None or (number > self.min if self.min_open else number >= self.min)
        high = self.max is None or (number < self.max if self.max_open else number <= self.max)
        return low and high
