"""A fake monotonic clock for code that takes a ``clock: Callable[[], float]``."""

from __future__ import annotations


class ManualClock:
    """Callable like ``time.monotonic``; its time moves only when told to."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds
