"""Options several ``powerplan`` commands share, declared once so their meaning cannot drift."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from planner import formats
from planner.censored import DEFAULT_MODE, MODE_HELP, MODES
from powerd.click_types import Fraction, Quantity

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]

# --overhead-w (caps, report): no default anywhere, because it decides the best cap
OVERHEAD_W_HELP = (
    "Provisioned W per GPU that does not scale with its cap: its share of host CPUs and "
    "memory, NICs, switches, cooling."
)
OVERHEAD_W_NEEDED = (
    "it decides the best cap, and no one number fits every site (docs/PLANNER.md, "
    "powerplan caps): measure or budget it, e.g. 360 from Meta's GB200 figures"
)


INPUT_FORMAT_HELP = (
    "Read the profile files as the tool wrote them: nvidia-smi (--query-gpu=timestamp,index,"
    "power.draw,... --format=csv; nvidia-smi:FIELDS, the fields as queried, for noheader), "
    "dcgm (dcgm-exporter scrapes, each after a '# scrape at UNIX_S' line, or samples with "
    "timestamps), zeus (Zeus's PowerMonitor CSV, GPUs 0, 1, ... or zeus:GPUS; or `python -m "
    "zeus.monitor power` output). Workload: --workload, else the file's stem; local times "
    "without a zone are read as UTC. Without it, an nvidia-smi header, a DCGM scrape and "
    "Zeus's monitor output are recognised."
)
NODE_HELP = (
    "Node name of the samples a tool's file holds (see --input-format) [default: the "
    "file's stem; dcgm: its Hostname label]."
)


def _input_format(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """``--input-format``'s text as a planner.formats.InputFormat (None when not given)."""
    if value is None:
        return None
    try:
        return formats.parse_format(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def profile_format_options() -> Decorator:
    """``--input-format`` and ``--node``: every profile file the command reads is read with
    them (planner.formats.reading), so each command's own code need not pass them on."""

    def apply(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def run(
            *args: Any, input_format: Any = None, node: str | None = None, **kwargs: Any
        ) -> Any:
            with formats.reading(input_format, node):
                return function(*args, **kwargs)

        return compose(
            click.option(
                "--input-format",
                metavar=formats.METAVAR,
                callback=_input_format,
                default=None,
                help=INPUT_FORMAT_HELP,
            ),
            click.option("--node", metavar="NAME", default=None, help=NODE_HELP),
        )(run)

    return apply


def compose(*decorators: Decorator) -> Decorator:
    """Apply click decorators as if stacked in this order (the first is the topmost)."""

    def apply(function: Callable[..., Any]) -> Callable[..., Any]:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return apply


def _in_order(ctx: click.Context, first: str, what: str) -> click.UsageError:
    """Arguments given in the wrong order: say the order, and what was out of place."""
    usage = f"powerplan {ctx.info_name} {first.upper()} PROFILES..."
    return click.UsageError(f"{usage}: the budgets file comes first, then the profiles ({what})")


def _profile_suffixes() -> tuple[str, ...]:
    from planner.profiles import CSV_SUFFIXES, LP_SUFFIXES, PARQUET_SUFFIXES

    return CSV_SUFFIXES + PARQUET_SUFFIXES + LP_SUFFIXES


def budgets_then_profiles(first: str) -> tuple[Decorator, Decorator]:
    """The FIRST (a budgets file) and PROFILES arguments; a profile first or a TOML file among
    the profiles (swapped arguments, or a mix without --mix) is answered with the order."""

    def check_first(ctx: click.Context, param: click.Parameter, path: Path) -> Path:
        if path.suffix.lower() in _profile_suffixes():
            raise _in_order(ctx, first, f"{path.name} is a profile")
        return path

    def check_profiles(
        ctx: click.Context, param: click.Parameter, paths: tuple[Path, ...]
    ) -> tuple[Path, ...]:
        toml = next((p for p in paths if p.suffix.lower() == ".toml"), None)
        if toml is not None:
            kinds = ", ".join(_profile_suffixes())
            what = f"{toml.name} is TOML; profiles are {kinds} files, a mix goes after --mix"
            raise _in_order(ctx, first, what)
        return paths

    path = click.Path(dir_okay=False, path_type=Path)
    return (
        click.argument(first, type=path, callback=check_first),
        click.argument("profiles", nargs=-1, required=True, type=path, callback=check_profiles),
    )


def placed_inputs(first: str) -> Decorator:
    """FIRST (a budgets file) PROFILES... --mix, --step-s, --seed, --column, --workload,
    --capped-demand, --input-format, --node: what ``planner.commands.size.load_inputs``
    reads."""
    return compose(
        *budgets_then_profiles(first),
        click.option(
            "--mix",
            "mix_path",
            required=True,
            type=click.Path(dir_okay=False, path_type=Path),
            help="The jobs that run: a TOML file of [[jobs]] (`powerplan size --help`).",
        ),
        click.option(
            "--step-s",
            type=Quantity("s", 0, min_open=True),
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
        capped_demand_option(),
        profile_format_options(),
    )


def capped_demand_option() -> Decorator:
    """``--capped-demand``: what a command makes of samples held at a cap
    (planner.censored)."""
    return click.option(
        "--capped-demand",
        type=click.Choice(MODES),
        default=DEFAULT_MODE,
        show_default=True,
        help=MODE_HELP,
    )


def replay_options(default_duration_s: float, duration_help: str) -> Decorator:
    """``--duration-s`` and ``--synchronised``: how long a replay runs, and whether every
    job starts at its profile's start, together (whatif, evaluate)."""
    return compose(
        click.option(
            "--duration-s",
            type=Quantity("s", 0, min_open=True),
            default=default_duration_s,
            show_default=True,
            help=duration_help,
        ),
        click.option(
            "--synchronised",
            is_flag=True,
            help="Start every job at the start of its profile, together (the grid's worst "
            "case), instead of at a random offset.",
        ),
    )


def demand_options(quantile_help: str) -> Decorator:
    """--quantile and --samples of the Monte Carlo demand (planner.sizing)."""
    return compose(
        click.option(
            "--quantile",
            type=Fraction(0.5, 1.0, max_open=True),
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
