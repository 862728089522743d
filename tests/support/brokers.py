"""Real servers for the test suite: Mosquitto on a free port, and an MQTT probe client.

Nothing here is a mock: the broker is Debian's ``mosquitto`` with its own
config file, started and stopped by the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import getpass
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt

from powerd.mqtt.url import NO_DELAY
from tests.support.servers import ServerProcess, find_program, free_port, port_open

__all__ = ["Mosquitto", "MqttProbe", "find_mosquitto", "free_port"]

MOSQUITTO_CANDIDATES = ("mosquitto", "/usr/sbin/mosquitto")


def find_mosquitto() -> str:
    return find_program(MOSQUITTO_CANDIDATES, "mosquitto")


# Every broker of the suite requires a login unless a test asks for an anonymous one (the
# shipped mosquitto.example.conf refuses anonymous clients too): this user, whose password
# every powerd process of a test finds in $POWERD_MQTT_PASSWORD (tests/conftest.py).
TEST_USER = "powerd-test"
TEST_PASSWORD = "t3st-Secret-9"


class Mosquitto(ServerProcess):
    """One Mosquitto process with its own config, on a free port (kept across restarts).

    By default it refuses anonymous clients and knows one user, ``TEST_USER`` (its ``url``
    names it); ``allow_anonymous=True`` makes an anonymous broker (forged traffic from
    anyone), and an ``extra_config`` with its own ``password_file`` brings its own users.
    """

    name = "mosquitto"
    marker = "broker"
    stop_timeout_s = 5.0

    def __init__(
        self,
        workdir: Path,
        extra_config: str = "",
        listener_options: str = "",
        allow_anonymous: bool = False,
        tls: bool = False,
    ) -> None:
        """``listener_options``: lines for the listener (certificates, require_certificate);
        ``extra_config``: lines for the broker (password_file, acl_file)."""
        super().__init__(workdir)
        self.extra_config = extra_config
        self.listener_options = listener_options
        self.allow_anonymous = allow_anonymous
        self.tls = tls
        self.config_path = workdir / "mosquitto.conf"

    @property
    def suite_login(self) -> bool:
        """Whether clients log in as ``TEST_USER`` (no anonymous clients, no users of its own)."""
        own_users = re.search(r"^\s*password_file\s", self.extra_config, re.M)
        return not self.allow_anonymous and own_users is None

    @property
    def url(self) -> str:
        user = f"{TEST_USER}@" if self.suite_login else ""
        return f"{'mqtts' if self.tls else 'mqtt'}://{user}127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        logins = ""
        if self.suite_login:
            passwords = self.workdir / "passwd"
            passwords.write_text("")
            subprocess.run(
                ["mosquitto_passwd", "-b", str(passwords), TEST_USER, TEST_PASSWORD], check=True
            )
            logins = f"password_file {passwords}\n"
        self.config_path.write_text(
            # Started as root, mosquitto drops to user "mosquitto", which cannot read the
            # test's private tmp dirs (certificates, password file); as anyone else this
            # line does nothing.
            f"user {getpass.getuser()}\n"
            f"per_listener_settings false\n"
            f"allow_anonymous {'true' if self.allow_anonymous else 'false'}\n"
            f"listener {self.port} 127.0.0.1\n"
            f"{self.listener_options}\n"
            "persistence false\n"
            "max_inflight_messages 100\n"
            "max_queued_messages 100000\n"
            f"{self.extra_config}\n"
            f"{logins}"
        )
        return [find_mosquitto(), "-c", str(self.config_path)]

    def ready(self) -> bool:
        return port_open(self.port)


@dataclass
class Received:
    topic: str
    payload: bytes
    retain: bool
    at: float  # monotonic time of arrival


class MqttProbe:
    """A test client that records every message it receives and lets tests await them."""

    def __init__(self, url_port: int, subscriptions: list[str], **client_kwargs: Any) -> None:
        """``client_kwargs`` go to aiomqtt.Client: username, password, tls_context. Without a
        username it logs in as the suite's user (an anonymous broker accepts that too)."""
        self.port = url_port
        self.subscriptions = subscriptions
        if "username" not in client_kwargs:
            client_kwargs = {**client_kwargs, "username": TEST_USER, "password": TEST_PASSWORD}
        self.client_kwargs = client_kwargs
        self.messages: list[Received] = []
        self._changed = asyncio.Condition()
        self._client: aiomqtt.Client | None = None
        self._reader: asyncio.Task | None = None

    async def __aenter__(self) -> MqttProbe:
        self._client = aiomqtt.Client(
            "127.0.0.1", self.port, socket_options=NO_DELAY, **self.client_kwargs
        )
        await self._client.__aenter__()
        for topic in self.subscriptions:
            await self._client.subscribe(topic, qos=1)
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await self._reader
        if self._client is not None:
            with contextlib.suppress(aiomqtt.MqttError):
                await self._client.__aexit__(None, None, None)

    async def _read(self) -> None:
        assert self._client is not None
        async for message in self._client.messages:
            payload = message.payload if isinstance(message.payload, bytes) else b""
            async with self._changed:
                self.messages.append(
                    Received(message.topic.value, payload, message.retain, time.monotonic())
                )
                self._changed.notify_all()

    async def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        assert self._client is not None
        await self._client.publish(topic, payload, qos=qos, retain=retain)

    def mark(self) -> int:
        """A position in the message log: ``expect(..., after=mark)`` looks only past it."""
        return len(self.messages)

    async def expect(
        self,
        topic_filter: str,
        predicate: Callable[[Received], bool] = lambda _m: True,
        after: int = 0,
        timeout_s: float = 10.0,
    ) -> Received:
        """The first message past ``after`` on a matching topic for which ``predicate`` holds."""
        pattern = topic_filter.replace("+", "*").replace("#", "*")
        checked = after

        def find() -> Received | None:
            nonlocal checked
            while checked < len(self.messages):
                message = self.messages[checked]
                checked += 1
                if fnmatch.fnmatchcase(message.topic, pattern) and predicate(message):
                    return message
            return None

        async def wait() -> Received:
            async with self._changed:
                while (found := find()) is None:
                    await self._changed.wait()
                return found

        try:
            return await asyncio.wait_for(wait(), timeout_s)
        except TimeoutError:
            seen = sorted({m.topic for m in self.messages[after:]})
            raise AssertionError(
                f"no message on {topic_filter} matching within {timeout_s} s; topics seen: {seen}"
            ) from None
