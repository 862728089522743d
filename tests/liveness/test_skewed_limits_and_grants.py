"""Site limits and grants judged by receipt (issue 34, item 3), real processes under
libfaketime: durations run from receipt on the monotonic clock, a ``ts`` more than
``max_clock_skew_s`` (30 s) ahead is refused (docs/PROTOCOL.md, "Clocks").

- a controller 20 minutes ahead applies a new 15-minute site limit (``powerd limit set``);
- a leaf controller 60 s ahead takes the coordinator's grants;
- a coordinator an hour ahead issues no grant a leaf takes, so none can be replayed for
  that hour;
- a restarted leaf takes no replayed grant of an older round (item 4).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from powerd.protocol import Grant, Summary, Topics, encode
from powerd.signing import Signer, generate_key_files, load_signer
from powerd.telemetry_schema import parse_line
from tests.liveness.clocks import needs_faketime, skewed_clock, spawn, spawn_controller, stop, tail
from tests.support.brokers import Mosquitto, MqttProbe, Received
from tests.support.controller_harness import CLUSTER, budgets_toml, controller_toml, until
from tests.support.keys import VERIFIER, key_files
from tests.support.tree_sites import three_rows

pytestmark = [pytest.mark.realtime, needs_faketime]

SCOPED = Topics(CLUSTER, scope="r1")
GRANT_TTL_S = 15.0


def summary_of(m: Received) -> Summary:
    return VERIFIER.decode(Summary, m.topic, m.payload)


@pytest.mark.asyncio
async def test_a_controller_20_minutes_ahead_applies_a_new_site_limit(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """Its cycles record the limit in force (``decision`` points, ``site_limit_w``) from
    seconds after ``powerd limit set --for 15m``, and still 5 s later (before: taken,
    logged, and never in force: by its clock the 15 minutes had ended 5 minutes ago)."""
    op_key, op_pub = generate_key_files(tmp_path / "operator")
    budgets, config, recorded = tmp_path / "b.toml", tmp_path / "c.toml", tmp_path / "ctl.lp"
    budgets.write_text(budgets_toml())
    config.write_text(
        controller_toml(mosquitto, "ctl-a") + f'\n[trust]\noperator_keys = ["{op_pub}"]\n'
    )
    limit_w = 8_000.0
    clock = skewed_clock(tmp_path, "ctl-a", "+20m")
    ctl = spawn_controller(
        ["--config", str(config), "--budgets", str(budgets), "--record", str(recorded)],
        tmp_path / "ctl.log",
        clock,
    )

    def limits_recorded() -> list[float | None]:
        if not recorded.exists():
            return []
        lines = [parse_line(x) for x in recorded.read_text().splitlines() if x]
        decisions = [x for x in lines if x.measurement == "decision"]
        return [x.fields.get("site_limit_w") for x in decisions]  # type: ignore[misc]

    try:
        await until(lambda: len(limits_recorded()) > 4, 30.0, "the controller's cycles")
        sent = subprocess.run(
            [sys.executable, "-m", "powerd", "limit", "set", "--key", str(op_key),
             "--broker", mosquitto.url, "--cluster", CLUSTER,
             "--site", f"{limit_w:g}W", "--for", "15m"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        before = len(limits_recorded())
        await until(lambda: limit_w in limits_recorded()[before:], 10.0, "the limit in force")
        await asyncio.sleep(5.0)
        last = limits_recorded()[-1]
    finally:
        ctl.terminate()
        ctl.wait(10)
    assert last == limit_w, tail(tmp_path / "ctl.log")


def leaf_toml(broker: Mosquitto, coordinator_pub: Path) -> str:
    return f"""
[controller]
name = "leaf-a"
cluster = "{CLUSTER}"
cycle_s = 0.25
heartbeat_s = 0.2
stale_after_s = 1.0
summary_every_s = 0.25
epoch_discovery_s = 0.3
takeover_after_s = 1.0

[broker]
url = "{broker.url}"
reconnect_min_s = 0.05
reconnect_max_s = 0.5

[trust]
coordinator_keys = ["{coordinator_pub}"]

[recorder]
enabled = false
"""


def spawn_leaf(tmp_path: Path, broker: Mosquitto, coordinator_pub: Path, log: str, offset: str):
    budgets, config = tmp_path / "rows.toml", tmp_path / "leaf.toml"
    budgets.write_text(three_rows())
    config.write_text(leaf_toml(broker, coordinator_pub))
    args = ["--config", str(config), "--budgets", str(budgets), "--scope", "r1"]
    return spawn_controller(args, tmp_path / log, skewed_clock(tmp_path, log, offset))


def grant(signer: Signer, budget_w: float, seq: int) -> bytes:
    body = Grant(
        v=1,
        scope="r1",
        coordinator="co",
        epoch=7,
        seq=seq,
        ts=time.time(),
        ttl_s=GRANT_TTL_S,
        budget_w=budget_w,
        ramp_w_per_s=1000.0,
    )
    return signer.sign(SCOPED.grant("r1"), encode(body))


@pytest.mark.asyncio
async def test_a_leaf_60_s_ahead_takes_the_coordinators_grants(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """Grants sent live (each a minute old by the leaf's clock, past their 15 s TTL) are
    in force from receipt: its summaries carry them (before: every grant refused, for
    good, and the row held its file budget)."""
    coord_key, coord_pub = generate_key_files(tmp_path / "coordinator")
    coordinator = load_signer(coord_key)
    async with MqttProbe(mosquitto.port, [f"{SCOPED.prefix}/#"]) as p:
        leaf = spawn_leaf(tmp_path, mosquitto, coord_pub, "leaf.log", "+60s")
        try:
            await p.expect(SCOPED.summary("r1"), timeout_s=30.0)
            mark = p.mark()
            for seq in range(1, 11):
                await p.publish(SCOPED.grant("r1"), grant(coordinator, 9_000.0, seq))
                await asyncio.sleep(0.3)
            got = await p.expect(
                SCOPED.summary("r1"), lambda m: summary_of(m).grant_seq == 10, after=mark
            )
        finally:
            stop(leaf)
    assert summary_of(got).budget_w == 9_000.0, tail(tmp_path / "leaf.log")


@pytest.mark.asyncio
async def test_a_coordinator_an_hour_ahead_issues_no_grant_a_leaf_takes(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """Its grants' ts run an hour ahead of the leaf's clock: refused, clock alarms, the row
    on its file budget; and one captured, replayed to a restarted leaf after the
    coordinator is gone, is refused too (before: taken, and replayable for the hour)."""
    coord_key, coord_pub = generate_key_files(tmp_path / "coordinator")
    _, leaf_pub = key_files(tmp_path)
    budgets = tmp_path / "rows.toml"
    budgets.write_text(three_rows())
    argv = [
        *(sys.executable, "-m", "powerd", "coordinator", "--budgets", str(budgets)),
        *("--broker", mosquitto.url, "--cluster", CLUSTER, "--name", "co-ahead"),
        *("--signing-key", str(coord_key), "--trust", str(leaf_pub)),
        *("--period-s", "0.5", "--grant-ttl-s", str(GRANT_TTL_S), "--takeover-after-s", "3"),
    ]
    async with MqttProbe(mosquitto.port, [f"{SCOPED.prefix}/#"]) as p:
        coord = spawn(argv, tmp_path / "coord.log", skewed_clock(tmp_path, "coord", "+1h"))
        leaf = spawn_leaf(tmp_path, mosquitto, coord_pub, "leaf-1.log", "+0")
        try:
            captured = await p.expect(SCOPED.grant("r1"), timeout_s=30.0)
            mark = p.mark()
            for _ in range(4):  # several of the leaf's summaries, and a period of grants each
                await p.expect(SCOPED.grant("r1"), after=p.mark(), timeout_s=10.0)
                await p.expect(SCOPED.summary("r1"), after=p.mark(), timeout_s=10.0)
            first = [summary_of(m) for m in p.messages[mark:] if m.topic == SCOPED.summary("r1")]
            coord.kill()
            coord.wait(10)
            stop(leaf)
            leaf = spawn_leaf(tmp_path, mosquitto, coord_pub, "leaf-2.log", "+0")
            await p.expect(SCOPED.summary("r1"), after=p.mark(), timeout_s=30.0)
            replay_mark = p.mark()
            for _ in range(5):
                await p.publish(SCOPED.grant("r1"), captured.payload)
                await asyncio.sleep(0.3)
            await p.expect(SCOPED.summary("r1"), after=p.mark(), timeout_s=10.0)
            second = [
                summary_of(m) for m in p.messages[replay_mark:] if m.topic == SCOPED.summary("r1")
            ]
        finally:
            stop(coord)
            stop(leaf)
    logs = f"{tail(tmp_path / 'leaf-1.log')}\n{tail(tmp_path / 'leaf-2.log')}"
    assert first and second, logs
    assert {s.grant_seq for s in first + second} == {None}, logs  # the file's budget
    assert "clock alarm" in (tmp_path / "leaf-1.log").read_text(), logs
    assert "clock alarm" in (tmp_path / "leaf-2.log").read_text(), logs


@pytest.mark.asyncio
async def test_a_restarted_leaf_takes_no_replayed_grant_of_an_older_round(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """A grant captured from a live coordinator, replayed live to a leaf that restarted
    (holding no grant, its ``(epoch, seq)`` memory gone, the retained grant cleared) after
    later rounds: refused, the coordinator's retained heartbeat (the seq of its last round)
    is the floor; the row stays on its file budget (before: taken, in force until the next
    grant replaced it)."""
    coord_key, coord_pub = generate_key_files(tmp_path / "coordinator")
    _, leaf_pub = key_files(tmp_path)
    budgets = tmp_path / "rows.toml"
    budgets.write_text(three_rows())
    argv = [
        *(sys.executable, "-m", "powerd", "coordinator", "--budgets", str(budgets)),
        *("--broker", mosquitto.url, "--cluster", CLUSTER, "--name", "co-a"),
        *("--signing-key", str(coord_key), "--trust", str(leaf_pub)),
        *("--period-s", "0.3", "--grant-ttl-s", str(GRANT_TTL_S), "--takeover-after-s", "3"),
    ]
    async with MqttProbe(mosquitto.port, [f"{SCOPED.prefix}/#"]) as p:
        coord = spawn(argv, tmp_path / "coord.log")
        leaf = spawn_leaf(tmp_path, mosquitto, coord_pub, "leaf-1.log", "+0")
        try:
            captured = await p.expect(SCOPED.grant("r1"), timeout_s=30.0)
            for _ in range(3):  # later rounds, each announced in the coordinator's heartbeat
                await p.expect(SCOPED.grant("r1"), after=p.mark(), timeout_s=10.0)
            await p.expect(SCOPED.coordinator_heartbeat, after=p.mark(), timeout_s=10.0)
            coord.kill()  # its last heartbeat stays retained: the round a restart learns
            coord.wait(10)
            stop(leaf)
            await p.publish(SCOPED.grant("r1"), b"", retain=True)  # no retained grant left
            leaf = spawn_leaf(tmp_path, mosquitto, coord_pub, "leaf-2.log", "+0")
            await p.expect(SCOPED.summary("r1"), after=p.mark(), timeout_s=30.0)
            replay_mark = p.mark()
            for _ in range(5):
                await p.publish(SCOPED.grant("r1"), captured.payload)
                await p.expect(SCOPED.summary("r1"), after=p.mark(), timeout_s=10.0)
            after = [
                summary_of(m) for m in p.messages[replay_mark:] if m.topic == SCOPED.summary("r1")
            ]
        finally:
            stop(coord)
            stop(leaf)
    log = (tmp_path / "leaf-2.log").read_text()
    assert after and {s.grant_seq for s in after} == {None}, tail(tmp_path / "leaf-2.log")
    assert "a replay" in log, tail(tmp_path / "leaf-2.log")
