"""Demand response: an operator's temporary limit on the site, with no I/O here.

An operator (or the utility, through one) publishes a signed, retained
``SiteLimit``: "120 MW for 15 minutes, starting now". The controller verifies
it with ``trust.operator_keys`` and, between ``starts_ts`` and ``expires_ts``
(wall clock), brings the site down to it: not at once, but along a line from
the site's measured power down at ``GLIDE_SHARE_OF_RAMP`` of the site's
ramp-down limit (the grid's limit on how fast the site may fall), so the cut
itself is no swing the grid sees. While the line glides, the site's capping
threshold and target are both on it (the target never more than the ramp's fall
under what the site will draw once the last cycle's caps hold, so a site behind
its line catches up no faster than the ramp): every cycle the site is cut by
what the line fell, never by a band at once (the file's target sits 3 % under its
threshold: 4.5 MW on the 150 MW site, which the first cycle of a glide cut in one
step when only the threshold glided; found by ``bench_scale --site-limit-mw``).
The line ends at the limit's target (the limit times the file's target over its
threshold); from there the site's bands are the file's, scaled to the limit.
At expiry (or a newer message with ``limit_w`` null) the file's bands return,
and the caps rise under the usual ramp limits.

Clocks (docs/PROTOCOL.md, "Clocks"): a limit's window is put on the caller's clock (the
services': monotonic) when it is taken. One delivered live is in force from its receipt
plus ``starts_ts - ts`` for ``expires_ts - starts_ts``, whatever the two wall clocks
say; a retained one (delivered on subscribe, maybe long after it was sent) is placed by
this wall clock, the only measure of its age there is, and refused if already over.
A ``ts`` more than ``max_clock_skew_s`` ahead of this clock is refused (a clock alarm).
Limits and clears are ordered by ``(ts, seq)``; the leader republishes the newest it
took under its own key (``Topics.site_limit_record``), the floor of that order for a
controller that restarts, so an older clear replayed as retained cannot erase it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from policies.in_force import GLIDE_SHARE_OF_RAMP, SiteLine, target_share, tree_in_force
from policies.tree import SITE, Tree
from powerd.clock_skew import DEFAULT_MAX_CLOCK_SKEW_S
from powerd.protocol import HeldLimit, SiteLimit

if TYPE_CHECKING:  # a type only: site limits sit below the budgets file's parsing
    from powerd.topology.grid import GridSpec


@dataclass
class SiteLimits:
    limit: SiteLimit | None = None  # the newest taken
    # its (start, end) on the caller's clock; None: the message's own (starts_ts, expires_ts)
    window: tuple[float, float] | None = None
    glide_w: float | None = None  # the glide line while a limit is in force
    glide_at: float | None = None  # the caller's clock at its last step
    step_s: float = 0.0  # how long its last step stood for
    # (the caller's clock, what the site was to draw after that cycle's caps) of the last cycles
    committed: deque[tuple[float, float]] = field(default_factory=deque)
    taken: int = 0
    refused: int = 0
    clock_alarms: int = 0  # refused: their ts ran more than max_clock_skew_s ahead
    max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S

    def take(
        self,
        message: SiteLimit,
        now: float | None = None,
        wall: float | None = None,
        live: bool = True,
    ) -> str | None:
        """A verified limit, received at ``now`` (the caller's clock; None: the message's
        own wall clock) when this wall clock said ``wall``, ``live`` or retained; why it
        was refused, or None if taken."""
        why = self._refusal(message, now, wall, live)
        if why is not None:
            self.refused += 1
            return why
        self.limit = message
        self.window = None if now is None else _window(message, now, wall, live)
        self.taken += 1
        return None

    def holds(self, message: SiteLimit) -> bool:
        """Whether ``message`` is the limit held (its retained copy, redelivered)."""
        last = self.limit
        return last is not None and (last.ts, last.seq) == (message.ts, message.seq)

    def _refusal(
        self, message: SiteLimit, now: float | None, wall: float | None, live: bool
    ) -> str | None:
        if wall is not None and message.ts - wall > self.max_clock_skew_s:
            self.clock_alarms += 1
            return (
                f"clock alarm: site limit ts is {message.ts - wall:.1f} s ahead of this clock "
                f"(max_clock_skew_s {self.max_clock_skew_s:g})"
            )
        last = self.limit
        if last is not None and (message.ts, message.seq) <= (last.ts, last.seq):
            return (
                f"site limit (ts {message.ts}, seq {message.seq}) is not newer than the one taken"
            )
        if now is not None and not live and _window(message, now, wall, live)[1] <= now:
            return f"a retained site limit (ts {message.ts}) already over by this clock"
        return None

    def held(self, now: float) -> HeldLimit | None:
        """The newest limit taken, as a leader's state tells it (``LeaderState.limit``),
        in force or not at ``now``; None if none was taken."""
        m = self.limit
        if m is None:
            return None
        return HeldLimit(
            operator=m.operator, ts=m.ts, seq=m.seq, limit_w=m.limit_w, starts_ts=m.starts_ts,
            expires_ts=m.expires_ts, in_force=self.active_w(now) is not None,
        )  # fmt: skip

    def active_w(self, now: float) -> float | None:
        """The limit in force at ``now`` (the clock ``take`` was given), or None."""
        m = self.limit
        if m is None or m.limit_w is None:
            return None
        start, end = (m.starts_ts, m.expires_ts) if self.window is None else self.window
        return m.limit_w if start <= now < end else None

    def tree_under(self, tree: Tree, *args: Any, by_caps: bool = False) -> Tree:
        """``tree`` (the file's) as the controller decides under it this cycle: under
        :meth:`line` (same arguments; ``policies.in_force.tree_in_force``), else itself."""
        line = self.line(tree, *args, by_caps=by_caps)
        return tree if line is None else tree_in_force(tree, site_line=line, by_caps=by_caps)

    def line(
        self,
        tree: Tree,
        now: float,
        measured_w: float,
        dt_s: float,
        ramp_down_w_per_s: float,
        committed_w: float | None = None,
        window_s: float = 1.0,
        *,
        by_caps: bool = False,
    ) -> SiteLine | None:
        """The limit in force and this cycle's point on the line down to it (None: none).

        ``committed_w``: what the site will draw once the last decision's caps hold. The
        target is then no lower than the line's fall since the last cycle under it (a site
        behind its line, cuts that waited their turn, catches up no faster than the line
        falls), nor than the ramp over the grid's ``window_s`` under what the site was to
        draw a window ago: a cycle's cuts land at once, so two cycles within one window
        (an early one after a late one) would cut the line's fall over both spans (found
        by ``bench_scale --site-limit-mw``: 1.2-1.3 MW in a second against 1 MW/s).

        Under safety by caps (``by_caps``) the line bounds the caps under the site and ends
        at the limit itself, and ``committed_w`` is where the caps in force could be without
        moving any draw (``policies.allocation.caps_at_draw_w``): headroom nobody draws is
        cut at once, the rest no faster than the line (``policies.in_force``). Held to the
        measured power's line alone, the first cycle cut the draw by the headroom the caps
        keep over it, at once (2.3 MW/s against the grid's 1 MW/s on the 150 MW site,
        ``bench_scale --site-limit-mw 110 --safety caps``)."""
        last_at = self.glide_at
        glide = self.threshold_w(
            now,
            measured_w,
            dt_s,
            ramp_down_w_per_s,
            end_share=target_share(tree, by_caps),
        )
        limit = self.active_w(now)
        if glide is None or limit is None:
            self.committed.clear()
            return None
        not_below_w = -math.inf  # over its breaker the site is cut at once, as ever
        over_breaker = measured_w > float(tree.limit_w[SITE])
        if committed_w is not None and math.isfinite(ramp_down_w_per_s) and not over_breaker:
            not_below_w = committed_w - GLIDE_SHARE_OF_RAMP * ramp_down_w_per_s * self.step_s
            if last_at is not None:
                self.committed.append((last_at, committed_w))
            while len(self.committed) > 1 and self.committed[1][0] <= now - window_s:
                self.committed.popleft()  # the newest at or before a window ago stays
            at, then_w = self.committed[0] if self.committed else (now, committed_w)
            if at <= now - window_s:
                not_below_w = max(not_below_w, then_w - ramp_down_w_per_s * window_s)
        return SiteLine(limit, glide, not_below_w)

    def threshold_w(
        self,
        now: float,
        measured_w: float,
        dt_s: float,
        ramp_down_w_per_s: float,
        end_share: float = 1.0,
    ) -> float | None:
        """The glide line this cycle under the limit (None: none in force): from the
        measured power down toward ``end_share`` of the limit at ``GLIDE_SHARE_OF_RAMP``
        of ``ramp_down_w_per_s``, then there. Each step falls by the time since the last
        (``now``; ``dt_s``, a cycle's length, at the first): a cycle that comes early
        steps less. A raised limit applies at once (the uncapping ramp limits the rise)."""
        limit = self.active_w(now)
        if limit is None:
            self.glide_w = self.glide_at = None
            return None
        if self.glide_at is not None:
            dt_s = max(0.0, now - self.glide_at)
        self.glide_at, self.step_s = now, dt_s
        end = limit * end_share
        start = measured_w if self.glide_w is None else self.glide_w
        if start <= end or not math.isfinite(ramp_down_w_per_s):
            self.glide_w = end
        else:
            self.glide_w = max(end, start - GLIDE_SHARE_OF_RAMP * ramp_down_w_per_s * dt_s)
        return self.glide_w


def _window(message: SiteLimit, now: float, wall: float | None, live: bool) -> tuple[float, float]:
    """A limit's (start, end) on the clock of ``now``: its ``ts`` is placed at its receipt
    if it came live, else ``wall - ts`` (at least 0) before it."""
    sent = now
    if not live and wall is not None:
        sent = now - max(0.0, wall - message.ts)
    return sent + (message.starts_ts - message.ts), sent + (message.expires_ts - message.ts)


def glide_ramp_w_per_s(grid: GridSpec | None, site_ramp_w_per_s: float) -> float:
    """How fast a site limit may bring the site down: the grid spec's ramp-down limit on
    measured power ([site.grid]), else the site's ramp limit on the sum of caps. The one
    rule a single controller and a tree's coordinator glide by."""
    if grid is not None and math.isfinite(grid.ramp_down_w_per_s):
        return float(grid.ramp_down_w_per_s)
    return float(site_ramp_w_per_s)
