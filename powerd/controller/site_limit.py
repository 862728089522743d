"""Demand response: an operator's temporary limit on the site, with no I/O here.

An operator (or the utility, through one) publishes a signed, retained
``SiteLimit``: "120 MW for 15 minutes, starting now". The controller verifies
it with ``trust.operator_keys`` and, between ``starts_ts`` and ``expires_ts``
(wall clock), lowers the site's capping threshold to it: not at once, but from
the site's measured power down at the site's ramp-down rate (the grid's limit
on how fast the site may fall), so the cut itself is no swing the grid sees.
The site's target and uncapping threshold keep their fractions of the
threshold. At expiry (or a newer message with ``limit_w`` null) the file's
bands return, and the caps rise under the usual ramp limits.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from policies.tree import SITE, Tree
from powerd.protocol import SiteLimit


@dataclass
class SiteLimits:
    limit: SiteLimit | None = None  # the newest taken
    glide_w: float | None = None  # the site's capping threshold while a limit is in force
    taken: int = 0
    refused: int = 0

    def take(self, message: SiteLimit) -> str | None:
        """A verified limit; why it was refused (older than the one in force), or None."""
        last = self.limit
        if last is not None and (message.ts, message.seq) <= (last.ts, last.seq):
            self.refused += 1
            return (
                f"site limit (ts {message.ts}, seq {message.seq}) is not newer than the one taken"
            )
        self.limit = message
        self.taken += 1
        return None

    def active_w(self, wall: float) -> float | None:
        """The limit in force at ``wall``, or None."""
        m = self.limit
        if m is None or m.limit_w is None or not m.starts_ts <= wall < m.expires_ts:
            return None
        return m.limit_w

    def threshold_w(
        self, wall: float, measured_w: float, dt_s: float, ramp_down_w_per_s: float
    ) -> float | None:
        """The site's capping threshold this cycle under the limit (None: none in force):
        from the measured power down toward the limit at ``ramp_down_w_per_s``, then the
        limit. A raised limit applies at once (the uncapping ramp limits the rise)."""
        target = self.active_w(wall)
        if target is None:
            self.glide_w = None
            return None
        start = measured_w if self.glide_w is None else self.glide_w
        if start <= target or not math.isfinite(ramp_down_w_per_s):
            self.glide_w = target
        else:
            self.glide_w = max(target, start - ramp_down_w_per_s * dt_s)
        return self.glide_w


def with_site_threshold(tree: Tree, threshold_w: float) -> Tree:
    """``tree`` with its site's capping threshold at most ``threshold_w``, its target and
    uncapping threshold keeping their ratios to it."""
    site_threshold = float(tree.cap_threshold_w[SITE])
    if threshold_w >= site_threshold:
        return tree
    scale = threshold_w / site_threshold
    arrays: dict[str, Any] = {}
    for name in ("cap_threshold_w", "cap_target_w", "uncap_threshold_w"):
        column = np.array(getattr(tree, name), dtype=float)
        column[SITE] *= scale
        arrays[name] = column
    return dataclasses.replace(tree, **arrays)
