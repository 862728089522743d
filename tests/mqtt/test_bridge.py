"""The shipped row-broker bridge (powerd/data/mosquitto-row-bridge.example.conf) between two
real Mosquittos: a row broker, bridged by that very file, and a site broker.

What must cross, and which way (docs/BROKERS.md): a leaf's summary and its retained
heartbeat go up; the scope's grant, the coordinator's retained heartbeat and job phases
come down; per-node traffic (telemetry, commands, acks, statuses) never leaves the row.
Payloads cross byte for byte on the same topic, so signed messages still verify.

The tests run twice (but the last two, ``acls`` only): ``open``, brokers without ACLs and the bridge logged in as the
suite's user, shows that the file's topic lines alone decide what crosses; ``acls``, the
site broker with the file's own ACL block for the bridge's login and the row broker with
the shipped powerd/data/mosquitto-acl.example, shows that those ACLs let the bridge
through (and, below, keep the bridge's login from anything more).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pytest

from powerd.signing import Signer, Verifier
from tests.support.brokers import TEST_PASSWORD, TEST_USER, Mosquitto, MqttProbe, Received
from tests.support.secure_brokers import passwd_file

PREFIX = "powerd/v1/default"  # the shipped file's cluster
SCOPE = "row01"  # the shipped file's scope
OTHER_SCOPE = "row02"  # another row's: its topics are not this bridge's
BRIDGE_USER = "powerd-bridge-row01"  # the shipped file's remote_username
BRIDGE_PASSWORD = "bridge-S3cret-7"
# Published on the row broker when the bridge connects ("1") and drops ("0"), retained;
# with `notifications true` also on the site broker (and "0" there as the bridge's will).
BRIDGE_STATE = f"$SYS/broker/connection/{BRIDGE_USER}/state"
# The suite's user, at a broker with ACLs: stands for the coordinator, the leaf
# controllers, agents and operators alike (what they may do is not what is tested here).
OBSERVER_ACL = f"user {TEST_USER}\ntopic readwrite powerd/v1/#\ntopic read $SYS/#\n"

SIGNER = Signer.generate()
VERIFIER = Verifier([SIGNER.trusted()])


def shipped_bridge() -> str:
    return (
        resources.files("powerd.data")
        .joinpath("mosquitto-row-bridge.example.conf")
        .read_text("utf-8")
    )


def row_bridge_config(site_port: int, username: str, password: str) -> str:
    """The shipped file with the site broker's address and the bridge's login filled in:
    nothing else changes (the scope, the cluster, every topic line are the file's)."""
    text = shipped_bridge()
    for key, value in (
        ("address", f"127.0.0.1:{site_port}"),
        ("remote_username", username),
        ("remote_password", password),
    ):
        text, count = re.subn(rf"^{key} .*$", f"{key} {value}", text, flags=re.M)
        assert count == 1, f"one {key} line expected in the shipped file, found {count}"
    return text


def site_acl_for_bridge() -> str:
    """The file's commented ACL block for the site broker, uncommented."""
    found = re.search(r"^# BEGIN site ACL\n(.*?)^# END site ACL$", shipped_bridge(), re.M | re.S)
    assert found is not None, "no site ACL block in the shipped file"
    lines = found[1].splitlines()
    assert all(line.startswith("# ") for line in lines), lines
    return "\n".join(line[2:] for line in lines) + "\n"


@dataclass
class Tree:
    site: Mosquitto
    row: Mosquitto


def brokers(workdir: Path, acls: bool) -> Tree:
    """The site broker and the row broker bridged to it (neither started)."""
    site_dir, row_dir = workdir / "site", workdir / "row"
    site_dir.mkdir()
    row_dir.mkdir()
    if not acls:
        site = Mosquitto(site_dir)  # the suite's login; no ACL
        bridge = row_bridge_config(site.port, TEST_USER, TEST_PASSWORD)
        return Tree(site, Mosquitto(row_dir, extra_config=bridge))
    users = passwd_file(
        site_dir / "passwd", {TEST_USER: TEST_PASSWORD, BRIDGE_USER: BRIDGE_PASSWORD}
    )
    acl = site_dir / "acl"
    acl.write_text(OBSERVER_ACL + site_acl_for_bridge())
    site = Mosquitto(site_dir, extra_config=f"password_file {users}\nacl_file {acl}\n")
    row_users = passwd_file(row_dir / "passwd", {TEST_USER: TEST_PASSWORD})
    row_acl = row_dir / "acl"
    shipped_acl = resources.files("powerd.data").joinpath("mosquitto-acl.example")
    row_acl.write_text(shipped_acl.read_text("utf-8") + "\n" + OBSERVER_ACL)
    bridge = row_bridge_config(site.port, BRIDGE_USER, BRIDGE_PASSWORD)
    row = Mosquitto(
        row_dir, extra_config=f"{bridge}\npassword_file {row_users}\nacl_file {row_acl}\n"
    )
    return Tree(site, row)


@pytest.fixture(params=["open", "acls"])
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tree]:
    """Both brokers running, the site's first (the bridge connects as the row's starts)."""
    started = brokers(tmp_path, acls=request.param == "acls")
    started.site.start()
    try:
        started.row.start()
        try:
            yield started
        finally:
            started.row.stop()
    finally:
        started.site.stop()


def payload_is(expected: bytes) -> Callable[[Received], bool]:
    return lambda message: message.payload == expected


async def bridge_up(row: MqttProbe) -> None:
    """Until the row broker says the bridge is connected (retained "1", or a live one)."""
    await row.expect(BRIDGE_STATE, payload_is(b"1"), timeout_s=15)


async def route_open(sender: MqttProbe, receiver: MqttProbe, topic: str) -> None:
    """Until a message ``sender`` publishes on ``topic`` reaches ``receiver``.

    Needed for the bridge's `in` topics only: the bridge says it is up before the site
    broker has taken its subscriptions (they follow its CONNACK), so a message published
    at the site just after the "1" may find no subscription yet. Each attempt is a
    distinct payload awaited for a short while; `out` topics need none of this (the row
    broker subscribes the bridge to them before it even connects).
    """
    for attempt in range(60):
        token = f"route check {attempt}".encode()
        mark = receiver.mark()
        await sender.publish(topic, token, qos=1)
        try:
            await receiver.expect(topic, payload_is(token), after=mark, timeout_s=0.25)
            return
        except AssertionError:
            continue
    raise AssertionError(f"nothing on {topic} crossed the bridge")


def signed(topic: str, **body: object) -> bytes:
    """A signed JSON message for ``topic``, as the controllers publish them (the
    signature covers the topic: it verifies only if the bridge does not remap it)."""
    return SIGNER.sign(topic, json.dumps({"v": 1, **body}, separators=(",", ":")).encode())


@pytest.fixture
async def probes(tree: Tree) -> AsyncIterator[tuple[MqttProbe, MqttProbe]]:
    """(at the row broker, at the site broker), each subscribed to the whole prefix before
    anything is published; returned once the bridge is up."""
    async with (
        MqttProbe(tree.row.port, ["powerd/v1/#", BRIDGE_STATE]) as row,
        MqttProbe(tree.site.port, ["powerd/v1/#"]) as site,
    ):
        await bridge_up(row)
        yield row, site


async def retained_at(broker: Mosquitto, topic: str) -> Received:
    """What a new subscriber to ``topic`` at ``broker`` gets at once: its retained message."""
    async with MqttProbe(broker.port, [topic]) as newcomer:
        kept = await newcomer.expect(topic)
    assert kept.retain, f"{topic}: not retained"
    return kept


async def test_the_leafs_summary_and_heartbeat_go_up_to_the_site_retained(
    tree: Tree, probes: tuple[MqttProbe, MqttProbe]
) -> None:
    """Both retained, as the leaf publishes them: a coordinator that takes over reads every
    leaf's newest summary at once, an operator sees every leaf's heartbeat."""
    row, site = probes
    for topic, message in (
        (
            f"{PREFIX}/scopes/{SCOPE}/summary",
            {"scope": SCOPE, "epoch": 3, "seq": 41, "measured_w": 812345.5},
        ),
        (
            f"{PREFIX}/scopes/{SCOPE}/heartbeat",
            {"epoch": 3, "controller": "row01-a", "state": "leader"},
        ),
    ):
        payload = signed(topic, **message)
        await row.publish(topic, payload, qos=1, retain=True)
        arrived = await site.expect(topic, payload_is(payload))  # the site has taken it
        assert VERIFIER.open(topic, arrived.payload) == payload  # same bytes, same topic
        assert (await retained_at(tree.site, topic)).payload == payload


async def test_the_grant_the_coordinators_heartbeat_and_job_phases_come_down_to_the_row(
    tree: Tree, probes: tuple[MqttProbe, MqttProbe]
) -> None:
    """The grant and the coordinator's heartbeat retained, as the coordinator publishes
    them (a leaf that restarts has its grant at once, from its own broker); job phases
    not retained, both forms of their topic."""
    row, site = probes
    for topic, message in (
        (
            f"{PREFIX}/scopes/{SCOPE}/grant",
            {"scope": SCOPE, "epoch": 2, "seq": 7, "ttl_s": 15.0, "budget_w": 9.5e6},
        ),
        (
            f"{PREFIX}/coordinator/heartbeat",
            {"epoch": 2, "controller": "site-a", "state": "leader"},
        ),
    ):
        await route_open(site, row, topic)
        payload = signed(topic, **message)
        await site.publish(topic, payload, qos=1, retain=True)
        arrived = await row.expect(topic, payload_is(payload))
        assert VERIFIER.open(topic, arrived.payload) == payload
        assert (await retained_at(tree.row, topic)).payload == payload

    for topic in (f"{PREFIX}/jobs/llm-7/phase", f"{PREFIX}/jobs/alice/llm-8/phase"):
        await route_open(site, row, topic)
        phase = json.dumps({"v": 1, "job": topic.split("/")[-2], "phase": "compute"}).encode()
        await site.publish(topic, phase, qos=1)
        assert (await row.expect(topic, payload_is(phase))).payload == phase


async def test_per_node_traffic_and_other_scopes_stay_where_they_are(
    tree: Tree, probes: tuple[MqttProbe, MqttProbe]
) -> None:
    """Nothing per node reaches the site; another scope's grant does not reach this row.

    Proving that a message never arrives: one client publishes the messages that must
    not cross, then, last, one that must (all QoS 1, so no broker may drop any of them
    for lack of room, and each publish returns once the broker has taken it: its PUBACK).
    The row broker hands each message it takes to every matching subscriber's queue
    before it acknowledges it, and the bridge is one subscriber whose queue goes to the
    site in order, as one connection the site handles in order; so had any of the first
    messages matched a bridge topic, it would have reached the site's subscriber before
    the last one. Once the last has arrived, none of the first can still be on its way.
    The same holds downwards, from one client at the site through the bridge to the row.
    """
    row, site = probes
    node = "r01-n07"
    must_stay = {
        f"{PREFIX}/nodes/{node}/telemetry": (b'{"v":1,"node":"r01-n07","seq":1}', False),
        f"{PREFIX}/nodes/{node}/command": (
            signed(f"{PREFIX}/nodes/{node}/command", epoch=3, seq=1, ttl_s=30),
            False,
        ),
        f"{PREFIX}/nodes/{node}/ack": (b'{"v":1,"node":"r01-n07","seq":1}', False),
        f"{PREFIX}/nodes/{node}/status": (b'{"v":1,"node":"r01-n07","state":"online"}', True),
        # the single controller's heartbeat of an untreed site: not a tree topic
        f"{PREFIX}/controller/heartbeat": (b'{"v":1,"epoch":1}', True),
        # another row's leaf, wrongly on this broker: not this bridge's scope
        f"{PREFIX}/scopes/{OTHER_SCOPE}/summary": (b'{"v":1,"scope":"row02"}', False),
    }
    for topic, (payload, retain) in must_stay.items():
        await row.publish(topic, payload, qos=1, retain=retain)
    last_topic = f"{PREFIX}/scopes/{SCOPE}/summary"
    await row.publish(last_topic, b'{"v":1,"scope":"row01","seq":2}', qos=1)
    await site.expect(last_topic)
    await row.expect(last_topic)  # and so, in order, everything before it at the row
    crossed = {m.topic for m in site.messages} & set(must_stay)
    assert not crossed, f"crossed to the site broker: {sorted(crossed)}"
    # every one of them did reach the row's own subscribers
    assert set(must_stay) <= {m.topic for m in row.messages}
    # nor is any kept retained at the site (retained ones arrive before what follows them)
    sentinel = f"{PREFIX}/test/sentinel"
    async with MqttProbe(tree.site.port, ["powerd/v1/#"]) as operator:
        await operator.publish(sentinel, b"", qos=1)
        await operator.expect(sentinel)
    assert not {m.topic for m in operator.messages} & set(must_stay)

    # Downwards: a grant for another scope, then this scope's, from one client at the site.
    grant_topic = f"{PREFIX}/scopes/{SCOPE}/grant"
    await route_open(site, row, grant_topic)
    other_grant = f"{PREFIX}/scopes/{OTHER_SCOPE}/grant"
    await site.publish(other_grant, b'{"v":1,"scope":"row02"}', qos=1)
    await site.publish(grant_topic, b'{"v":1,"scope":"row01","seq":8}', qos=1)
    await row.expect(grant_topic, payload_is(b'{"v":1,"scope":"row01","seq":8}'))
    assert other_grant not in {m.topic for m in row.messages}


@pytest.mark.parametrize("tree", ["acls"], indirect=True)
async def test_the_bridges_login_at_the_site_may_do_no_more_than_the_bridge(
    tree: Tree,
) -> None:
    """A row broker taken over still cannot command nodes nor speak for another scope at
    the site: the site's ACL (the shipped block) refuses its login anything else. The same
    ordering argument as above: the allowed message, published last, arrives after any
    refused one would have."""
    async with (
        MqttProbe(tree.site.port, ["powerd/v1/#"]) as site,
        MqttProbe(tree.site.port, [], username=BRIDGE_USER, password=BRIDGE_PASSWORD) as thief,
    ):
        refused = [
            f"{PREFIX}/nodes/r01-n07/command",
            f"{PREFIX}/scopes/{OTHER_SCOPE}/summary",
            f"{PREFIX}/scopes/{SCOPE}/grant",
            f"{PREFIX}/coordinator/heartbeat",
            f"{PREFIX}/jobs/llm-7/phase",
        ]
        for topic in refused:
            await thief.publish(topic, b'{"v":1}', qos=1)
        allowed = f"{PREFIX}/scopes/{SCOPE}/summary"
        await thief.publish(allowed, b'{"v":1,"scope":"row01"}', qos=1)
        await site.expect(allowed)
        assert not {m.topic for m in site.messages} & set(refused)


@pytest.mark.parametrize("tree", ["acls"], indirect=True)
async def test_after_the_site_broker_restarts_the_bridge_comes_back_and_catches_up(
    tree: Tree,
) -> None:
    """The site broker stops, and comes back having forgotten everything (no persistence:
    no retained messages, no sessions). The row broker keeps the bridge's queue, reconnects
    by itself (restart_timeout), sends the summary published during the outage and the
    leaf's retained messages again, and takes its grant subscription at the site again."""
    heartbeat_topic = f"{PREFIX}/scopes/{SCOPE}/heartbeat"
    heartbeat = signed(heartbeat_topic, epoch=3, controller="row01-a", state="leader")
    summary_topic = f"{PREFIX}/scopes/{SCOPE}/summary"
    during = signed(summary_topic, scope=SCOPE, epoch=3, seq=99, measured_w=1.0e6)
    async with MqttProbe(tree.row.port, ["powerd/v1/#", BRIDGE_STATE]) as row:
        await bridge_up(row)
        await row.publish(heartbeat_topic, heartbeat, qos=1, retain=True)
        assert (await retained_at(tree.site, heartbeat_topic)).payload == heartbeat

        mark = row.mark()
        tree.site.stop()
        await row.expect(BRIDGE_STATE, payload_is(b"0"), after=mark)
        await row.publish(summary_topic, during, qos=1, retain=True)  # queued for the bridge
        tree.site.start()  # the same port
        async with MqttProbe(tree.site.port, ["powerd/v1/#", BRIDGE_STATE]) as site:
            # On reconnecting, the bridge's first message to the site is its "1", then what
            # it queued. A live (not retained) "1" here means this subscriber was in place
            # before the bridge came back (it waits restart_timeout, 2 s or more), so it is
            # owed the queued summary too; a retained one would make the check unsound.
            back = await site.expect(BRIDGE_STATE, payload_is(b"1"), timeout_s=40)
            assert not back.retain, "the bridge came back before the subscriber was in place"
            arrived = await site.expect(summary_topic, payload_is(during))
            assert VERIFIER.open(summary_topic, arrived.payload) == during
            await site.expect(heartbeat_topic, payload_is(heartbeat))
            # retained at the site again, though the site broker had forgotten them
            assert (await retained_at(tree.site, summary_topic)).payload == during
            assert (await retained_at(tree.site, heartbeat_topic)).payload == heartbeat

            grant_topic = f"{PREFIX}/scopes/{SCOPE}/grant"
            await route_open(site, row, grant_topic)  # resubscribed at the forgetful site
            grant = signed(grant_topic, scope=SCOPE, epoch=2, seq=8, ttl_s=15.0, budget_w=9e6)
            await site.publish(grant_topic, grant, qos=1, retain=True)
            assert (await row.expect(grant_topic, payload_is(grant))).payload == grant
