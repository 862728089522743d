"""A receive-only MQTT 3.1.1 client for one QoS 0 firehose: the controller's telemetry.

What it speaks: CONNECT (clean session, optional username and password, TLS
through the broker settings), one SUBSCRIBE at QoS 0, PUBLISH in (a QoS 1 or
2 one, which a QoS 0 subscription should never get, is acknowledged all the
same), PINGREQ/PINGRESP, DISCONNECT. Nothing else: commands, acks and
heartbeats go through paho (``powerd.mqtt.link``), agents use aiomqtt.

Why it exists: at 20,736 messages a second paho spent ~20 us of Python per
message on this path (three or four ``recv`` calls, a packet dict, a message
object, a callback through a topic matcher), most of a core before the
controller decoded anything (bench/RESULTS.md, "scale"). Here the socket is
read 256 KiB at a time through asyncio's stream, and each frame is sliced
out of the buffer: the topic and payload are the only objects made per
message, and they go straight to ``on_message(topic, payload, arrived)``.

A broker that says nothing for 1.5 keepalives, or sends something this
client does not expect, ends the session (``lost``); the caller reconnects.
What anyone may publish on a telemetry topic never does: a frame over
``MAX_FRAME_BYTES`` is skipped as it streams past (never held whole) and a
retained PUBLISH (agents never retain telemetry: one is a stranger's, and the
broker would send it again on every subscribe) is dropped, both counted
(``oversized``, ``retained``). Reconnecting for them would lose every node's
telemetry, again and again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Callable, Sequence

from powerd.mqtt.url import BrokerSettings

log = logging.getLogger("powerd.mqtt")

READ_BYTES = 256 * 1024
CONNECT_TIMEOUT_S = 10.0
MAX_FRAME_BYTES = 1024 * 1024  # a telemetry payload is at most 64 KiB; more is nonsense

OnMessage = Callable[[str, bytes, float], None]  # topic, payload, monotonic arrival time

_CONNACK, _PUBLISH, _SUBACK, _PINGRESP = 0x20, 0x30, 0x90, 0xD0
_PINGREQ = b"\xc0\x00"
_DISCONNECT = b"\xe0\x00"


class StreamError(Exception):
    """The broker refused us, broke the protocol, or went away."""


def remaining_length(n: int) -> bytes:
    """MQTT's variable-length integer: 7 bits a byte, high bit set while more follow."""
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def str16(text: str) -> bytes:
    """A length-prefixed UTF-8 string, as MQTT writes topics, names and passwords."""
    data = text.encode()
    return struct.pack("!H", len(data)) + data


def connect_packet(
    client_id: str, keepalive_s: int, username: str | None, password: str | None
) -> bytes:
    """CONNECT, MQTT 3.1.1, clean session."""
    flags = 0x02  # clean session
    payload = str16(client_id)
    if username is not None:
        flags |= 0x80
        payload += str16(username)
        if password is not None:
            flags |= 0x40
            payload += str16(password)
    body = str16("MQTT") + bytes([4, flags]) + struct.pack("!H", keepalive_s) + payload
    return b"\x10" + remaining_length(len(body)) + body


def subscribe_packet(packet_id: int, topic_filter: str | Sequence[str], qos: int = 0) -> bytes:
    """SUBSCRIBE to one topic filter, or to several in one packet."""
    filters = [topic_filter] if isinstance(topic_filter, str) else topic_filter
    body = struct.pack("!H", packet_id) + b"".join(str16(f) + bytes([qos]) for f in filters)
    return b"\x82" + remaining_length(len(body)) + body


# Topic filters per SUBSCRIBE packet when a stream takes many (a leaf controller's nodes).
FILTERS_PER_PACKET = 256


class MqttStream:
    def __init__(
        self,
        broker: BrokerSettings,
        client_id: str,
        topic_filter: str | Sequence[str],
        on_message: OnMessage,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``topic_filter``: one filter (a wildcard), or many (a scoped controller's nodes,
        one topic each: the broker then sends it only its own nodes' telemetry)."""
        self.broker = broker
        self.client_id = client_id
        self.topic_filters = (topic_filter,) if isinstance(topic_filter, str) else (*topic_filter,)
        if not self.topic_filters:
            raise ValueError("a stream needs at least one topic filter")
        self.topic_filter = (
            self.topic_filters[0]
            if len(self.topic_filters) == 1
            else f"{self.topic_filters[0]} and {len(self.topic_filters) - 1} more"
        )
        self.on_message = on_message
        self.received = 0
        self.oversized = 0  # frames over MAX_FRAME_BYTES, skipped unread
        self.retained = 0  # retained PUBLISHes, dropped
        self._skipping_bytes = 0  # what is left of an oversized frame being skipped
        self._monotonic = monotonic
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._buffer = bytearray()

    async def connect(self) -> None:
        """Connect and subscribe; StreamError (refused), OSError or TimeoutError if not."""
        kwargs = self.broker.client_kwargs()
        async with asyncio.timeout(CONNECT_TIMEOUT_S):  # not wait_for: it can swallow a cancel
            self._reader, self._writer = await asyncio.open_connection(
                self.broker.host,
                self.broker.port,
                ssl=kwargs.get("tls_context"),
                limit=4 * READ_BYTES,
            )
        self._buffer.clear()
        self._skipping_bytes = 0
        self._writer.write(
            connect_packet(
                self.client_id,
                int(self.broker.keepalive_s),
                kwargs.get("username"),
                kwargs.get("password"),
            )
        )
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            kind, body = await self._next_control_frame()
        if kind != _CONNACK or len(body) != 2 or body[1] != 0:
            raise StreamError(f"connection refused (CONNACK {bytes(body).hex() or kind})")
        chunks = [
            self.topic_filters[i : i + FILTERS_PER_PACKET]
            for i in range(0, len(self.topic_filters), FILTERS_PER_PACKET)
        ]
        for packet_id, chunk in enumerate(chunks, start=1):
            self._writer.write(subscribe_packet(packet_id, chunk))
        waiting = {packet_id: len(chunk) for packet_id, chunk in enumerate(chunks, start=1)}
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            while waiting:
                kind, body = await self._next_control_frame()
                if kind == _PUBLISH:
                    continue  # telemetry of a filter already granted (QoS 0): the next comes
                packet_id = int.from_bytes(body[:2]) if len(body) >= 2 else -1
                codes = body[2:]
                if kind != _SUBACK or len(codes) != waiting.pop(packet_id, -1):
                    raise StreamError(f"unexpected answer to SUBSCRIBE (frame {kind:#x})")
                if any(code >= 0x80 for code in codes):
                    raise StreamError(f"subscription to {self.topic_filter} refused by the broker")

    async def run(self) -> str:
        """Receive until the connection ends; why it ended."""
        assert self._reader is not None and self._writer is not None
        keepalive_s = self.broker.keepalive_s
        pinger = asyncio.create_task(self._ping(keepalive_s / 2))
        try:
            while True:
                try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel
                    async with asyncio.timeout(1.5 * keepalive_s):
                        data = await self._reader.read(READ_BYTES)
                except TimeoutError:
                    return f"nothing from the broker for {1.5 * keepalive_s:g} s"
                if not data:
                    return "the broker closed the connection"
                if self._skipping_bytes:
                    data = self._skip(data)
                self._buffer += data
                self._frames(self._monotonic())
        except (StreamError, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            pinger.cancel()

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        with contextlib.suppress(OSError, RuntimeError):
            writer.write(_DISCONNECT)
        writer.close()

    # --- frames ------------------------------------------------------------------------

    def _skip(self, data: bytes) -> bytes:
        """What of ``data`` is left once the rest of an oversized frame is dropped."""
        n = min(len(data), self._skipping_bytes)
        self._skipping_bytes -= n
        return data[n:]

    def _frames(self, arrived: float) -> None:
        """Hand out every whole frame in the buffer; keep a partial one for the next read."""
        buf = self._buffer
        view = memoryview(buf)
        end, pos = len(buf), 0
        on_message = self.on_message
        try:
            while pos + 2 <= end:
                header = buf[pos]
                # remaining length: 1 to 4 bytes, 7 bits each
                length, shift, i = 0, 0, pos + 1
                while True:
                    if i >= end:
                        return  # the length itself is not all here yet
                    byte = buf[i]
                    length |= (byte & 0x7F) << shift
                    i += 1
                    if not byte & 0x80:
                        break
                    shift += 7
                    if shift > 21:
                        raise StreamError("malformed remaining length")
                if length > MAX_FRAME_BYTES:  # skipped, never held: the session goes on
                    self.oversized += 1
                    skipped = min(length, end - i)
                    self._skipping_bytes = length - skipped
                    pos = i + skipped
                    continue
                if i + length > end:
                    return  # the frame is not all here yet
                kind = header & 0xF0
                if kind == _PUBLISH:
                    if length < 2:
                        raise StreamError("a PUBLISH too short for its topic")
                    topic_end = i + 2 + ((buf[i] << 8) | buf[i + 1])
                    topic = str(view[i + 2 : topic_end], "utf-8", "replace")
                    qos = (header >> 1) & 0x03
                    if topic_end + (2 if qos else 0) > i + length:
                        raise StreamError("a PUBLISH whose topic runs past its end")
                    if qos:  # never at a QoS 0 subscription; acknowledged all the same
                        self._acknowledge(qos, bytes(view[topic_end : topic_end + 2]))
                        topic_end += 2
                    if header & 0x01:  # retained: no agent's, and resent on every subscribe
                        self.retained += 1
                    else:
                        self.received += 1
                        on_message(topic, bytes(view[topic_end : i + length]), arrived)
                elif kind != _PINGRESP:
                    raise StreamError(f"unexpected packet type {kind >> 4}")
                pos = i + length
        finally:
            view.release()
            del buf[:pos]

    def _acknowledge(self, qos: int, packet_id: bytes) -> None:
        assert self._writer is not None
        self._writer.write((b"\x40\x02" if qos == 1 else b"\x50\x02") + packet_id)

    async def _next_control_frame(self) -> tuple[int, bytearray]:
        """The next whole frame while connecting (CONNACK, SUBACK): its type and body."""
        assert self._reader is not None
        while True:
            buf = self._buffer
            skipped_whole = False
            if len(buf) >= 2:
                length, shift, i = 0, 0, 1
                while i < len(buf):
                    byte = buf[i]
                    length |= (byte & 0x7F) << shift
                    i += 1
                    if not byte & 0x80:
                        if length > MAX_FRAME_BYTES:  # a stranger's PUBLISH: skipped
                            self.oversized += 1
                            skipped = min(length, len(buf) - i)
                            self._skipping_bytes = length - skipped
                            skipped_whole = not self._skipping_bytes
                            del buf[: i + skipped]
                        elif i + length <= len(buf):
                            kind, body = buf[0] & 0xF0, buf[i : i + length]
                            del buf[: i + length]
                            return kind, body
                        break
                    shift += 7
                    if shift > 21:
                        raise StreamError("malformed remaining length")
                if skipped_whole:
                    continue  # what came after the skipped frame: looked at before reading
            data = await self._reader.read(READ_BYTES)
            if not data:
                raise StreamError("the broker closed the connection")
            buf += self._skip(data) if self._skipping_bytes else data

    async def _ping(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            if self._writer is not None:
                self._writer.write(_PINGREQ)
