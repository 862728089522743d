"""Options several ``powerplan`` commands share, declared once so their meaning cannot drift."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def compose(*decorators: Decorator) -> Decorator:
    """Apply click decorators as if stacked in this order (the first is the topmost)."""

    def apply(function: Callable[..., Any]) -> Callable[..., Any]:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return apply


def placed_inputs(first: str) -> Decorator:
    """FIRST (a budgets file) PROFILES... --mix, --step-s, --seed, --column, --workload:
    what ``planner.commands.size.load_inputs`` reads."""
    return compose(
        click.argument(first, type=click.Path(dir_okay=False, path_type=Path)),
        click.argument(
            "profiles", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path)
        ),
        click.option(
            "--mix",
            "mix_path",
            required=True,
            type=click.Path(dir_okay=False, path_type=Path),
            help="The jobs that run: a TOML file of [[jobs]] (`powerplan size --help`).",
        ),
        click.option(
            "--step-s",
            type=click.FloatRange(min=0, min_open=True),
            default=1.0,
            show_default=True,
            help="Resample profiles to this step (the controller's cycle).",
        ),
        click.option(
            "--seed",
            type=int,
            default=0,
            show_default=True,
            help="Seeds the jobs' random offsets (and Monte Carlo draws).",
        ),
        click.option(
            "--column",
            "column_pairs",
            multiple=True,
            metavar="NAME=COLUMN",
            help="Map a profile column (as in `powerplan profiles`).",
        ),
        click.option(
            "--workload", default=None, help="Workload name for profile rows that have none."
        ),
    )


def demand_options(quantile_help: str) -> Decorator:
    """--quantile and --samples of the Monte Carlo demand (planner.sizing)."""
    return compose(
        click.option(
            "--quantile",
            type=click.FloatRange(0.5, 1.0, max_open=True),
            default=0.999,
            show_default=True,
            help=quantile_help,
        ),
        click.option(
            "--samples",
            type=click.IntRange(min=100),
            default=100_000,
            show_default=True,
            help="Monte Carlo values per node (offset draws x window).",
        ),
    )


def speed_options(sweep_help: str) -> Decorator:
    """--speed-exponent and --sweep: how fast a GPU runs under a cap (planner.whatif)."""
    return compose(
        click.option(
            "--speed-exponent",
            type=click.FloatRange(0, 2),
            default=0.28,
            show_default=True,
            help="Relative speed under a cap = (power/demand)^this, without --sweep.",
        ),
        click.option(
            "--sweep",
            "sweep_paths",
            multiple=True,
            type=click.Path(dir_okay=False, exists=True, path_type=Path),
            help=sweep_help,
        ),
    )
