"""Stale and malformed commands are acknowledged as such and change nothing."""

from __future__ import annotations

import pytest

from powerd.gpu.simulated import open_simulated
from powerd.protocol import GpuCommand
from tests.support.agent_harness import (
    NODE,
    TOPICS,
    become_controlled,
    command,
    heartbeat,
    probe,
    running_agent,
    send,
)
from tests.support.keys import sign


def caps(gpus):
    return [(g.enforced_cap_w(), g.locked_max_sm_clock_mhz()) for g in gpus]


async def test_stale_commands_change_nothing(mosquitto):
    gpus = open_simulated("2xH100")
    async with probe(mosquitto) as p, running_agent(mosquitto, gpus):
        await become_controlled(p, epoch=3)
        applied = await send(p, command(3, 10, [GpuCommand(index=0, cap_w=450.0)]))
        before = caps(gpus)
        replay = await send(p, command(3, 10, [GpuCommand(index=0, cap_w=250.0)]))
        older = await send(p, command(3, 9, [GpuCommand(index=0, cap_w=250.0)]))
        old_epoch = await send(p, command(2, 99, [GpuCommand(index=1, cap_w=250.0)]))
        # a newer epoch's heartbeat makes the current epoch's commands stale too
        await p.publish(TOPICS.heartbeat, heartbeat(epoch=4))
        superseded = await send(p, command(3, 11, [GpuCommand(index=1, cap_w=250.0)]))
        after = caps(gpus)
    assert applied.result == "applied"
    assert [replay.result, older.result, old_epoch.result, superseded.result] == ["stale"] * 4
    assert before == after == [(450.0, None), (500.0, None)]


MALFORMED = {
    "not json": b"\x00\xffcap=9000",
    "json array": b"[1, 2, 3]",
    "missing epoch": b'{"v":1,"seq":5,"ts":1.0,"ttl_s":30,"gpus":[{"index":0,"cap_w":250}]}',
    "string cap": b'{"v":1,"epoch":1,"seq":5,"ts":1.0,"ttl_s":30,"gpus":[{"index":0,"cap_w":"250"}]}',
    "infinite cap": b'{"v":1,"epoch":1,"seq":5,"ts":1.0,"ttl_s":30,"gpus":[{"index":0,"cap_w":1e999}]}',
    "negative cap": b'{"v":1,"epoch":1,"seq":5,"ts":1.0,"ttl_s":30,"gpus":[{"index":0,"cap_w":-5}]}',
    "zero cap": b'{"v":1,"epoch":1,"seq":5,"ts":1.0,"ttl_s":30,"gpus":[{"index":0,"cap_w":0}]}',
    "duplicate index": (
        b'{"v":1,"epoch":1,"seq":5,"ts":1.0,"ttl_s":30,'
        b'"gpus":[{"index":0,"cap_w":250},{"index":0,"cap_w":650}]}'
    ),
    "version 2": b'{"v":2,"epoch":1,"seq":5,"ts":1.0,"ttl_s":30,"gpus":[{"index":0,"cap_w":250}]}',
    "empty": b"",
}


@pytest.mark.parametrize("payload", MALFORMED.values(), ids=MALFORMED.keys())
async def test_malformed_command_is_rejected_and_changes_nothing(mosquitto, payload):
    gpus = open_simulated("2xH100")
    async with probe(mosquitto) as p, running_agent(mosquitto, gpus) as daemon:
        await become_controlled(p)
        before = caps(gpus)
        # signed where it can be (a JSON object), as a controller with a bug would send it
        signable = payload.startswith(b"{") and payload.endswith(b"}")
        ack = await send(p, sign(TOPICS.command(NODE), payload) if signable else payload)
        # the agent still takes a good command afterwards
        good = await send(p, command(1, 6, [GpuCommand(index=1, cap_w=333.0)]))
    assert ack.result == "rejected"
    assert ack.errors and ack.errors[0].message
    assert caps(gpus)[0] == before[0]
    assert good.result == "applied"
    counters = daemon.core.counters
    assert (counters.payloads_rejected, counters.unverified) == ((1, 0) if signable else (0, 1))
