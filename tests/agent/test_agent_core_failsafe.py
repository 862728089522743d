"""Failsafe caps at start, liveness of the controller, deadlines and recovery."""

from __future__ import annotations

from functools import partial

import pytest

from powerd.agent.config import FailsafeConfig
from powerd.agent.core import AgentCore
from powerd.agent.rules import FAILSAFE_RAISE_SHARE
from powerd.gpu import GpuPermissionError
from powerd.protocol import Command, GpuCommand, encode
from tests.support.agent_core_harness import (
    AFTER_S,
    COMMAND_TOPIC,
    FAILSAFE_W,
    Node,
    command,
    core_clock,
    heartbeat,
    heartbeat_each_second,
    make_core,
    mode_after,
    settings_of,
    started_core,
)
from tests.support.clock import ManualClock
from tests.support.keys import sign


def all_gpus(count: int, cap_w: float, clock_mhz: int | None = None) -> list[GpuCommand]:
    return [GpuCommand(index=i, cap_w=cap_w, max_sm_clock_mhz=clock_mhz) for i in range(count)]


@pytest.fixture
def clock() -> ManualClock:
    return core_clock()


@pytest.fixture
def node(clock: ManualClock) -> Node:
    """A started core on 4 H100s, failsafe cap 500 W, no heartbeat yet."""
    return started_core(clock)


def controlled_with_command(clock: ManualClock, core: AgentCore, ttl_s: float = 30.0) -> None:
    """Live leader heartbeat, then (1, 1): every GPU at 600 W (above its 500 W failsafe cap),
    clocks locked at 1200 MHz."""
    core.on_heartbeat(heartbeat(clock))
    assert core.mode == "controlled"
    ack = core.on_command(command(1, 1, *all_gpus(len(core.gpus), 600.0, 1200), ttl_s=ttl_s))
    assert ack.result == "applied"


FAILSAFE_STATE = [(FAILSAFE_W, None)] * 4
COMMANDED_STATE = [(600.0, 1200)] * 4


# --- start ---------------------------------------------------------------------


def test_start_applies_default_fraction_and_unlocks(clock: ManualClock) -> None:
    core, gpus = make_core(clock, FailsafeConfig())
    for g in gpus:  # whatever was left on the GPUs before the agent started
        g.set_power_limit_w(650.0)
        g.lock_max_sm_clock_mhz(900)
    core.start()
    assert core.failsafe_caps_w == {i: pytest.approx(560.0) for i in range(4)}  # 0.8 x 700 W
    assert [g.power_limit_w() for g in gpus] == [pytest.approx(560.0)] * 4
    assert [g.locked_max_sm_clock_mhz() for g in gpus] == [None] * 4


def test_start_default_fraction_follows_the_model(clock: ManualClock) -> None:
    core, gpus = make_core(clock, FailsafeConfig(fraction=0.5), spec="2xGB200")
    core.start()
    assert [g.power_limit_w() for g in gpus] == [600.0, 600.0]  # 0.5 x 1200 W


def test_per_index_caps_win_over_cap_w(clock: ManualClock) -> None:
    core, gpus = make_core(clock, FailsafeConfig(cap_w=500.0, caps_w={1: 400.0, 3: 650.0}))
    core.start()
    assert [g.power_limit_w() for g in gpus] == [500.0, 400.0, 500.0, 650.0]


def test_out_of_range_failsafe_cap_is_clamped(clock: ManualClock) -> None:
    core, gpus = make_core(clock, FailsafeConfig(cap_w=100.0, caps_w={2: 900.0}))
    assert core.failsafe_caps_w == {0: 200.0, 1: 200.0, 2: 700.0, 3: 200.0}
    core.start()
    assert [g.power_limit_w() for g in gpus] == [200.0, 200.0, 700.0, 200.0]


def test_start_survives_a_failing_gpu(clock: ManualClock) -> None:
    core, gpus = make_core(clock)
    gpus[1].inject_error("set_power_limit_w", GpuPermissionError("not root"))
    gpus[1].lock_max_sm_clock_mhz(900)
    core.start()  # logs, does not raise
    assert [g.power_limit_w() for g in gpus] == [FAILSAFE_W, 700.0, FAILSAFE_W, FAILSAFE_W]
    assert gpus[1].locked_max_sm_clock_mhz() is None  # the clock part still ran


def test_mode_before_any_heartbeat_is_failsafe(node: Node) -> None:
    core, _ = node
    assert core.mode == "failsafe"
    assert core.node_state == "failsafe"
    assert core.status().state == "failsafe"
    assert core.telemetry().mode == "failsafe"
    assert not core.controller_live()


# --- local mode ---------------------------------------------------------------


def test_local_mode(clock: ManualClock) -> None:
    core, gpus = make_core(clock, mode="local")
    core.start()
    assert core.mode == "local"
    assert core.node_state == "online"
    assert settings_of(gpus) == FAILSAFE_STATE  # failsafe caps in local mode too
    core.on_heartbeat(heartbeat(clock))  # a controller exists, but this agent is local
    assert core.mode == "local"
    ack = core.on_command(command(1, 1, *all_gpus(4, 600.0)))
    assert ack.result == "rejected"
    assert "local" in ack.errors[0].message
    assert ack.errors[0].index is None
    assert settings_of(gpus) == FAILSAFE_STATE
    assert core.counters.commands_refused == 1
    assert mode_after(clock, core, AFTER_S * 3) == "local"
    assert core.counters.failsafe_entries == 0
    assert core.telemetry().mode == "local"


# --- commands need a live leader ------------------------------------------------


def test_commands_refused_before_a_heartbeat(clock: ManualClock, node: Node) -> None:
    core, gpus = node
    ack = core.on_command(command(1, 1, *all_gpus(4, 600.0)))
    assert (ack.result, ack.epoch, ack.seq, ack.gpus) == ("rejected", 1, 1, [])
    assert "heartbeat" in ack.errors[0].message
    assert settings_of(gpus) == FAILSAFE_STATE
    assert core.counters.commands_refused == 1
    assert core.counters.payloads_rejected == 0  # well-formed: refused, not malformed
    # a refused command takes no place in the order: once the leader is live it applies
    core.on_heartbeat(heartbeat(clock))
    assert core.on_command(command(1, 1, *all_gpus(4, 600.0))).result == "applied"


def test_leader_heartbeat_makes_it_controlled(clock: ManualClock, node: Node) -> None:
    core, _ = node
    core.on_heartbeat(heartbeat(clock))
    assert core.mode == "controlled"
    assert core.controller_live()
    assert core.node_state == "online"
    assert core.telemetry().mode == "controlled"


@pytest.mark.parametrize("age_s", [0.0, AFTER_S, 3600.0, 86400.0 * 30, -20.0])
def test_a_retained_heartbeat_does_not_count(clock: ManualClock, node: Node, age_s: float) -> None:
    """Delivered on subscribe (retained): however fresh its ts, never liveness (a dead
    leader's, re-delivered at every resubscribe, kept agents out of failsafe)."""
    core, gpus = node
    core.on_heartbeat(heartbeat(clock, age_s=age_s), live=False)
    assert core.mode == "failsafe"
    assert core.counters.heartbeats_ignored == 1
    assert core.on_command(command(1, 1, *all_gpus(4, 600.0))).result == "rejected"
    assert settings_of(gpus) == FAILSAFE_STATE


@pytest.mark.parametrize("age_s", [0.0, 8.0, 3600.0, -20.0])
def test_a_live_heartbeat_counts_from_its_receipt_whatever_its_ts(
    clock: ManualClock, node: Node, age_s: float
) -> None:
    """A controller whose clock is behind (or a little ahead) is followed: liveness for
    failsafe_after_s of this node's monotonic clock from receipt, not from its ts."""
    core, _ = node
    core.on_heartbeat(heartbeat(clock, age_s=age_s))
    assert core.mode == "controlled"
    assert mode_after(clock, core, AFTER_S) == "controlled"
    assert mode_after(clock, core, 0.5) == "failsafe"


@pytest.mark.parametrize("ahead_s", [30.5, 300.0, 3600.0])
def test_a_heartbeat_from_the_future_is_a_clock_alarm(
    clock: ManualClock, node: Node, ahead_s: float
) -> None:
    """More than max_clock_skew_s (30 s) ahead: refused, counted, never liveness."""
    core, _ = node
    core.on_heartbeat(heartbeat(clock, age_s=-ahead_s))
    assert core.mode == "failsafe"
    assert core.counters.clock_alarms == 1
    assert core.skew.alarms == 1


def test_the_leaders_skew_is_measured_on_receipt(clock: ManualClock, node: Node) -> None:
    core, _ = node
    heartbeat_each_second(clock, core, 3, partial(heartbeat, age_s=3600.0))
    assert core.mode == "controlled"
    assert core.skew.skew_s["ctl-a"] == pytest.approx(3600.0)


def test_a_replayed_heartbeat_of_the_followed_epoch_is_no_liveness(
    clock: ManualClock, node: Node
) -> None:
    """Captured heartbeats of the current leader, replayed live after it died: not newer
    than the newest seen, so the node falls to failsafe on time."""
    core, _ = node
    captured = []
    for _ in range(5):
        clock.advance(1.0)
        captured.append(heartbeat(clock))
        core.on_heartbeat(captured[-1])
    for i in range(12):  # the leader is dead; someone replays what it sent
        clock.advance(1.0)
        core.on_heartbeat(captured[i % 5])
        core.tick()
    assert core.mode == "failsafe"
    assert core.counters.heartbeats_replayed == 12


def test_standby_heartbeats_do_not_count(clock: ManualClock, node: Node) -> None:
    core, gpus = node
    core.on_heartbeat(heartbeat(clock, epoch=1, state="standby"))
    assert core.mode == "failsafe"
    assert core.counters.heartbeats_ignored == 1
    assert core.on_command(command(1, 1, *all_gpus(4, 600.0))).result == "rejected"
    # nor do they keep a leader's liveness going
    core.on_heartbeat(heartbeat(clock, epoch=1))
    heartbeat_each_second(clock, core, 12, partial(heartbeat, epoch=1, state="standby"))
    assert core.mode == "failsafe"
    assert settings_of(gpus) == FAILSAFE_STATE


def test_heartbeats_of_an_older_epoch_are_ignored_while_the_newest_leader_lives(
    clock: ManualClock, node: Node
) -> None:
    core, _ = node
    for _ in range(12):
        clock.advance(1.0)
        core.on_heartbeat(heartbeat(clock, epoch=2))
        core.on_heartbeat(heartbeat(clock, epoch=1))  # the deposed controller
        core.tick()
    assert core.counters.heartbeats_ignored == 12
    assert core.counters.deposed_epochs == 0
    assert core.telemetry().epoch == 2


def test_a_deposed_epochs_live_leader_is_followed_once_the_newest_is_silent(
    clock: ManualClock, node: Node
) -> None:
    """The deposed-epoch rule (docs/PROTOCOL.md): the newest epoch's leader (say, one whose
    clock lifted its epoch) silent for failsafe_after_s, the node follows the live signed
    leader of a lower epoch and starts its command order afresh."""
    core, gpus = node
    core.on_heartbeat(heartbeat(clock, epoch=9))
    assert core.on_command(command(9, 50, *all_gpus(4, 600.0))).result == "applied"
    heartbeat_each_second(clock, core, 10, partial(heartbeat, epoch=3))  # 10 s: not yet
    assert core.counters.deposed_epochs == 0
    assert core.telemetry().epoch == 9
    heartbeat_each_second(clock, core, 1, partial(heartbeat, epoch=3))  # silent > 10 s
    assert core.counters.deposed_epochs == 1
    assert core.mode == "controlled"
    assert core.telemetry().epoch == 3
    assert core.on_command(command(3, 1, *all_gpus(4, 550.0))).result == "applied"
    assert all(g.power_limit_w() == 550.0 for g in gpus)


# --- losing the controller ---------------------------------------------------------


def test_no_heartbeat_for_failsafe_after_s_enters_failsafe(clock: ManualClock, node: Node) -> None:
    core, gpus = node
    controlled_with_command(clock, core)
    assert settings_of(gpus) == COMMANDED_STATE
    assert mode_after(clock, core, AFTER_S) == "controlled"  # exactly at the deadline: still live
    assert settings_of(gpus) == COMMANDED_STATE
    assert mode_after(clock, core, 0.5) == "failsafe"
    assert core.node_state == "failsafe"
    assert settings_of(gpus) == FAILSAFE_STATE
    assert core.counters.failsafe_entries == 1
    # commands are refused until a leader is back, and ticks do not re-enter
    assert core.on_command(command(1, 2, *all_gpus(4, 600.0))).result == "rejected"
    clock.advance(AFTER_S * 2)
    core.tick()
    assert core.counters.failsafe_entries == 1


def test_regular_heartbeats_keep_it_controlled(clock: ManualClock, node: Node) -> None:
    core, gpus = node
    controlled_with_command(clock, core, ttl_s=30.0)
    for second in range(1, 121):
        clock.advance(1.0)
        if second % 5 == 0:
            core.on_heartbeat(heartbeat(clock))
        core.tick()
        assert core.mode == "controlled", f"after {second} s"
    assert settings_of(gpus) == COMMANDED_STATE
    assert core.counters.failsafe_entries == 0


def test_command_ttl_expiry_enters_failsafe(clock: ManualClock, node: Node) -> None:
    core, gpus = node
    controlled_with_command(clock, core, ttl_s=3.0)
    assert mode_after(clock, core, 3.0) == "controlled"
    clock.advance(0.5)  # the heartbeat is still live (10 s), the command is not
    assert core.controller_live()
    core.tick()
    assert core.mode == "failsafe"
    assert settings_of(gpus) == FAILSAFE_STATE
    assert core.counters.failsafe_entries == 1


def test_command_ttl_is_refreshed_by_live_heartbeats(clock: ManualClock, node: Node) -> None:
    # docs/PROTOCOL.md: failsafe when no newer command *or heartbeat of a live
    # controller* arrives within ttl_s
    core, gpus = node
    controlled_with_command(clock, core, ttl_s=3.0)
    heartbeat_each_second(clock, core, 60)
    assert core.mode == "controlled"
    assert settings_of(gpus) == COMMANDED_STATE
    # once the heartbeats stop, the ttl (shorter than failsafe_after_s) expires first
    assert mode_after(clock, core, 3.5) == "failsafe"
    assert settings_of(gpus) == FAILSAFE_STATE


def test_stale_or_standby_heartbeats_do_not_refresh_the_ttl(clock: ManualClock, node: Node) -> None:
    core, _ = node
    controlled_with_command(clock, core, ttl_s=3.0)
    clock.advance(2.0)
    core.on_heartbeat(heartbeat(clock, state="standby"))
    core.on_heartbeat(heartbeat(clock, age_s=AFTER_S + 1))
    assert mode_after(clock, core, 1.5) == "failsafe"


def test_each_command_sets_its_own_ttl(clock: ManualClock, node: Node) -> None:
    core, _ = node
    controlled_with_command(clock, core, ttl_s=3.0)
    clock.advance(2.0)
    assert core.on_command(command(1, 2, *all_gpus(4, 310.0), ttl_s=5.0)).result == "applied"
    # 6.5 s after the first command, 4.5 s after the second
    assert mode_after(clock, core, 4.5) == "controlled"
    assert mode_after(clock, core, 1.0) == "failsafe"


def test_stale_command_does_not_extend_the_ttl(clock: ManualClock, node: Node) -> None:
    core, _ = node
    controlled_with_command(clock, core, ttl_s=3.0)
    clock.advance(2.0)
    assert core.on_command(command(1, 1, *all_gpus(4, 600.0), ttl_s=60.0)).result == "stale"
    assert mode_after(clock, core, 1.5) == "failsafe"


def test_ttl_is_measured_from_receipt_not_sender_ts(clock: ManualClock, node: Node) -> None:
    core, _ = node
    core.on_heartbeat(heartbeat(clock))
    # sent (by its ts) an hour ago: with a 5 s ttl it is still good for 5 s from now
    old = sign(
        COMMAND_TOPIC,
        encode(
            Command(v=1, epoch=1, seq=1, ts=clock.wall - 3600, ttl_s=5.0, gpus=all_gpus(4, 600.0))
        ),
    )
    assert core.on_command(old).result == "applied"
    assert mode_after(clock, core, 4.5) == "controlled"
    assert mode_after(clock, core, 1.0) == "failsafe"


# --- recovery -------------------------------------------------------------------


def test_heartbeat_returning_makes_it_controlled_again(clock: ManualClock, node: Node) -> None:
    core, gpus = node
    controlled_with_command(clock, core)
    assert mode_after(clock, core, AFTER_S + 1) == "failsafe"

    core.on_heartbeat(heartbeat(clock))
    assert core.mode == "controlled"
    assert core.node_state == "online"
    # failsafe caps stay until the controller says otherwise
    assert settings_of(gpus) == FAILSAFE_STATE
    assert core.on_command(command(1, 1, *all_gpus(4, 620.0))).result == "stale"
    assert core.on_command(command(1, 2, *all_gpus(4, 620.0))).result == "applied"
    assert [g.power_limit_w() for g in gpus] == [620.0] * 4

    # and a second loss is a second failsafe entry
    assert mode_after(clock, core, AFTER_S + 1) == "failsafe"
    assert settings_of(gpus) == FAILSAFE_STATE
    assert core.counters.failsafe_entries == 2


def test_a_heartbeat_read_after_a_stall_does_not_cover_it(clock: ManualClock, node: Node) -> None:
    """The agent itself stalled past its deadline (suspended, starved), no tick ran, and the
    first thing it reads is the backlog's heartbeat: failsafe first, then controlled."""
    core, gpus = node
    controlled_with_command(clock, core)
    clock.advance(AFTER_S + 1)  # no tick: the process was stopped
    core.on_heartbeat(heartbeat(clock))
    assert core.counters.failsafe_entries == 1
    assert settings_of(gpus) == FAILSAFE_STATE  # its caps came down on their own
    assert core.mode == "controlled"  # and it follows the live leader again


def test_failsafe_with_a_lost_gpu_still_protects_the_others(clock: ManualClock, node: Node) -> None:
    core, gpus = node
    controlled_with_command(clock, core)
    gpus[0].lose()
    assert mode_after(clock, core, AFTER_S + 1) == "failsafe"  # the tick does not raise
    assert settings_of(gpus[1:]) == FAILSAFE_STATE[1:]
    # telemetry leaves the lost GPU out and counts the failure
    telemetry = core.telemetry()
    assert [g.index for g in telemetry.gpus] == [1, 2, 3]
    assert core.counters.gpu_read_errors == 1


def test_failsafe_cuts_at_once_and_raises_what_was_below_it_later(
    clock: ManualClock, node: Node
) -> None:
    """Make before break on the agent's side: with the controller gone, a GPU whose cap is
    above its failsafe cap comes down at once; one below (a controller lent its watts to
    another GPU under the same breaker) rises only FAILSAFE_RAISE_SHARE of the deadline
    later, when every other agent has come down to its failsafe caps."""
    core, gpus = node
    core.on_heartbeat(heartbeat(clock))
    below = [
        GpuCommand(index=i, cap_w=300.0 if i < 2 else 650.0, max_sm_clock_mhz=1200)
        for i in range(4)
    ]
    assert core.on_command(command(1, 1, *below)).result == "applied"
    assert mode_after(clock, core, AFTER_S + 0.5) == "failsafe"
    assert settings_of(gpus) == [(300.0, None)] * 2 + [(FAILSAFE_W, None)] * 2
    assert mode_after(clock, core, FAILSAFE_RAISE_SHARE * AFTER_S - 0.1) == "failsafe"
    assert settings_of(gpus)[:2] == [(300.0, None)] * 2
    assert mode_after(clock, core, 0.2) == "failsafe"
    assert settings_of(gpus) == FAILSAFE_STATE
    # a controller back before the raise: it says what the GPUs hold, nothing rises
    core, gpus = node
    core.on_heartbeat(heartbeat(clock))
    assert core.on_command(command(1, 2, *all_gpus(4, 300.0))).result == "applied"
    assert mode_after(clock, core, AFTER_S + 0.5) == "failsafe"
    core.on_heartbeat(heartbeat(clock))
    assert mode_after(clock, core, FAILSAFE_RAISE_SHARE * AFTER_S + 0.1) == "controlled"
    assert [cap for cap, _ in settings_of(gpus)] == [300.0] * 4
