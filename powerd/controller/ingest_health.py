"""Whether the controller's telemetry path is keeping up: judged over a window, not a cycle.

The inbox replaces a node's waiting sample with a newer one when the control loop has not
decoded it yet (``powerd.controller.inbox``). Now and then that is coalescing, not a
controller falling behind: a cycle that keeps the loop busy for longer than an agent's
period (agents smoothing in software sample at 10 Hz) replaces one sample, and the
controller still decides on the newest. Warned about on every such cycle, an operator
read "telemetry over capacity" once a minute from a controller with capacity to spare
(every `bench_smooth_loop` run: 1 sample in 25 s). So the counts are added up over
``JUDGE_S`` seconds or ``JUDGE_SAMPLES`` samples, whichever comes first, and judged then:

- **over capacity** when more than ``DROPPED_SHARE`` of the samples received were replaced
  before they were decoded (raise ``controller.ingest_share``, or give the controller a
  host of its own: docs/CONTROLLER.md, "Scale");
- **lost** when any sample never reached the controller (gaps in an agent's ``seq``: the
  broker or the network), however few.

Every count still goes to the controller's telemetry each cycle (``CycleCounters``).
"""

from __future__ import annotations

from dataclasses import dataclass

JUDGE_S = 10.0
JUDGE_SAMPLES = 200
DROPPED_SHARE = 0.05


@dataclass
class IngestHealth:
    """The telemetry counts since the window began; ``add`` every cycle."""

    received: int = 0
    dropped: int = 0
    lost: int = 0
    waiting_max: int = 0
    since_s: float | None = None

    def add(self, now_s: float, received: int, dropped: int, lost: int, waiting: int) -> str | None:
        """Add one cycle's counts. When the window is complete: what to warn about (None if
        nothing), and a new window begins."""
        if self.since_s is None:
            self.since_s = now_s
        self.received += received
        self.dropped += dropped
        self.lost += lost
        self.waiting_max = max(self.waiting_max, waiting)
        span_s = now_s - self.since_s
        if span_s < JUDGE_S and self.received < JUDGE_SAMPLES:
            return None
        over = self.dropped > DROPPED_SHARE * self.received
        message = None
        if over or self.lost:
            message = (
                f"{'telemetry over capacity: ' if over else 'telemetry lost: '}"
                f"{self.dropped} of {self.received} samples dropped (a newer one of the same "
                f"node came before they were decoded), {self.lost} lost (gaps in agents' seq) "
                f"in {span_s:.1f} s; up to {self.waiting_max} nodes waiting"
            )
        self.received = self.dropped = self.lost = self.waiting_max = 0
        self.since_s = now_s
        return message
