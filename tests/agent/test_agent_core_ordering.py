"""AgentCore applies commands only in (epoch, seq) order; partial commands leave the rest alone."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerd.protocol import Ack, GpuCommand, encode
from tests.support.agent_core_harness import (
    FAILSAFE_W,
    NODE,
    Node,
    cap,
    command,
    controlled_core,
    core_clock,
    heartbeat,
    settings_of,
)
from tests.support.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return core_clock()


@pytest.fixture
def node(clock: ManualClock) -> Node:
    """A started core on 4 simulated H100s, following a live leader of epoch 1."""
    return controlled_core(clock)


def assert_stale(ack: Ack, epoch: int, seq: int) -> None:
    assert ack.result == "stale"
    assert (ack.epoch, ack.seq) == (epoch, seq)
    assert ack.gpus == []
    assert ack.errors == []


def test_commands_in_order_apply(node: Node) -> None:
    core, gpus = node
    assert core.on_command(command(1, 1, cap(0, 300.0))).result == "applied"
    assert core.on_command(command(1, 2, cap(0, 350.0))).result == "applied"
    assert core.on_command(command(1, 10, cap(0, 400.0))).result == "applied"  # gaps are fine
    assert gpus[0].power_limit_w() == 400.0
    assert core.counters.commands_applied == 3
    assert core.counters.commands_stale == 0


def test_ack_describes_the_command(clock: ManualClock, node: Node) -> None:
    core, _ = node
    clock.advance(0.25)
    ack = core.on_command(command(1, 7, GpuCommand(index=2, cap_w=610.0, max_sm_clock_mhz=1410)))
    assert (ack.v, ack.node, ack.epoch, ack.seq, ack.result) == (1, NODE, 1, 7, "applied")
    assert ack.ts == clock.wall
    assert [(g.index, g.cap_w, g.max_sm_clock_mhz, g.clamped) for g in ack.gpus] == [
        (2, 610.0, 1410, False)
    ]
    assert ack.errors == []
    encode(ack)  # a valid payload


def test_same_order_is_stale_and_changes_nothing(node: Node) -> None:
    core, gpus = node
    core.on_command(command(1, 5, cap(0, 300.0)))
    before = settings_of(gpus)
    ack = core.on_command(command(1, 5, cap(0, 400.0), GpuCommand(index=1, max_sm_clock_mhz=900)))
    assert_stale(ack, 1, 5)
    assert settings_of(gpus) == before
    assert core.counters.commands_stale == 1
    assert core.counters.commands_applied == 1


def test_lower_seq_is_stale(node: Node) -> None:
    core, gpus = node
    core.on_command(command(1, 5, cap(0, 300.0)))
    for seq in (4, 0):
        assert_stale(core.on_command(command(1, seq, cap(0, 400.0))), 1, seq)
    assert gpus[0].power_limit_w() == 300.0
    assert core.counters.commands_stale == 2


def test_lower_epoch_is_stale_whatever_its_seq(clock: ManualClock, node: Node) -> None:
    core, gpus = node
    core.on_command(command(1, 3, cap(0, 300.0)))
    core.on_heartbeat(heartbeat(clock, 2))  # failover: a new controller incarnation
    assert core.on_command(command(2, 0, cap(0, 320.0))).result == "applied"
    # the old controller, still sending with a higher seq, is stale
    assert_stale(core.on_command(command(1, 1_000_000, cap(0, 690.0))), 1, 1_000_000)
    assert gpus[0].power_limit_w() == 320.0


def test_epoch_below_newest_heartbeat_is_stale_before_any_command(
    clock: ManualClock, node: Node
) -> None:
    core, gpus = node
    core.on_heartbeat(heartbeat(clock, 3))
    before = settings_of(gpus)
    assert_stale(core.on_command(command(2, 50, cap(0, 300.0))), 2, 50)
    assert settings_of(gpus) == before
    # a stale command does not move the order: the leader's (3, 0) still applies
    assert core.on_command(command(3, 0, cap(0, 300.0))).result == "applied"
    assert gpus[0].power_limit_w() == 300.0


def test_higher_epoch_accepted_with_any_seq(clock: ManualClock, node: Node) -> None:
    core, gpus = node
    assert core.on_command(command(1, 1000, cap(0, 300.0))).result == "applied"
    core.on_heartbeat(heartbeat(clock, 2))
    assert core.on_command(command(2, 0, cap(0, 310.0))).result == "applied"
    assert gpus[0].power_limit_w() == 310.0
    # an epoch above the newest heartbeat's is a newer controller too
    assert core.on_command(command(9, 0, cap(0, 320.0))).result == "applied"
    assert gpus[0].power_limit_w() == 320.0
    assert_stale(core.on_command(command(2, 1, cap(0, 330.0))), 2, 1)


def test_heartbeat_of_an_older_epoch_is_ignored_after_a_newer_command(
    clock: ManualClock, node: Node
) -> None:
    core, _ = node
    core.on_command(command(4, 0, cap(0, 300.0)))
    ignored = core.counters.heartbeats_ignored
    clock.advance(0.5)
    core.on_heartbeat(heartbeat(clock, 1))
    assert core.counters.heartbeats_ignored == ignored + 1


def test_out_of_order_delivery(node: Node) -> None:
    core, gpus = node
    deliveries = [(1, 1), (1, 3), (1, 2), (2, 0), (1, 4), (2, 1), (2, 1), (2, 2)]
    results = []
    for epoch, seq in deliveries:
        cap_w = 200.0 + 10 * epoch + seq  # tells which command set the cap
        results.append(core.on_command(command(epoch, seq, cap(0, cap_w))).result)
    assert results == [
        "applied",
        "applied",
        "stale",
        "applied",
        "stale",
        "applied",
        "stale",
        "applied",
    ]
    assert gpus[0].power_limit_w() == 200.0 + 20 + 2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 4)), min_size=1, max_size=12))
def test_only_increasing_orders_apply(orders: list[tuple[int, int]]) -> None:
    core, gpus = controlled_core(core_clock(), "1xH100")
    newest: tuple[int, int] | None = None
    expected_cap = FAILSAFE_W
    for epoch, seq in orders:
        cap_w = 300.0 + 20 * epoch + seq
        ack = core.on_command(command(epoch, seq, cap(0, cap_w)))
        if newest is None or (epoch, seq) > newest:
            assert ack.result == "applied"
            newest, expected_cap = (epoch, seq), cap_w
        else:
            assert ack.result == "stale"
        assert gpus[0].power_limit_w() == expected_cap


# --- GPUs and fields left out ------------------------------------------------


def test_gpus_left_out_keep_their_settings(node: Node) -> None:
    core, gpus = node
    core.on_command(
        command(
            1,
            1,
            GpuCommand(index=0, cap_w=300.0, max_sm_clock_mhz=1200),
            GpuCommand(index=1, cap_w=350.0, max_sm_clock_mhz=1300),
        )
    )
    ack = core.on_command(command(1, 2, cap(0, 400.0)))
    assert [g.index for g in ack.gpus] == [0]
    assert settings_of(gpus) == [
        (400.0, 1200),  # cap changed, lock absent: kept
        (350.0, 1300),  # left out: unchanged
        (FAILSAFE_W, None),
        (FAILSAFE_W, None),
    ]


def test_empty_gpu_list_changes_nothing_but_counts(node: Node) -> None:
    core, gpus = node
    before = settings_of(gpus)
    ack = core.on_command(command(1, 1))
    assert (ack.result, ack.gpus, ack.errors) == ("applied", [], [])
    assert settings_of(gpus) == before
    assert core.on_command(command(1, 1)).result == "stale"  # it still took its place in order


def test_cap_absent_leaves_the_cap(node: Node) -> None:
    core, gpus = node
    core.on_command(command(1, 1, cap(0, 300.0)))
    ack = core.on_command(command(1, 2, GpuCommand(index=0, max_sm_clock_mhz=1000)))
    assert settings_of(gpus)[0] == (300.0, 1000)
    assert (ack.gpus[0].cap_w, ack.gpus[0].max_sm_clock_mhz) == (300.0, 1000)


def test_clock_lock_absent_null_and_value(node: Node) -> None:
    core, gpus = node
    # a value locks
    ack = core.on_command(command(1, 1, GpuCommand(index=0, max_sm_clock_mhz=1410)))
    assert gpus[0].locked_max_sm_clock_mhz() == 1410
    assert (ack.gpus[0].max_sm_clock_mhz, ack.gpus[0].clamped) == (1410, False)
    # absent leaves it
    core.on_command(command(1, 2, cap(0, 450.0)))
    assert gpus[0].locked_max_sm_clock_mhz() == 1410
    # null removes it
    ack = core.on_command(command(1, 3, GpuCommand(index=0, max_sm_clock_mhz=None)))
    assert gpus[0].locked_max_sm_clock_mhz() is None
    assert ack.gpus[0].max_sm_clock_mhz is None
    assert ack.gpus[0].clamped is False
    assert gpus[0].power_limit_w() == 450.0
    # null on an unlocked GPU is fine too
    assert core.on_command(command(1, 4, GpuCommand(index=0, max_sm_clock_mhz=None))).result == (
        "applied"
    )


def test_null_clock_is_sent_as_null() -> None:
    # the distinction absent / null must survive encoding, or the tests above prove nothing
    assert b'"max_sm_clock_mhz":null' in command(1, 1, GpuCommand(index=0, max_sm_clock_mhz=None))
    assert b"max_sm_clock_mhz" not in command(1, 1, cap(0, 300.0))


@pytest.mark.parametrize(
    ("asked", "locked", "clamped"),
    [
        (5000, 1980, True),  # H100 SM clock range is 345..1980 MHz
        (1981, 1980, True),
        (100, 345, True),
        (1, 345, True),
        (345, 345, False),
        (1980, 1980, False),
        (1410.4, 1410, False),  # whole MHz
    ],
)
def test_clock_lock_clamped_into_range(
    node: Node, asked: float, locked: int, clamped: bool
) -> None:
    core, gpus = node
    ack = core.on_command(command(1, 1, GpuCommand(index=3, max_sm_clock_mhz=asked)))
    assert ack.result == "applied"
    assert gpus[3].locked_max_sm_clock_mhz() == locked
    assert (ack.gpus[0].max_sm_clock_mhz, ack.gpus[0].clamped) == (locked, clamped)
