"""The fleet's telemetry connections: MQTT 3.1.1 QoS 0 publishing, and nothing else.

A load generator has to cost less than what it loads. Through paho, one
QoS 0 publish cost the fleet ~12 us of Python (a message-info object with a
condition variable, the packet built field by field, a send per message);
20,736 nodes a second took most of a core beside the controller it was
loading on the same 2-core machine. This writes the PUBLISH frames itself
into a buffer and sends the buffer when the socket takes it: a few
microseconds a message.

It speaks only what a QoS 0 publisher needs (CONNECT with optional username
and password, CONNACK, PUBLISH, PINGREQ/PINGRESP, DISCONNECT; TLS through an
``ssl.SSLContext``), for the simulator only; the framing is
``powerd.mqtt.stream``'s, the controller's telemetry receiver. Everything that must behave as
an agent does (commands, acks, heartbeats) goes through paho in
``powerd.fleet.runner``; the controller and the agent use paho and aiomqtt.
"""

from __future__ import annotations

import socket
import ssl
import time

from powerd.mqtt.stream import connect_packet, remaining_length, str16
from powerd.mqtt.url import BrokerSettings

PINGREQ = b"\xc0\x00"
DISCONNECT = b"\xe0\x00"
MAX_BUFFER_BYTES = 64 * 1024 * 1024  # beyond this the broker is not reading: drop, count


class WireError(ConnectionError):
    pass


class TopicFrames:
    """The start of a QoS 0 PUBLISH to one topic, ready to have a payload appended."""

    def __init__(self, topic: str) -> None:
        self._topic = str16(topic)

    def frame(self, payload: bytes) -> bytes:
        body_len = len(self._topic) + len(payload)
        return b"\x30" + remaining_length(body_len) + self._topic + payload


class WirePublisher:
    """One connection that publishes QoS 0 messages written into its buffer."""

    def __init__(self, broker: BrokerSettings, client_id: str) -> None:
        self.broker = broker
        self.client_id = client_id
        self.sock: socket.socket | None = None
        self._out = bytearray()
        self.dropped = 0  # frames not buffered: the broker did not read fast enough
        self._last_send = time.monotonic()

    def connect(self, timeout_s: float = 10.0) -> None:
        kwargs = self.broker.client_kwargs()
        sock: socket.socket = socket.create_connection(
            (self.broker.host, self.broker.port), timeout=timeout_s
        )
        if "tls_context" in kwargs:
            context: ssl.SSLContext = kwargs["tls_context"]
            sock = context.wrap_socket(sock, server_hostname=self.broker.host)
        sock.sendall(
            connect_packet(
                self.client_id,
                int(self.broker.keepalive_s),
                kwargs.get("username"),
                kwargs.get("password"),
            )
        )
        connack = b""
        while len(connack) < 4:
            chunk = sock.recv(4 - len(connack))
            if not chunk:
                raise WireError(f"{self.broker.display}: connection closed before CONNACK")
            connack += chunk
        if connack[0] != 0x20 or connack[3] != 0:
            raise WireError(f"{self.broker.display}: connection refused (CONNACK {connack.hex()})")
        sock.setblocking(False)
        self.sock = sock

    def write(self, frame: bytes) -> None:
        if len(self._out) > MAX_BUFFER_BYTES:
            self.dropped += 1
            return
        self._out += frame

    @property
    def wants_write(self) -> bool:
        return bool(self._out)

    def flush(self) -> None:
        """Send what the socket takes now."""
        assert self.sock is not None
        while self._out:
            try:
                sent = self.sock.send(self._out)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                return
            del self._out[:sent]
            self._last_send = time.monotonic()

    def tick(self) -> None:
        """Keepalive (a PINGREQ when idle) and read away what the broker sends (PINGRESP)."""
        assert self.sock is not None
        if time.monotonic() - self._last_send > self.broker.keepalive_s / 2 and not self._out:
            self._out += PINGREQ
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    raise WireError(f"{self.broker.display}: the broker closed the connection")
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass

    def close(self) -> None:
        if self.sock is None:
            return
        try:
            self.sock.setblocking(True)
            self.sock.settimeout(2.0)
            self.flush_blocking()
            self.sock.sendall(DISCONNECT)
        except OSError:
            pass
        finally:
            self.sock.close()
            self.sock = None

    def flush_blocking(self) -> None:
        assert self.sock is not None
        if self._out:
            self.sock.sendall(self._out)
            self._out.clear()
