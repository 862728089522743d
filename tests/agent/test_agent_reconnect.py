"""A broker restart is survived without restarting the agent; the node stays safe meanwhile."""

from __future__ import annotations

from powerd.gpu.simulated import open_simulated
from powerd.protocol import GpuCommand, Status, decode
from tests.support.agent_harness import (
    FAILSAFE_CAP_W,
    NODE,
    TOPICS,
    become_controlled,
    command,
    probe,
    running_agent,
    send,
    telemetry,
)


async def test_broker_restart_is_survived(mosquitto):
    gpus = open_simulated("2xH100")
    async with running_agent(mosquitto, gpus, failsafe_after_s=1.0) as daemon:
        async with probe(mosquitto) as p:
            await become_controlled(p)
            await send(p, command(1, 1, [GpuCommand(index=0, cap_w=600.0)]))
        mosquitto.stop()
        # with the broker gone, the controller is gone too: the node makes itself safe
        await daemon.wait_for(lambda: daemon.core.mode == "failsafe", timeout_s=10)
        assert not daemon.connected.is_set()
        assert gpus[0].enforced_cap_w() == FAILSAFE_CAP_W
        mosquitto.start()
        await daemon.wait_for(lambda: daemon.session.sessions >= 2, timeout_s=15)
        async with probe(mosquitto) as p:
            status = decode(Status, (await p.expect(TOPICS.status(NODE))).payload, NODE)
            fresh = telemetry((await p.expect(TOPICS.telemetry(NODE))).payload)
            await become_controlled(p, epoch=2)
            ack = await send(p, command(2, 1, [GpuCommand(index=1, cap_w=290.0)]))
    assert status.state == "failsafe"  # republished on reconnect (persistence is off)
    assert fresh.mode == "failsafe"
    assert ack.result == "applied"
    assert gpus[1].enforced_cap_w() == 290.0
