"""Telemetry reaches a real broker with every configured GPU, in sequence, read back from the device."""

from __future__ import annotations

from powerd.gpu.simulated import open_simulated
from powerd.protocol import Status, decode
from tests.support.agent_harness import (
    FAILSAFE_CAP_W,
    NODE,
    TOPICS,
    probe,
    running_agent,
    telemetry,
)


async def test_telemetry_carries_every_configured_gpu(mosquitto):
    gpus = open_simulated("4xH100")
    async with probe(mosquitto) as p, running_agent(mosquitto, gpus):
        first = telemetry((await p.expect(TOPICS.telemetry(NODE))).payload)
        mark = p.mark()
        second = telemetry((await p.expect(TOPICS.telemetry(NODE), after=mark)).payload)

    assert first.node == NODE
    assert [g.index for g in first.gpus] == [0, 1, 2, 3]
    assert len({g.uuid for g in first.gpus}) == 4
    assert second.seq == first.seq + 1
    assert second.ts > first.ts
    for g in second.gpus:
        assert (g.cap_min_w, g.cap_max_w) == (200.0, 700.0)
        assert g.cap_w == FAILSAFE_CAP_W  # failsafe until a controller speaks
        assert 0.0 <= g.power_w <= g.cap_w
        assert g.max_sm_clock_mhz is None
        assert g.power_reading == "simulated"
        assert g.cap_w == gpus[g.index].enforced_cap_w()
    assert first.mode == "failsafe"


async def test_status_is_retained_and_says_failsafe_before_a_controller(mosquitto):
    async with running_agent(mosquitto):
        # a subscriber that connects later still gets the node's status
        async with probe(mosquitto) as p:
            got = await p.expect(TOPICS.status(NODE))
    status = decode(Status, got.payload, NODE)
    assert got.retain
    assert status.state == "failsafe"
    assert status.gpus == 4


async def test_local_mode_publishes_telemetry_and_takes_no_commands(mosquitto):
    async with probe(mosquitto) as p, running_agent(mosquitto, mode="local") as daemon:
        got = telemetry((await p.expect(TOPICS.telemetry(NODE))).payload)
        status = decode(Status, (await p.expect(TOPICS.status(NODE))).payload, NODE)
    assert got.mode == "local"
    assert status.state == "online"
    assert daemon.core.mode == "local"
