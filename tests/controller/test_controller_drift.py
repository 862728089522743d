"""Drift: a node that holds other caps than commanded is commanded again, once per retry period,
and only on telemetry sampled after it acked our last command."""

from __future__ import annotations

import itertools

import pytest

from powerd.controller.core import CAP_SETTLE_S, DRIFT_RETRY_S
from tests.controller.test_controller_core import (
    BANDS,
    CAP_MAX_W,
    NODES,
    WALL0,
    Bench,
    caps_w,
    make_bench,
)

NODE = "k2-n1"  # in a rack with room: the decision is its maximum cap


@pytest.fixture
def bench() -> Bench:
    # the bands, whose decision for NODE is its maximum cap whatever it holds (safety by
    # caps, the default, takes caps a GPU holds below its entitlement and does not draw as
    # they are: it would command nothing back)
    b = make_bench(policy=BANDS)
    b.report_all(300.0, ts=WALL0)
    b.apply(b.cycle())  # every node commanded and acked (acks stamped WALL0)
    assert b.cycle(advance_s=1.0).commands == []
    return b


def report(bench: Bench, cap_w: float, ts: float, clock_mhz: int | None = None) -> None:
    for node in NODES:
        kw = {"cap_w": cap_w} if node == NODE else {}
        bench.report(node, 300.0, ts=ts, clock_mhz=clock_mhz if node == NODE else None, **kw)


def test_a_node_holding_other_caps_after_its_ack_is_commanded_again(bench: Bench) -> None:
    report(bench, 450.0, ts=WALL0 + 2.0)  # sampled after its ack: someone changed its caps
    result = bench.cycle(advance_s=1.0)
    assert [node for node, _ in result.commands] == [NODE]
    # from what it holds, handed back towards its maximum (uncapping steps)
    assert all(c > 450.0 for c in caps_w(dict(result.commands)[NODE]))
    assert result.counters.nodes_drifted == 1


def test_a_clock_lock_nobody_asked_for_is_drift_too(bench: Bench) -> None:
    report(bench, CAP_MAX_W, ts=WALL0 + 2.0, clock_mhz=900)
    result = bench.cycle(advance_s=1.0)
    (command,) = [c for node, c in result.commands if node == NODE]
    assert all(g.max_sm_clock_mhz is None for g in command.gpus)  # unlocked explicitly


def test_telemetry_sampled_before_the_ack_is_no_drift(bench: Bench) -> None:
    """Telemetry and acks come on two connections: a sample taken before the command was
    applied can be decoded after its ack. It says nothing about what the node holds now."""
    report(bench, 450.0, ts=WALL0 - 0.5)
    result = bench.cycle(advance_s=1.0)
    assert result.commands == [] and result.counters.nodes_drifted == 0
    gpus = bench.gpus(NODE)  # and its caps are still the ack's, not the old sample's
    assert list(bench.core.cap_w[gpus.start : gpus.stop]) == [CAP_MAX_W, CAP_MAX_W]


def test_no_drift_while_a_command_is_pending(bench: Bench) -> None:
    report(bench, 450.0, ts=WALL0 + 2.0)
    first = bench.cycle(advance_s=1.0)
    assert [n for n, _ in first.commands] == [NODE]  # not acked: pending
    report(bench, 450.0, ts=WALL0 + 3.0)  # still the old caps: the command is on its way
    assert bench.cycle(advance_s=1.0).commands == []


def test_a_node_that_keeps_refusing_is_retried_once_per_retry_period(bench: Bench) -> None:
    """A GPU that will not take the cap would drift every cycle: no command storm."""
    sent_at: list[float] = []
    ts = WALL0 + 2.0
    for _ in range(int(3 * DRIFT_RETRY_S)):
        report(bench, 450.0, ts=ts)
        result = bench.cycle(advance_s=1.0)
        for node, command in result.commands:
            assert node == NODE
            sent_at.append(bench.clock.t)
            bench.apply(result)  # acked, but the device keeps 450 W
            bench.caps[NODE] = [450.0, 450.0]
            del command
        ts += 1.0
    assert 3 <= len(sent_at) <= 4
    assert all(b - a >= DRIFT_RETRY_S for a, b in itertools.pairwise(sent_at))


@pytest.mark.parametrize("after_ack_s", [0.0, 0.05, CAP_SETTLE_S - 0.01])
def test_caps_read_back_just_after_the_ack_are_neither_drift_nor_taken(
    bench: Bench, after_ack_s: float
) -> None:
    """A GPU enforces a new limit ~0.1 s after it is set (an H200: up to 92 ms), so a sample
    taken right after the ack may still show the old cap: that is no drift."""
    report(bench, 450.0, ts=WALL0 + after_ack_s)
    result = bench.cycle(advance_s=1.0)
    assert result.commands == [] and result.counters.nodes_drifted == 0
    gpus = bench.gpus(NODE)
    assert list(bench.core.cap_w[gpus.start : gpus.stop]) == [CAP_MAX_W, CAP_MAX_W]
    report(bench, 450.0, ts=WALL0 + CAP_SETTLE_S)  # settled: it holds other caps
    assert [node for node, _ in bench.cycle(advance_s=1.0).commands] == [NODE]


@pytest.mark.parametrize("drifted_w", [450.0, CAP_MAX_W])
def test_a_drifted_cap_is_never_adopted_as_the_controllers_own(drifted_w: float) -> None:
    """A capped node found holding other caps (a replayed command applied, a hand-set cap)
    under safety by caps, the default: commanded back to the controller's caps, never
    re-decided from the drifted ones (which were taken as commanded: ratified, or stepped
    back up from over many cycles)."""
    capped = "k1-n1"
    bench = make_bench()
    bench.report_all(300.0, ts=WALL0)
    commanded = caps_w(bench.apply(bench.cycle())[capped])
    assert max(commanded) < CAP_MAX_W - 50.0
    assert bench.cycle(advance_s=1.0).commands == []
    for node in NODES:
        kw = {"cap_w": drifted_w} if node == capped else {}
        bench.report(node, 300.0, ts=WALL0 + 2.0, **kw)
    result = bench.cycle(advance_s=1.0)
    assert result.counters.nodes_drifted == 1
    assert caps_w(dict(result.commands)[capped]) == pytest.approx(commanded, abs=0.5)
