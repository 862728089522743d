"""An MQTT broker inside the process (amqtt), for `powerd demo`: no servers to install.

Production runs Mosquitto, EMQX or HiveMQ; this is for one machine and a few
hundred clients at most.
"""

from __future__ import annotations

import logging
import socket
from types import TracebackType

from amqtt.broker import Broker


def free_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        self._broker = Broker(
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
