"""Acks and telemetry that come late, samples that are lost: no command takes away watts
that no rule of the policy took (a property).

Found at site scale over an oversubscribed broker (bench/RESULTS.md, "What cut over the
broker, found and fixed"): with acks seconds late, the policy decided from read-back caps
older than a raise in flight, and the controller "cut" the node back to them; with a
different share of nodes unheard every cycle, priority shifts and levellings were made on
nodes counted at their caps and undone when they were heard again. Here the agents apply
every command at once, but their acks arrive 0-3 cycles later and their samples 0-2 cycles
late (taken then, showing the caps they held then) or not at all, on the test tree, with raises bounded
to 2 a cycle (hand-backs in turn) and early cycles. Every command that leaves a GPU below
both what the controller last sent it and what its agent holds must be a cut that a rule
of ``policies.capping`` made this cycle (``cut_levels``, ``shifted``, ``levelled``).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerd.protocol import Command
from tests.controller.test_controller_core import (
    CAP_MAX_W,
    NODES,
    WALL0,
    ack_payload,
    caps_w,
    make_bench,
)

STEPS = 25
TOLERANCE_W = 1.0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_late_acks_and_lost_samples_take_no_watts_that_no_rule_took(data: st.DataObject) -> None:
    bench = make_bench(ack_timeout_s=3.0, command_ttl_s=30.0, max_raises_per_cycle=2)
    draw_w = {node: data.draw(st.floats(150.0, 650.0), label=node) for node in NODES}
    loss = data.draw(st.sampled_from([0.0, 0.3, 0.6]), label="loss")
    held: dict[str, list[list[float]]] = {node: [] for node in NODES}  # each step's caps
    walls: list[float] = []  # each step's wall time
    last_sent: dict[str, list[float]] = {}
    acks_due: list[tuple[int, str, Command, float]] = []
    unexplained: list[str] = []
    for step in range(STEPS):
        bench.clock.advance(data.draw(st.sampled_from([0.5, 1.0]), label="period"))
        now = WALL0 + bench.clock.t
        walls.append(now)
        for node in NODES:
            held[node].append(list(bench.caps.get(node, [CAP_MAX_W, CAP_MAX_W])))
        for due in [a for a in acks_due if a[0] <= step]:
            acks_due.remove(due)
            _, node, command, applied_at = due
            bench.core.on_ack(node, ack_payload(node, command, ts=applied_at))
        for node in NODES:
            if data.draw(st.floats(0.0, 1.0), label="lost") < loss:
                continue
            lag = min(data.draw(st.integers(0, 2), label="lag"), len(walls) - 1)
            bench.report(node, draw_w[node], cap_w=held[node][-1 - lag], ts=walls[-1 - lag])
        result = bench.cycle()
        decision = result.decision
        for node, command in result.commands:
            gpus = bench.gpus(node)
            before, holds = last_sent.get(node), held[node][-1]
            for local, cap_w in enumerate(caps_w(command)):
                i = gpus.start + local
                lowest = holds[local] if before is None else min(before[local], holds[local])
                explained = decision.cut_levels[i] or decision.shifted[i] or decision.levelled[i]
                if cap_w < lowest - TOLERANCE_W and not explained:
                    unexplained.append(
                        f"step {step}: {node} gpu {local} to {cap_w:.1f} W, sent "
                        f"{before and before[local]}, holds {holds[local]:.1f} W"
                    )
            last_sent[node] = caps_w(command)
        for node, command in bench.apply(result, ack=False).items():  # applied at once
            delay = data.draw(st.integers(0, 3), label="ack delay")
            acks_due.append((step + delay, node, command, now))
    assert unexplained == []
