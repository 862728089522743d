"""The shipped Mosquitto configuration (powerd/data/mosquitto.example.conf) on a real broker.

Issue 12, point 6: a dead node's retained ``offline`` status was gone after a
broker restart without persistence. With the shipped file the broker saves its
retained messages on a clean stop and loads them at start; the same file with
``persistence false`` shows what was lost.
"""

from __future__ import annotations

import contextlib
import re
from importlib import resources
from pathlib import Path

import aiomqtt
import pytest

from powerd.protocol import MAX_PAYLOAD_BYTES, PROTOCOL_VERSION, Status, Topics, decode, encode
from tests.support.brokers import Mosquitto, MqttProbe

SENTINEL = "powerd/v1/test/sentinel"


def shipped_config(persistence_dir: Path, persistence: bool = True) -> str:
    """The shipped file, adapted to a test broker: no listener of its own (``Mosquitto``
    adds one on a free port) and its persistence in ``persistence_dir``."""
    text = resources.files("powerd.data").joinpath("mosquitto.example.conf").read_text("utf-8")
    for line in ("persistence true", "persistence_location /var/lib/mosquitto/"):
        assert re.search(rf"^{line}$", text, re.M), f"{line!r} not in the shipped file"
    assert re.search(r"^max_queued_messages 5000$", text, re.M)
    text = re.sub(r"^listener .*$", "", text, flags=re.M)
    text = text.replace("/var/lib/mosquitto/", f"{persistence_dir}/")
    if not persistence:
        text = text.replace("persistence true", "persistence false")
    return text


async def retained_after_subscribing(broker: Mosquitto, topic: str) -> list[bytes]:
    """The retained messages a new subscriber to ``topic`` gets: all of them arrive before
    a message it publishes itself after subscribing (the broker keeps the order)."""
    async with MqttProbe(broker.port, [topic, SENTINEL]) as probe:
        await probe.publish(SENTINEL, b"", qos=1)
        await probe.expect(SENTINEL)
        return [m.payload for m in probe.messages if m.topic == topic and m.retain]


@pytest.mark.parametrize("persistence", [True, False], ids=["shipped", "persistence-false"])
async def test_a_dead_nodes_offline_status_survives_a_broker_restart(
    tmp_path: Path, persistence: bool
) -> None:
    store = tmp_path / "persistence"
    store.mkdir()
    broker = Mosquitto(tmp_path, extra_config=shipped_config(store, persistence))
    topic = Topics("c1").status("r01-n07")
    offline = encode(
        Status(
            v=PROTOCOL_VERSION, node="r01-n07", state="offline", ts=1.8e9, gpus=8, agent_version="t"
        )
    )
    broker.start()
    try:
        async with MqttProbe(broker.port, []) as agent:  # what its last will leaves
            await agent.publish(topic, offline, qos=1, retain=True)
        assert await retained_after_subscribing(broker, topic) == [offline]
        broker.stop()  # a clean stop: SIGTERM
        assert (store / "mosquitto.db").exists() == persistence
        broker.start()  # the same port, the same persistence directory
        after_restart = await retained_after_subscribing(broker, topic)
    finally:
        broker.stop()
    if persistence:
        assert after_restart == [offline]
        assert decode(Status, after_restart[0]).state == "offline"
    else:  # the point: without persistence the dead node's status is gone
        assert after_restart == []


async def test_the_largest_message_passes_and_a_2_mb_one_goes_nowhere(tmp_path: Path) -> None:
    """``max_packet_size``: a message of the protocol's largest payload, signed, is
    delivered; a 2 MB retained one is refused (its publisher disconnected), so no
    subscriber ever gets it, now or on a later subscribe."""
    store = tmp_path / "persistence"
    store.mkdir()
    text = shipped_config(store)
    assert re.search(r"^max_packet_size 131072$", text, re.M)
    broker = Mosquitto(tmp_path, extra_config=text)
    largest = b"x" * (MAX_PAYLOAD_BYTES + 200)  # its signature's room too
    big_topic, ok_topic = Topics("c1").telemetry("r01-n07"), Topics("c1").telemetry("r01-n08")
    broker.start()
    try:
        async with MqttProbe(broker.port, [ok_topic]) as probe:
            await probe.publish(ok_topic, largest, qos=1)
            await probe.expect(ok_topic)
        with contextlib.suppress(aiomqtt.MqttError):  # disconnected by the broker
            async with MqttProbe(broker.port, []) as intruder:
                await intruder.publish(big_topic, b"h" * 2_000_000, qos=1, retain=True)
        assert await retained_after_subscribing(broker, big_topic) == []
    finally:
        broker.stop()
