"""A leader that loses the broker learns, when it is back, who leads now: a standby that took
over meanwhile keeps the lead (issue 12, finding 6: the heartbeat-seen flag was never cleared,
so a reconnected controller led at once and two leaders shared the site)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from powerd.protocol import Heartbeat, encode
from powerd.topology import parse_budgets
from tests.support.controller_harness import (
    TOPICS,
    WAIT_S,
    budgets_toml,
    controller_config,
    heartbeat_of,
    probe,
    running_controller,
    until,
)
from tests.support.keys import sign

OUTAGE_S = 1.5  # the reconnect delay: long enough for a standby to take over meanwhile


async def test_a_reconnected_leader_defers_to_the_standby_that_took_over(mosquitto):
    config = controller_config(mosquitto, name="ctl-a")
    config = replace(
        config, broker=replace(config.broker, reconnect_min_s=OUTAGE_S, reconnect_max_s=OUTAGE_S)
    )
    topology = parse_budgets(budgets_toml(), source="<test budgets>")
    async with probe(mosquitto) as p, running_controller(mosquitto, topology, config) as a:
        epoch_a = a.core.epoch
        link = a.service.control
        sessions = a.service.control_stats.sessions
        link.close()  # the broker connection breaks
        await until(lambda: not a.service.leading.is_set(), what="A noticed")
        # the broker lost its retained messages meanwhile (restarted without persistence):
        # an empty retained payload deletes A's retained heartbeat
        await p.publish(TOPICS.heartbeat, b"", retain=True)

        # and ctl-b, its standby, took over: signed, live heartbeats every 0.2 s (not retained
        # here, so that A hears one only by waiting for it, epoch_discovery_s = 0.3 s, before
        # it decides whether to lead)
        async def standby_leads() -> None:
            while True:
                beat = Heartbeat(
                    v=1, epoch=epoch_a + 1, ts=time.time(), controller="ctl-b", state="leader"
                )
                await p.publish(TOPICS.heartbeat, sign(TOPICS.heartbeat, encode(beat)))
                await asyncio.sleep(0.2)

        b = asyncio.create_task(standby_leads())
        try:
            await until(
                lambda: a.service.control_stats.sessions > sessions,
                timeout_s=WAIT_S,
                what="A reconnected",
            )
            back = p.mark()
            await asyncio.sleep(4 * config.cycle_s)  # a window: A would lead within a cycle
            leading_after = a.service.leading.is_set()
        finally:
            b.cancel()

    assert not leading_after
    assert a.service.leadership.leader_name == "ctl-b"
    beats_a = [
        heartbeat_of(m)
        for m in p.messages[back:]
        if m.topic == TOPICS.heartbeat and heartbeat_of(m).controller == "ctl-a"
    ]
    assert [beat for beat in beats_a if beat.state == "leader"] == []
