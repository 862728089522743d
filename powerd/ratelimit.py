"""Rate limits for logs and replies, so a flood of bad input cannot flood anything else."""

from __future__ import annotations

import logging
from collections.abc import Callable


class LogOncePer:
    """Log a message at most once per ``interval_s`` per key, counting what was held back.

    The protocol asks receivers to log a rejected payload once per sender per
    minute: the key is the sender (or the topic, where MQTT does not say who sent it).
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warning(self, key: str, now_s: float, msg: str, *args: object) -> bool:
        last = self._last.get(key)
        if last is not None and now_s - last < self._interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        held = self._held.pop(key, 0)
        self._last[key] = now_s
        suffix = f" ({held} more like it in the last {self._interval_s:.0f} s)" if held else ""
        self._logger.warning(msg + suffix, *args)
        return True


class TokenBucket:
    """At most ``rate_per_s`` events a second on average, bursts up to ``burst``."""

    def __init__(self, rate_per_s: float, burst: float, clock: Callable[[], float]) -> None:
        self._rate = rate_per_s
        self._burst = burst
        self._tokens = burst
        self._clock = clock
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
