"""Failover: a leader killed with SIGKILL leaves a stale retained heartbeat; a new controller
leads with the next epoch, the agents follow it, and the tree stays inside its limits throughout.
A clean stop leaves a retained standby heartbeat.

Both controllers run the bands (``BANDS``): with them A holds every GPU below its failsafe
cap, so the agents' fallback is a rise (``FAILSAFE_RAISE_SHARE``) and the caps a new leader
sets are told apart from the failsafe caps. Under safety by caps, the default, this tree's
racks fit every GPU at its maximum; a SIGKILL under it is
tests/controller/test_controller_caps_safety.py's."""

from __future__ import annotations

import asyncio
import resource
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from powerd.protocol import Command, Heartbeat, decode, encode
from powerd.topology import parse_budgets
from tests.support.controller_harness import (
    AGENT_FAILSAFE_AFTER_S,
    BANDS,
    BANDS_TOML,
    FAILSAFE_CAP_W,
    RACKS,
    SERVERS,
    TOPICS,
    WAIT_S,
    ack_of,
    budgets_toml,
    controller_config,
    controller_toml,
    heartbeat_of,
    node_of,
    probe,
    running_agents,
    running_controller,
    spawn_controller,
    telemetry_of,
    until,
)
from tests.support.keys import sign

# A controller before A left this, retained, as it stopped cleanly; above the wall clock in
# ms (epochs are at least that), so each new leader's epoch is exactly the last one + 1.
OLD_EPOCH = 10**13


def tail(log: Path, chars: int = 3000) -> str:
    """The end of a controller's log, for an assertion's message."""
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


def wire_summary(p) -> dict:
    """What went over the broker, for an assertion's message: heartbeats by controller and
    state, commands and acks by node (ack results), each node's last telemetry mode."""
    out: dict = {"heartbeats": {}, "commands": {}, "acks": {}, "mode": {}}
    for m in p.messages:
        kind = m.topic.rsplit("/", 1)[-1]
        if kind == "heartbeat":
            beat = heartbeat_of(m)
            key = f"{beat.controller}/{beat.state}/{beat.epoch}"
            out["heartbeats"][key] = out["heartbeats"].get(key, 0) + 1
        elif kind == "command":
            out["commands"][node_of(m.topic)] = out["commands"].get(node_of(m.topic), 0) + 1
        elif kind == "ack":
            results = out["acks"].setdefault(node_of(m.topic), {})
            result = ack_of(m).result
            results[result] = results.get(result, 0) + 1
        elif kind == "telemetry":
            out["mode"][node_of(m.topic)] = telemetry_of(m).mode
    return out


def heartbeat_is(controller: str, state: str, epoch: int | None = None):
    def check(m) -> bool:
        beat = heartbeat_of(m)
        return (
            beat.controller == controller
            and beat.state == state
            and (epoch is None or beat.epoch == epoch)
        )

    return check


async def test_killed_leader_is_replaced_with_a_higher_epoch_and_caps_stay_safe(
    mosquitto, tmp_path
):
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(budgets_toml())
    topology = parse_budgets(budgets.read_text())
    tree = topology.tree
    config_a = tmp_path / "ctl-a.toml"
    config_a.write_text(controller_toml(mosquitto, "ctl-a") + BANDS_TOML)

    async with probe(mosquitto) as p, running_agents(mosquitto, topology, "compute") as agents:
        old = Heartbeat(
            v=1, epoch=OLD_EPOCH, ts=time.time() - 60, controller="ctl-old", state="standby"
        )
        await p.publish(TOPICS.heartbeat, sign(TOPICS.heartbeat, encode(old)), retain=True)

        a = spawn_controller(
            ["--config", str(config_a), "--budgets", str(budgets), "--log-level", "warning"],
            tmp_path / "ctl-a.log",
        )
        try:
            beat = await p.expect(TOPICS.heartbeat, heartbeat_is("ctl-a", "leader"), timeout_s=30)
            epoch_a = heartbeat_of(beat).epoch
            # A caps both racks (in compute, over budget) below the failsafe caps
            try:
                await agents.wait_for(lambda: max(agents.caps()) < 450.0, what="A capped")
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}; on the wire: {wire_summary(p)}; caps {agents.caps()}; "
                    f"A's log:\n{tail(tmp_path / 'ctl-a.log')}"
                ) from None
            caps_by_a = agents.caps()
            killed_mark = p.mark()
            a.send_signal(signal.SIGKILL)  # no step-down: its last heartbeat stays, retained
            a.wait(WAIT_S)
        finally:
            a.kill()
            a.wait(WAIT_S)
        killed_at = time.monotonic()

        # with no live leader the agents fall back to their failsafe caps on their own
        for node in SERVERS:
            await p.expect(
                TOPICS.telemetry(node),
                lambda m: telemetry_of(m).mode == "failsafe",
                after=killed_mark,
            )
        # A had capped them below their failsafe caps: they rise once every agent came
        # down (powerd.agent.rules.FAILSAFE_RAISE_SHARE), none of them at once
        assert max(agents.caps()) <= FAILSAFE_CAP_W
        await agents.wait_for(
            lambda: agents.caps() == [FAILSAFE_CAP_W] * 16, what="the failsafe caps"
        )

        # a new controller: the retained heartbeat is A's, stale; it leads with A's epoch + 1
        b_mark = p.mark()
        config_b = controller_config(mosquitto, name="ctl-b", policy=BANDS)
        async with running_controller(mosquitto, topology, config_b) as b:
            assert b.core.epoch == epoch_a + 1
            acks = {}
            for node in SERVERS:
                got = await p.expect(
                    TOPICS.ack(node), lambda m: ack_of(m).epoch == epoch_a + 1, after=b_mark
                )
                acks[node] = ack_of(got)
                await p.expect(
                    TOPICS.telemetry(node),
                    lambda m: telemetry_of(m).mode == "controlled",
                    after=p.messages.index(got),
                )
            await agents.wait_for(lambda: max(agents.caps()) < 450.0, what="B capped the racks")
            stop_mark = p.mark()
        # a clean stop: B's retained heartbeat says standby at once
        standby = await p.expect(
            TOPICS.heartbeat, heartbeat_is("ctl-b", "standby", epoch_a + 1), after=stop_mark
        )
        assert standby.at - killed_at > 0

    assert a.returncode == -signal.SIGKILL
    assert epoch_a == OLD_EPOCH + 1
    assert all(ack.result == "applied" for ack in acks.values())
    assert max(caps_by_a) < FAILSAFE_CAP_W
    async with probe(mosquitto) as late:  # retained: a newcomer sees the standby heartbeat
        retained = await late.expect(TOPICS.heartbeat)
    assert retained.retain and heartbeat_is("ctl-b", "standby", epoch_a + 1)(retained)
    # B led one epoch and its standby heartbeat was its last word (it did not lead again
    # while stepping down)
    beats_b = [heartbeat_of(m) for m in p.messages if m.topic == TOPICS.heartbeat]
    beats_b = [beat for beat in beats_b if beat.controller == "ctl-b"]
    assert {beat.epoch for beat in beats_b} == {epoch_a + 1}
    assert [beat.state for beat in beats_b][-1] == "standby"
    assert [beat.state for beat in beats_b].count("standby") == 1

    # Safety, over the whole run (A leading, A dead, agents in failsafe, B leading): no GPU
    # ever held a cap above its failsafe cap or above what a controller had commanded it,
    # and the caps under every tree node (servers, racks, the row, the site), plus the
    # overheads, stayed inside its limit. Uncapped, the racks would be over budget.
    commanded: dict[tuple[str, int], float] = {}
    caps = np.full(topology.n_gpus, np.nan)
    overhead = tree.overhead_below_w
    racks = [topology.node_index(r) for r in RACKS]
    uncapped = tree.node_sum(np.full(topology.n_gpus, 700.0)) + overhead
    assert np.all(uncapped[racks] > tree.budget_w[racks])
    snapshots = 0
    for m in p.messages:
        kind = m.topic.rsplit("/", 1)[-1]
        if kind == "command":
            for g in decode(Command, m.payload).gpus:
                commanded[(node_of(m.topic), g.index)] = g.cap_w
        elif kind == "telemetry":
            t = telemetry_of(m)
            first = topology.server_gpus(t.node).start
            for g in t.gpus:
                allowed = max(FAILSAFE_CAP_W, commanded.get((t.node, g.index), 0.0))
                assert g.cap_w <= allowed + 1e-3, (t.node, g.index, g.cap_w, allowed)
                caps[first + g.index] = g.cap_w
            if np.isnan(caps).any():
                continue  # not every node heard from yet
            snapshots += 1
            cap_sum = tree.node_sum(caps) + overhead
            assert np.all(cap_sum <= tree.limit_w), dict(
                zip(topology.names, cap_sum - tree.limit_w, strict=True)
            )
    assert snapshots > 50


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# wall-clock pacing: every agent's samples at full rate across the takeover, and the
# standby's CPU over a window (one loaded parallel run: 60 samples where 61 were due)
@pytest.mark.realtime
async def test_hot_standby_takes_over_before_the_agents_fall_back_to_failsafe(mosquitto, tmp_path):
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(budgets_toml())
    topology = parse_budgets(budgets.read_text())
    config_a = tmp_path / "ctl-a.toml"
    config_a.write_text(controller_toml(mosquitto, "ctl-a") + BANDS_TOML)
    # B takes over 0.6 s after A's last heartbeat; the agents would give up after 1.5 s
    config_b = controller_config(mosquitto, name="ctl-b", takeover_after_s=0.6, policy=BANDS)

    async with probe(mosquitto) as p, running_agents(mosquitto, topology, "compute") as agents:
        a = spawn_controller(
            ["--config", str(config_a), "--budgets", str(budgets), "--log-level", "warning"],
            tmp_path / "ctl-a.log",
        )
        try:
            beat = await p.expect(TOPICS.heartbeat, heartbeat_is("ctl-a", "leader"), timeout_s=30)
            epoch_a = heartbeat_of(beat).epoch
            await agents.wait_for(lambda: max(agents.caps()) < 450.0, what="A capped the racks")

            async with running_controller(mosquitto, topology, config_b, lead=False) as b:
                # while A leads, B stands by: no cycles, no heartbeat, and (nearly) no CPU
                await until(lambda: b.service.leadership.highest_epoch_seen == epoch_a)
                standby_mark = p.mark()
                cpu_before, wall_before = cpu_s(), time.monotonic()
                await asyncio.sleep(1.5)  # an observation window, 2.5 x B's takeover time
                cpu_used = cpu_s() - cpu_before
                wall = time.monotonic() - wall_before
                assert not b.service.leading.is_set()
                assert b.cycles == []
                assert not any(
                    heartbeat_of(m).controller == "ctl-b"
                    for m in p.messages[standby_mark:]
                    if m.topic == TOPICS.heartbeat
                )
                assert cpu_used < 0.5 * wall, f"{cpu_used:.2f} s of CPU in {wall:.2f} s"

                killed_mark = p.mark()
                a.send_signal(signal.SIGKILL)
                killed_at = time.monotonic()
                a.wait(WAIT_S)
                await asyncio.wait_for(b.service.leading.wait(), WAIT_S)
                epoch_b = b.core.epoch
                assert epoch_b > epoch_a  # above A's, and at least the wall clock in ms
                for node in SERVERS:
                    await p.expect(
                        TOPICS.ack(node),
                        lambda m: ack_of(m).epoch == epoch_b and ack_of(m).result == "applied",
                        after=killed_mark,
                    )
                # past the moment the agents would have given up on A (its last heartbeat
                # + 1.5 s), all of them still controlled
                for node in SERVERS:
                    await p.expect(
                        TOPICS.telemetry(node),
                        lambda m: m.at > killed_at + AGENT_FAILSAFE_AFTER_S + 0.3,
                        after=killed_mark,
                    )
                end_mark = p.mark()
        finally:
            a.kill()
            a.wait(WAIT_S)

    after_kill = [m for m in p.messages[killed_mark:end_mark] if m.topic.endswith("/telemetry")]
    assert len(after_kill) > 4 * 10 * AGENT_FAILSAFE_AFTER_S
    # no agent noticed: none fell back to failsafe, every cap stayed where A had put it
    assert {telemetry_of(m).mode for m in after_kill} == {"controlled"}
    assert max(g.cap_w for m in after_kill for g in telemetry_of(m).gpus) < 450.0
