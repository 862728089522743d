"""Clock policies: a signed command grants a GPU a job's comm clock, and that job's own
announcements lock and unlock it at once; nothing else does, and nothing once it lapses."""

from __future__ import annotations

import json

import pytest

from powerd.agent.phase_clock import PHASE_BURST, PHASES_PER_S
from powerd.gpu.simulated import SimulatedGpu
from powerd.protocol import CommClock, GpuCommand, PhaseEvent, encode
from tests.support.agent_core_harness import (
    AFTER_S,
    TOPICS,
    command,
    controlled_core,
    core_clock,
    heartbeat,
)
from tests.support.clock import ManualClock

JOB = "llm"
COMM_MHZ = 1100.0


def policy(job: str = JOB, clock_mhz: float = COMM_MHZ, owner: str | None = None) -> CommClock:
    return CommClock(job=job, max_sm_clock_mhz=clock_mhz, owner=owner)


def granted(index: int, cap_w: float = 600.0, **options) -> GpuCommand:
    """A GPU entry that carries the policy (``options`` go to ``policy``)."""
    return GpuCommand(index=index, cap_w=cap_w, comm_clock=policy(**options))


def announcement(phase: str, job: str = JOB, clock: ManualClock | None = None) -> bytes:
    ts = 1_795_320_000.0 if clock is None else clock.wall
    return encode(PhaseEvent(v=1, job=job, ts=ts, phase=phase))  # type: ignore[arg-type]


def locks(gpus: list[SimulatedGpu]) -> list[int | None]:
    return [g.locked_max_sm_clock_mhz() for g in gpus]


@pytest.fixture
def clock() -> ManualClock:
    return core_clock()


def test_communication_locks_at_once_and_the_next_phase_releases(clock):
    core, gpus = controlled_core(clock)
    ack = core.on_command(command(1, 1, granted(0), granted(1), GpuCommand(index=2, cap_w=600.0)))
    assert ack.result == "applied"
    assert [g.comm_clock for g in ack.gpus] == [policy(), policy(), None]
    assert core.phase_topics == {TOPICS.phase(JOB)}
    assert locks(gpus) == [None] * 4  # a policy alone moves nothing

    core.on_phase(TOPICS.phase(JOB), announcement("communication"))
    assert locks(gpus) == [1100, 1100, None, None]  # only the GPUs granted the policy
    core.on_phase(TOPICS.phase(JOB), announcement("compute"))
    assert locks(gpus) == [None] * 4
    core.on_phase(TOPICS.phase(JOB), announcement("communication"))
    core.on_phase(TOPICS.phase(JOB), announcement("checkpoint"))  # any other phase releases
    assert locks(gpus) == [None] * 4
    assert core.phase_clocks.counters.locks == 4
    assert core.phase_clocks.counters.unlocks == 4


def test_another_job_or_another_owner_moves_nothing(clock):
    core, gpus = controlled_core(clock)
    core.on_command(command(1, 1, granted(0, owner="alice"), granted(1, job="other")))
    assert core.phase_topics == {TOPICS.phase(JOB, "alice"), TOPICS.phase("other")}
    core.on_phase(TOPICS.phase(JOB), announcement("communication"))  # unowned: not alice's
    core.on_phase(TOPICS.phase(JOB, "mallory"), announcement("communication"))
    core.on_phase(TOPICS.phase("third"), announcement("communication", job="third"))
    assert locks(gpus) == [None] * 4
    assert core.phase_clocks.counters.phases_ignored == 3
    core.on_phase(TOPICS.phase(JOB, "alice"), announcement("communication"))
    assert locks(gpus) == [1100, None, None, None]


def test_a_newer_command_without_the_policy_ends_it_and_releases_its_lock(clock):
    core, gpus = controlled_core(clock)
    core.on_command(command(1, 1, granted(0), granted(1)))
    core.on_phase(TOPICS.phase(JOB), announcement("communication"))
    assert locks(gpus)[:2] == [1100, 1100]
    # GPU 0 keeps the policy; GPU 1's entry has none; GPUs the command leaves out have none
    ack = core.on_command(command(1, 2, granted(0), GpuCommand(index=1, cap_w=600.0)))
    assert [g.comm_clock for g in ack.gpus] == [policy(), None]
    assert [g.max_sm_clock_mhz for g in ack.gpus] == [1100, None]  # read back after the release
    assert locks(gpus)[:2] == [1100, None]
    core.on_command(command(1, 3, GpuCommand(index=2, cap_w=600.0)))  # GPU 0 left out
    assert locks(gpus) == [None] * 4
    assert core.phase_topics == frozenset()
    core.on_phase(TOPICS.phase(JOB), announcement("communication"))
    assert locks(gpus) == [None] * 4


def test_failsafe_ends_every_policy(clock):
    core, gpus = controlled_core(clock)
    core.on_command(command(1, 1, granted(0), ttl_s=5.0))
    core.on_phase(TOPICS.phase(JOB), announcement("communication"))
    assert locks(gpus)[0] == 1100
    clock.advance(AFTER_S + 1)  # no heartbeat: the announcement below ticks into failsafe first
    core.on_phase(TOPICS.phase(JOB), announcement("communication"))
    assert core.mode == "failsafe"
    assert locks(gpus) == [None] * 4
    assert core.phase_topics == frozenset()


def test_expired_ttl_ends_the_policy_before_the_announcement_counts(clock):
    core, gpus = controlled_core(clock)
    core.on_command(command(1, 1, granted(0), ttl_s=2.0))
    clock.advance(3.0)  # the command's ttl has run out; the heartbeat (10 s) has not
    core.on_phase(TOPICS.phase(JOB), announcement("communication"))
    assert core.mode == "failsafe"
    assert locks(gpus) == [None] * 4


def test_a_newer_epoch_ends_every_policy_and_releases(clock):
    core, gpus = controlled_core(clock)
    core.on_command(command(1, 1, granted(0)))
    core.on_phase(TOPICS.phase(JOB), announcement("communication"))
    core.on_heartbeat(heartbeat(clock, epoch=2))
    assert locks(gpus) == [None] * 4
    assert core.phase_topics == frozenset()
    core.on_phase(TOPICS.phase(JOB), announcement("communication"))
    assert locks(gpus) == [None] * 4


def test_the_same_epoch_again_keeps_the_policy(clock):
    core, gpus = controlled_core(clock)
    core.on_command(command(1, 1, granted(0)))
    core.on_heartbeat(heartbeat(clock, epoch=1))
    core.on_phase(TOPICS.phase(JOB), announcement("communication"))
    assert locks(gpus)[0] == 1100


@pytest.mark.parametrize(("asked", "held"), [(50.0, 345), (99_999.0, 1980), (1100.4, 1100)])
def test_the_policy_clock_is_clamped_into_the_device_range(clock, asked, held):
    core, gpus = controlled_core(clock)
    ack = core.on_command(command(1, 1, granted(0, clock_mhz=asked)))
    assert ack.gpus[0].comm_clock == policy(clock_mhz=float(held))
    assert ack.gpus[0].clamped is (held != round(asked))
    core.on_phase(TOPICS.phase(JOB), announcement("communication"))
    assert locks(gpus)[0] == held


def test_the_later_of_command_and_announcement_sets_the_clock(clock):
    """A command's own clock applies when it arrives; the job's next announcement takes over."""
    core, gpus = controlled_core(clock)
    entry = GpuCommand(index=0, cap_w=600.0, max_sm_clock_mhz=1400.0, comm_clock=policy())
    core.on_command(command(1, 1, entry))
    assert locks(gpus)[0] == 1400
    core.on_phase(TOPICS.phase(JOB), announcement("compute"))
    assert locks(gpus)[0] is None
    core.on_phase(TOPICS.phase(JOB), announcement("communication"))
    # a command that sets the clock takes the lock over: the policy ending leaves it
    core.on_command(command(1, 2, GpuCommand(index=0, max_sm_clock_mhz=1200.0)))
    assert locks(gpus)[0] == 1200


def test_a_new_clock_in_the_policy_moves_a_lock_the_job_made(clock):
    core, gpus = controlled_core(clock)
    core.on_command(command(1, 1, granted(0)))
    core.on_phase(TOPICS.phase(JOB), announcement("communication"))
    core.on_command(command(1, 2, granted(0, clock_mhz=900.0)))
    assert locks(gpus)[0] == 900


def test_garbage_on_the_phase_topic_is_counted_and_moves_nothing(clock):
    core, gpus = controlled_core(clock)
    core.on_command(command(1, 1, granted(0)))
    bad = [
        b"",
        b"\xff\xfe",
        b"[]",
        b'{"v":1}',
        json.dumps({"v": 1, "job": JOB, "ts": 1.0, "phase": "warp-speed"}).encode(),
        announcement("communication", job="other"),  # its name does not match the topic
        b'{"v":1,"job":"llm","ts":1e999,"phase":"communication"}',
    ]
    for payload in bad:
        core.on_phase(TOPICS.phase(JOB), payload)
    core.on_phase("powerd/v1/default/nodes/x/command", announcement("communication"))
    core.on_phase("elsewhere", announcement("communication"))
    assert locks(gpus) == [None] * 4
    assert core.phase_clocks.counters.phases_rejected == len(bad) + 2


def test_a_flood_of_announcements_is_dropped_past_the_rate(clock):
    core, gpus = controlled_core(clock)
    core.on_command(command(1, 1, granted(0)))
    flood = int(PHASE_BURST) + 100
    for k in range(flood):
        core.on_phase(TOPICS.phase(JOB), announcement("communication" if k % 2 else "compute"))
    counters = core.phase_clocks.counters
    assert counters.phases_dropped == flood - int(PHASE_BURST)
    assert counters.phases_applied == int(PHASE_BURST)
    clock.advance(1.0)  # the bucket refills at PHASES_PER_S
    core.on_heartbeat(heartbeat(clock))
    for _ in range(int(PHASES_PER_S)):
        core.on_phase(TOPICS.phase(JOB), announcement("communication"))
    assert counters.phases_applied == int(PHASE_BURST + PHASES_PER_S)
    assert locks(gpus)[0] == 1100


def test_an_unsigned_command_grants_nothing(clock):
    core, gpus = controlled_core(clock)
    body = command(1, 1, granted(0))
    unsigned = body[: body.index(b',"key":')] + b"}"
    ack = core.on_command(unsigned)
    assert ack.result == "rejected"
    assert core.phase_topics == frozenset()
    core.on_phase(TOPICS.phase(JOB), announcement("communication"))
    assert locks(gpus) == [None] * 4


def test_a_stale_command_grants_nothing(clock):
    core, _ = controlled_core(clock)
    core.on_command(command(1, 5, GpuCommand(index=0, cap_w=600.0)))
    ack = core.on_command(command(1, 4, granted(0)))
    assert ack.result == "stale"
    assert core.phase_topics == frozenset()
