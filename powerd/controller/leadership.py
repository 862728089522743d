"""Who leads: epochs from the retained heartbeat, step-down, and standby takeover.

Rules (docs/PROTOCOL.md, safety rule 2): a starting controller takes the
highest epoch it sees plus one, and at least the wall clock in milliseconds; a
leader that sees a heartbeat with a higher epoch, or the same epoch from a
controller whose name sorts lower, steps down at once. A standby takes over
(with a new, higher epoch) once no live leader heartbeat has been seen for
``takeover_after_s``, or at once when the leader it followed publishes a
standby heartbeat (it stopped cleanly).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from powerd.protocol import Heartbeat

log = logging.getLogger("powerd.controller")


@dataclass
class Leadership:
    name: str
    takeover_after_s: float
    epoch: int = 0
    leading: bool = False
    highest_epoch_seen: int = -1
    leader_seen_mono: float = float("-inf")  # last heartbeat of another live leader
    leader_name: str | None = None  # that leader's name

    def observe(self, beat: Heartbeat, now_mono: float, age_s: float) -> bool:
        """Take in another controller's heartbeat; True if we must step down now."""
        if beat.controller == self.name and beat.epoch == self.epoch:
            return False  # our own, back from the broker
        self.highest_epoch_seen = max(self.highest_epoch_seen, beat.epoch)
        if beat.state != "leader" and beat.controller == self.leader_name:
            self.leader_seen_mono = float("-inf")  # the leader stopped cleanly: take over now
            self.leader_name = None
            return False
        if beat.state != "leader" or age_s > self.takeover_after_s:
            return False  # a standby, or a stale retained heartbeat of a dead leader
        self.leader_seen_mono = now_mono - age_s
        self.leader_name = beat.controller
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
        """Lead with an epoch above every one seen, and at least ``floor``.

        The service's floor is the wall clock in milliseconds: a controller that finds
        no retained heartbeat (the broker lost it) still leads above a leader that died
        before it started, so agents following that leader follow it. Nothing else
        raises an epoch: telemetry's ``epoch`` is never taken (a node's login could
        report any number), only verified heartbeats' (``observe``).
        """
        self.epoch = max(self.highest_epoch_seen + 1, self.epoch + 1, floor)
        self.highest_epoch_seen = self.epoch
        self.leading = True
        log.info("%s leads with epoch %d", self.name, self.epoch)
        return self.epoch
