"""The shipped ACL's logins on a real Mosquitto with passwords: coordinator, operator,
the jobs' shared fill login (agents write their own node's fill requests, ``powerd-fill``
reads them all), and the broker's warnings about the ACL.

A forbidden publish is dropped by the broker without a word (MQTT 3.1.1); each case then
publishes an allowed message on the same connection, and once the observer has that one,
the forbidden one (sent before it) would have arrived first had the broker passed it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.brokers import Mosquitto, MqttProbe
from tests.support.secure_brokers import shipped_acl_broker

TOPICS_PREFIX = "powerd/v1/acl"
PASSWORDS = {
    "powerd-controller": "ctl-Secret-1",
    "powerd-coordinator": "coord-Secret-2",
    "powerd-operator": "op-Secret-3",
    "powerd-reader": "read-Secret-4",
    "n1": "n1-Secret-5",
    "n2": "n2-Secret-6",
    "powerd-fill": "fill-Secret-7",
}


@pytest.fixture
def shipped_acl(tmp_path: Path):
    broker = shipped_acl_broker(tmp_path, PASSWORDS)
    broker.start()
    yield broker
    broker.stop()


def login(broker: Mosquitto, user: str, subscriptions: list[str]) -> MqttProbe:
    return MqttProbe(broker.port, subscriptions, username=user, password=PASSWORDS[user])


@pytest.mark.asyncio
async def test_the_operator_login_publishes_site_limits_and_nothing_else(shipped_acl) -> None:
    limit, command = f"{TOPICS_PREFIX}/operator/site-limit", f"{TOPICS_PREFIX}/nodes/n1/command"
    async with (
        login(shipped_acl, "powerd-controller", [f"{TOPICS_PREFIX}/#"]) as everything,
        login(shipped_acl, "powerd-coordinator", [limit]) as coordinator,
        login(shipped_acl, "powerd-operator", []) as operator,
    ):
        await operator.publish(command, b"forbidden")
        await operator.publish(f"{TOPICS_PREFIX}/controller/heartbeat", b"forbidden")
        await operator.publish(limit, b"limit-1")
        await everything.expect(limit)
        got = await coordinator.expect(limit)  # the coordinator applies limits in a tree
    assert got.payload == b"limit-1"
    assert [m.topic for m in everything.messages] == [limit]


@pytest.mark.asyncio
async def test_the_coordinator_keeps_its_site_limit_record_and_no_controllers(shipped_acl) -> None:
    record = f"{TOPICS_PREFIX}/coordinator/site-limit"
    async with login(shipped_acl, "powerd-coordinator", []) as coordinator:
        await coordinator.publish(
            f"{TOPICS_PREFIX}/controller/site-limit", b"forbidden", retain=True
        )
        await coordinator.publish(f"{TOPICS_PREFIX}/operator/site-limit", b"forbidden", retain=True)
        await coordinator.publish(record, b"record-1", retain=True)
    # a restarted coordinator finds its record retained, and nothing it may not write
    async with (
        login(shipped_acl, "powerd-coordinator", [record]) as restarted,
        login(shipped_acl, "powerd-controller", [f"{TOPICS_PREFIX}/#"]) as everything,
    ):
        got = await restarted.expect(record)
        # after the retained messages a subscription gets, a live one: all of them are in
        beat = f"{TOPICS_PREFIX}/coordinator/heartbeat"
        await restarted.publish(beat, b"live")
        await everything.expect(beat)
    assert got.payload == b"record-1" and got.retain
    assert [m.topic for m in everything.messages] == [record, beat]


@pytest.mark.asyncio
async def test_the_operator_reads_the_leaders_states_and_heartbeats_only(shipped_acl) -> None:
    """What `powerd limit` waits for and `powerd status` shows (issue 36): the leaders'
    states and heartbeats reach the operator and the reader; telemetry does not reach the
    operator; the coordinator may publish its state."""
    states = [f"{TOPICS_PREFIX}/{t}" for t in ("controller/state", "scopes/r1/state")]
    beats = [f"{TOPICS_PREFIX}/{t}" for t in ("controller/heartbeat", "coordinator/heartbeat")]
    coordinator_state = f"{TOPICS_PREFIX}/coordinator/state"
    telemetry = f"{TOPICS_PREFIX}/nodes/n1/telemetry"
    wanted = [*states, *beats, coordinator_state]
    async with (
        login(shipped_acl, "powerd-operator", [f"{TOPICS_PREFIX}/#"]) as operator,
        login(shipped_acl, "powerd-reader", [f"{TOPICS_PREFIX}/#"]) as reader,
        login(shipped_acl, "powerd-controller", []) as controller,
        login(shipped_acl, "powerd-coordinator", []) as coordinator,
    ):
        await controller.publish(telemetry, b"not for the operator")
        for topic in [*states, beats[0]]:
            await controller.publish(topic, b"x")
        await coordinator.publish(beats[1], b"x")
        await coordinator.publish(coordinator_state, b"x")
        for topic in wanted:
            await operator.expect(topic)
            await reader.expect(topic)
    assert sorted(m.topic for m in operator.messages) == sorted(wanted)
    assert telemetry in [m.topic for m in reader.messages]


# the public reads the ACL gives every login on purpose, as its comment says
PUBLIC_READS = {
    "powerd/v1/+/controller/heartbeat",
    "powerd/v1/+/scopes/+/heartbeat",
    "powerd/v1/+/jobs/+/phase",
    "powerd/v1/+/jobs/+/+/phase",
}


def test_the_shipped_acl_warns_only_about_its_public_reads(shipped_acl) -> None:
    """No warning about the fill lines (the old `pattern read .../nodes/+/fill`), and none
    but the four lines the ACL's comment names."""
    log = shipped_acl.log_tail(100_000)
    assert "Config loaded" in log or "running" in log, log  # the log is the broker's
    warned = {line.split("'")[1] for line in log.splitlines() if "Warning: ACL pattern" in line}
    assert warned == PUBLIC_READS, log


@pytest.mark.asyncio
async def test_the_fill_login_reads_every_node_and_an_agent_only_writes_its_own(
    shipped_acl,
) -> None:
    fills = f"{TOPICS_PREFIX}/nodes/+/fill"
    async with (
        login(shipped_acl, "powerd-fill", [fills]) as jobs,
        login(shipped_acl, "n2", [fills]) as other_node,
        login(shipped_acl, "n1", []) as agent,
    ):
        await agent.publish(f"{TOPICS_PREFIX}/nodes/n2/fill", b"forged")  # another node's: dropped
        await agent.publish(f"{TOPICS_PREFIX}/nodes/n1/fill", b"mine")
        got = await jobs.expect(f"{TOPICS_PREFIX}/nodes/n1/fill")
        await jobs.publish(f"{TOPICS_PREFIX}/nodes/n1/fill", b"forged")  # the job login: read only
        await other_node.publish(f"{TOPICS_PREFIX}/nodes/n2/fill", b"n2's own")
        await jobs.expect(f"{TOPICS_PREFIX}/nodes/n2/fill")
    assert got.payload == b"mine"
    assert [m.payload for m in jobs.messages] == [b"mine", b"n2's own"]
