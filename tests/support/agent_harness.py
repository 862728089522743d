"""Run a real agent daemon in-process against a real broker, and speak the protocol to it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import msgspec

from powerd.agent.config import AgentConfig, FailsafeConfig
from powerd.agent.daemon import AgentDaemon
from powerd.gpu import Gpu
from powerd.gpu.simulated import open_simulated
from powerd.mqtt.url import parse_broker_url
from powerd.protocol import Ack, Command, GpuCommand, Heartbeat, Telemetry, Topics, decode, encode
from powerd.vocabulary import ControllerState
from tests.support.brokers import Mosquitto, MqttProbe
from tests.support.keys import VERIFIER, sign

NODE = "r01-n01"
TOPICS = Topics("test")
FAILSAFE_CAP_W = 500.0


def agent_config(server: Mosquitto, **overrides: Any) -> AgentConfig:
    config = AgentConfig(
        node=NODE,
        cluster=TOPICS.cluster,
        period_s=0.1,
        failsafe_after_s=1.0,
        broker=replace(parse_broker_url(server.url), reconnect_min_s=0.05, reconnect_max_s=0.5),
        failsafe=FailsafeConfig(cap_w=FAILSAFE_CAP_W),
    )
    return replace(config, **overrides)


@contextlib.asynccontextmanager
async def running_agent(
    server: Mosquitto, gpus: Sequence[Gpu] | None = None, **overrides: Any
) -> AsyncIterator[AgentDaemon]:
    """An agent daemon on simulated H100s, connected; stopped cleanly on exit."""
    gpus = list(gpus) if gpus is not None else list(open_simulated("4xH100"))
    daemon = AgentDaemon(agent_config(server, **overrides), gpus, verifier=VERIFIER)
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    try:
        await asyncio.wait_for(daemon.connected.wait(), 10)
        yield daemon
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def probe(broker: Mosquitto) -> MqttProbe:
    return MqttProbe(broker.port, [f"{TOPICS.prefix}/#"])


def heartbeat(epoch: int = 1, ts: float | None = None, state: ControllerState = "leader") -> bytes:
    """A leader heartbeat signed by the suite's controller key."""
    beat = Heartbeat(
        v=1,
        epoch=epoch,
        ts=time.time() if ts is None else ts,
        controller="ctl-test",
        state=state,
    )
    return sign(TOPICS.heartbeat, encode(beat))


def command(epoch: int, seq: int, gpus: list[GpuCommand], ttl_s: float = 30.0) -> bytes:
    """A command for ``NODE`` signed by the suite's controller key."""
    body = encode(Command(v=1, epoch=epoch, seq=seq, ts=time.time(), ttl_s=ttl_s, gpus=gpus))
    return sign(TOPICS.command(NODE), body)


async def become_controlled(p: MqttProbe, epoch: int = 1) -> None:
    """Publish a live leader heartbeat and wait until the agent reports `controlled`."""
    mark = p.mark()
    await p.publish(TOPICS.heartbeat, heartbeat(epoch))
    await p.expect(
        TOPICS.telemetry(NODE), lambda m: telemetry(m.payload).mode == "controlled", after=mark
    )


async def send(p: MqttProbe, payload: bytes) -> Ack:
    """Publish a command and return the agent's ack for it (the next ack after publishing)."""
    mark = p.mark()
    await p.publish(TOPICS.command(NODE), payload)
    got = await p.expect(TOPICS.ack(NODE), after=mark)
    return decode(Ack, got.payload, NODE)


def telemetry(payload: bytes) -> Telemetry:
    return decode(Telemetry, payload, NODE)


def raw(payload: bytes) -> dict:
    return msgspec.json.decode(payload)
