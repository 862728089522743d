"""Peers' clocks as a receiver sees them: skew measured on receipt, a ``ts`` too far ahead
refused.

Liveness, TTLs and validity are judged on the receiver's monotonic clock from when a
message arrived (docs/PROTOCOL.md, "Clocks"); a sender's ``ts`` only orders its messages
and tells a replay from a fresh one. So a ``ts`` may lag the receiver's clock by any
amount (a peer whose clock is behind is still followed), but not run ahead of it by more
than ``max_clock_skew_s``: a message from the future is refused and counted as a clock
alarm, since taking it would let a bad clock (or a replay of one) hold its effect for as
long as it runs ahead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from powerd.ratelimit import LogOncePer

DEFAULT_MAX_CLOCK_SKEW_S = 30.0
# A peer's measured skew that moves by more than this share of the bound is logged again.
SKEW_CHANGE_SHARE = 0.5


@dataclass
class SkewWatch:
    """The skew of each peer (receiver wall clock minus the peer's ``ts`` at receipt, so
    positive: the peer is behind), and the clock alarms: messages refused as too far
    ahead."""

    max_skew_s: float
    log: logging.Logger
    what: str = "peer"  # how the log names the peers: "controller", "coordinator", ...
    skew_s: dict[str, float] = field(default_factory=dict)  # per peer, at its last live message
    alarms: int = 0
    _logged_s: dict[str, float] = field(default_factory=dict)  # per peer, the skew last logged
    _alarm_log: LogOncePer | None = None

    def ahead(self, peer: str, ts: float, wall: float, now_mono: float, live: bool = True) -> bool:
        """Take a message's ``ts``: measure ``peer``'s skew (live messages only: a retained
        one's age is no skew); True (a clock alarm, counted and logged) when ``ts`` is more
        than ``max_skew_s`` ahead of ``wall``, and the message must be refused."""
        skew_s = wall - ts
        if -skew_s > self.max_skew_s:
            self.alarms += 1
            if self._alarm_log is None:
                self._alarm_log = LogOncePer(self.log)
            self._alarm_log.warning(
                f"clock-ahead-{peer}",
                now_mono,
                "clock alarm: %s %s sent ts %.1f s ahead of this clock (bound "
                "max_clock_skew_s %g s): refused; check both clocks (NTP)",
                self.what,
                peer,
                -skew_s,
                self.max_skew_s,
            )
            return True
        if live:
            self._measure(peer, skew_s)
        return False

    def _measure(self, peer: str, skew_s: float) -> None:
        self.skew_s[peer] = skew_s
        logged = self._logged_s.get(peer)
        moved = logged is not None and abs(skew_s - logged) > SKEW_CHANGE_SHARE * self.max_skew_s
        first_large = logged is None and abs(skew_s) > self.max_skew_s
        if moved or first_large:
            self.log.warning(
                "clock skew: %s %s's clock is %.1f s %s this one%s",
                self.what,
                peer,
                abs(skew_s),
                "behind" if skew_s >= 0 else "ahead of",
                "" if logged is None else f" (was {logged:+.1f} s)",
            )
        if logged is None or moved or first_large:
            self._logged_s[peer] = skew_s

    @property
    def largest_s(self) -> float | None:
        """The measured skew of largest size among the peers (signed), None before any."""
        if not self.skew_s:
            return None
        return max(self.skew_s.values(), key=abs)
