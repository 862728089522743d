"""Safety by caps with real processes: a controller (``[policy] safety_by_caps``) lends an
idle node's watts to a computing one under a tight rack breaker, the work moves, and the
controller is killed with SIGKILL in the middle of moving the watts back. Real agents on
simulated GPUs, real Mosquitto, the controller a process of its own.

Over the whole run, on the wire: every rack, the row and the site hold their caps in
force within their limits, with a GPU counted at the higher of what it last reported and
what it was last commanded (a command in flight may land at any time), and after the kill
the agents reach their failsafe caps without a moment over a limit (cuts first)."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np

from policies import PolicySettings
from powerd.protocol import Command, decode
from powerd.topology import parse_budgets
from tests.support.controller_harness import (
    FAILSAFE_CAP_W,
    TOPICS,
    WAIT_S,
    ack_of,
    budgets_toml,
    controller_toml,
    node_of,
    probe,
    running_agents,
    spawn_controller,
    telemetry_of,
)

# 8 H100 a rack, 200 W of overhead a node and 100 W a rack: at the 500 W failsafe caps
# 4,500 W, at their 700 W maximum 6,100 W; the breaker takes 5,000 W, so one node may
# run at its maximum only with watts its rack sibling lends.
RACK_LIMIT_W = 5000.0
LENDER, BORROWER = "r1-k1-n2", "r1-k1-n1"


def tight_budgets() -> str:
    return budgets_toml().replace("limit_w = 6200", f"limit_w = {RACK_LIMIT_W:g}")


async def test_caps_in_force_fit_every_limit_through_a_reallocation_and_a_kill(
    mosquitto, tmp_path: Path
) -> None:
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(tight_budgets())
    topology = parse_budgets(budgets.read_text())
    tree = topology.tree
    config = tmp_path / "ctl.toml"
    config.write_text(controller_toml(mosquitto, "ctl-a") + "\n[policy]\nsafety_by_caps = true\n")

    async with probe(mosquitto) as p, running_agents(mosquitto, topology, "idle") as agents:
        agents.set_phase([BORROWER], "compute")
        ctl = spawn_controller(
            ["--config", str(config), "--budgets", str(budgets), "--log-level", "warning"],
            tmp_path / "ctl.log",
        )
        try:
            # the idle node lends (once idle for lend_after_s, after the controller is up):
            # the computing one runs above its failsafe cap
            await agents.wait_for(
                lambda: min(agents.caps([BORROWER])) > 650.0,
                timeout_s=WAIT_S + PolicySettings().lend_after_s,
                what="the borrower raised",
            )
            lent = agents.caps([LENDER])
            # the work moves: the borrower idles, the lender computes; killed as soon as
            # the controller commands the first cut of that reallocation
            mark = p.mark()
            agents.set_phase([BORROWER], "idle")
            agents.set_phase([LENDER], "compute")
            first = await p.expect(TOPICS.command(BORROWER), after=mark, timeout_s=WAIT_S)
            ctl.send_signal(signal.SIGKILL)
            ctl.wait(WAIT_S)
        finally:
            ctl.kill()
            ctl.wait(WAIT_S)
        # alone, every agent ends at its failsafe caps (the lender's raise waits)
        await agents.wait_for(
            lambda: agents.caps() == [FAILSAFE_CAP_W] * topology.n_gpus,
            timeout_s=WAIT_S,
            what="every GPU at its failsafe cap",
        )
        messages = list(p.messages)

    assert max(lent) < FAILSAFE_CAP_W  # it had lent below its failsafe cap
    first_caps = [g.cap_w for g in decode(Command, first.payload).gpus]
    assert all(isinstance(c, float) and c < 650.0 for c in first_caps)  # a cut
    assert ctl.returncode == -signal.SIGKILL

    # the invariant, on the wire, at every message
    start = {n: topology.server_gpus(n).start for n in topology.servers}
    reported = np.full(topology.n_gpus, np.nan)
    commanded = np.full(topology.n_gpus, -np.inf)
    overhead = tree.overhead_below_w
    checked = 0
    for m in messages:
        kind = m.topic.rsplit("/", 1)[-1]
        if kind == "command":
            for entry in decode(Command, m.payload).gpus:
                if isinstance(entry.cap_w, float):
                    commanded[start[node_of(m.topic)] + entry.index] = entry.cap_w
        elif kind == "ack":
            for answer in ack_of(m).gpus:
                if answer.cap_w is not None:
                    reported[start[node_of(m.topic)] + answer.index] = answer.cap_w
        elif kind == "telemetry":
            t = telemetry_of(m)
            for sample in t.gpus:
                reported[start[t.node] + sample.index] = sample.cap_w
            if t.mode == "failsafe":  # no command of the dead controller holds any more
                gpus = topology.server_gpus(t.node)
                commanded[gpus.start : gpus.stop] = -np.inf
        else:
            continue
        if np.isnan(reported).any():
            continue  # not every node heard from yet
        checked += 1
        in_force = tree.node_sum(np.maximum(reported, commanded)) + overhead
        assert np.all(in_force <= tree.limit_w + 1e-6), dict(
            zip(topology.names, in_force - tree.limit_w, strict=True)
        )
        # and what the devices reported alone (the agents' own moves: failsafe)
        assert np.all(tree.node_sum(reported) + overhead <= tree.limit_w + 1e-6)
    assert checked > 50
