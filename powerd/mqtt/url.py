"""Broker addresses: ``mqtt://[user@]host[:port]`` or ``mqtts://`` (TLS), and how to connect."""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

PASSWORD_ENV = "POWERD_MQTT_PASSWORD"
# Without TCP_NODELAY, a small QoS 1 publish (an ack) that follows a QoS 0 one
# (telemetry) waits for the peer's delayed ACK: ~40 ms per message, measured.
NO_DELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)


@dataclass(frozen=True)
class BrokerSettings:
    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password_file: str | None = None  # secrets live in a file or the environment, never in logs
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    keepalive_s: float = 30.0
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0

    @property
    def display(self) -> str:
        """The address without credentials, for logs."""
        scheme = "mqtts" if self.tls else "mqtt"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    def password(self) -> str | None:
        if self.password_file:
            try:
                return Path(self.password_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ValueError(
                    f"cannot read broker password file {self.password_file}: {exc}"
                ) from None
        return os.environ.get(PASSWORD_ENV)

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``aiomqtt.Client`` (hostname, port, auth, TLS, keepalive)."""
        kwargs: dict[str, Any] = {
            "hostname": self.host,
            "port": self.port,
            "keepalive": int(self.keepalive_s),
            "socket_options": NO_DELAY,
        }
        if self.username:
            kwargs["username"] = self.username
            kwargs["password"] = self.password()
        if self.tls:
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file:
                context.load_cert_chain(self.cert_file, self.key_file)
            kwargs["tls_context"] = context
        return kwargs


def parse_broker_url(url: str, base: BrokerSettings | None = None) -> BrokerSettings:
    """Parse a broker URL.

    Settings a URL cannot carry (credential and TLS files) come from ``base``.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "mqtts"):
        raise ValueError(f"broker URL {url!r} must start with mqtt:// or mqtts://")
    if not parts.hostname:
        raise ValueError(f"broker URL {url!r} has no host")
    if parts.password:
        raise ValueError(
            "put the broker password in broker.password_file or $POWERD_MQTT_PASSWORD, "
            "not in the URL"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"broker URL {url!r} must be scheme://[user@]host[:port] only")
    tls = parts.scheme == "mqtts"
    try:
        port = parts.port or (8883 if tls else 1883)
    except ValueError:
        raise ValueError(f"broker URL {url!r} has an invalid port") from None
    settings = base or BrokerSettings(host=parts.hostname, port=port)
    return replace(
        settings,
        host=parts.hostname,
        port=port,
        tls=tls,
        username=unquote(parts.username) if parts.username else settings.username,
    )
