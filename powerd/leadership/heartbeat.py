"""Signed heartbeats and the clean hand-over, for every tier that leads by them.

The site controller and the leaf controllers (``powerd.controller.service``) and
the coordinators (``powerd.coordinator.service``) lead and follow by the same
rules (``powerd.leadership.state``), each on its own heartbeat topic.
"""

from __future__ import annotations

import logging

from powerd.leadership.state import Leadership
from powerd.mqtt.link import MqttLink
from powerd.protocol import Heartbeat, encode
from powerd.signing import Signer
from powerd.vocabulary import PROTOCOL_VERSION, ControllerState


def signed_heartbeat(
    signer: Signer,
    topic: str,
    leadership: Leadership,
    state: ControllerState,
    ts: float,
    seq: int | None = None,
) -> bytes:
    """A heartbeat of ``leadership``'s name and epoch, signed for ``topic``; ``ts``: the
    epoch's time base (``Leadership.beat_ts``); ``seq``: the highest command seq sent."""
    beat = Heartbeat(
        v=PROTOCOL_VERSION,
        epoch=leadership.epoch,
        ts=ts,
        controller=leadership.name,
        state=state,
        seq=seq,
    )
    return signer.sign(topic, encode(beat))


async def step_down_on_exit(
    link: MqttLink,
    leadership: Leadership,
    topic: str,
    signer: Signer,
    ts: float,
    log: logging.Logger,
) -> None:
    """A clean stop hands over at once: a retained standby heartbeat, not a stale leader one
    (a standby takes over when the leader it followed says so, live). ``ts``: the epoch's
    time base (``Leadership.beat_ts``), so the standby takes it as sent now."""
    if not leadership.leading:
        return
    if not link.connected.is_set():
        log.warning("no broker connection to step down on: a standby leads once this epoch "
                    "has been silent for its takeover time")  # fmt: skip
        return
    leadership.leading = False
    standby = signed_heartbeat(signer, topic, leadership, "standby", ts)
    mid = link.publish(topic, standby, qos=1, retain=True)
    if mid is None or not await link.published(mid, 2.0):
        log.warning("could not publish the standby heartbeat on exit")
