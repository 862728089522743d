"""Two jobs in one over-budget rack: the low-priority job's GPUs give their watts first.

Under the bands (``fast_uncap``): only they cap a rack over its budget, and rule 3b is
theirs; safety by caps, the default, orders its classes its own way
(tests/policies/test_policy_allocation.py)."""

from __future__ import annotations

import time

import numpy as np

from powerd.protocol import PhaseEvent, encode
from tests.support.controller_harness import (
    CAP_MAX_W,
    CAP_MIN_W,
    NODES,
    TOPICS,
    fast_uncap,
    node_of,
    probe,
    running_cluster,
    telemetry_of,
)

LOW_NODE, HIGH_NODE = NODES["r1-k1"]


def phase_event(job: str, phase: str, nodes: list[str], priority: str) -> bytes:
    return encode(
        PhaseEvent(v=1, job=job, ts=time.time(), phase=phase, nodes=nodes, priority=priority)  # type: ignore[arg-type]
    )


async def test_low_priority_job_is_capped_before_the_high_priority_one(mosquitto):
    async with (
        probe(mosquitto) as p,
        running_cluster(mosquitto, phase="idle", policy=fast_uncap()) as cluster,
    ):
        ctl, agents, tree = cluster.controller, cluster.agents, cluster.controller.core.tree
        rack = ctl.node("r1-k1")
        low, high = ctl.gpus_of([LOW_NODE]), ctl.gpus_of([HIGH_NODE])
        # high first, so that a mix-up of the two cannot pass for the ordering
        await p.publish(
            TOPICS.phase("train-big"), phase_event("train-big", "compute", [HIGH_NODE], "high")
        )
        await p.publish(TOPICS.phase("sweep"), phase_event("sweep", "compute", [LOW_NODE], "low"))
        await ctl.wait_for(lambda: {"train-big", "sweep"} <= set(ctl.core.jobs))
        assert ctl.core.job_of(LOW_NODE) == "sweep" and ctl.core.job_of(HIGH_NODE) == "train-big"
        await agents.wait_for(lambda: min(agents.caps()) == CAP_MAX_W, what="caps at max")

        first = len(ctl.cycles)
        agents.set_phase([LOW_NODE, HIGH_NODE], "compute")  # the rack: ~5.6 kW, budget 4 kW
        await ctl.wait_for(lambda: any(c.decision.node_capping[rack] for c in ctl.cycles[first:]))
        capping = next(c for c in ctl.cycles[first:] if c.decision.node_capping[rack])
        # the devices follow (their commands applied and acked, however loaded the machine),
        # then a few cycles more, in which the priorities must hold
        low_capped_w = CAP_MIN_W + 0.1 * (CAP_MAX_W - CAP_MIN_W)
        await agents.wait_for(
            lambda: max(agents.caps([LOW_NODE])) < low_capped_w, what="the low job capped"
        )
        await ctl.wait_cycles(4)
        settled = ctl.cycles[-1]
        low_caps = agents.caps([LOW_NODE])
        high_caps = agents.caps([HIGH_NODE])
        end = p.mark()  # later messages are the teardown (agents stopping at failsafe caps)

    d = capping.decision
    # the rack needed ~1.8 kW; the low job gives all it can (down to cap_min) first
    need = d.node_power_w[rack] - tree.cap_target_w[rack]
    assert need > 1000.0
    assert np.allclose(d.cap_w[low], CAP_MIN_W)
    # the high job gives only what the low job could not: far less per GPU
    low_cut = float(np.sum(CAP_MAX_W - d.cap_w[low]))
    high_cut = float(np.sum(CAP_MAX_W - d.cap_w[high]))
    assert low_cut > 4 * high_cut
    assert d.cap_w[high].min() > d.cap_w[low].max() + 300.0
    assert d.node_predicted_w[rack] <= tree.cap_target_w[rack] + 1e-6
    # the same on the devices, cycles later: the priorities held, the rack is under its budget
    assert max(low_caps) < min(high_caps)
    # between the bands, with the high job at what it draws, the low one may take back only
    # the rack's headroom to its target: a few watts a GPU
    assert max(low_caps) < low_capped_w
    assert min(high_caps) > 600.0
    assert settled.decision.node_power_w[rack] <= tree.budget_w[rack]
    # and the high job's GPUs kept running near full power
    last = {}
    for m in p.messages[:end]:
        if m.topic.endswith("/telemetry") and node_of(m.topic) == HIGH_NODE:
            last = {g.index: g.power_w for g in telemetry_of(m).gpus}
    assert min(last.values()) > 550.0


async def test_a_high_job_leaving_a_checkpoint_takes_the_watts_back_from_low(mosquitto):
    """The inversion rule 3b closes, on real agents: the high job checkpoints (staged caps)
    while the low job computes; back in compute the high job is held at its staged caps
    and the rack ends between its bands. The low job must give way."""
    async with (
        probe(mosquitto) as p,
        running_cluster(mosquitto, phase="idle", policy=fast_uncap()) as cluster,
    ):
        ctl, agents, tree = cluster.controller, cluster.agents, cluster.controller.core.tree
        rack = ctl.node("r1-k1")
        await p.publish(TOPICS.phase("sweep"), phase_event("sweep", "compute", [LOW_NODE], "low"))
        await p.publish(
            TOPICS.phase("train-big"),
            phase_event("train-big", "checkpoint", [HIGH_NODE], "high"),
        )
        agents.set_phase([LOW_NODE], "compute")
        agents.set_phase([HIGH_NODE], "checkpoint")
        staged_w = CAP_MIN_W + 0.25 * (CAP_MAX_W - CAP_MIN_W)  # startup_cap_fraction
        await agents.wait_for(
            lambda: max(agents.caps([HIGH_NODE])) <= staged_w + 1.0, what="staged caps"
        )
        # back to compute: the high job's GPUs draw all their staged caps allow
        first = len(ctl.cycles)
        await p.publish(
            TOPICS.phase("train-big"), phase_event("train-big", "compute", [HIGH_NODE], "high")
        )
        agents.set_phase([HIGH_NODE], "compute")
        await agents.wait_for(
            lambda: min(agents.caps([HIGH_NODE])) > 550.0 and max(agents.caps([LOW_NODE])) < 300.0,
            what="the high job's caps back above the low job's",
        )
        shifted = [c for c in ctl.cycles[first:] if c.decision.node_shift_w[rack] > 0]
        over_limit = [
            c for c in ctl.cycles[first:] if c.decision.node_power_w[rack] > tree.limit_w[rack]
        ]
    assert shifted, "the rack never shifted watts between priorities"
    assert not over_limit
