"""Grid smoothing end to end: a controller with ``grid_smoothing`` over a real broker, agents
on simulated GB200s (which have NVML power smoothing). Every GPU ends up holding the
controller's profile, reports it in telemetry, and keeps it when its agent stops."""

from __future__ import annotations

import pytest

from powerd.controller.app import build_service
from powerd.controller.config import ControllerConfig
from powerd.controller.smoothing import GRID_PRESET, grid_smoothing
from powerd.topology import BudgetError, parse_budgets
from tests.support.controller_harness import (
    SERVERS,
    TOPICS,
    budgets_toml,
    controller_config,
    probe,
    running_agents,
    running_controller,
    telemetry_of,
)

GRID = """
[site.grid]
ramp_up_kw_per_s = 2
ramp_down_kw_per_s = 1
floor_fraction = 0.5
"""


def gb200_budgets() -> str:
    text = budgets_toml().replace('model = "H100"', 'model = "GB200"')
    text = text.replace("[models.H100]", GRID + "\n[models.GB200]")
    return text


@pytest.mark.realtime  # nothing resent: every ack within ack_timeout_s, which the
# parallel stage's load broke once
async def test_agents_hold_the_controllers_profile_and_keep_it_when_they_stop(mosquitto):
    topology = parse_budgets(gb200_budgets(), source="<gb200 budgets>")
    profile = grid_smoothing(topology)
    n_gpus = topology.tree.n_gpus
    assert profile.ramp_down_w_per_s == pytest.approx(0.9 * 1000 / n_gpus)
    config = controller_config(mosquitto, grid_smoothing=True)
    async with probe(mosquitto) as p, running_agents(mosquitto, topology, "compute") as agents:
        before = {n: [g.smoothing() for g in agents.gpus[n]] for n in SERVERS}
        assert all(s is not None and not s.enabled for ss in before.values() for s in ss)
        async with running_controller(mosquitto, topology, config) as ctl:
            assert ctl.core.settings.smoothing == profile
            assert ctl.core.settings.policy.uncap_within_caps
            # the caps handed back rise no faster than the GPUs' share of the grid's ramp-up
            assert ctl.core.tree.ramp_w_per_s[0] == pytest.approx(0.9 * 2000.0)

            def held() -> bool:
                return all(
                    (s := g.smoothing()) is not None
                    and s.enabled
                    and s.preset == GRID_PRESET
                    and s.ramp_down_w_per_s == pytest.approx(profile.ramp_down_w_per_s)
                    and s.ramp_up_w_per_s == pytest.approx(profile.ramp_up_w_per_s)
                    and s.floor_percent == pytest.approx(profile.floor_percent)
                    for n in SERVERS
                    for g in agents.gpus[n]
                )

            await agents.wait_for(held, what="every GPU holds the grid profile")
            # telemetry says so, for every GPU of every node (it carries a state when it
            # changes and every SMOOTHING_STATE_EVERY_SAMPLES samples: the next that does)
            mark = p.mark()
            for node in SERVERS:
                message = await p.expect(
                    TOPICS.telemetry(node),
                    after=mark,
                    predicate=lambda m: all(g.smoothing for g in telemetry_of(m).gpus),
                )
                states = [g.smoothing for g in telemetry_of(message).gpus]
                assert all(s is not None and s.enabled for s in states), (node, states)
                assert {s.floor_percent for s in states if s} == {profile.floor_percent}
            counters = [c.result.counters for c in ctl.cycles]
            sent = sum(c.commands_sent for c in counters)
            # one command a node brings the profile with its caps; caps over the budget then
            # come down at the GPUs' ramp-down share, at most a command a node a cycle; no
            # flood, and nothing resent
            assert sent <= len(SERVERS) * len(counters), (sent, len(counters))
            assert sum(c.resends for c in counters) == 0
    # the agents stopped with on_exit = "keep" (the default): like their caps, the GPUs keep
    # the profile, so a restarting agent does not let the site's ramp loose (on_exit =
    # "restore" puts the smoothing found back: tests/agent/test_agent_smoothing.py)
    assert held()


def test_grid_smoothing_without_a_grid_spec_refuses_to_start():
    topology = parse_budgets(budgets_toml(), source="<no grid>")
    with pytest.raises(BudgetError, match=r"<no grid>: \[site.grid\]: grid smoothing"):
        build_service(ControllerConfig(grid_smoothing=True), topology)
