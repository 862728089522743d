"""A command is applied, acknowledged with read-back values, and visible in the next telemetry."""

from __future__ import annotations

from powerd.gpu.simulated import open_simulated
from powerd.protocol import GpuCommand
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


async def test_command_applied_acked_and_seen_in_next_telemetry(mosquitto):
    gpus = open_simulated("4xH100")
    async with probe(mosquitto) as p, running_agent(mosquitto, gpus):
        await become_controlled(p)
        ack = await send(
            p,
            command(
                1,
                1,
                [
                    GpuCommand(index=0, cap_w=350.0, max_sm_clock_mhz=1410),
                    GpuCommand(index=2, cap_w=900.0),  # above the H100's 700 W: clamped
                ],
            ),
        )
        after_ack = await p.expect(
            TOPICS.telemetry(NODE), lambda m: telemetry(m.payload).ts > ack.ts
        )
    assert ack.result == "applied", ack
    assert (ack.epoch, ack.seq) == (1, 1)
    by_index = {g.index: g for g in ack.gpus}
    assert (by_index[0].cap_w, by_index[0].max_sm_clock_mhz, by_index[0].clamped) == (
        350.0,
        1410,
        False,
    )
    assert (by_index[2].cap_w, by_index[2].clamped) == (700.0, True)
    assert gpus[0].enforced_cap_w() == 350.0
    assert gpus[0].locked_max_sm_clock_mhz() == 1410

    seen = {g.index: g for g in telemetry(after_ack.payload).gpus}
    assert seen[0].cap_w == 350.0
    assert seen[0].max_sm_clock_mhz == 1410
    assert seen[2].cap_w == 700.0
    assert seen[1].cap_w == FAILSAFE_CAP_W  # left out of the command: unchanged
    assert seen[0].power_w <= 350.0


async def test_unknown_gpu_index_is_an_error_and_the_rest_apply(mosquitto):
    gpus = open_simulated("2xH100")
    async with probe(mosquitto) as p, running_agent(mosquitto, gpus):
        await become_controlled(p)
        ack = await send(
            p, command(1, 1, [GpuCommand(index=7, cap_w=300.0), GpuCommand(index=1, cap_w=300.0)])
        )
    assert ack.result == "partial"
    assert [e.index for e in ack.errors] == [7]
    assert "unknown GPU index 7" in ack.errors[0].message
    assert gpus[1].enforced_cap_w() == 300.0
    assert gpus[0].enforced_cap_w() == FAILSAFE_CAP_W


async def test_null_clock_removes_the_lock_and_absent_keeps_it(mosquitto):
    gpus = open_simulated("1xH100")
    async with probe(mosquitto) as p, running_agent(mosquitto, gpus):
        await become_controlled(p)
        await send(p, command(1, 1, [GpuCommand(index=0, max_sm_clock_mhz=1200)]))
        kept = await send(p, command(1, 2, [GpuCommand(index=0, cap_w=400.0)]))
        removed = await send(p, command(1, 3, [GpuCommand(index=0, max_sm_clock_mhz=None)]))
    assert kept.gpus[0].max_sm_clock_mhz == 1200
    assert removed.gpus[0].max_sm_clock_mhz is None
    assert gpus[0].locked_max_sm_clock_mhz() is None
    assert gpus[0].enforced_cap_w() == 400.0
