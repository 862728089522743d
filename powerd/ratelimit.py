"""Rate limits for logs and replies, so a flood of bad input cannot flood anything else."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

MAX_LOG_KEYS = 10_000


class LogOncePer:
    """Log a message at most once per ``interval_s`` per key, counting what was held back.

    The protocol asks receivers to log a rejected payload once per sender per
    minute: the key is the sender (or the topic, where MQTT does not say who sent it).

    ``tally`` is the same limit for a message that gives the count itself
    ("dropped 1200 points in the last 60 s"): the caller formats and logs it.

    At most ``MAX_LOG_KEYS`` keys are remembered (a sender may make up names: jobs,
    owners, nodes): past that the older half is forgotten, which costs a line each.
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    @property
    def interval_s(self) -> float:
        return self._interval_s

    def tally(self, key: str, now_s: float, count: int = 1) -> int | None:
        """Add ``count`` to ``key``'s tally. Once per interval: the tally since the last
        time it was returned, this ``count`` included, and it starts over; else None."""
        if len(self._last) >= MAX_LOG_KEYS and key not in self._last:
            self._forget_older_half()
        self._held[key] = self._held.get(key, 0) + count
        last = self._last.get(key)
        if last is not None and now_s - last < self._interval_s:
            return None
        self._last[key] = now_s
        return self._held.pop(key)

    def _forget_older_half(self) -> None:
        for key in list(self._last)[: len(self._last) // 2]:
            del self._last[key]
            self._held.pop(key, None)

    def log(self, level: int, key: str, now_s: float, msg: str, *args: object) -> bool:
        """Log ``msg % args`` at ``level`` unless ``key`` was logged less than
        ``interval_s`` ago; the first line after a quiet spell says how many were held."""
        seen = self.tally(key, now_s)
        if seen is None:
            return False
        held = seen - 1
        suffix = f" ({held} more like it in the last {self._interval_s:.0f} s)" if held else ""
        self._logger.log(level, msg + suffix, *args)
        return True

    def warning(self, key: str, now_s: float, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, now_s, msg, *args)


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


class KeyedBuckets:
    """A token bucket per key (an owner, a job): at most ``rate_per_s`` events a second
    each, bursts up to ``burst``. At most ``max_keys`` buckets are kept, the least recently
    used forgotten first (a forgotten key starts with a full bucket): bounded memory
    whatever keys a sender makes up, so a bound on all keys together belongs beside it."""

    def __init__(self, rate_per_s: float, burst: float, max_keys: int) -> None:
        self._rate = rate_per_s
        self._burst = burst
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str, now_s: float) -> bool:
        """One event for ``key`` at ``now_s`` (monotonic): True if it is within the rate."""
        tokens, at = self._buckets.pop(key, (self._burst, now_s))
        tokens = min(self._burst, tokens + max(0.0, now_s - at) * self._rate)
        taken = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if taken else tokens, now_s)
        if len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
        return taken
