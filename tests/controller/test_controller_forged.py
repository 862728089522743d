"""Forged control traffic (issue 12, findings 1-3), on an anonymous broker and on one that
requires a login (the attacker has one): real agents on
simulated GPUs, a real controller, real Mosquitto. Whoever can publish cannot sign: no
forged command moves a GPU, no forged heartbeat deposes the leader or leads the agents,
no epoch reported in telemetry moves the controller's."""

from __future__ import annotations

import time

from powerd.protocol import INT64_MAX, Command, GpuCommand, Heartbeat, Telemetry, encode
from tests.support.controller_harness import (
    BANDS,
    CAP_MAX_W,
    GPUS_PER_NODE,
    NODES,
    SERVERS,
    TOPICS,
    ack_of,
    probe,
    running_cluster,
)
from tests.support.keys import STRANGER, sign

NODE = NODES["r1-k1"][0]


def forged_command(epoch: int) -> bytes:
    """What finding 1 sent: the current epoch, a huge seq, every GPU at its maximum, a long ttl."""
    gpus = [GpuCommand(index=i, cap_w=CAP_MAX_W) for i in range(GPUS_PER_NODE)]
    return encode(Command(v=1, epoch=epoch, seq=10**18, ts=time.time(), ttl_s=86_400, gpus=gpus))


async def test_a_forged_command_moves_no_gpu_and_the_rack_stays_inside_its_limit(
    anonymous_mosquitto,
):
    """On an anonymous broker, as finding 1 tried it: anyone can publish, nobody can sign."""
    broker = anonymous_mosquitto
    # the bands hold the racks' GPUs below the forged 700 W, where a forgery that moved one
    # would show (under safety by caps, the default, this tree's racks fit every GPU at 700 W)
    async with (
        probe(broker) as p,
        running_cluster(broker, phase="compute", policy=BANDS) as cluster,
    ):
        ctl, agents, tree = cluster.controller, cluster.agents, cluster.controller.core.tree
        # in compute both racks are over budget: the controller holds their GPUs below max
        await agents.wait_for(lambda: max(agents.caps()) < 450.0, what="racks capped")
        epoch = ctl.core.epoch
        body = forged_command(epoch)
        topic = TOPICS.command(NODE)
        forgeries = [
            body,  # unsigned, as from `mosquitto_pub` on an anonymous broker
            STRANGER.sign(topic, body),  # signed by a key nobody trusts
            sign(TOPICS.command(NODES["r1-k2"][0]), body),  # the real key, another node's topic
        ]
        acks = []
        for payload in forgeries:
            mark = p.mark()
            await p.publish(topic, payload)
            got = await p.expect(TOPICS.ack(NODE), lambda m: ack_of(m).seq == 10**18, after=mark)
            acks.append(ack_of(got))
        first = len(ctl.cycles)
        await ctl.wait_cycles(8)
        cycles = ctl.cycles[first:]
        daemon = agents.daemons[NODE]

    assert [a.result for a in acks] == ["rejected"] * len(forgeries)
    assert daemon.core.counters.unverified >= len(forgeries)
    assert daemon.core.counters.commands_stale == 0  # the controller's own go on applying
    assert max(agents.caps([NODE])) < 450.0  # never at the forged 700 W
    rack = ctl.node("r1-k1")
    assert all(c.decision.node_power_w[rack] <= tree.limit_w[rack] for c in cycles)
    assert all(c.result.counters.acks_stale == 0 for c in cycles)


async def test_a_forged_retained_heartbeat_deposes_no_leader_and_leads_no_agent(mosquitto):
    async with probe(mosquitto) as p, running_cluster(mosquitto, phase="idle") as cluster:
        ctl, agents = cluster.controller, cluster.agents
        epoch = ctl.core.epoch
        rejected_before = ctl.core.rejected_total
        phantom = encode(
            Heartbeat(v=1, epoch=INT64_MAX, ts=time.time(), controller="aaa", state="leader")
        )
        # repeated, as finding 3 did to keep any controller from leading
        for _ in range(3):
            await p.publish(TOPICS.heartbeat, phantom, retain=True)
            await p.publish(TOPICS.heartbeat, STRANGER.sign(TOPICS.heartbeat, phantom), retain=True)
            await ctl.wait_cycles(4)
        first = len(ctl.cycles)
        await ctl.wait_cycles(4)
        still_leading = ctl.service.leading.is_set() and ctl.service.leadership.leading
        modes = {agents.daemons[node].core.mode for node in SERVERS}

    assert still_leading
    assert modes == {"controlled"}
    assert {c.epoch for c in ctl.cycles[first:]} == {epoch}
    assert ctl.service.leadership.highest_epoch_seen < INT64_MAX
    assert ctl.core.rejected_total >= rejected_before + 6
    for node in SERVERS:
        core = agents.daemons[node].core
        assert core.telemetry().epoch == epoch  # not the phantom's
        assert core.counters.unverified >= 6


async def test_an_epoch_reported_in_telemetry_moves_no_epoch(mosquitto):
    """Finding 2: one node's own login reporting epoch + 10^20 made the controller take 10
    new epochs in 10 s. Telemetry's epoch is information; epochs come from heartbeats."""
    async with probe(mosquitto) as p, running_cluster(mosquitto, phase="idle") as cluster:
        ctl = cluster.controller
        epoch = ctl.core.epoch
        sample = cluster.agents.daemons[NODE].core.telemetry()
        for k in range(10):
            lying = Telemetry(
                v=1,
                node=NODE,
                ts=time.time(),
                seq=sample.seq + 1000 + k,
                mode="controlled",
                gpus=sample.gpus,
                epoch=INT64_MAX - k,
            )
            await p.publish(TOPICS.telemetry(NODE), encode(lying), qos=0)
            await ctl.wait_cycles(1)
        first = len(ctl.cycles)
        await ctl.wait_cycles(4)

    assert ctl.core.epoch == epoch
    assert {c.epoch for c in ctl.cycles[first:]} == {epoch}
