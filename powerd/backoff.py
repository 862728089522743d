"""Reconnect delays: exponential backoff with full jitter.

Full jitter (a uniform draw below the exponential bound) spreads the
reconnects of twenty thousand agents after a broker restart, instead of
having them all knock at once.
"""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, min_s: float, max_s: float, rng: random.Random | None = None) -> None:
        if not 0 < min_s <= max_s:
            raise ValueError("need 0 < min_s <= max_s")
        self.min_s = min_s
        self.max_s = max_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay_s(self) -> float:
        """The delay before the next attempt, in [min_s, bound], bound doubling up to max_s."""
        # the exponent stops growing once the bound is reached: no overflow in a long outage
        bound = min(self.max_s, self.min_s * 2.0 ** min(self.attempt, 64))
        self.attempt += 1
        return self.min_s + self._rng.random() * (bound - self.min_s)

    def reset(self) -> None:
        self.attempt = 0
