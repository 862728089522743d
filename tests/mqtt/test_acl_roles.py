"""The shipped ACL's coordinator and operator logins, on a real Mosquitto with passwords.

A forbidden publish is dropped by the broker without a word (MQTT 3.1.1); each case then
publishes an allowed message on the same connection, and once the observer has that one,
the forbidden one (sent before it) would have arrived first had the broker passed it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from tests.support.brokers import Mosquitto, MqttProbe
from tests.support.secure_brokers import passwd_file

TOPICS_PREFIX = "powerd/v1/acl"
PASSWORDS = {
    "powerd-controller": "ctl-Secret-1",
    "powerd-coordinator": "coord-Secret-2",
    "powerd-operator": "op-Secret-3",
}


@pytest.fixture
def shipped_acl(tmp_path: Path):
    acl = tmp_path / "acl"
    acl.write_text(resources.files("powerd.data").joinpath("mosquitto-acl.example").read_text())
    passwords = passwd_file(tmp_path / "passwd", PASSWORDS)
    broker = Mosquitto(
        tmp_path, allow_anonymous=False, extra_config=f"password_file {passwords}\nacl_file {acl}"
    )
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
