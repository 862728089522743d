"""The demo in a terminal: the console, a one-line header, and the run shown live or logged."""

from __future__ import annotations

import asyncio

from rich.console import Console
from rich.live import Live

import powerd.demo
from powerd.demo.runner import DemoOptions, DemoRun
from powerd.demo.view import EventLog, LiveView


def demo_console() -> Console:
    """The terminal's console; 110 columns into a log or a pipe (no reason to wrap at 80)."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=110)
    return console


def run_in_console(options: DemoOptions, console: Console, live: bool | None) -> DemoRun:
    """Print the header, run the demo (``powerd.demo.run_demo``) showing it live (default:
    when the console is a terminal) or as an event log, and return the finished run."""
    live = console.is_terminal if live is None else live
    console.print(
        f"powerd demo: {options.duration_s:g} s on "
        f"{options.budgets or 'powerd/data/budgets/demo.toml'}, "
        "embedded broker, controller, one agent per node, two training jobs",
        highlight=False,
    )
    run_demo = powerd.demo.run_demo  # looked up at run time: tests put a canned run there
    if live:
        view = LiveView()
        with Live(console=console, auto_refresh=False, transient=False) as screen:
            return asyncio.run(
                run_demo(options, lambda state: screen.update(view.render(state), refresh=True))
            )
    return asyncio.run(run_demo(options, EventLog(console)))
