"""Which controller a node follows, and whether it lives: heartbeats by receipt.

The rules of docs/PROTOCOL.md ("Clocks", "a deposed epoch"), with no I/O, shared by
the agent (``powerd.agent.core``) and the fleet simulator (``powerd.fleet.model``), so
the two answer every heartbeat alike:

- only a signed **leader** heartbeat counts; one whose ``ts`` runs more than
  ``max_clock_skew_s`` ahead of this wall clock is a clock alarm (``SkewWatch``);
- one of the followed ``(controller, epoch)`` whose ``ts`` is not newer than the newest
  seen of it is a replay;
- a newer epoch is followed at once; an older one only when delivered live while the
  newest epoch's leader has been silent for more than ``failsafe_after_s`` (the
  deposed-epoch rule), and then the command order starts afresh;
- only a heartbeat delivered **live** proves liveness (for ``failsafe_after_s`` from its
  receipt); a retained one says who leads, in which epoch;
- the first live heartbeat of an epoch sets the command order's floor at its ``seq``
  (the highest the leader sent): what it sent before is a replay to a node that did not
  hear it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from powerd.clock_skew import SkewWatch
from powerd.protocol import Heartbeat

Verdict = Literal["standby", "clock_alarm", "replay", "deposed", "retained", "live"]


@dataclass(frozen=True)
class Taken:
    """What one heartbeat did."""

    verdict: Verdict  # "live": it proves the leader lives now; anything else: it does not
    new_epoch: bool = False  # another epoch is followed from now on
    floor: tuple[int, int] | None = None  # the command order's floor, when this one sets it


class Following:
    def __init__(
        self,
        failsafe_after_s: float,
        max_clock_skew_s: float,
        log: logging.Logger,
        now_mono: float,
    ) -> None:
        self.failsafe_after_s = failsafe_after_s
        self.skew = SkewWatch(max_clock_skew_s, log, "controller")
        self.newest_epoch = -1
        self.deposed_epochs = 0  # times a live leader of an older epoch was followed
        self._log = log
        self._heard_mono = now_mono  # the newest epoch's last live heartbeat (or its news)
        self._leader: tuple[str, int] | None = None  # (controller, epoch) followed
        self._leader_ts = float("-inf")  # the newest ts seen of it
        self._floor_pending = True

    def heartbeat(self, beat: Heartbeat, now_mono: float, now_wall: float, live: bool) -> Taken:
        """Take a verified heartbeat, delivered ``live`` or retained."""
        if beat.state != "leader":
            return Taken("standby")
        if self.skew.ahead(beat.controller, beat.ts, now_wall, now_mono, live):
            return Taken("clock_alarm")
        if (beat.controller, beat.epoch) == self._leader and beat.ts <= self._leader_ts:
            return Taken("replay")
        new_epoch = beat.epoch != self.newest_epoch
        if new_epoch and not self._take_epoch(beat, now_mono, live):
            return Taken("deposed")
        self._leader, self._leader_ts = (beat.controller, beat.epoch), beat.ts
        if not live:
            return Taken("retained", new_epoch)
        self._heard_mono = now_mono
        floor = None
        if self._floor_pending:
            self._floor_pending = False
            floor = (beat.epoch, -1 if beat.seq is None else beat.seq)
        return Taken("live", new_epoch, floor)

    def _take_epoch(self, beat: Heartbeat, now_mono: float, live: bool) -> bool:
        """Whether ``beat``'s epoch (not the one followed) is followed from now on."""
        if beat.epoch < self.newest_epoch:
            silent_s = now_mono - self._heard_mono
            if not live or silent_s <= self.failsafe_after_s:
                return False
            self.deposed_epochs += 1
            self._log.warning(
                "epoch %d silent for %.0f s: following the live leader %s of epoch %d",
                self.newest_epoch,
                silent_s,
                beat.controller,
                beat.epoch,
            )
        elif self.newest_epoch >= 0:
            self._log.info(
                "controller epoch %d -> %d (%s)", self.newest_epoch, beat.epoch, beat.controller
            )
        self.newest_epoch = beat.epoch
        self._heard_mono = now_mono  # silent from now, unless heard live
        self._floor_pending = True
        return True

    def command_epoch(self, epoch: int) -> None:
        """A command of ``epoch`` was applied: no older epoch's command is taken after it."""
        self.newest_epoch = max(self.newest_epoch, epoch)
