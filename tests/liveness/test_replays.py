"""Replays on an open broker that outlive a restart (issue 34, item 4), with a real
Mosquitto, real controllers, a real ``powerd agent`` process and the ``powerd limit`` CLI:

- an agent restarted (its ``(epoch, seq)`` memory gone) takes no replayed older command
  of the current epoch: the heartbeat's ``seq`` is its order's floor;
- a captured clean-exit standby heartbeat, replayed, moves no leadership;
- an older site-limit ``clear`` replayed as retained does not erase a newer limit across
  a controller restart: the leader's record of the limit is the order's floor.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from powerd.protocol import Ack, Command, decode
from powerd.signing import generate_key_files
from powerd.topology import parse_budgets
from tests.liveness.clocks import leaders, spawn, tail
from tests.support.brokers import Mosquitto, MqttProbe, Received
from tests.support.controller_harness import (
    AGENT_FAILSAFE_AFTER_S,
    TOPICS,
    WAIT_S,
    budgets_toml,
    controller_config,
    heartbeat_of,
    probe,
    run_powerd,
    running_controller,
    until,
)
from tests.support.keys import key_files

pytestmark = pytest.mark.realtime

NODE = "r1-k1-n1"  # the one node with an agent (a process); the others stay silent


def agent_argv(broker: Mosquitto, trust: Path) -> list[str]:
    return [
        *(sys.executable, "-m", "powerd", "agent", "--simulate", "4xH100"),
        *("--broker", broker.url, "--cluster", TOPICS.cluster, "--node", NODE),
        *("--period-s", "0.1", "--failsafe-after-s", str(AGENT_FAILSAFE_AFTER_S)),
        *("--trust", str(trust), "--log-level", "info"),
    ]


def ack_is(epoch: int, seq: int, result: str | None = None):
    def check(m: Received) -> bool:
        ack = decode(Ack, m.payload, NODE)
        return (ack.epoch, ack.seq) == (epoch, seq) and result in (None, ack.result)

    return check


def acks_of(p: MqttProbe, epoch: int, seq: int, after: int) -> list[str]:
    """The results of the acks of command (epoch, seq) since message ``after``."""
    return [
        decode(Ack, m.payload, NODE).result
        for m in p.messages[after:]
        if m.topic == TOPICS.ack(NODE) and ack_is(epoch, seq)(m)
    ]


@pytest.mark.asyncio
async def test_a_restarted_agent_takes_no_replayed_older_command(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """A command the agent applied is captured; the agent restarts (SIGKILL, then a new
    process); the capture is replayed every 20 ms from before the new agent hears its
    first live heartbeat. It is never applied again: refused while no heartbeat is live,
    then stale (before: applied, 548 -> 642 W a GPU, by the first replay after it)."""
    _, trust = key_files(tmp_path)
    topology = parse_budgets(budgets_toml())
    async with probe(mosquitto) as p, running_controller(mosquitto, topology):
        agent = spawn(agent_argv(mosquitto, trust), tmp_path / "agent-1.log")
        try:
            got = await p.expect(
                TOPICS.ack(NODE), lambda m: decode(Ack, m.payload, NODE).result == "applied"
            )
            ack = decode(Ack, got.payload, NODE)
            captured = next(
                m
                for m in reversed(p.messages[: p.messages.index(got)])
                if m.topic == TOPICS.command(NODE)
                and (decode(Command, m.payload).epoch, decode(Command, m.payload).seq)
                == (ack.epoch, ack.seq)
            )
            agent.kill()
            agent.wait(WAIT_S)
            restart_mark = p.mark()
            agent = spawn(agent_argv(mosquitto, trust), tmp_path / "agent-2.log")
            # replay from the new agent's first word until well after it is controlled
            await p.expect(TOPICS.status(NODE), after=restart_mark, timeout_s=30.0)
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                await p.publish(TOPICS.command(NODE), captured.payload)
                await asyncio.sleep(0.02)
            await p.expect(
                TOPICS.ack(NODE), ack_is(ack.epoch, ack.seq, "stale"), after=restart_mark
            )
        finally:
            agent.terminate()
            agent.wait(WAIT_S)
    results = acks_of(p, ack.epoch, ack.seq, restart_mark)
    log = tail(tmp_path / "agent-2.log")
    assert "applied" not in results, (results, log)
    assert "stale" in results, (results, log)


@pytest.mark.asyncio
async def test_a_replayed_clean_exit_heartbeat_moves_no_leadership(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """A stops cleanly (its standby heartbeat captured), restarts and leads again; B
    stands by. The capture, replayed live every 0.2 s for 3 s, is of an older epoch than
    the leader B follows: B never leads (before: B took over at each replay, 16 leader
    changes in 40 s)."""
    topology = parse_budgets(budgets_toml())
    config_a = controller_config(mosquitto, name="ctl-a")
    config_b = controller_config(mosquitto, name="ctl-b")
    async with probe(mosquitto) as p:
        async with running_controller(mosquitto, topology, config_a):
            stop_mark = p.mark()
        standby = await p.expect(
            TOPICS.heartbeat, lambda m: heartbeat_of(m).state == "standby", after=stop_mark
        )
        async with (
            running_controller(mosquitto, topology, config_a) as a,
            running_controller(mosquitto, topology, config_b, lead=False) as b,
        ):
            await until(lambda: b.service.leadership.leader_name == "ctl-a")
            await asyncio.sleep(2 * config_b.takeover_after_s)  # B has heard A live
            replay_mark = p.mark()
            for _ in range(15):
                await p.publish(TOPICS.heartbeat, standby.payload)
                await asyncio.sleep(0.2)
            b_led = b.service.leading.is_set()
            a_leads = a.service.leading.is_set()
    assert heartbeat_of(standby).controller == "ctl-a"
    assert not b_led and a_leads
    assert [name for name, _ in leaders(p.messages[replay_mark:])] == ["ctl-a"]
    assert len(leaders(p.messages)) == 2  # A's two epochs, nobody else's


@pytest.mark.asyncio
async def test_an_older_clear_replayed_as_retained_does_not_erase_a_limit_across_a_restart(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """An operator clears, then sets a limit; the captured clear is republished retained
    (the operator topic's retained message is now the old clear) and the controller
    restarts. The limit stays in force: the leader had republished it under its key, and
    the restarted one takes the newer of the two (before: the limit was forgotten)."""
    op_key, op_pub = generate_key_files(tmp_path / "operator")
    topology = parse_budgets(budgets_toml())
    config = replace(controller_config(mosquitto), operator_keys=(str(op_pub),))
    limit_w = 8_000.0

    async def run_limit(*args: str) -> None:
        code, out = await run_powerd("limit", *args, "--key", str(op_key),
                                     "--broker", mosquitto.url, "--cluster", TOPICS.cluster)  # fmt: skip
        assert code == 0, out

    async with probe(mosquitto) as p:
        async with running_controller(mosquitto, topology, config) as first:
            clear_mark = p.mark()
            await run_limit("clear")
            clear = await p.expect(TOPICS.site_limit, after=clear_mark)
            await run_limit("set", "--site", f"{limit_w:g}W", "--for", "10m")
            await first.wait_for(lambda: first.core.site_limit_w == limit_w)
            await p.publish(TOPICS.site_limit, clear.payload, retain=True)
            await first.wait_cycles(4)
            assert first.core.site_limit_w == limit_w  # running: refused by its order
        async with MqttProbe(mosquitto.port, [TOPICS.site_limit]) as late:
            retained = await late.expect(TOPICS.site_limit)
        assert retained.payload == clear.payload  # what a restart finds on the operator topic
        async with running_controller(mosquitto, topology, config) as restarted:
            await restarted.wait_cycles(4)
            in_force_w = restarted.core.site_limit_w
    assert in_force_w == limit_w
