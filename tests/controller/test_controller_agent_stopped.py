"""An agent process frozen (SIGSTOP) under a real controller, then resumed (issue 12's fault
suite): while frozen the controller counts its node at its caps and sends it nothing; resumed
past its failsafe_after_s it falls to its failsafe caps on its own, then follows the live
leader again and is commanded afresh. No tree node over its limit throughout."""

from __future__ import annotations

import asyncio
import signal

from powerd.protocol import Telemetry, decode
from powerd.topology import parse_budgets
from tests.agent.test_agent_process import NODE, start_agent, state_is
from tests.support.agent_harness import TOPICS, probe
from tests.support.controller_harness import (
    WAIT_S,
    ack_of,
    controller_config,
    running_controller,
)

FROZEN_S = 3.0  # past the agent's failsafe_after_s (2 s) and the controller's stale_after_s

BUDGETS = f"""
version = 1
[site]
name = "lab"
limit_w = 3000
budget_w = 2000
[models.H100]
failsafe_cap_w = 500
comm_clock_mhz = 1100
[[rows]]
name = "r1"
limit_w = 3000
budget_w = 2000
[[rows.racks]]
name = "k1"
limit_w = 3000
budget_w = 1200
[[rows.racks.nodes]]
name = "{NODE}"
gpus = 2
model = "H100"
overhead_w = 100
"""


def mode_of(message) -> str:
    return decode(Telemetry, message.payload, NODE).mode


async def test_a_frozen_agent_is_counted_at_its_caps_then_falls_to_failsafe_alone(
    mosquitto, tmp_path
):
    topology = parse_budgets(BUDGETS, source="<test budgets>")
    config = controller_config(
        mosquitto,
        cluster=TOPICS.cluster,
        stale_after_s=1.0,
        takeover_after_s=0.5,
        agent_failsafe_after_s=2.0,  # the agent's --failsafe-after-s
    )
    tree = topology.tree
    async with probe(mosquitto) as p, running_controller(mosquitto, topology, config) as ctl:
        agent = start_agent(mosquitto.url, tmp_path)
        try:
            await p.expect(TOPICS.ack(NODE), lambda m: ack_of(m).result == "applied", timeout_s=30)
            await p.expect(TOPICS.telemetry(NODE), lambda m: mode_of(m) == "controlled")
            agent.send_signal(signal.SIGSTOP)
            frozen_from = len(ctl.cycles)
            await asyncio.sleep(FROZEN_S)  # the fault lasts this long: nothing to wait for
            frozen = ctl.cycles[frozen_from:]
            resume_mark = p.mark()
            agent.send_signal(signal.SIGCONT)
            # on its own: failsafe first (its leader was silent to it for > 2 s), said on its
            # status whether its sample loop or the backlog's first heartbeat runs first ...
            await p.expect(TOPICS.status(NODE), state_is("failsafe"), after=resume_mark)
            # ... then the live leader again, and a fresh command applied
            back = await p.expect(
                TOPICS.telemetry(NODE), lambda m: mode_of(m) == "controlled", after=resume_mark
            )
            await p.expect(
                TOPICS.ack(NODE),
                lambda m: ack_of(m).result == "applied",
                after=p.messages.index(back),
                timeout_s=WAIT_S,
            )
            resumed = ctl.cycles[frozen_from + len(frozen) :]
        finally:
            agent.send_signal(signal.SIGCONT)
            agent.terminate()
            agent.wait(20)

    stale = [c for c in frozen if c.result.counters.stale_nodes == 1]
    assert stale, "the frozen node was never counted stale"
    first_stale = frozen.index(stale[0])
    # once stale: no command to it, and it is counted at (at least) its failsafe caps
    assert all(NODE not in dict(c.result.commands) for c in frozen[first_stale:])
    node = topology.node_index(NODE)
    assert all(c.decision.node_power_w[node] >= 2 * 500.0 for c in frozen[first_stale:])
    # no tree node over its limit, frozen or not
    for c in frozen + resumed:
        assert (c.decision.node_power_w <= tree.limit_w + 1e-6).all()
