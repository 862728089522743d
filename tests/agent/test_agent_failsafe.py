"""Heartbeat loss or an expired command puts the node in failsafe on its own, within one period."""

from __future__ import annotations

import asyncio
import time

import pytest

from powerd.agent.daemon import AgentDaemon
from powerd.gpu.simulated import open_simulated
from powerd.protocol import GpuCommand, Status, decode
from tests.support.agent_harness import (
    FAILSAFE_CAP_W,
    NODE,
    TOPICS,
    agent_config,
    become_controlled,
    command,
    heartbeat,
    probe,
    running_agent,
    send,
    telemetry,
)
from tests.support.brokers import Mosquitto
from tests.support.keys import VERIFIER

# the failsafe's deadline: run apart from the other tests (pyproject.toml, markers)
pytestmark = pytest.mark.realtime

FAILSAFE_AFTER_S = 1.0
PERIOD_S = 0.1
SCHEDULING_SLACK_S = 0.5  # a loaded 2-core CI machine


async def test_heartbeat_loss_gives_failsafe_within_one_period(mosquitto):
    gpus = open_simulated("2xH100")
    async with (
        probe(mosquitto) as p,
        running_agent(mosquitto, gpus, failsafe_after_s=FAILSAFE_AFTER_S, period_s=PERIOD_S),
    ):
        await become_controlled(p)
        await send(
            p,
            command(
                1,
                1,
                [
                    GpuCommand(index=0, cap_w=600.0, max_sm_clock_mhz=1100),
                    GpuCommand(index=1, cap_w=650.0),
                ],
            ),
        )
        mark = p.mark()
        await p.publish(TOPICS.heartbeat, heartbeat(epoch=1))
        last_beat_at = time.monotonic()
        got = await p.expect(
            TOPICS.telemetry(NODE), lambda m: telemetry(m.payload).mode == "failsafe", after=mark
        )
        status = await p.expect(
            TOPICS.status(NODE), lambda m: decode(Status, m.payload).state == "failsafe", after=mark
        )
        async with probe(mosquitto) as late:  # retained: a newcomer sees it too
            retained = await late.expect(TOPICS.status(NODE))
    elapsed_s = got.at - last_beat_at
    assert FAILSAFE_AFTER_S - 0.05 <= elapsed_s <= FAILSAFE_AFTER_S + PERIOD_S + SCHEDULING_SLACK_S
    assert [g.cap_w for g in telemetry(got.payload).gpus] == [FAILSAFE_CAP_W, FAILSAFE_CAP_W]
    assert all(g.max_sm_clock_mhz is None for g in telemetry(got.payload).gpus)
    assert decode(Status, status.payload, NODE).state == "failsafe"
    assert retained.retain
    assert decode(Status, retained.payload, NODE).state == "failsafe"


async def test_expired_command_ttl_gives_failsafe_before_heartbeat_loss(mosquitto):
    gpus = open_simulated("1xH100")
    async with (
        probe(mosquitto) as p,
        running_agent(mosquitto, gpus, failsafe_after_s=5.0, period_s=PERIOD_S) as daemon,
    ):
        await become_controlled(p)
        sent_at = time.monotonic()
        ack = await send(p, command(1, 1, [GpuCommand(index=0, cap_w=600.0)], ttl_s=0.3))
        got = await p.expect(
            TOPICS.telemetry(NODE), lambda m: telemetry(m.payload).mode == "failsafe"
        )
    assert ack.result == "applied"
    assert got.at - sent_at < 5.0  # long before the heartbeat would have run out
    assert gpus[0].enforced_cap_w() == FAILSAFE_CAP_W
    assert daemon.core.counters.failsafe_entries == 1


async def test_heartbeat_return_ends_failsafe(mosquitto):
    async with (
        probe(mosquitto) as p,
        running_agent(mosquitto, failsafe_after_s=FAILSAFE_AFTER_S, period_s=PERIOD_S) as daemon,
    ):
        await become_controlled(p)
        await daemon.wait_for(lambda: daemon.core.mode == "failsafe", timeout_s=5)
        await become_controlled(p, epoch=2)
        assert daemon.core.mode == "controlled"
        ack = await send(p, command(2, 1, [GpuCommand(index=0, cap_w=260.0)]))
    assert ack.result == "applied"


async def test_stale_retained_heartbeat_is_not_a_live_controller(mosquitto):
    async with probe(mosquitto) as p:
        # a controller that died a minute ago left its retained heartbeat behind
        await p.publish(TOPICS.heartbeat, heartbeat(epoch=5, ts=time.time() - 60), retain=True)
        async with running_agent(mosquitto, failsafe_after_s=FAILSAFE_AFTER_S) as daemon:
            ack = await send(p, command(5, 1, [GpuCommand(index=0, cap_w=260.0)]))
            mode = daemon.core.mode
            ignored = daemon.core.counters.heartbeats_ignored
    assert ack.result == "rejected"
    assert mode == "failsafe"
    assert ignored >= 1


async def test_failsafe_caps_applied_before_any_broker_answers(tmp_path):
    nowhere = Mosquitto(tmp_path)  # never started: nothing listens on its port
    gpus = open_simulated("2xH100")
    daemon = AgentDaemon(agent_config(nowhere), gpus, verifier=VERIFIER)
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    await daemon.wait_for(lambda: True, timeout_s=5)  # one pass of the sample loop
    caps = [g.enforced_cap_w() for g in gpus]
    connected = daemon.connected.is_set()
    stop.set()
    await asyncio.wait_for(task, 10)
    assert caps == [FAILSAFE_CAP_W, FAILSAFE_CAP_W]
    assert not connected
