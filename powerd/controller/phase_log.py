"""What the controller says about jobs' phases: each change at DEBUG, an INFO summary at
most once per ``interval_s``.

A site's jobs announce many phases a minute (every communication interval of every job);
one INFO line each would flood the journal. The summary counts announcements by phase,
names the jobs that started and shut down (the first few; the rest counted) and counts
phases inferred from power; it is logged when the interval has passed, on the next
announcement or cycle (``flush``), and never when nothing happened.
"""

from __future__ import annotations

import collections
import logging

SUMMARY_INTERVAL_S = 60.0
NAMES_SHOWN = 5  # job names a summary lists per kind; the rest are counted


class PhaseLog:
    def __init__(self, logger: logging.Logger, interval_s: float = SUMMARY_INTERVAL_S) -> None:
        self._log = logger
        self.interval_s = interval_s
        self._reset()

    def _reset(self) -> None:
        self._since: float | None = None  # when the tally began (monotonic s)
        self._phases: collections.Counter[str] = collections.Counter()
        self._jobs: set[str] = set()  # bounded: a count past 10 x NAMES_SHOWN is "50+"
        self._started = _Names()
        self._ended = _Names()
        self._inferred = 0

    def announced(
        self, now_s: float, job: str, phase: str, nodes: int, priority: str, new: bool
    ) -> None:
        self._log.debug("job %s: %s (%d nodes, %s priority)", job, phase, nodes, priority)
        self._begin(now_s)
        self._phases[phase] += 1
        if len(self._jobs) < 10 * NAMES_SHOWN:  # a count of distinct jobs, bounded
            self._jobs.add(job)
        if new:
            self._started.add(job)
        if phase == "shutdown":
            self._ended.add(job)
        self.flush(now_s)

    def inferred(self, now_s: float, job: str, what: str) -> None:
        self._log.debug("job %s: %s inferred from power", job, what)
        self._begin(now_s)
        self._inferred += 1

    def flush(self, now_s: float) -> None:
        """Log the summary if the interval since the tally began has passed."""
        since = self._since
        if since is None or now_s - since < self.interval_s:
            return
        self._log.info("%s", self.summary(now_s - since))
        self._reset()

    def summary(self, over_s: float) -> str:
        total = sum(self._phases.values())
        by_phase = ", ".join(f"{phase} {n}" for phase, n in self._phases.most_common())
        jobs = f"{len(self._jobs)}{'+' if len(self._jobs) >= 10 * NAMES_SHOWN else ''}"
        parts = [f"phases in the last {over_s:.0f} s: {total} announced by {jobs} jobs"]
        if by_phase:
            parts[0] += f" ({by_phase})"
        for names, verb in ((self._started, "started"), (self._ended, "shut down")):
            if names.count:
                parts.append(f"{names.count} {verb} ({names})")
        if self._inferred:
            parts.append(f"{self._inferred} phase changes inferred from power")
        return "; ".join(parts)

    def _begin(self, now_s: float) -> None:
        if self._since is None:
            self._since = now_s


class _Names:
    """The first NAMES_SHOWN names added, and how many were."""

    def __init__(self) -> None:
        self.shown: list[str] = []
        self.count = 0

    def add(self, name: str) -> None:
        self.count += 1
        if len(self.shown) < NAMES_SHOWN:
            self.shown.append(name)

    def __str__(self) -> str:
        more = self.count - len(self.shown)
        shown = ", ".join(self.shown)
        return f"{shown} and {more} more" if more > 0 else shown
