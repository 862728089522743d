"""Against a Mosquitto with passwords, the shipped topic ACL, and TLS (with client certificates)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from powerd.agent.daemon import AgentDaemon
from powerd.gpu.simulated import open_simulated
from powerd.mqtt.url import PASSWORD_ENV, BrokerSettings
from powerd.protocol import CommClock, GpuCommand, PhaseEvent, encode
from tests.support.agent_harness import (
    FAILSAFE_CAP_W,
    NODE,
    TOPICS,
    agent_config,
    become_controlled,
    command,
    running_agent,
    send,
    telemetry,
)
from tests.support.brokers import Mosquitto, MqttProbe
from tests.support.keys import VERIFIER
from tests.support.secure_brokers import (
    make_certs,
    shipped_acl_broker,
    tls_broker,
)

AGENT_PASSWORD = "n0de-Secret-42"
CONTROLLER_PASSWORD = "ctl-Secret-17"
JOB_OWNER, JOB_PASSWORD = "alice", "j0b-Secret-8"


@pytest.fixture
def secured(tmp_path: Path):
    """Mosquitto with no anonymous access, a password file and powerd's example ACL."""
    broker = shipped_acl_broker(
        tmp_path,
        {
            NODE: AGENT_PASSWORD,
            "powerd-controller": CONTROLLER_PASSWORD,
            "intruder": "x",
            JOB_OWNER: JOB_PASSWORD,
        },
    )
    broker.start()
    yield broker
    broker.stop()


async def test_password_and_acl(secured, monkeypatch, caplog):
    monkeypatch.setenv(PASSWORD_ENV, AGENT_PASSWORD)
    caplog.set_level(logging.DEBUG)
    gpus = open_simulated("2xH100")
    controller = MqttProbe(
        secured.port,
        [f"{TOPICS.prefix}/#"],
        username="powerd-controller",
        password=CONTROLLER_PASSWORD,
    )
    intruder = MqttProbe(secured.port, [], username="intruder", password="x")
    as_node = replace(agent_config(secured).broker, username=NODE)
    async with controller as ctl, intruder as bad, running_agent(secured, gpus, broker=as_node):
        first = telemetry((await ctl.expect(TOPICS.telemetry(NODE))).payload)
        await become_controlled(ctl)
        # the broker drops what the ACL forbids: the intruder cannot command the node
        await bad.publish(TOPICS.heartbeat, b'{"v":1}')
        await bad.publish(TOPICS.command(NODE), command(1, 99, [GpuCommand(index=0, cap_w=200.0)]))
        ack = await send(ctl, command(1, 1, [GpuCommand(index=1, cap_w=333.0)]))
    assert first.node == NODE
    assert ack.result == "applied"
    assert gpus[1].enforced_cap_w() == 333.0
    assert gpus[0].enforced_cap_w() == FAILSAFE_CAP_W  # the intruder's 200 W never arrived
    assert AGENT_PASSWORD not in caplog.text


def _announcement(phase: str) -> bytes:
    return encode(PhaseEvent(v=1, job="llm", ts=1_795_320_000.0, phase=phase))  # type: ignore[arg-type]


async def test_acl_lets_the_agent_follow_its_granted_job_and_nobody_else_speak_for_it(
    secured, monkeypatch
):
    """The shipped ACL lets an agent read a job owner's phase topic (its clock policy), and
    lets only that owner write it: an intruder's announcement never reaches the agent."""
    monkeypatch.setenv(PASSWORD_ENV, AGENT_PASSWORD)
    gpus = open_simulated("2xH100")
    controller = MqttProbe(
        secured.port,
        [f"{TOPICS.prefix}/#"],
        username="powerd-controller",
        password=CONTROLLER_PASSWORD,
    )
    owner = MqttProbe(secured.port, [], username=JOB_OWNER, password=JOB_PASSWORD)
    intruder = MqttProbe(secured.port, [], username="intruder", password="x")
    as_node = replace(agent_config(secured).broker, username=NODE)
    topic = TOPICS.phase("llm", JOB_OWNER)
    policy = CommClock(job="llm", owner=JOB_OWNER, max_sm_clock_mhz=1100)
    async with (
        controller as ctl,
        owner as job,
        intruder as bad,
        running_agent(secured, gpus, broker=as_node) as daemon,
    ):
        await become_controlled(ctl)
        ack = await send(ctl, command(1, 1, [GpuCommand(index=0, comm_clock=policy)]))
        assert ack.gpus[0].comm_clock == policy
        await bad.publish(topic, _announcement("communication"))  # dropped by the broker
        # everything the broker took before this ack has reached the agent
        await send(ctl, command(1, 2, [GpuCommand(index=0, comm_clock=policy)]))
        assert gpus[0].locked_max_sm_clock_mhz() is None
        assert daemon.core.phase_clocks.counters.phases_applied == 0
        mark = ctl.mark()
        await job.publish(topic, _announcement("communication"))
        await ctl.expect(
            TOPICS.telemetry(NODE),
            lambda m: telemetry(m.payload).gpus[0].max_sm_clock_mhz == 1100,
            after=mark,
        )
    assert daemon.core.phase_clocks.counters.phases_applied == 1


async def test_wrong_password_keeps_node_safe_and_secret_out_of_logs(secured, monkeypatch, caplog):
    monkeypatch.setenv(PASSWORD_ENV, "wrong-" + AGENT_PASSWORD)
    caplog.set_level(logging.DEBUG)
    gpus = open_simulated("1xH100")
    config = agent_config(secured)
    config = replace(config, broker=replace(config.broker, username=NODE))
    daemon = AgentDaemon(config, gpus, verifier=VERIFIER)
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    await daemon.wait_for(lambda: daemon.session.failures >= 2, timeout_s=15)
    stop.set()
    await asyncio.wait_for(task, 10)
    assert daemon.session.sessions == 0
    assert gpus[0].enforced_cap_w() == FAILSAFE_CAP_W
    assert "authoriz" in caplog.text.lower()  # the operator sees why
    assert AGENT_PASSWORD not in caplog.text


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    return make_certs(tmp_path_factory.mktemp("certs"), client_cn=NODE)


def tls_probe(broker: Mosquitto, certs: dict[str, Path]) -> MqttProbe:
    context = ssl.create_default_context(cafile=str(certs["ca_crt"]))
    context.load_cert_chain(str(certs["client_crt"]), str(certs["client_key"]))
    return MqttProbe(broker.port, [f"{TOPICS.prefix}/#"], tls_context=context)


def tls_settings(broker: Mosquitto, **files: Path) -> BrokerSettings:
    base = agent_config(broker).broker
    named: dict[str, Any] = {k: str(v) for k, v in files.items()}
    return replace(base, **named)


@pytest.mark.parametrize("client_cert", [False, True], ids=["server-cert", "mutual-tls"])
async def test_agent_over_tls(tmp_path, certs, client_cert):
    broker = tls_broker(tmp_path, certs, require_client_cert=client_cert)
    broker.start()
    files = {"ca_file": certs["ca_crt"]}
    if client_cert:
        files |= {"cert_file": certs["client_crt"], "key_file": certs["client_key"]}
    try:
        async with (
            tls_probe(broker, certs) as p,
            running_agent(broker, broker=tls_settings(broker, **files)),
        ):
            got = telemetry((await p.expect(TOPICS.telemetry(NODE))).payload)
            await become_controlled(p)
            ack = await send(p, command(1, 1, [GpuCommand(index=0, cap_w=444.0)]))
    finally:
        broker.stop()
    assert broker.url.startswith("mqtts://")
    assert len(got.gpus) == 4
    assert ack.result == "applied"


@pytest.mark.parametrize(
    "files",
    [
        pytest.param({"ca_file": "other_crt"}, id="untrusted-server"),
        pytest.param({"ca_file": "ca_crt"}, id="no-client-cert"),
    ],
)
async def test_tls_refused_keeps_node_safe(tmp_path, certs, files):
    broker = tls_broker(tmp_path, certs, require_client_cert=True)
    broker.start()
    gpus = open_simulated("1xH100")
    config = replace(
        agent_config(broker),
        broker=tls_settings(broker, **{k: certs[v] for k, v in files.items()}),
    )
    daemon = AgentDaemon(config, gpus, verifier=VERIFIER)
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    try:
        await daemon.wait_for(lambda: daemon.session.failures >= 2, timeout_s=15)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        broker.stop()
    assert daemon.session.sessions == 0
    assert gpus[0].enforced_cap_w() == FAILSAFE_CAP_W
