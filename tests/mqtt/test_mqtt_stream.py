"""The controller's receive-only telemetry client: MQTT frames however the bytes arrive, and
against a real Mosquitto (retained messages, thousands of messages, a refused login)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerd.mqtt.stream import READ_BYTES, MqttStream, StreamError, remaining_length, str16
from powerd.mqtt.url import parse_broker_url
from tests.support.brokers import TEST_PASSWORD, TEST_USER, Mosquitto
from tests.support.secure_brokers import passwd_file


def publish_frame(topic: str, payload: bytes, qos: int = 0, retain: bool = False, mid: int = 7):
    body = str16(topic) + (mid.to_bytes(2, "big") if qos else b"") + payload
    header = 0x30 | (qos << 1) | int(retain)
    return bytes([header]) + remaining_length(len(body)) + body


class Written:
    """What the stream writes back (acks): the other end of the socket, recorded."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


def offline_stream() -> tuple[MqttStream, list[tuple[str, bytes, float]]]:
    got: list[tuple[str, bytes, float]] = []
    stream = MqttStream(
        parse_broker_url("mqtt://127.0.0.1"), "t", "#", lambda t, p, a: got.append((t, p, a))
    )
    stream._writer = Written()  # type: ignore[assignment]
    return stream, got


MESSAGES = [
    ("powerd/v1/c/nodes/a/telemetry", b"{}"),
    ("powerd/v1/c/nodes/b/telemetry", b"x" * 200),  # a two-byte remaining length
    ("powerd/v1/c/nodes/\u00e9/telemetry", b"y" * 20_000),  # three bytes; a UTF-8 topic
    ("powerd/v1/c/nodes/d/telemetry", b""),
]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 25_000), max_size=12))
def test_frames_come_out_whole_however_the_reads_cut_them(cuts: list[int]) -> None:
    stream, got = offline_stream()
    wire = b"".join(publish_frame(t, p, retain=i == 0) for i, (t, p) in enumerate(MESSAGES))
    wire += b"\xd0\x00"  # a PINGRESP among them
    wire += publish_frame("powerd/v1/c/nodes/e/telemetry", b"z")
    position = 0
    for cut in [*sorted(cuts), len(wire)]:
        chunk, position = wire[position:cut], max(position, cut)
        stream._buffer += chunk
        stream._frames(1.0)
    # the first is retained: no agent's (they never retain telemetry), dropped and counted
    assert [(t, p) for t, p, _ in got] == [*MESSAGES[1:], ("powerd/v1/c/nodes/e/telemetry", b"z")]
    assert stream.received == 4 and stream.retained == 1 and len(stream._buffer) == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 2_100_000), max_size=8))
def test_an_oversized_frame_is_skipped_as_it_streams_past_never_held(cuts: list[int]) -> None:
    """A 2 MB PUBLISH (over MAX_FRAME_BYTES) costs neither the session nor 2 MB of buffer:
    its bytes are dropped as they come, and the frames after it are handed out."""
    stream, got = offline_stream()
    wire = publish_frame("powerd/v1/c/nodes/a/telemetry", b"{}")
    wire += publish_frame("powerd/v1/c/nodes/x/telemetry", b"h" * 2_000_000, retain=True)
    wire += publish_frame("powerd/v1/c/nodes/b/telemetry", b"ok")
    position, held = 0, 0
    for cut in [*sorted(cuts), len(wire)]:
        chunk, position = wire[position:cut], max(position, cut)
        for k in range(0, len(chunk), READ_BYTES):  # as run() reads: READ_BYTES at a time
            data = chunk[k : k + READ_BYTES]
            stream._buffer += stream._skip(data) if stream._skipping_bytes else data
            held = max(held, len(stream._buffer))
            stream._frames(1.0)
    assert [(t, p) for t, p, _ in got] == [
        ("powerd/v1/c/nodes/a/telemetry", b"{}"),
        ("powerd/v1/c/nodes/b/telemetry", b"ok"),
    ]
    assert stream.oversized == 1 and len(stream._buffer) == 0
    assert held <= READ_BYTES + 64  # one read and what was left of the last, not the frame


def test_a_qos_1_publish_is_acknowledged() -> None:
    stream, got = offline_stream()
    stream._buffer += publish_frame("t/1", b"p", qos=1, mid=0x0102)
    stream._frames(2.0)
    assert got == [("t/1", b"p", 2.0)]
    assert stream._writer.data == b"\x40\x02\x01\x02"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        pytest.param(b"\x20\x02\x00\x00", "unexpected packet type 2", id="connack-mid-stream"),
        pytest.param(b"\x30\xff\xff\xff\xff\x01", "malformed remaining length", id="5-byte-length"),
    ],
)
def test_what_a_broker_never_sends_ends_the_session(frame: bytes, why: str) -> None:
    stream, got = offline_stream()
    stream._buffer += publish_frame("t/ok", b"1") + frame
    with pytest.raises(StreamError, match=why):
        stream._frames(0.0)
    assert [t for t, _, _ in got] == ["t/ok"]  # what came before it was handed out


async def test_against_mosquitto_retained_and_many(mosquitto: Mosquitto) -> None:
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    publisher.username_pw_set(TEST_USER, TEST_PASSWORD)
    publisher.connect("127.0.0.1", mosquitto.port)
    publisher.loop_start()
    try:
        publisher.publish("p/n0/telemetry", b"retained", qos=1, retain=True).wait_for_publish(5)
        got: list[tuple[str, bytes]] = []
        done = asyncio.Event()

        def on_message(topic: str, payload: bytes, _arrived: float) -> None:
            got.append((topic, payload))
            if len(got) == 5000:
                done.set()

        stream = MqttStream(
            parse_broker_url(mosquitto.url), "stream-test", "p/+/telemetry", on_message
        )
        await stream.connect()
        reading = asyncio.create_task(stream.run())
        for i in range(5000):
            publisher.publish(f"p/n{i % 7}/telemetry", i.to_bytes(4, "big") * 64)
        await asyncio.wait_for(done.wait(), 30)
        stream.close()
        assert "closed" in await asyncio.wait_for(reading, 10)
    finally:
        publisher.loop_stop()
    assert stream.retained == 1  # the retained one: dropped, counted
    assert [int.from_bytes(p[:4], "big") for _, p in got] == list(range(5000))


async def test_a_refused_login_is_an_error_that_says_so(tmp_path: Path) -> None:
    passwords = passwd_file(tmp_path / "passwd", {"ctl": "right"})
    broker = Mosquitto(tmp_path, allow_anonymous=False, extra_config=f"password_file {passwords}")
    broker.start()
    try:
        wrong = tmp_path / "pw"
        wrong.write_text("wrong")
        settings_ = parse_broker_url(f"mqtt://ctl@127.0.0.1:{broker.port}")
        from dataclasses import replace

        stream = MqttStream(replace(settings_, password_file=str(wrong)), "s", "#", lambda *_: None)
        with pytest.raises(StreamError, match="connection refused"):
            await stream.connect()
        stream.close()
    finally:
        broker.stop()


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_ends_the_session_with_a_stream_error_and_nothing_else(data: bytes) -> None:
    """Whatever bytes come, the parser hands out whole frames or raises StreamError."""
    stream, _ = offline_stream()
    stream._buffer += b"\x30" + data if data[:1] != b"\x30" else data
    with contextlib.suppress(StreamError):
        stream._frames(0.0)
