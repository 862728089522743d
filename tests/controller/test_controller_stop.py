"""A clean stop hands over on the link the controller led on: the control loop does not end
its session at the stop flag (that closed the link under the step-down, so no standby
heartbeat went out and the standby waited ``takeover_after_s``; seen once in a loaded CI run)."""

from __future__ import annotations

from powerd.topology import parse_budgets
from tests.support.controller_harness import (
    TOPICS,
    budgets_toml,
    controller_config,
    heartbeat_of,
    probe,
    running_controller,
)


def beat_state(state: str):
    return lambda m: heartbeat_of(m).controller == "ctl-a" and heartbeat_of(m).state == state


async def test_a_stopping_controller_keeps_its_link_until_it_has_stepped_down(mosquitto):
    topology = parse_budgets(budgets_toml(), source="<test budgets>")
    config = controller_config(mosquitto, name="ctl-a")
    async with probe(mosquitto) as p, running_controller(mosquitto, topology, config) as a:
        mark = p.mark()
        # what the shell does first on a stop, before it cancels the service's other tasks
        a.service.lead.stopping = True
        a.service._decide_now.set()  # and the control loop wakes meanwhile (a cycle due)
        # its session goes on: still connected, still beating as the leader
        await p.expect(TOPICS.heartbeat, beat_state("leader"), after=mark)
        assert a.service.control.connected.is_set()
        assert a.service.leadership.leading
        cycles = len(a.cycles)
    # then the stop itself: the standby heartbeat goes out on that link, retained
    standby = await p.expect(TOPICS.heartbeat, beat_state("standby"), after=mark)
    assert heartbeat_of(standby).epoch == a.core.epoch
    assert len(a.cycles) == cycles  # no cycle (no command) once stopping
