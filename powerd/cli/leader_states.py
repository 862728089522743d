"""The operator tools' broker session (``powerd limit``, ``powerd status``): an MQTT v5
client that reads the leaders' retained states (``LeaderState``) and learns from the
broker's PUBACK whether a publish was refused.

MQTT v5, because under 3.1.1 Mosquitto drops a publish its ACL denies and acknowledges
it as if taken; under v5 its PUBACK carries reason code 0x87 "Not authorized" at once.
(A denied *read* is never reported: Mosquitto only stops delivering.)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from powerd.protocol import LeaderState, ProtocolError, decode
from powerd.signing import Verifier

Verdict = Literal["confirmed", "refused"]


@dataclass(frozen=True)
class Seen:
    """A leader state as read: on which topic, and whether its signature was checked."""

    topic: str
    state: LeaderState
    verified: bool


def read_state(topic: str, payload: bytes, verifier: Verifier | None) -> Seen:
    """A leader state off ``topic``; with ``verifier`` only if a trusted key signed it.
    ProtocolError otherwise."""
    if verifier is None:
        return Seen(topic, decode(LeaderState, payload), verified=False)
    return Seen(topic, verifier.decode(LeaderState, topic, payload), verified=True)


def verdict(state: LeaderState, ts: float, seq: int) -> tuple[Verdict, str] | None:
    """What ``state`` says of the operator message ``(ts, seq)``: held (confirmed, with
    what is held), refused (with the leader's reason), or nothing yet (None)."""
    held, refused = state.limit, state.refused
    if held is not None and (held.ts, held.seq) == (ts, seq):
        return "confirmed", describe_held(state)
    if refused is not None and (refused.ts, refused.seq) == (ts, seq):
        return "refused", refused.reason
    return None


def describe_held(state: LeaderState) -> str:
    """The site limit a leader holds, in words."""
    import time

    held = state.limit
    if held is None:
        return "no site limit taken"
    if held.limit_w is None:
        return f"site limit cleared (by {held.operator})"
    start, end = (
        time.strftime("%H:%M:%S", time.localtime(t)) for t in (held.starts_ts, held.expires_ts)
    )
    status = "in force" if held.in_force else "not in force now"
    return f"{held.limit_w / 1e3:,.1f} kW from {start} until {end}, {status} (by {held.operator})"


def who(state: LeaderState) -> str:
    """The leader, in words: ``controller ctl-a (scope row1, epoch 3)``."""
    scope = "" if state.scope is None else f"scope {state.scope}, "
    return f"{state.role} {state.name} ({scope}epoch {state.epoch})"


class PublishRefused(Exception):
    """The broker answered a publish with a failure reason code (MQTT v5 PUBACK)."""


class Session:
    """An MQTT v5 connection whose publishes report the broker's PUBACK reason code."""

    def __init__(self, client_kwargs: dict[str, Any]) -> None:
        self.client_kwargs = client_kwargs
        self._reasons: dict[int, Any] = {}

    @contextlib.asynccontextmanager
    async def connect(self, subscriptions: list[str]) -> AsyncIterator[Any]:
        import aiomqtt
        import paho.mqtt.client as mqtt

        client = aiomqtt.Client(
            **self.client_kwargs, protocol=aiomqtt.ProtocolVersion.V5, timeout=10
        )
        async with client:
            paho = client._client  # aiomqtt drops the PUBACK's reason code: keep it first
            forward: Any = paho.on_publish  # paho types it for one callback API of several

            def on_publish(c: mqtt.Client, userdata: Any, mid: int, rc: Any, props: Any) -> None:
                self._reasons[mid] = rc
                forward(c, userdata, mid, rc, props)

            paho.on_publish = on_publish
            for topic in subscriptions:
                await client.subscribe(topic, qos=1)
            self.client = client
            yield client

    async def publish(self, topic: str, payload: bytes, retain: bool) -> None:
        """Publish at QoS 1 and wait for the PUBACK; PublishRefused with its reason."""
        self._reasons.clear()
        await self.client.publish(topic, payload, qos=1, retain=retain)
        for rc in self._reasons.values():
            if getattr(rc, "is_failure", False):
                raise PublishRefused(str(rc))


async def states(client: Any, verifier: Verifier | None, errors: list[str]) -> AsyncIterator[Seen]:
    """The leader states as they arrive on ``client``'s subscriptions; what could not be
    read (unsigned, untrusted, malformed) is said in ``errors`` and skipped."""
    async for message in client.messages:
        payload = message.payload if isinstance(message.payload, bytes) else b""
        try:
            yield read_state(str(message.topic), payload, verifier)
        except ProtocolError as exc:
            errors.append(f"{message.topic}: {exc}")
