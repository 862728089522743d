"""powerd.embedded_broker: the demo's broker hands retained messages to their subscribers only."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from powerd.embedded_broker import EmbeddedBroker

WAIT_S = 10.0


class Client:
    """A paho client on its own thread that records what it receives."""

    def __init__(self, port: int, name: str) -> None:
        self.received: list[tuple[str, bytes, bool]] = []
        self.got = threading.Condition()
        self.subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=name, clean_session=True)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *args: self.subscribed.set()
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        with self.got:
            self.received.append((message.topic, message.payload, bool(message.retain)))
            self.got.notify_all()

    async def subscribe(self, topic: str) -> None:
        self.subscribed.clear()
        self.client.subscribe(topic, qos=1)
        assert await asyncio.to_thread(self.subscribed.wait, WAIT_S)

    async def wait_for(self, topic: str) -> None:
        def arrived() -> bool:
            with self.got:
                return self.got.wait_for(
                    lambda: any(t == topic for t, _, _ in self.received), WAIT_S
                )

        assert await asyncio.to_thread(arrived), (topic, self.received)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


async def test_a_new_client_gets_no_retained_message_of_another_clients_subscription() -> None:
    """amqtt 0.12 replayed, on every CONNECT, the retained messages of every filter any client
    held: the demo's fill followers got the controller's retained heartbeat. Fails without
    powerd's mend (``_RetainedToOwnSubscriptions``)."""
    async with EmbeddedBroker() as broker:
        holder = Client(broker.port, "holder")
        newcomer = late = None
        try:
            await holder.subscribe("powerd/v1/demo/controller/heartbeat")
            holder.client.publish(
                "powerd/v1/demo/controller/heartbeat", b"beat", qos=1, retain=True
            )
            await holder.wait_for("powerd/v1/demo/controller/heartbeat")  # stored by now

            newcomer = Client(broker.port, "newcomer")
            await newcomer.subscribe("powerd/v1/demo/nodes/n1/fill")
            newcomer.client.publish("powerd/v1/demo/nodes/n1/fill", b"marker", qos=1)
            await newcomer.wait_for("powerd/v1/demo/nodes/n1/fill")
            assert newcomer.received == [("powerd/v1/demo/nodes/n1/fill", b"marker", False)]

            # and a client that does subscribe to it still gets it, marked retained
            late = Client(broker.port, "late")
            await late.subscribe("powerd/v1/demo/controller/heartbeat")
            await late.wait_for("powerd/v1/demo/controller/heartbeat")
            assert late.received == [("powerd/v1/demo/controller/heartbeat", b"beat", True)]
        finally:
            for client in (holder, newcomer, late):
                if client is not None:
                    client.close()
