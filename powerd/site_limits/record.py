"""The leader's record of the operator's site limit: the limits' order across restarts.

Operator limits and clears are ordered by ``(ts, seq)`` (``powerd.site_limits.limits``),
but what a restarted service finds on the operator's topic is whatever was retained
there last, which anyone with that login, or anyone who captured an older message, can
replace with an older clear. So whoever applies limits (a site's controller; in a tree,
the coordinator) republishes the newest limit it took, retained, under its own key on a
topic of its role. A restarted (or standby) peer takes the record first as a retained
operator message is taken (its window by the wall clock): the floor of the order, below
which an older operator message is refused.

``operator_limit``: which operator messages count at all (``trust.operator_keys``).
"""

from __future__ import annotations

import logging

from powerd.mqtt.link import MqttLink
from powerd.protocol import ProtocolError, SiteLimit, encode
from powerd.signing import Signer, Verifier
from powerd.site_limits.limits import SiteLimits


def operator_limit(operators: Verifier | None, topic: str, payload: bytes) -> SiteLimit:
    """An operator's site limit, verified; ProtocolError when no operator signed it (or
    none is trusted: every limit is refused)."""
    if operators is None:
        raise ProtocolError("no operator key is trusted (trust.operator_keys)")
    return operators.decode(SiteLimit, topic, payload)


class SiteLimitRecord:
    def __init__(self, topic: str, signer: Signer, peers: Verifier, log: logging.Logger) -> None:
        """``topic``: the record's (``Topics.site_limit_record`` for controllers,
        ``Topics.coordinator_site_limit_record`` for coordinators); ``peers``: whose
        records count (the role's keys, ours among them); ``log``: where a record taken
        is said."""
        self.topic = topic
        self.signer = signer
        self.peers = peers
        self.log = log

    def publish(self, link: MqttLink, limits: SiteLimits) -> None:
        """Republish the newest limit taken, retained, under our key (nothing if none)."""
        if limits.limit is None:
            return
        payload = self.signer.sign(self.topic, encode(limits.limit))
        link.publish(self.topic, payload, qos=1, retain=True)

    def take(self, limits: SiteLimits, payload: bytes, now: float, wall: float) -> SiteLimit | None:
        """Take a peer's record into ``limits``: the record if it was newer than what
        they hold, else None (our own record coming back is not counted as refused).
        ProtocolError when it is not a peer's."""
        record = self.peers.decode(SiteLimit, self.topic, payload)
        if limits.holds(record):
            return None
        if limits.take(record, now, wall, live=False) is not None:
            return None
        self.log.info("site limit record taken: operator %s's of ts %.3f, seq %d",
                      record.operator, record.ts, record.seq)  # fmt: skip
        return record
