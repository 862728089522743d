"""When load falls, caps come back gradually: the site's cap sum rises within its ramp limit.

Under the bands (``fast_uncap``), which cap the racks in compute and hand the watts back as
the load falls; under safety by caps, the default, idle GPUs keep their caps or lend them."""

from __future__ import annotations

import itertools

import numpy as np

from tests.support.controller_harness import (
    CAP_MAX_W,
    CYCLE_S,
    SERVERS,
    TOPICS,
    budgets_toml,
    fast_uncap,
    probe,
    running_cluster,
    telemetry_of,
)

SITE_RAMP_W_PER_S = 3000.0  # 750 W a cycle; the 16 GPUs are ~4.6 kW below their maximum
# Devices hold caps in whole mW: a cap read back may be up to 0.5 mW above the one commanded.
ROUNDING_W = 16 * 0.001


async def test_caps_come_back_within_the_site_ramp_limit(mosquitto):
    budgets = budgets_toml(site_ramp_w_per_s=SITE_RAMP_W_PER_S)
    # uncap_step_fraction 1: every GPU asks for its whole gap, so only the ramp limit holds it
    async with (
        probe(mosquitto) as p,
        running_cluster(mosquitto, budgets, phase="compute", policy=fast_uncap()) as cluster,
    ):
        ctl, agents = cluster.controller, cluster.agents
        racks = [ctl.node("r1-k1"), ctl.node("r1-k2")]
        # both racks in compute: capped below the failsafe caps, on the devices too
        await agents.wait_for(lambda: max(agents.caps()) < 450.0, what="racks capped")
        await ctl.wait_cycles(2)
        capped_sum = sum(agents.caps())

        agents.set_phase(SERVERS, "idle")  # the load falls
        fell_at = len(ctl.cycles)
        await ctl.wait_for(lambda: np.all(ctl.core.cap_w == CAP_MAX_W))
        await agents.wait_for(lambda: min(agents.caps()) == CAP_MAX_W, what="caps back at max")
        cycles = ctl.cycles[fell_at - 1 :]
        # the probe sees the devices' caps through telemetry, a sample later: wait for every
        # node's report of its caps at max before leaving (the probe stops with the block)
        mark = p.mark()
        for node in SERVERS:
            await p.expect(
                TOPICS.telemetry(node),
                lambda m: all(g.cap_w == CAP_MAX_W for g in telemetry_of(m).gpus),
                after=mark,
            )
        end = p.mark()  # what came later is the teardown (agents stopping at failsafe caps)

    # per cycle, the sum of caps under the site rises by at most ramp * dt
    sums = [float(np.sum(c.decision.cap_w)) for c in cycles]
    rises = [b - a for a, b in itertools.pairwise(sums)]
    for c, rise in zip(cycles[1:], rises, strict=True):
        assert rise <= SITE_RAMP_W_PER_S * c.dt_s + ROUNDING_W, (rise, c.dt_s)
        assert not c.decision.node_capping[racks].any()
    # gradual: the ramp limit held it back (rises at the limit), over many cycles
    total = sums[-1] - sums[0]
    assert total > 0.9 * (16 * CAP_MAX_W - capped_sum)
    binding = [
        r for c, r in zip(cycles[1:], rises, strict=True) if r > 0.99 * SITE_RAMP_W_PER_S * c.dt_s
    ]
    assert len(binding) >= 3, rises
    assert len([r for r in rises if r > 0]) >= total / (SITE_RAMP_W_PER_S * 2 * CYCLE_S)
    assert sums[-1] == 16 * CAP_MAX_W  # and all the way back up

    # what the devices enforced (agents' telemetry) rose no faster either: between any two
    # moments, by at most the ramp over the time between them plus one cycle's step
    caps: dict[str, list[float]] = {}
    points: list[tuple[float, float]] = []
    for m in p.messages[:end]:
        if not m.topic.endswith("/telemetry"):
            continue
        t = telemetry_of(m)
        caps[t.node] = [g.cap_w for g in t.gpus]
        if len(caps) == len(SERVERS) and m.at >= cycles[0].mono:
            points.append((m.at, sum(sum(c) for c in caps.values())))
    assert len(points) > 10
    step = SITE_RAMP_W_PER_S * max(c.dt_s for c in cycles)
    # total(t2) - total(t1) <= ramp * (t2 - t1) + step for all t1 < t2, i.e. g(t) = total - ramp * t
    # never exceeds its running minimum by more than one step
    lowest = float("inf")
    for at, total_w in points:
        g = total_w - SITE_RAMP_W_PER_S * at
        lowest = min(lowest, g)
        assert g - lowest <= step + ROUNDING_W, (at, total_w)
    assert points[-1][1] == 16 * CAP_MAX_W
