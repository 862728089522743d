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

Grants are not the only rises: a staged start's compute takes its headroom at once, a
job's first step from idle is its own, a resumption steps up by what its wait let fall.
So a cycle also gets no more than what the *draw it sees* has left of the window: ``window
- (drawn now - the least drawn at a cycle within the window) / ramp``, given the draw and
the ramp (W/s). Where the draw rose on its own, the raises wait for it. (The controller
gives it the draw under grid smoothing only, of the GPUs that no smoothing hardware of
their own ramps: ``ControllerCore._drawn_for_the_window``.)
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
        self._drawn: deque[tuple[float, float]] = deque()  # (when, the draw seen then, W)

    def take(
        self,
        now_s: float,
        dt_s: float,
        drawn_w: float | None = None,
        ramp_w_per_s: float = math.inf,
    ) -> float:
        """The seconds of ramp the cycle at ``now_s``, ``dt_s`` after the one before, may
        hand back; counted against the window's from now on. ``drawn_w``: the site's draw
        as this cycle sees it (None: grants alone count); ``ramp_w_per_s``: the ramp the
        seconds are of (inf: the draw is not counted)."""
        given, since_s = self._given, now_s - self.window_s
        _drop_up_to(given, since_s)
        seconds = max(0.0, min(dt_s, self.window_s - sum(s for _, s in given)))
        if drawn_w is not None and math.isfinite(drawn_w):
            drawn = self._drawn
            _drop_up_to(drawn, since_s)
            drawn.append((now_s, drawn_w))
            if math.isfinite(ramp_w_per_s) and ramp_w_per_s > 0:
                risen_w = drawn_w - min(w for _, w in drawn)
                seconds = max(0.0, min(seconds, self.window_s - risen_w / ramp_w_per_s))
        given.append((now_s, seconds))
        return seconds


def _drop_up_to(entries: deque[tuple[float, float]], since_s: float) -> None:
    """Drop the (when, value) entries from ``since_s`` back: out of the window."""
    while entries and entries[0][0] <= since_s:
        entries.popleft()
