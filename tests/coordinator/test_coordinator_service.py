"""`powerd coordinator` in process against a real Mosquitto: signed summaries in, signed
grants out, forged summaries ignored, a standby that takes over with a higher epoch."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from powerd.coordinator.app import build_coordinator
from powerd.coordinator.config import CoordinatorConfig, validate
from powerd.coordinator.service import CoordinatorService
from powerd.mqtt.url import parse_broker_url
from powerd.protocol import Grant, Heartbeat, SiteLimit, Summary, Topics, encode
from powerd.signing import Signer, Verifier, generate_key_files, load_signer
from powerd.systemd import SystemdNotifier
from powerd.topology import parse_budgets
from tests.support.brokers import Mosquitto, MqttProbe, free_port
from tests.support.controller_harness import until
from tests.support.keys import SIGNER, STRANGER, key_files
from tests.support.tree_sites import three_rows

CLUSTER = "cotest"
TOPICS = Topics(CLUSTER)
COORDINATOR_KEY = Signer.generate()
GRANTS = Verifier([COORDINATOR_KEY.trusted()])


def config(broker: Mosquitto, tmp_path: Path, name: str) -> CoordinatorConfig:
    _, leaf_pub = key_files(tmp_path)
    cfg = CoordinatorConfig(
        name=name,
        cluster=CLUSTER,
        period_s=0.2,
        grant_ttl_s=2.0,
        heartbeat_s=0.2,
        takeover_after_s=1.0,
        epoch_discovery_s=0.3,
        broker=replace(parse_broker_url(broker.url), reconnect_min_s=0.05, reconnect_max_s=0.5),
        controller_keys=(str(leaf_pub),),
    )
    validate(cfg, "test")
    return cfg


@contextlib.asynccontextmanager
async def running(cfg: CoordinatorConfig) -> AsyncIterator[CoordinatorService]:
    service = build_coordinator(cfg, parse_budgets(three_rows()), signer=COORDINATOR_KEY)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        yield service
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def summary(
    scope: str, high_w: float, seq: int, signer: Signer = SIGNER, budget_w: float = 12_000.0
) -> bytes:
    watts = 2600.0 + high_w
    fields: dict[str, Any] = dict(v=1, scope=scope, controller=f"leaf-{scope}", epoch=1,
                                  seq=seq, ts=time.time(), nodes=2, stale_nodes=0)  # fmt: skip
    fields.update(measured_w=watts, predicted_w=watts, cap_sum_w=watts, fixed_w=2600.0)
    fields.update(demand_w=[high_w, 0.0, 0.0], held_w=[0.0, 0.0, 0.0], ramp_w_per_s=None)
    fields.update(budget_w=budget_w, file_budget_w=12_000.0, limit_w=14_000.0)
    body = encode(Summary(**fields))
    return signer.sign(TOPICS.summary(scope), body)


def grant_of(message) -> Grant:
    return GRANTS.decode(Grant, message.topic, message.payload)


@pytest.mark.asyncio
async def test_grants_follow_signed_summaries_and_ignore_forged_ones(mosquitto, tmp_path):
    async with (
        MqttProbe(mosquitto.port, [f"{TOPICS.prefix}/#"]) as probe,
        running(config(mosquitto, tmp_path, "co-a")) as service,
    ):
        await asyncio.wait_for(service.leading.wait(), 5)
        first = await probe.expect(TOPICS.grant("r1"))
        assert grant_of(first).budget_w == 12_000.0  # no summary yet: the file budget
        # a stranger's summary claiming r1 wants everything counts for nothing
        await probe.publish(TOPICS.summary("r1"), summary("r1", 9000.0, 1, signer=STRANGER))
        # the leaves' own: r1 runs a high-priority job wanting 9 kW above its floors
        mark = probe.mark()
        for seq, scope in enumerate(("r2", "r3"), start=1):
            await probe.publish(TOPICS.summary(scope), summary(scope, 0.0, seq))
        assert service.core.summaries[0] is None  # the forged one was refused
        await probe.publish(TOPICS.summary("r1"), summary("r1", 9000.0, 1))
        # r2 and r3 idle: lowered at once; r1 rises only once they hold their lower budgets
        mark = probe.mark()
        lowered = {}
        for scope in ("r2", "r3"):
            got = await probe.expect(
                TOPICS.grant(scope), lambda m: grant_of(m).budget_w < 12_000.0, after=mark
            )
            lowered[scope] = grant_of(got).budget_w
        rising = await probe.expect(TOPICS.grant("r1"), after=probe.mark())
        assert grant_of(rising).budget_w == 12_000.0  # make before break: not yet
        mark = probe.mark()
        for scope in ("r2", "r3"):
            await probe.publish(
                TOPICS.summary(scope), summary(scope, 0.0, 10, budget_w=lowered[scope])
            )
        wants = (2600 + 9000) / 0.95  # nothing held: what it draws, at its target
        got = await probe.expect(
            TOPICS.grant("r1"), lambda m: grant_of(m).budget_w > 12_000.0, after=mark
        )
        grant = grant_of(got)
        assert grant.budget_w >= wants - 1e-6
        assert grant.coordinator == "co-a" and grant.ttl_s == 2.0
        assert sum(lowered.values()) + grant.budget_w <= service.core.site.pool_w + 1e-6
        beat = await probe.expect(TOPICS.coordinator_heartbeat)
        assert GRANTS.decode(Heartbeat, beat.topic, beat.payload).state == "leader"


@pytest.mark.asyncio
async def test_a_standby_coordinator_takes_over_with_a_higher_epoch(mosquitto, tmp_path):
    async with MqttProbe(mosquitto.port, [f"{TOPICS.prefix}/#"]) as probe:
        leader_context = running(config(mosquitto, tmp_path, "co-a"))
        leader = await leader_context.__aenter__()
        stopped = False
        try:
            await asyncio.wait_for(leader.leading.wait(), 5)
            async with running(config(mosquitto, tmp_path, "co-b")) as standby:
                # co-b finds co-a's retained heartbeat and follows it
                await until(lambda: standby.leadership.leader_name == "co-a", 5, "a follower")
                await probe.expect(TOPICS.grant("r1"), lambda m: grant_of(m).coordinator == "co-a")
                assert not standby.leadership.leading
                first_epoch = leader.leadership.epoch
                mark = probe.mark()
                stopped = True
                await leader_context.__aexit__(None, None, None)  # a clean stop: hands over
                await asyncio.wait_for(standby.leading.wait(), 5)
                got = await probe.expect(TOPICS.grant("r2"), after=mark)
                grant = grant_of(got)
                assert grant.coordinator == "co-b" and grant.epoch > first_epoch
        finally:
            if not stopped:
                await leader_context.__aexit__(None, None, None)


def site_limit(operator: Signer, limit_w: float | None, ts: float) -> bytes:
    body = SiteLimit(v=1, operator="ops", seq=int(ts * 1000), ts=ts, limit_w=limit_w,
                     starts_ts=ts, expires_ts=ts + 600.0)  # fmt: skip
    return operator.sign(TOPICS.site_limit, encode(body))


@pytest.mark.asyncio
async def test_an_older_clear_replayed_as_retained_does_not_erase_a_limit_across_a_restart(
    mosquitto, tmp_path
):
    """The coordinator applies site limits in a tree: it republishes the newest it took under
    its key (``Topics.coordinator_site_limit_record``), and a restarted one takes that record
    as the floor of the limits' order, so the operator topic's retained older clear (a
    replay) does not erase the limit (before: the limit was forgotten)."""
    key, pub = generate_key_files(tmp_path / "operator")
    operator = load_signer(key)
    cfg = replace(config(mosquitto, tmp_path, "co-a"), operator_keys=(str(pub),))
    now = time.time()
    clear, limit = site_limit(operator, None, now - 1.0), site_limit(operator, 30_000.0, now)
    async with MqttProbe(mosquitto.port, [TOPICS.coordinator_site_limit_record]) as probe:
        async with running(cfg) as first:
            await asyncio.wait_for(first.leading.wait(), 5)
            await probe.publish(TOPICS.site_limit, limit, retain=True)
            await probe.expect(TOPICS.coordinator_site_limit_record)  # its record
            await probe.publish(TOPICS.site_limit, clear, retain=True)  # the replay
            await until(lambda: first.site_limits.refused == 1, 5, "the clear refused")
            assert first.site_limits.active_w(first._monotonic()) == 30_000.0
        async with running(cfg) as restarted:
            limits = restarted.site_limits
            # the retained clear and the record, in either order: both taken, or one refused
            await until(lambda: limits.taken + limits.refused >= 2, 5, "clear and record")
            await asyncio.wait_for(restarted.leading.wait(), 5)
            assert restarted.site_limits.limit is not None
            assert restarted.site_limits.limit.limit_w == 30_000.0
            assert restarted.site_limits.active_w(restarted._monotonic()) == 30_000.0


class CountingNotifier(SystemdNotifier):
    """Counts watchdog pings; wakes the test at the second."""

    def __init__(self) -> None:
        super().__init__(socket_path="")
        self.pings = 0
        self.pinged_twice = asyncio.Event()

    def watchdog(self) -> None:
        self.pings += 1
        if self.pings >= 2:
            self.pinged_twice.set()


@pytest.mark.asyncio
async def test_the_watchdog_is_pinged_while_the_broker_is_down(tmp_path):
    down = replace(
        parse_broker_url(f"mqtt://127.0.0.1:{free_port()}"),
        reconnect_min_s=0.05,
        reconnect_max_s=0.2,
    )
    _, leaf_pub = key_files(tmp_path)
    cfg = CoordinatorConfig(
        name="co-a", cluster=CLUSTER, period_s=0.2, grant_ttl_s=2.0, heartbeat_s=0.05,
        takeover_after_s=1.0, broker=down, controller_keys=(str(leaf_pub),),
    )  # fmt: skip
    notifier = CountingNotifier()
    core = build_coordinator(cfg, parse_budgets(three_rows()), signer=COORDINATOR_KEY).core
    service = CoordinatorService(cfg, core, signer=COORDINATOR_KEY, notifier=notifier)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        await asyncio.wait_for(notifier.pinged_twice.wait(), 10)
        assert not service.stats.up.is_set()  # never connected: pings come all the same
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
