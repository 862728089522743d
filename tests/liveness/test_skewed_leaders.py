"""Leaders and standbys whose wall clocks are off by an hour, as real processes (issue 34,
item 3): liveness is judged by receipt, on the monotonic clock; a ts from the future is
refused; epochs are the highest seen + 1 (docs/PROTOCOL.md, "Clocks").

Two ``powerd controller`` processes (A, then B), each on its own wall clock under
libfaketime, lead the test tree's four in-process agents (failsafe after 1.5 s;
controllers: heartbeat 0.2 s, takeover after 1.0 s). What is asserted comes off the wire:
the live leader heartbeats (who led, in which epoch) and every agent's telemetry (its
mode, and the epoch it follows).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from powerd.topology import parse_budgets
from tests.liveness.clocks import (
    SkewedClock,
    leaders,
    longest_failsafe_s,
    needs_faketime,
    samples,
    skewed_clock,
    spawn_controller,
    stop,
    tail,
)
from tests.support.brokers import Mosquitto, MqttProbe
from tests.support.controller_harness import (
    AGENT_FAILSAFE_AFTER_S,
    SERVERS,
    TAKEOVER_AFTER_S,
    TOPICS,
    WAIT_S,
    budgets_toml,
    controller_toml,
    heartbeat_of,
    probe,
    running_agents,
    until,
)

pytestmark = [pytest.mark.realtime, needs_faketime]

# No agent is in failsafe longer than failsafe_after_s plus a takeover; the margin is
# for two Python processes and four agents on a loaded 2-core machine.
FAILSAFE_BOUND_S = AGENT_FAILSAFE_AFTER_S + TAKEOVER_AFTER_S + 1.0
# A leader's death to every agent following its successor (takeover, a cycle, a beat)
FOLLOW_WITHIN_S = AGENT_FAILSAFE_AFTER_S + TAKEOVER_AFTER_S + 2.0


def configs(tmp_path: Path, broker: Mosquitto) -> tuple[Path, Path, Path]:
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(budgets_toml())
    paths = []
    for name in ("ctl-a", "ctl-b"):
        path = tmp_path / f"{name}.toml"
        path.write_text(controller_toml(broker, name) + "\n[recorder]\nenabled = false\n")
        paths.append(path)
    return budgets, paths[0], paths[1]


def args(config: Path, budgets: Path) -> list[str]:
    return ["--config", str(config), "--budgets", str(budgets), "--log-level", "info"]


async def leading(p: MqttProbe, name: str, after: int = 0, timeout_s: float = 30.0) -> int:
    """The epoch of ``name``'s first live leader heartbeat after ``after``."""
    got = await p.expect(
        TOPICS.heartbeat,
        lambda m: (
            not m.retain
            and heartbeat_of(m).controller == name
            and heartbeat_of(m).state == "leader"
        ),
        after=after,
        timeout_s=timeout_s,
    )
    return heartbeat_of(got).epoch


async def all_follow(p: MqttProbe, epoch: int, after: int, timeout_s: float) -> float:
    """Wait until every agent reports it is controlled under ``epoch``; when the last of
    them first said so (monotonic, at the probe)."""

    def done() -> bool:
        last = {n: s[-1] for n, s in samples(p.messages, after).items()}
        return all(
            n in last and (last[n].mode, last[n].epoch) == ("controlled", epoch) for n in SERVERS
        )

    await until(done, timeout_s, f"every agent controlled under epoch {epoch}")
    by_node = samples(p.messages, after)
    return max(
        next(s.at for s in by_node[n] if (s.mode, s.epoch) == ("controlled", epoch))
        for n in SERVERS
    )


@dataclass
class Pair:
    a: subprocess.Popen[bytes]
    b: subprocess.Popen[bytes]
    epoch_a: int  # A's epoch, every agent following it
    b_starts: int  # the probe's mark just before B started


@contextlib.asynccontextmanager
async def a_leading_b_standing_by(
    p: MqttProbe,
    tmp_path: Path,
    mosquitto: Mosquitto,
    clock_a: SkewedClock | None = None,
    clock_b: SkewedClock | None = None,
) -> AsyncIterator[Pair]:
    """A leads with every agent following it, then B starts and connects; both are stopped
    at the end (A may have been killed already). ``clock_a``, ``clock_b``: their wall
    clocks (None: the real one)."""
    budgets, config_a, config_b = configs(tmp_path, mosquitto)
    a = spawn_controller(args(config_a, budgets), tmp_path / "a.log", clock_a)
    b = None
    try:
        epoch_a = await leading(p, "ctl-a")
        await all_follow(p, epoch_a, 0, WAIT_S)
        b_starts = p.mark()
        b = spawn_controller(args(config_b, budgets), tmp_path / "b.log", clock_b)
        await until(lambda: "connected to" in (tmp_path / "b.log").read_text(), 30.0, "B up")
        yield Pair(a, b, epoch_a, b_starts)
    finally:
        stop(a)
        if b is not None:
            b.terminate()
            b.wait(WAIT_S)


def logs_of(tmp_path: Path) -> str:
    return f"A:\n{tail(tmp_path / 'a.log')}\nB:\n{tail(tmp_path / 'b.log')}"


def worst_failsafe_s(p: MqttProbe, after: int) -> float:
    return max(longest_failsafe_s(s) for s in samples(p.messages, after).values())


@pytest.mark.asyncio
async def test_a_dead_leader_that_ran_an_hour_ahead_keeps_nobody_out_of_failsafe(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """A's clock runs an hour ahead for 3 s, then A dies (SIGKILL). Someone replays what it
    sent, live and retained, every 0.2 s. Its heartbeats are no liveness: the standby B
    takes over within its takeover time and every agent follows B (before: the replayed
    heartbeats, an hour "fresh", kept every agent controlled and B passive)."""
    clock_a = skewed_clock(tmp_path, "ctl-a")
    topology = parse_budgets(budgets_toml())
    async with (
        probe(mosquitto) as p,
        running_agents(mosquitto, topology, "compute"),
        a_leading_b_standing_by(p, tmp_path, mosquitto, clock_a=clock_a) as pair,
    ):
        a, epoch_a = pair.a, pair.epoch_a
        ahead_mark = p.mark()
        clock_a.step("+1h")
        await asyncio.sleep(3.0)
        captured = [
            m for m in p.messages[ahead_mark:] if m.topic == TOPICS.heartbeat and not m.retain
        ]
        a.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        a.wait(WAIT_S)
        killed_mark = p.mark()
        replay_until = killed_at + FOLLOW_WITHIN_S + 2.0
        i = 0
        while time.monotonic() < replay_until:
            beat = captured[i % len(captured)]
            await p.publish(TOPICS.heartbeat, beat.payload, retain=True)
            await p.publish(TOPICS.heartbeat, beat.payload)
            i += 1
            await asyncio.sleep(0.2)
        assert len(captured) >= 10
        epoch_b = await leading(p, "ctl-b", after=killed_mark, timeout_s=1.0)
        b_led_at = next(
            m.at
            for m in p.messages[killed_mark:]
            if m.topic == TOPICS.heartbeat
            and not m.retain
            and heartbeat_of(m).controller == "ctl-b"
        )
        followed_at = await all_follow(p, epoch_b, killed_mark, 1.0)
    logs = logs_of(tmp_path)
    print(f"B led {b_led_at - killed_at:.2f} s after A's death, all agents followed after "
          f"{followed_at - killed_at:.2f} s, longest failsafe {worst_failsafe_s(p, killed_mark):.2f} s")  # fmt: skip
    assert epoch_b == epoch_a + 1, logs
    assert b_led_at - killed_at <= TAKEOVER_AFTER_S + 1.5, logs
    assert followed_at - killed_at <= FOLLOW_WITHIN_S + 2.0, logs
    assert worst_failsafe_s(p, killed_mark) <= FAILSAFE_BOUND_S
    assert leaders(p.messages) == [("ctl-a", epoch_a), ("ctl-b", epoch_b)]


@pytest.mark.asyncio
@pytest.mark.parametrize("offset", ["+1h", "-1h"])
async def test_a_standby_an_hour_off_makes_at_most_one_leadership_change(
    mosquitto: Mosquitto, tmp_path: Path, offset: str
) -> None:
    """A (a correct clock) leads; B starts with its clock an hour ahead or behind, then A
    dies. At most one leadership change over the run; every agent follows a live leader
    within the failsafe time of A's death; no agent in failsafe longer than
    failsafe_after_s plus a takeover. Before: B an hour ahead deposed A 0.3 s after its
    start with an epoch an hour of milliseconds up; B an hour behind led after A's death
    with heartbeats an hour old that no agent followed (the site in failsafe for good)."""
    clock_b = skewed_clock(tmp_path, "ctl-b", offset)
    topology = parse_budgets(budgets_toml())
    async with (
        probe(mosquitto) as p,
        running_agents(mosquitto, topology, "compute"),
        a_leading_b_standing_by(p, tmp_path, mosquitto, clock_b=clock_b) as pair,
    ):
        a, epoch_a, start_mark = pair.a, pair.epoch_a, pair.b_starts
        await asyncio.sleep(3.0)  # B has heard A for a while
        before_kill = leaders(p.messages[start_mark:])
        a.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        a.wait(WAIT_S)
        killed_mark = p.mark()
        epoch_b = await leading(p, "ctl-b", after=start_mark, timeout_s=FOLLOW_WITHIN_S)
        followed_at = await all_follow(p, epoch_b, killed_mark, FOLLOW_WITHIN_S + 2.0)
        await asyncio.sleep(2.0)  # and they stay with it
        end = {n: s[-1] for n, s in samples(p.messages, killed_mark).items()}
    logs = logs_of(tmp_path)
    changes = leaders(p.messages)
    print(f"{offset}: leaders {changes}; all agents followed B {followed_at - killed_at:.2f} s "
          f"after A's death, longest failsafe {worst_failsafe_s(p, start_mark):.2f} s")  # fmt: skip
    assert changes == [("ctl-a", epoch_a), ("ctl-b", epoch_b)], logs  # one change at most
    assert epoch_b == epoch_a + 1, logs  # not lifted by B's clock
    if offset == "+1h":  # A's heartbeats are in B's past: followed, A never deposed
        assert before_kill == [("ctl-a", epoch_a)], logs
    assert followed_at - killed_at <= FOLLOW_WITHIN_S + 2.0, logs
    assert {(s.mode, s.epoch) for s in end.values()} == {("controlled", epoch_b)}, logs
    assert worst_failsafe_s(p, start_mark) <= FAILSAFE_BOUND_S, logs


@pytest.mark.asyncio
async def test_a_leader_whose_clock_steps_an_hour_either_way_stays_followed(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """A leads with B standing by; A's wall clock steps an hour ahead, then an hour behind,
    3 s each. No leadership change, and no agent ever falls to failsafe: A's heartbeats
    carry its epoch's time base, moved by its monotonic clock (before: stepped back, its
    heartbeats were an hour old to every agent, failsafe for good, and B took over)."""
    clock_a = skewed_clock(tmp_path, "ctl-a")
    topology = parse_budgets(budgets_toml())
    async with (
        probe(mosquitto) as p,
        running_agents(mosquitto, topology, "compute"),
        a_leading_b_standing_by(p, tmp_path, mosquitto, clock_a=clock_a) as pair,
    ):
        epoch_a = pair.epoch_a
        mark = p.mark()
        for offset in ("+1h", "-1h", "+0"):
            clock_a.step(offset)
            await asyncio.sleep(3.0)
        end = {n: s[-1] for n, s in samples(p.messages, mark).items()}
    logs = logs_of(tmp_path)
    assert leaders(p.messages) == [("ctl-a", epoch_a)], logs
    assert worst_failsafe_s(p, mark) == 0.0, logs
    assert {(s.mode, s.epoch) for s in end.values()} == {("controlled", epoch_a)}, logs
