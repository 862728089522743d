"""Against a real Mosquitto: a signed command grants GPU 0 a job's comm clock; the job's own
announcements, published to the broker, lock and unlock it; a newer command without the
policy ends it, and the agent stops listening."""

from __future__ import annotations

from powerd.gpu.simulated import open_simulated
from powerd.protocol import CommClock, GpuCommand, PhaseEvent, encode
from tests.support.agent_harness import (
    NODE,
    TOPICS,
    become_controlled,
    command,
    probe,
    running_agent,
    send,
    telemetry,
)
from tests.support.brokers import MqttProbe

JOB = "llm"
COMM_MHZ = 1100


def announcement(phase: str) -> bytes:
    return encode(PhaseEvent(v=1, job=JOB, ts=1_795_320_000.0, phase=phase))  # type: ignore[arg-type]


def granted(index: int) -> GpuCommand:
    return GpuCommand(
        index=index, cap_w=600.0, comm_clock=CommClock(job=JOB, max_sm_clock_mhz=COMM_MHZ)
    )


async def lock_seen(p: MqttProbe, want: int | None, after: int) -> None:
    """Until a telemetry message shows GPU 0's lock at ``want`` and GPU 1 unlocked."""
    await p.expect(
        TOPICS.telemetry(NODE),
        lambda m: [g.max_sm_clock_mhz for g in telemetry(m.payload).gpus][:2] == [want, None],
        after=after,
    )


async def test_announcements_move_the_granted_clock_until_the_policy_ends(mosquitto):
    gpus = open_simulated("2xH100")
    async with probe(mosquitto) as p, running_agent(mosquitto, gpus) as daemon:
        await become_controlled(p)
        ack = await send(p, command(1, 1, [granted(0), GpuCommand(index=1, cap_w=600.0)]))
        assert ack.result == "applied"
        assert ack.gpus[0].comm_clock == CommClock(job=JOB, max_sm_clock_mhz=COMM_MHZ)
        # the agent subscribed before it acked: the job's announcement reaches it
        mark = p.mark()
        await p.publish(TOPICS.phase(JOB), announcement("communication"))
        await lock_seen(p, COMM_MHZ, mark)
        assert gpus[0].locked_max_sm_clock_mhz() == COMM_MHZ
        assert gpus[1].locked_max_sm_clock_mhz() is None

        mark = p.mark()
        await p.publish(TOPICS.phase(JOB), announcement("compute"))
        await lock_seen(p, None, mark)

        await p.publish(TOPICS.phase(JOB), announcement("communication"))
        mark = p.mark()
        await lock_seen(p, COMM_MHZ, mark)
        # a newer command without the policy: the lock the job made is released ...
        ack = await send(p, command(1, 2, [GpuCommand(index=0, cap_w=600.0)]))
        assert ack.gpus[0].comm_clock is None
        assert ack.gpus[0].max_sm_clock_mhz is None
        applied = daemon.core.phase_clocks.counters.phases_applied
        # ... and the agent no longer listens: an announcement, then a command whose ack
        # proves that everything published before it was handled
        await p.publish(TOPICS.phase(JOB), announcement("communication"))
        ack = await send(p, command(1, 3, [GpuCommand(index=1, cap_w=550.0)]))
        assert ack.result == "applied"
        counters = daemon.core.phase_clocks.counters
        assert counters.phases_applied == applied
        assert counters.phases_ignored == 0  # unsubscribed: it never arrived
        assert gpus[0].locked_max_sm_clock_mhz() is None
