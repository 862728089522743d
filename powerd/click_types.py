"""Click parameter types and options that ``powerd``'s and ``powerplan``'s commands share,
declared once outside either CLI: a number in the unit an option's name ends in, a fraction,
and ``--safety``. A value written with a unit (``1.2kW``, ``15m``) or as a percentage is
refused with the number to write instead, in plain words; the units are ``powerd.units``'."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from powerd.units import UNITS, plain_number, split_quantity

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]

SAFETY_CHOICES = ("caps", "bands")
SAFETY_HELP = (
    "caps: every rack, row and the site within its limit by the caps in force, the caps "
    "moved to the GPUs held at theirs (policies/allocation.py, docs/CONTROLLER.md 'Safety "
    "by caps'); bands: Dynamo's bands on measured power, a node drawing above its "
    "cap_threshold capped down to its cap_target (policies/capping.py)."
)


def safety_option(what: str) -> Decorator:
    """``--safety caps|bands`` (default caps): how the controller's policy keeps every level
    within its limit; ``what`` says what it applies to. The command gets ``safety``."""
    return click.option(
        "--safety",
        type=click.Choice(SAFETY_CHOICES),
        default=SAFETY_CHOICES[0],
        show_default=True,
        help=f"{what} {SAFETY_HELP}",
    )


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
