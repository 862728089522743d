"""How many seconds of the site's ramp each cycle may hand back.

A ramp limit is measured over a window (``[site.grid]`` ``window_s``; 1 s without
one): the site's draw may rise by at most ``ramp × window`` between any two instants
that far apart. A cycle that hands back ``ramp × dt`` (``dt`` the time since the cycle
before) keeps the rate on average, but not within a window once cycles bunch: one a
little late hands back more than its share, and the cycles after it, on time again,
their own on top, so one window holds the grants of more than a window's seconds (the
demo at startup: 23 kW of raises within 0.9 s under an 18 kW/s ramp). ``RampWindow``
gives each cycle ``min(dt, window - what the cycles before it within the window were
given)``: every window's grants add up to at most ``ramp × window``, and cycles on time
get ``dt`` each, as before.
"""

from __future__ import annotations

import math
from collections import deque


class RampWindow:
    """The seconds of ramp granted by the cycles of the last window (module docstring)."""

    def __init__(self, window_s: float = 1.0) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"a ramp window is a positive number of seconds, not {window_s}")
        self.window_s = window_s
        self._given: deque[tuple[float, float]] = deque()  # (when, seconds given)

    def take(self, now_s: float, dt_s: float) -> float:
        """The seconds of ramp the cycle at ``now_s``, ``dt_s`` after the one before, may
        hand back; counted against the window's from now on."""
        given = self._given
        while given and given[0][0] <= now_s - self.window_s:
            given.popleft()
        seconds = max(0.0, min(dt_s, self.window_s - sum(s for _, s in given)))
        given.append((now_s, seconds))
        return seconds
