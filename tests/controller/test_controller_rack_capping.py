"""A rack pushed over its budget is back under it within two control cycles, and only it is capped.

Under the bands (``fast_uncap``): safety by caps, the default, holds a rack within its
limit by its caps, not under its budget."""

from __future__ import annotations

import numpy as np

from tests.support.controller_harness import (
    CAP_MAX_W,
    NODES,
    fast_uncap,
    node_of,
    probe,
    running_cluster,
    telemetry_of,
)


async def test_rack_over_budget_is_back_under_within_two_cycles(mosquitto):
    async with (
        probe(mosquitto) as p,
        running_cluster(mosquitto, phase="idle", policy=fast_uncap()) as cluster,
    ):
        ctl, agents, tree = cluster.controller, cluster.agents, cluster.controller.core.tree
        rack, other = ctl.node("r1-k1"), ctl.node("r1-k2")
        rack_gpus, other_gpus = ctl.gpus_of(NODES["r1-k1"]), ctl.gpus_of(NODES["r1-k2"])
        # idle: every cap handed back up to the maximum, on the devices too
        await agents.wait_for(lambda: min(agents.caps()) == CAP_MAX_W, what="caps at max")
        await ctl.wait_cycles(1)

        first = len(ctl.cycles)
        agents.set_phase(NODES["r1-k1"], "compute")  # 8 GPUs at ~638 W: ~5.6 kW
        await ctl.wait_for(
            lambda: any(
                c.decision.node_power_w[rack] > tree.cap_threshold_w[rack]
                for c in ctl.cycles[first:]
            )
        )
        over = next(
            k
            for k in range(first, len(ctl.cycles))
            if ctl.cycles[k].decision.node_power_w[rack] > tree.cap_threshold_w[rack]
        )
        await ctl.wait_for(lambda: len(ctl.cycles) >= over + 6)
        cycles = ctl.cycles[over : over + 6]
        end = p.mark()  # later messages are the teardown (agents stopping at failsafe caps)

    saw = cycles[0].decision
    # it was really over: above the budget
    assert saw.node_power_w[rack] > tree.budget_w[rack]
    assert saw.node_capping[rack]
    # the cycle that saw it commanded caps that bring it to the capping target
    assert saw.node_predicted_w[rack] <= tree.cap_target_w[rack] + 1e-6
    assert np.all(saw.cap_w[rack_gpus] < CAP_MAX_W)
    sent = {node for node, _ in cycles[0].result.commands}
    assert set(NODES["r1-k1"]) <= sent
    # two cycles later at the latest the measured power is under the budget, and stays there
    measured = [float(c.decision.node_power_w[rack]) for c in cycles]
    assert min(measured[1:3]) <= tree.budget_w[rack], measured
    assert max(measured[2:]) <= tree.budget_w[rack], measured
    assert not any(c.decision.node_capping[rack] for c in cycles[2:]), measured
    # the other rack, idle, was not touched
    for c in cycles:
        assert np.all(c.decision.cap_w[other_gpus] == CAP_MAX_W)
        assert not c.decision.node_capping[other]

    # the agents' own telemetry agrees: from two cycles after the overload on, the rack's
    # GPUs plus its overheads draw less than the budget
    overhead = float(tree.overhead_below_w[rack])
    after = cycles[2].mono
    latest: dict[str, float] = {}
    checked = 0
    for m in p.messages[:end]:
        if not m.topic.endswith("/telemetry") or node_of(m.topic) not in NODES["r1-k1"]:
            continue
        t = telemetry_of(m)
        latest[t.node] = sum(g.power_w for g in t.gpus)
        if m.at > after and len(latest) == 2:
            assert sum(latest.values()) + overhead <= tree.budget_w[rack]
            checked += 1
    assert checked >= 3
