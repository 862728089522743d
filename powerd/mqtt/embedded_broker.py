"""An MQTT broker inside the process (amqtt), for `powerd demo`: no servers to install.

Production runs Mosquitto, EMQX or HiveMQ; this is for one machine and a few
hundred clients at most. One amqtt bug is mended here (``_RetainedToOwnSubscriptions``).
"""

from __future__ import annotations

import logging
import socket
from types import TracebackType

from amqtt.broker import Broker
from amqtt.session import Session


def free_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _RetainedToOwnSubscriptions(Broker):  # type: ignore[misc]  # amqtt ships no types
    """amqtt's broker, sending a client the retained messages of its own subscriptions only.

    On every CONNECT, amqtt 0.11 and 0.12 replay to the connecting client the retained messages
    matching *every* topic filter any client of the broker subscribes to (the loop added
    for persistent sessions by Yakifo/amqtt#248 walks the broker's subscriptions, not the
    session's). MQTT 3.1.1 (3.3.1.3) delivers a retained message to "future subscribers
    whose subscriptions match its topic name" only. Seen in ``powerd demo``: each job's
    fill follower, subscribed to its nodes' fill topics alone, got the controller's
    retained heartbeat as it connected and logged it as a stray message. Replays on
    CONNECT and SUBSCRIBE both go through the method below; a session's own
    subscriptions are registered before their SUBSCRIBE replays, so those still come.
    """

    async def _publish_retained_messages_for_subscription(
        self, subscription: tuple[str, int], session: Session
    ) -> None:
        holders = self._subscriptions.get(subscription[0], [])
        if any(holder is session for holder, _ in holders):
            await super()._publish_retained_messages_for_subscription(subscription, session)


class EmbeddedBroker:
    """``async with EmbeddedBroker() as broker: ... broker.url``"""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_local_port()
        self._broker: Broker | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    async def __aenter__(self) -> EmbeddedBroker:
        # amqtt logs every connection at INFO; the demo has its own view
        for name in ("amqtt", "transitions"):
            logging.getLogger(name).setLevel(logging.ERROR)
        self._broker = _RetainedToOwnSubscriptions(
            {
                "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{self.port}"}},
                "plugins": {
                    "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
                },
            }
        )
        await self._broker.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._broker is not None:
            await self._broker.shutdown()
            self._broker = None
