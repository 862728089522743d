"""powerd.mqtt.embedded_broker: the demo's broker hands retained messages to their subscribers only."""

from __future__ import annotations

from powerd.mqtt.embedded_broker import EmbeddedBroker
from tests.support.brokers import MqttProbe

HEARTBEAT = "powerd/v1/demo/controller/heartbeat"
FILL = "powerd/v1/demo/nodes/n1/fill"


async def test_a_new_client_gets_no_retained_message_of_another_clients_subscription() -> None:
    """amqtt 0.12 replayed, on every CONNECT, the retained messages of every filter any client
    held: the demo's fill followers got the controller's retained heartbeat. Fails without
    powerd's mend (``_RetainedToOwnSubscriptions``)."""
    async with EmbeddedBroker() as broker, MqttProbe(broker.port, [HEARTBEAT]) as holder:
        await holder.publish(HEARTBEAT, b"beat", retain=True)
        await holder.expect(HEARTBEAT)  # stored by now

        async with MqttProbe(broker.port, [FILL]) as newcomer:
            await newcomer.publish(FILL, b"marker")
            await newcomer.expect(FILL)
            seen = [(m.topic, m.payload, m.retain) for m in newcomer.messages]
            assert seen == [(FILL, b"marker", False)]

        # a client that does subscribe to it still gets it, marked retained
        async with MqttProbe(broker.port, [HEARTBEAT]) as late:
            got = await late.expect(HEARTBEAT)
            assert (got.payload, got.retain) == (b"beat", True)
