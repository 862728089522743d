"""The agent core obeys only signed control messages (issue 12), holds a command at most its
own max_command_ttl_s, and reports the failsafe cap it holds."""

from __future__ import annotations

import pytest

from powerd.agent.config import FailsafeConfig
from powerd.agent.core import AgentCore
from powerd.gpu.simulated import open_simulated
from powerd.protocol import INT64_MAX, Command, GpuCommand, Heartbeat, encode
from tests.support.agent_core_harness import (
    AFTER_S,
    COMMAND_TOPIC,
    FAILSAFE_W,
    NODE,
    TOPICS,
    WALL0,
    cap,
    command,
    controlled_core,
    core_clock,
    heartbeat,
    make_core,
    settings_of,
    started_core,
)
from tests.support.clock import ManualClock
from tests.support.keys import STRANGER, sign


@pytest.fixture
def clock() -> ManualClock:
    return core_clock()


def body(epoch: int, seq: int, cap_w: float = 650.0, ttl_s: float = 30.0) -> bytes:
    gpus = [GpuCommand(index=i, cap_w=cap_w) for i in range(4)]
    return encode(Command(v=1, epoch=epoch, seq=seq, ts=WALL0, ttl_s=ttl_s, gpus=gpus))


def test_only_the_trusted_key_signing_for_this_node_moves_a_gpu(clock: ManualClock) -> None:
    core, gpus = controlled_core(clock, epoch=3)
    before = settings_of(gpus)
    other_node = TOPICS.command("r01-n04")
    for payload in (
        body(3, 1),  # unsigned
        STRANGER.sign(COMMAND_TOPIC, body(3, 1)),  # a key nobody trusts
        sign(other_node, body(3, 1)),  # the right key, another node's command
        sign(TOPICS.heartbeat, body(3, 1)),  # the right key, signed as a heartbeat
    ):
        ack = core.on_command(payload)
        assert (ack.result, ack.epoch, ack.seq) == ("rejected", 3, 1)
        assert ack.errors[0].index is None and "sign" in ack.errors[0].message
    assert settings_of(gpus) == before
    assert core.counters.unverified == 4 and core.counters.payloads_rejected == 0
    # the same order, signed, was taken by none of them: it applies now
    assert core.on_command(sign(COMMAND_TOPIC, body(3, 1))).result == "applied"
    assert [g.power_limit_w() for g in gpus] == [650.0] * 4


def test_a_forged_command_with_a_huge_seq_takes_no_place_in_the_order(clock: ManualClock) -> None:
    """Finding 1: seq 10^18 applied at once held the rack over its breaker, and every later
    command of the real controller was acked stale."""
    core, gpus = controlled_core(clock, epoch=3)
    assert core.on_command(body(3, 10**18, cap_w=700.0, ttl_s=86_400)).result == "rejected"
    assert core.on_command(command(3, 2, cap(0, 400.0))).result == "applied"
    assert gpus[0].power_limit_w() == 400.0
    assert core.counters.commands_stale == 0


def test_a_forged_heartbeat_neither_leads_nor_raises_the_epoch(clock: ManualClock) -> None:
    """Finding 3: a retained heartbeat with epoch 2^63 deposed the leader and led the agents."""
    core, _ = started_core(clock)
    phantom = encode(
        Heartbeat(v=1, epoch=INT64_MAX, ts=clock.wall, controller="aaa", state="leader")
    )
    core.on_heartbeat(phantom)
    core.on_heartbeat(STRANGER.sign(TOPICS.heartbeat, phantom))
    core.on_heartbeat(sign(COMMAND_TOPIC, phantom))  # signed, but not as a heartbeat
    assert core.mode == "failsafe" and core.counters.unverified == 3
    core.on_heartbeat(heartbeat(clock, epoch=2))  # the real leader
    assert core.mode == "controlled"
    assert core.telemetry().epoch == 2
    assert core.on_command(command(2, 1, cap(0, 400.0))).result == "applied"


def test_a_command_holds_at_most_max_command_ttl_s(clock: ManualClock) -> None:
    """Whatever its ttl_s says (up to the protocol's day), once heartbeats stop."""
    core, gpus = make_core(clock, max_command_ttl_s=3.0)
    core.start()
    core.on_heartbeat(heartbeat(clock))
    assert core.on_command(command(1, 1, cap(0, 650.0), ttl_s=3600.0)).result == "applied"
    clock.advance(2.9)
    core.tick()
    assert core.mode == "controlled"
    clock.advance(0.2)  # 3.1 s: past the agent's bound, long before the command's hour
    core.tick()
    assert core.mode == "failsafe"
    assert gpus[0].power_limit_w() == FAILSAFE_W


def test_a_shorter_ttl_still_counts(clock: ManualClock) -> None:
    core, _ = make_core(clock, max_command_ttl_s=3.0)
    core.start()
    core.on_heartbeat(heartbeat(clock))
    core.on_command(command(1, 1, cap(0, 650.0), ttl_s=1.0))
    clock.advance(1.1)
    core.tick()
    assert core.mode == "failsafe"


def test_a_controlled_agent_cannot_be_built_without_trusted_keys(clock: ManualClock) -> None:
    gpus = open_simulated("1xH100", clock=clock.monotonic)
    with pytest.raises(ValueError, match="public keys"):
        AgentCore(NODE, gpus, FailsafeConfig(cap_w=FAILSAFE_W), AFTER_S, verifier=None)
    local = AgentCore(
        NODE, gpus, FailsafeConfig(cap_w=FAILSAFE_W), AFTER_S, verifier=None, mode="local"
    )
    local.start()
    ack = local.on_command(command(1, 1, cap(0, 650.0)))  # signed, but it obeys no one
    assert ack.result == "rejected" and gpus[0].power_limit_w() == FAILSAFE_W


def test_the_status_reports_the_highest_failsafe_cap_it_holds(clock: ManualClock) -> None:
    """The controller compares it with the budgets file's (one source of failsafe truth)."""
    core, _ = make_core(clock, FailsafeConfig(cap_w=500.0, caps_w={2: 560.0}))
    assert core.status().failsafe_cap_w == 560.0
