"""What the controller believes of what agents say (issue 12): a `stale` ack is not an applied
command, and a node whose agent holds a failsafe cap above the plan counts at its own."""

from __future__ import annotations

import numpy as np

from powerd.protocol import Status, encode
from tests.controller.test_controller_core import (
    FAILSAFE_W,
    NODES,
    WALL0,
    ack_payload,
    make_bench,
)


def status_with_failsafe(node: str, failsafe_cap_w: float) -> bytes:
    return encode(
        Status(
            v=1,
            node=node,
            state="online",
            ts=WALL0,
            gpus=2,
            agent_version="0.1.0",
            failsafe_cap_w=failsafe_cap_w,
        )
    )


def test_a_stale_ack_is_not_an_applied_command_and_it_is_asked_again() -> None:
    """Finding 1: a `stale` ack cleared the pending command as if applied, so a forged newer
    command held the node for as long as the epoch lasted."""
    bench = make_bench()
    bench.report_all(300.0)
    first = bench.cycle()
    node, command = first.commands[0]
    bench.apply(first, ack=False)
    acked_before = bench.core.counters.acks_received
    # the node says our newest command is stale: it holds a newer one of this epoch
    bench.core.on_ack(node, ack_payload(node, command, "stale"))
    assert bench.core.counters.acks_received == acked_before  # not counted as applied
    bench.report_all(300.0)
    again = bench.cycle(advance_s=1.0)
    assert again.counters.acks_stale == 1
    resent = [c for n, c in again.commands if n == node]
    assert resent and resent[0].seq > command.seq  # asked again, with a newer seq


def test_a_node_whose_agent_holds_more_than_planned_counts_at_its_own_when_silent() -> None:
    """Finding 4: racks were proven at the file's failsafe cap, agents held their own (higher)
    one; the controller counted silent nodes at the file's."""
    bench = make_bench()
    bench.report_all(300.0)
    bench.cycle()
    node = NODES[0]
    gpus = bench.gpus(node)
    bench.core.on_status(node, status_with_failsafe(node, FAILSAFE_W + 160.0))
    bench.core.on_status(NODES[1], status_with_failsafe(NODES[1], FAILSAFE_W))  # as planned
    # every node goes silent for longer than the agents' failsafe_after_s
    bench.clock.advance(60.0)
    counters = type(bench.core.counters)()
    state, _ = bench.core.cluster_state(bench.clock(), counters)
    assert counters.failsafe_over_plan == 1
    assert np.all(state.cap_w[gpus.start : gpus.stop] == FAILSAFE_W + 160.0)
    other = bench.gpus(NODES[1])
    assert np.all(state.cap_w[other.start : other.stop] == FAILSAFE_W)
    # the agent is fixed: it reports the plan's cap again, and counts at it
    bench.core.on_status(node, status_with_failsafe(node, FAILSAFE_W))
    counters = type(bench.core.counters)()
    state, _ = bench.core.cluster_state(bench.clock(), counters)
    assert counters.failsafe_over_plan == 0
    assert np.all(state.cap_w[gpus.start : gpus.stop] == FAILSAFE_W)
