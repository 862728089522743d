"""A leader's state for people (``LeaderState``): built from a service's parts, signed,
published retained on its role's topic.

Published at once after the leader takes or refuses an operator site limit (what
``powerd limit`` waits for), when its epoch changes, and every ``STATE_EVERY_S``
otherwise: counts, not per-node data, so it costs the same at 20,000 nodes as at 2.
Only a leader publishes it; a new leader overwrites it. Nothing reads it to decide
anything (``powerd status`` and ``powerd limit`` show it): a restarted service takes the
limits' order from ``SiteLimitRecord``, never from this, so a stale or forged state
cannot poison a restart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import numpy as np

from policies.tree import over_limit_by_level
from powerd.mqtt.link import MqttLink
from powerd.protocol import (
    PROTOCOL_VERSION,
    HeldLimit,
    LeaderState,
    LevelCounts,
    NodeCounts,
    RefusedLimit,
    SiteLimit,
    encode,
)
from powerd.signing import Signer
from powerd.vocabulary import STALE

STATE_EVERY_S = 5.0  # between two states when nothing happened
REASON_MAX_CHARS = 300  # RefusedLimit.reason's bound


def node_counts(by_mode: Mapping[str, int]) -> NodeCounts:
    """The state's nodes by mode, from a count by mode and ``STALE``
    (``NodeViews.by_mode``)."""
    return NodeCounts(
        controlled=by_mode["controlled"],
        failsafe=by_mode["failsafe"],
        local=by_mode["local"],
        stale=by_mode[STALE],
    )


def levels_over(level: np.ndarray, power_w: np.ndarray, limit_w: np.ndarray) -> LevelCounts:
    """Tree nodes (``level``: 0 site, 1 row, 2 rack, 3 server) whose measured power is
    over their limit, by level."""
    site, row, rack = over_limit_by_level(level, power_w, limit_w)
    return LevelCounts(site=site, row=row, rack=rack)


class StateReport:
    def __init__(
        self,
        topic: str,
        signer: Signer,
        role: Literal["controller", "coordinator"],
        name: str,
        scope: str | None = None,
        every_s: float = STATE_EVERY_S,
    ) -> None:
        """``topic``: the role's state topic (``Topics.state_of``, ``coordinator_state``)."""
        self.topic = topic
        self.signer = signer
        self.role: Literal["controller", "coordinator"] = role
        self.name = name
        self.scope = scope
        self.every_s = every_s
        self.refused: RefusedLimit | None = None
        self.published = 0
        self._sent_at = -math.inf
        self._sent_epoch: int | None = None

    def refuse(self, limit: SiteLimit, reason: str, held: bool) -> None:
        """Remember a trusted limit refused, unless it is the one held coming back (a
        retained copy redelivered on a reconnect: ``held``, ``SiteLimits.holds``)."""
        if held:
            return
        self.refused = RefusedLimit(ts=limit.ts, seq=limit.seq, reason=reason[:REASON_MAX_CHARS])

    def due(self, now: float, epoch: int) -> bool:
        """Whether a state is due at ``now`` (monotonic): none yet in this epoch, or the
        last ``every_s`` ago."""
        return epoch != self._sent_epoch or now - self._sent_at >= self.every_s

    def publish(
        self,
        link: MqttLink,
        now: float,
        *,
        epoch: int,
        wall: float,
        limit: HeldLimit | None = None,
        nodes: NodeCounts | None = None,
        over_limit: LevelCounts | None = None,
        leaves_silent: int | None = None,
    ) -> LeaderState:
        """Sign and publish the state, retained (QoS 1); ``now``: monotonic, ``wall``: its ts."""
        state = LeaderState(
            v=PROTOCOL_VERSION, role=self.role, name=self.name, epoch=epoch, ts=wall,
            scope=self.scope, limit=limit, refused=self.refused, nodes=nodes,
            over_limit=over_limit, leaves_silent=leaves_silent,
        )  # fmt: skip
        link.publish(self.topic, self.signer.sign(self.topic, encode(state)), qos=1, retain=True)
        self._sent_at, self._sent_epoch = now, epoch
        self.published += 1
        return state
