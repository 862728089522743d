"""A progress bar on stderr for long runs (a whatif replay of the 150 MW site takes 40 s),
drawn only where a person watches: never when stderr is piped, so ``--format json`` and
scripts see nothing but their output."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

OnStep = Callable[[int, int], None]

SHOW_AFTER_S = 2.0  # a run shorter than this shows no bar at all


@contextmanager
def step_progress(
    what: str, *, stream: TextIO | None = None, show_after_s: float | None = None
) -> Iterator[OnStep | None]:
    """An ``on_step(done, total)`` for a long loop (``planner.whatif.replay``): a rich bar on
    ``stream`` (stderr) once the run has taken ``show_after_s`` (``SHOW_AFTER_S``), gone when
    the run ends. None (nothing to call, nothing drawn) when the stream is no terminal or rich
    is missing."""
    stream = sys.stderr if stream is None else stream
    wait_s = SHOW_AFTER_S if show_after_s is None else show_after_s
    if not stream.isatty():
        yield None
        return
    try:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskID,
            TimeRemainingColumn,
        )
    except ImportError:  # rich comes with the demo extra; the planner runs without it
        yield None
        return
    progress = Progress(
        f"{what}:",
        BarColumn(),
        MofNCompleteColumn(),
        "steps, left",
        TimeRemainingColumn(),
        console=Console(file=stream),
        transient=True,
    )
    started_s = time.monotonic()
    task: list[TaskID] = []  # the bar's task, once shown

    def on_step(done: int, total: int) -> None:
        if not task:
            if time.monotonic() - started_s < wait_s:
                return
            task.append(progress.add_task(what, total=total, completed=done))
            progress.start()
        progress.update(task[0], completed=done)

    try:
        yield on_step
    finally:
        progress.stop()
