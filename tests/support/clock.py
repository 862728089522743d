"""The suite's one fake clock, for code that takes its time as callables.

``ManualClock`` stands in for ``time.monotonic`` (call it, or pass
``clock.monotonic``) and ``time.time`` (``clock.time``); both move together,
and only when a test says so (``advance``).
"""

from __future__ import annotations

WALL0 = 1_795_320_000.0
"""The wall time a ``ManualClock`` starts at unless told (a fixed date, so runs repeat)."""


class ManualClock:
    """Monotonic time ``t`` and wall time ``wall`` that move together, only when told to."""

    def __init__(self, t: float = 1000.0, wall: float = WALL0) -> None:
        self.t = t
        self.wall = wall

    def __call__(self) -> float:
        """Like ``time.monotonic()``."""
        return self.t

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        """Like ``time.time()``."""
        return self.wall

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.wall += seconds
