"""Reloading the budgets file at run time (SIGHUP): numbers change at once, a file that
does not load or changes the tree's structure changes nothing."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from powerd.controller.reload import changes, refusal
from powerd.topology import parse_budgets
from tests.support.controller_harness import (
    BANDS,
    BANDS_TOML,
    NODES,
    RACKS,
    TOPICS,
    WAIT_S,
    budgets_toml,
    controller_toml,
    probe,
    running_agents,
    running_cluster,
    spawn_controller,
    until,
)

TEXT = budgets_toml()
LOWER = TEXT.replace("budget_w = 4000", "budget_w = 3000", 1)  # the first rack only
# A reloaded budget is enforced by the bands (BANDS): safety by caps, the default, keeps
# every level within its limit and has no use for a budget.


def test_numbers_may_change_structure_and_failsafe_caps_may_not():
    running, lower = parse_budgets(TEXT), parse_budgets(LOWER)
    assert refusal(running, lower) is None
    assert changes(running, lower) == ["r1-k1: budget_w 4000 -> 3000"]
    renamed = parse_budgets(TEXT.replace('"r1-k2-n2"', '"r1-k2-n9"'))
    assert "structure" in (refusal(running, renamed) or "")
    more_gpus = parse_budgets(TEXT.replace("gpus = 4", "gpus = 2", 1))
    assert "GPU count" in (refusal(running, more_gpus) or "")
    failsafe = parse_budgets(TEXT.replace("failsafe_cap_w = 500", "failsafe_cap_w = 450"))
    assert "failsafe cap" in (refusal(running, failsafe) or "")


@pytest.mark.asyncio
async def test_a_reloaded_budget_is_enforced_and_a_refused_one_changes_nothing(mosquitto):
    async with running_cluster(mosquitto, phase="compute", policy=BANDS) as c:
        ctl, rack = c.controller, c.controller.node(RACKS[0])
        overhead = float(c.topology.tree.overhead_below_w[rack])
        renamed = parse_budgets(LOWER.replace('"r1-k2-n2"', '"r1-k2-n9"'))
        assert ctl.service.reload(renamed) is not None
        assert ctl.core.tree.budget_w[rack] == 4000  # refused: nothing changed
        assert ctl.service.reload(parse_budgets(LOWER)) is None
        assert ctl.core.tree.budget_w[rack] == 3000
        assert ctl.core.tree.cap_threshold_w[rack] == pytest.approx(3000 * 0.98)
        # the agents of that rack are capped to it: caps plus overheads at its new target
        nodes = NODES[RACKS[0]]
        await c.agents.wait_for(
            lambda: sum(c.agents.caps(nodes)) + overhead <= 3000 * 0.95 + 1.0,
            what="the rack capped to its reloaded budget",
        )
        assert ctl.service.reloads == 1


@pytest.mark.asyncio
async def test_sighup_reloads_the_file_and_a_broken_file_leaves_the_budgets_in_force(
    mosquitto, tmp_path: Path
):
    budgets, config = tmp_path / "budgets.toml", tmp_path / "ctl.toml"
    budgets.write_text(TEXT)
    config.write_text(controller_toml(mosquitto, "ctl-a") + BANDS_TOML)
    log = tmp_path / "ctl.log"
    topology = parse_budgets(TEXT)
    async with probe(mosquitto) as p, running_agents(mosquitto, topology, "compute") as agents:
        ctl = spawn_controller(
            ["--config", str(config), "--budgets", str(budgets), "--log-level", "info"], log
        )
        try:
            await p.expect(TOPICS.heartbeat, timeout_s=30)
            rack = NODES[RACKS[0]]
            overhead = float(topology.tree.overhead_below_w[topology.node_index(RACKS[0])])
            await agents.wait_for(lambda: max(agents.caps()) < 700.0, what="capped")

            # a budget above its limit: TOML, but not a budgets file the loader takes
            budgets.write_text(TEXT.replace("budget_w = 4000", "budget_w = 7000", 1))
            ctl.send_signal(signal.SIGHUP)
            await until(lambda: "budgets reload refused" in log.read_text(), WAIT_S, "refused")
            assert "budget_w = 7000 W is above its limit_w" in log.read_text()  # the loader's
            assert ctl.poll() is None  # still running, and still leading:
            await p.expect(TOPICS.heartbeat, after=p.mark())

            budgets.write_text(LOWER)
            ctl.send_signal(signal.SIGHUP)
            await until(lambda: "budgets reloaded" in log.read_text(), WAIT_S, "reloaded")
            assert "r1-k1: budget_w 4000 -> 3000" in log.read_text()
            await agents.wait_for(
                lambda: sum(agents.caps(rack)) + overhead <= 3000 * 0.95 + 1.0,
                what="the rack capped to its reloaded budget",
            )
        finally:
            ctl.send_signal(signal.SIGTERM)
            ctl.wait(WAIT_S)
