"""Clock policies in the controller's commands: the GPUs of a job whose announcements are live
are granted its comm clock with their caps; the controller sends no comm lock of its own for
them once their agent listens, and locks them itself again when the announcements go stale,
the agent takes no policy, or an announcement came before the agent listened."""

from __future__ import annotations

import math

import pytest
from msgspec import UNSET, UnsetType

from powerd.controller.core import CycleResult
from powerd.protocol import Ack, Command, CommClock, GpuAck, GpuCommand, encode
from tests.controller.test_controller_core import (
    BANDS,
    COMM_CLOCK_MHZ,
    WALL0,
    Bench,
    caps_w,
    make_bench,
)

JOB = "llm"
JOB_NODES = ("k2-n1", "k2-n2")  # rack k2 has room: no capping gets in the way
POLICY = CommClock(job=JOB, max_sm_clock_mhz=COMM_CLOCK_MHZ)
LIVE_S = 10.0


def agent_ack(node: str, command: Command, takes_policies: bool = True) -> bytes:
    """What an agent acks: caps as commanded, the clock it holds, the policy it holds (an
    agent that knows none, ``takes_policies=False``, leaves it out)."""
    return encode(
        Ack(
            v=1,
            node=node,
            epoch=command.epoch,
            seq=command.seq,
            ts=WALL0,
            result="applied",
            gpus=[
                GpuAck(
                    index=g.index,
                    cap_w=cap_w,
                    max_sm_clock_mhz=_held_clock(g),
                    clamped=False,
                    comm_clock=g.comm_clock
                    if takes_policies and not isinstance(g.comm_clock, UnsetType)
                    else None,
                )
                for g, cap_w in zip(command.gpus, caps_w(command), strict=True)
            ],
            errors=[],
        )
    )


def _held_clock(entry: GpuCommand) -> int | None:
    """The lock an agent reads back after the entry (its clock; a test holds none before)."""
    clock = entry.max_sm_clock_mhz
    return None if clock is None or isinstance(clock, UnsetType) else round(clock)


def run_cycle(bench: Bench, advance_s: float = 0.5, takes_policies: bool = True) -> dict:
    """Every node reports 300 W a GPU, a cycle runs, every command is applied and acked."""
    bench.clock.advance(advance_s)
    for node in bench.topology.tree.server_names:
        bench.report(node, 300.0, ts=WALL0 + bench.clock.t)
    result: CycleResult = bench.core.cycle()
    out = {}
    for node, command in result.commands:
        bench.caps[node] = caps_w(command)
        out[node] = command
        bench.core.on_ack(node, agent_ack(node, command, takes_policies))
    return out


def policies(command: Command) -> list[CommClock | None]:
    return [None if g.comm_clock is UNSET else g.comm_clock for g in command.gpus]


def clocks(command: Command) -> list[object]:
    return [g.max_sm_clock_mhz for g in command.gpus]


@pytest.fixture
def bench() -> Bench:
    bench = make_bench(announced_live_s=LIVE_S)
    run_cycle(bench)  # every node commanded once (the first cycle knows nothing)
    return bench


def test_the_policy_goes_out_with_the_caps_to_the_jobs_gpus_only() -> None:
    # the bands, whose decision (every GPU's maximum here) makes a cap set below it move
    bench = make_bench(announced_live_s=LIVE_S, policy=BANDS)
    run_cycle(bench)  # every node commanded once (the first cycle knows nothing)
    bench.phase(JOB, "startup", JOB_NODES)
    sent = run_cycle(bench)
    assert sorted(sent) == sorted(JOB_NODES)  # granting is a change of its own
    for node in JOB_NODES:
        assert policies(sent[node]) == [POLICY, POLICY]
        assert clocks(sent[node]) == [None, None]  # the controller's own clock, said once
    # the policy holds only as long as the command that carries it: every later command
    # to those nodes carries it again
    bench.phase(JOB, "compute")
    bench.core.commanded_cap_w[bench.gpus("k2-n1")] = 650.0  # as if a cap must move
    sent = run_cycle(bench)
    assert policies(sent["k2-n1"]) == [POLICY, POLICY]
    assert clocks(sent["k2-n1"]) == [UNSET, UNSET]  # the clock is the job's now


def test_no_lock_of_its_own_once_the_agent_listens(bench: Bench) -> None:
    bench.phase(JOB, "startup", JOB_NODES)
    run_cycle(bench)  # granted, and acked: the agents listen from here
    bench.clock.advance(0.1)
    bench.phase(JOB, "communication")
    sent = run_cycle(bench)
    assert all(clocks(c) == [UNSET, UNSET] for c in sent.values()), sent
    result = bench.core.cycle()
    assert result.counters.clock_policy_gpus == 4
    # ... and the agents' locks, in their telemetry, are not drift to be commanded back
    bench.clock.advance(0.5)
    for node in JOB_NODES:
        bench.report(node, 150.0, clock_mhz=1100, ts=WALL0 + bench.clock.t)
    result = bench.core.cycle()
    assert result.counters.nodes_drifted == 0
    assert [n for n, _ in result.commands] == []


def test_without_policies_the_controller_locks_communication_itself() -> None:
    """The same story with agent_comm_clock off: the test above would see the lock."""
    bench = make_bench(announced_live_s=LIVE_S, agent_comm_clock=False)
    run_cycle(bench)
    bench.phase(JOB, "startup", JOB_NODES)
    assert all(p is None for c in run_cycle(bench).values() for p in policies(c))
    bench.phase(JOB, "communication")
    sent = run_cycle(bench)
    assert [clocks(sent[n]) for n in JOB_NODES] == [[COMM_CLOCK_MHZ] * 2] * 2


def test_an_announcement_before_the_agent_listened_is_locked_by_the_controller(
    bench: Bench,
) -> None:
    bench.phase(JOB, "startup", JOB_NODES)
    bench.clock.advance(0.5)
    grant = dict(bench.core.cycle().commands)  # sent, not yet acked
    bench.phase(JOB, "communication")  # the agents may not have subscribed yet
    bench.clock.advance(0.1)
    for node, command in grant.items():
        bench.core.on_ack(node, agent_ack(node, command))
    sent = run_cycle(bench)
    assert [clocks(sent[n]) for n in JOB_NODES] == [[COMM_CLOCK_MHZ] * 2] * 2
    assert [policies(sent[n]) for n in JOB_NODES] == [[POLICY] * 2] * 2
    # the job's next announcement reached the agents: theirs from now on
    bench.phase(JOB, "compute")
    assert run_cycle(bench) == {}


def test_stale_announcements_end_the_policy_and_the_controller_locks_again(
    bench: Bench,
) -> None:
    bench.phase(JOB, "startup", JOB_NODES)
    run_cycle(bench)
    bench.clock.advance(0.1)
    bench.phase(JOB, "communication")
    run_cycle(bench)
    sent = run_cycle(bench, advance_s=LIVE_S + 1)  # nothing announced for longer than live
    for node in JOB_NODES:
        assert policies(sent[node]) == [None, None]
        assert clocks(sent[node]) == [COMM_CLOCK_MHZ] * 2  # its last word, locked by itself
    assert bench.core.cycle().counters.clock_policy_gpus == 0
    # announcing again makes them live: granted again
    bench.phase(JOB, "compute")
    sent = run_cycle(bench)
    assert [policies(sent[n]) for n in JOB_NODES] == [[POLICY] * 2] * 2
    assert [clocks(sent[n]) for n in JOB_NODES] == [[None] * 2] * 2


def test_a_stale_job_has_its_phases_inferred_again(bench: Bench) -> None:
    bench.phase(JOB, "startup", JOB_NODES)
    bench.phase(JOB, "compute")
    bench.phase(JOB, "communication")
    bench.phase(JOB, "compute")
    job = bench.core.jobs[JOB]
    assert job.announces_waits
    assert not bench.core.announcements_live(job, bench.clock.t + LIVE_S + 1)
    # power history of a synchronised wait: the job's GPUs fall together
    for step in range(int(LIVE_S) + 8):
        bench.clock.advance(1.0)
        power = 600.0 if step < LIVE_S + 2 else 90.0
        for node in bench.topology.tree.server_names:
            drawn = power if node in JOB_NODES else 300.0
            bench.report(node, drawn, ts=WALL0 + bench.clock.t)
        bench.core.cycle()
    assert job.inferred_phase is not None


def test_an_agent_that_takes_no_policy_is_locked_by_the_controller(bench: Bench) -> None:
    bench.phase(JOB, "startup", JOB_NODES)
    run_cycle(bench, takes_policies=False)  # an older agent: the ack has no comm_clock
    assert bench.core.comm_clock_refused[bench.gpus("k2-n1")].all()
    sent = run_cycle(bench, takes_policies=False)  # the policy withdrawn, clocks said
    assert [policies(sent[n]) for n in JOB_NODES] == [[None] * 2] * 2
    bench.phase(JOB, "communication")
    sent = run_cycle(bench, takes_policies=False)
    assert [clocks(sent[n]) for n in JOB_NODES] == [[COMM_CLOCK_MHZ] * 2] * 2
    assert [policies(sent[n]) for n in JOB_NODES] == [[None] * 2] * 2


def test_a_new_epoch_grants_afresh(bench: Bench) -> None:
    bench.phase(JOB, "startup", JOB_NODES)
    run_cycle(bench)
    bench.core.new_epoch(bench.core.epoch + 1)
    assert math.isinf(bench.core.comm_clock_acked[0])
    sent = run_cycle(bench)
    assert [policies(sent[n]) for n in JOB_NODES] == [[POLICY] * 2] * 2
    assert [clocks(sent[n]) for n in JOB_NODES] == [[None] * 2] * 2
