"""An agent that restarts loses its ``(epoch, seq)`` memory: the heartbeat's ``seq`` (the
highest the controller sent) is the floor of its order, so a replayed older command of the
current epoch is stale (docs/PROTOCOL.md, "Clocks")."""

from __future__ import annotations

from powerd.protocol import Heartbeat, encode
from tests.support.agent_core_harness import (
    TOPICS,
    cap,
    command,
    core_clock,
    settings_of,
    started_core,
)
from tests.support.clock import ManualClock
from tests.support.keys import sign


def heartbeat_with_seq(clock: ManualClock, epoch: int, seq: int | None) -> bytes:
    beat = Heartbeat(v=1, epoch=epoch, ts=clock.wall, controller="ctl-a", state="leader", seq=seq)
    return sign(TOPICS.heartbeat, encode(beat))


def test_a_restarted_agent_takes_no_replayed_command_older_than_the_heartbeats_seq() -> None:
    clock = core_clock()
    before, _ = started_core(clock)  # the agent before its restart
    before.on_heartbeat(heartbeat_with_seq(clock, 7, 0))
    captured = command(7, 3, cap(0, 642.0))
    assert before.on_command(captured).result == "applied"
    assert before.on_command(command(7, 4, cap(0, 548.0))).result == "applied"
    clock.advance(5.0)
    after, gpus = started_core(clock)  # restarted: no memory of (7, 4)
    assert after.on_command(captured).result == "rejected"  # no live heartbeat yet
    after.on_heartbeat(heartbeat_with_seq(clock, 7, 4))
    ack = after.on_command(captured)
    assert (ack.result, ack.epoch, ack.seq) == ("stale", 7, 3)
    assert settings_of(gpus)[0][0] == 500.0  # still its failsafe cap
    assert after.on_command(command(7, 5, cap(0, 548.0))).result == "applied"


def test_the_floor_is_set_by_the_first_live_heartbeat_only() -> None:
    """Later heartbeats' seq does not move the floor: a command the controller queued
    before a heartbeat but published after it is not refused."""
    clock = core_clock()
    core, _ = started_core(clock)
    core.on_heartbeat(heartbeat_with_seq(clock, 7, 4))
    clock.advance(1.0)
    core.on_heartbeat(heartbeat_with_seq(clock, 7, 9))
    assert core.on_command(command(7, 5, cap(0, 548.0))).result == "applied"


def test_a_retained_heartbeat_sets_no_floor() -> None:
    """Retained: its seq may be old; the first live one's counts."""
    clock = core_clock()
    core, _ = started_core(clock)
    core.on_heartbeat(heartbeat_with_seq(clock, 7, 2), live=False)
    clock.advance(1.0)
    core.on_heartbeat(heartbeat_with_seq(clock, 7, 6))
    assert core.on_command(command(7, 5, cap(0, 548.0))).result == "stale"
    assert core.on_command(command(7, 7, cap(0, 548.0))).result == "applied"


def test_a_heartbeat_without_seq_sets_no_floor() -> None:
    """An older controller's heartbeat (no seq): the order starts where it did."""
    clock = core_clock()
    core, _ = started_core(clock)
    core.on_heartbeat(heartbeat_with_seq(clock, 7, None))
    assert core.on_command(command(7, 0, cap(0, 548.0))).result == "applied"
