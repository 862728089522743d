"""Who leads: epochs from heartbeats, step-down, and standby takeover, with no I/O.

The same rules for every tier that leads by heartbeats (the site controller, the leaf
controllers, the coordinators), each on its own heartbeat topic; "controller" below is
any of them.

Rules (docs/PROTOCOL.md, safety rule 2 and "Clocks"): a starting controller takes the
highest epoch it sees plus one (the wall clock in milliseconds only when it has seen no
heartbeat at all); a leader that sees a heartbeat with a higher epoch, or the same epoch
from a controller whose name sorts lower, steps down at once. A standby takes over
(with a new, higher epoch) once no live leader heartbeat has been received for
``takeover_after_s``, or at once when the leader it follows says, live, that it stopped
cleanly.

Liveness is by receipt, on the monotonic clock: a heartbeat delivered live proves its
leader lives now; a retained one (delivered on subscribe) only says who leads and in
which epoch, and a starting controller waits ``takeover_after_s`` for that leader to be
heard live. A heartbeat whose ``ts`` runs more than ``max_clock_skew_s`` ahead of this
clock is refused (a clock alarm, ``powerd.clock_skew``), and one of the followed
leader's epoch whose ``ts`` is not newer than the newest seen is a replay.

A leader's heartbeats carry the time base of its epoch: set at takeover (the last
followed leader's, as measured on receipt, when that leader's clock was taken; else this
clock) and moved on by the monotonic clock, so a leader whose wall clock steps stays
followed, and a standby whose clock is off continues a time base the agents took.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from powerd.clock_skew import DEFAULT_MAX_CLOCK_SKEW_S, SkewWatch
from powerd.protocol import Heartbeat

# Its lines (takeover, step-down, clock alarms) read as the controller's on every tier.
log = logging.getLogger("powerd.controller")


@dataclass
class Leadership:
    name: str
    takeover_after_s: float
    epoch: int = 0
    leading: bool = False
    highest_epoch_seen: int = -1
    leader_seen_mono: float = float("-inf")  # last live heartbeat of another leader
    leader_name: str | None = None  # that leader's name
    leader_epoch: int | None = None  # and epoch
    leader_ts: float = float("-inf")  # the newest ts seen of that (leader, epoch)
    max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S
    heartbeats_replayed: int = 0  # a followed leader's heartbeat not newer than the newest
    skew: SkewWatch = field(init=False)
    _base_skew_s: float | None = None  # this clock minus the followed leader's time base
    _anchor: tuple[int, float, float] | None = None  # (epoch, base wall, monotonic) we send

    def __post_init__(self) -> None:
        self.skew = SkewWatch(self.max_clock_skew_s, log, "controller")

    def observe(
        self, beat: Heartbeat, now_mono: float, wall: float | None = None, live: bool = True
    ) -> bool:
        """Take in another controller's verified heartbeat, received at ``now_mono`` (this
        clock's wall time ``wall``; None: the beat's own ts), ``live`` or retained; True
        if we must step down now."""
        if beat.controller == self.name and beat.epoch == self.epoch:
            return False  # our own, back from the broker
        self.highest_epoch_seen = max(self.highest_epoch_seen, beat.epoch)
        wall = beat.ts if wall is None else wall
        if self.skew.ahead(beat.controller, beat.ts, wall, now_mono, live):
            return False  # a clock alarm: from the future, it leads nobody here
        if beat.state != "leader":
            if live and self._follows(beat) and self._fresh_stop(beat, wall):
                self.leader_seen_mono = float("-inf")  # it stopped cleanly: take over now
                self.leader_name = self.leader_epoch = None
            return False
        if self._follows(beat) and beat.ts <= self.leader_ts:
            if live:
                self.heartbeats_replayed += 1
            return False
        if beat.epoch < self.highest_epoch_seen:
            return False  # a deposed leader: the newest epoch's goes on or is taken over
        if not live:
            self._follow_retained(beat, now_mono)
            return False
        self._follow(beat, wall)
        self.leader_seen_mono = now_mono
        return self._outranked(beat)

    def _follows(self, beat: Heartbeat) -> bool:
        return beat.controller == self.leader_name and beat.epoch == self.leader_epoch

    def _fresh_stop(self, beat: Heartbeat, wall: float) -> bool:
        """A followed leader's clean stop, newer than its last heartbeat and sent now (by
        its time base, within ``max_clock_skew_s``): never a captured one replayed."""
        base_skew_s = 0.0 if self._base_skew_s is None else self._base_skew_s
        sent_now = abs(wall - beat.ts - base_skew_s) <= self.max_clock_skew_s
        return beat.ts > self.leader_ts and sent_now

    def _follow(self, beat: Heartbeat, wall: float) -> None:
        self.leader_name, self.leader_epoch, self.leader_ts = beat.controller, beat.epoch, beat.ts
        self._base_skew_s = wall - beat.ts

    def _follow_retained(self, beat: Heartbeat, now_mono: float) -> None:
        """A retained leader heartbeat: that leader may be alive; wait ``takeover_after_s``
        for it to be heard live before taking over (its ``ts`` cannot tell: our clock may
        be off). Our own name's, from before a restart, is a leader known dead."""
        if beat.controller == self.name:
            return
        if not self._follows(beat):
            self.leader_seen_mono = max(self.leader_seen_mono, now_mono)
        self.leader_name, self.leader_epoch = beat.controller, beat.epoch
        self.leader_ts = max(self.leader_ts, beat.ts)

    def _outranked(self, beat: Heartbeat) -> bool:
        if not self.leading:
            return False
        outranked = beat.epoch > self.epoch or (
            beat.epoch == self.epoch and beat.controller < self.name
        )
        if outranked:
            log.warning(
                "controller %s (epoch %d) outranks us (%s, epoch %d): stepping down",
                beat.controller,
                beat.epoch,
                self.name,
                self.epoch,
            )
            self.leading = False
        return outranked

    def should_lead(self, now_mono: float) -> bool:
        """Not leading, and no other live leader heard from for ``takeover_after_s``."""
        return not self.leading and now_mono - self.leader_seen_mono > self.takeover_after_s

    def take_over(self, floor: int = 0) -> int:
        """Lead with an epoch above every one seen; ``floor`` (the service's: the wall
        clock in milliseconds) only when no heartbeat at all was seen.

        Epochs above every one seen, never from the wall clock past that: a standby whose
        clock runs an hour ahead would otherwise lead with an epoch that puts every
        correct-clock successor below it for that hour. The floor is for a controller
        that finds no heartbeat (the broker lost the retained one) while agents may still
        follow a dead leader's epoch; if that floor is below it (or lifted by a bad
        clock), agents follow the live leader of a lower epoch once the newest epoch's
        has been silent ``failsafe_after_s`` (the deposed-epoch rule). Nothing else raises
        an epoch: telemetry's ``epoch`` is never taken (a node's login could report any
        number), only verified heartbeats' (``observe``).
        """
        seen = self.highest_epoch_seen >= 0 or self.epoch > 0
        self.epoch = max(self.highest_epoch_seen + 1, self.epoch + 1, 0 if seen else floor)
        self.highest_epoch_seen = self.epoch
        self.leading = True
        self._anchor = None  # a new time base at the first heartbeat of this epoch
        log.info("%s leads with epoch %d", self.name, self.epoch)
        return self.epoch

    def beat_ts(self, now_mono: float, wall: float) -> float:
        """The ``ts`` of a heartbeat we send now: this epoch's time base, moved on by the
        monotonic clock (a step of our wall clock does not move it). The base is the one
        the leader we followed sent, when it is known, else our wall clock."""
        anchor = self._anchor
        if anchor is None or anchor[0] != self.epoch:
            base = wall if self._base_skew_s is None else wall - self._base_skew_s
            anchor = self._anchor = (self.epoch, base, now_mono)
        return anchor[1] + (now_mono - anchor[2])
