"""`powerd coordinator`: a thin asyncio shell around ``CoordinatorCore`` and ``Leadership``.

One connection to the (site) broker: summaries, coordinator heartbeats and the
operator's site limits in, grants, our heartbeat and our record of the site limit
(``powerd.site_limit_record``) out, every one signed. A leader/standby pair works as
the controllers' does (``powerd.controller.leadership``) on its own heartbeat
topic: a standby takes over once the leader is silent ``takeover_after_s``,
before the leaves' grants expire. Grants are retained: a leaf controller that
restarts, or a standby leaf that takes over, has its scope's grant at once
(a grant older than its TTL is refused by its ``ts``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from powerd.backoff import Backoff
from powerd.controller.leadership import Leadership
from powerd.controller.site_limit import SiteLimits
from powerd.coordinator.config import CoordinatorConfig
from powerd.coordinator.core import CoordinatorCore, Period
from powerd.heartbeat import signed_heartbeat, step_down_on_exit
from powerd.mqtt_link import LINK_ERRORS, LinkError, MqttLink
from powerd.mqtt_session import SessionStats, cancel_until_done, keep_connected
from powerd.protocol import Heartbeat, ProtocolError, SiteLimit, Summary, Topics, encode
from powerd.ratelimit import LogOncePer
from powerd.signing import Signer
from powerd.site_limit_record import SiteLimitRecord
from powerd.systemd import SystemdNotifier
from powerd.vocabulary import ControllerState

log = logging.getLogger("powerd.coordinator")


class CoordinatorService:
    def __init__(
        self,
        config: CoordinatorConfig,
        core: CoordinatorCore,
        signer: Signer | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        notifier: SystemdNotifier | None = None,
    ) -> None:
        self.config = config
        self.core = core
        self.signer = signer if signer is not None else config.signer()
        self.summaries_from = config.summary_verifier()  # the leaves' keys only
        self.heartbeats_from = config.heartbeat_verifier(self.signer)  # coordinators' only
        self.notifier = notifier or SystemdNotifier()
        self.topics = t = Topics(config.cluster)
        self.link = MqttLink(
            config.broker,
            f"powerd-coordinator-{config.cluster}-{config.name}",
            [
                (t.coordinator_heartbeat, 1),
                (t.all_summaries, 1),
                (t.site_limit, 1),
                (t.coordinator_site_limit_record, 1),  # the limits' order, across restarts
            ],
            self._on_message,
            monotonic=monotonic,
        )
        self.leadership = Leadership(
            config.name, config.takeover_after_s, max_clock_skew_s=config.max_clock_skew_s
        )
        # an operator's temporary site limit (demand response)
        self.site_limits = SiteLimits(max_clock_skew_s=config.max_clock_skew_s)
        core.max_clock_skew_s = config.max_clock_skew_s
        self.operators = config.operator_verifier()
        self.site_limit_record = SiteLimitRecord(
            t.coordinator_site_limit_record, self.signer, self.heartbeats_from
        )
        self.stats = SessionStats()
        self.leading = asyncio.Event()
        self.periods: list[Period] = []  # the last few
        self.period_listeners: list[Callable[[Period], None]] = []
        self._monotonic = monotonic
        self._wall = wall
        self._heartbeat_seen = asyncio.Event()
        self._stopping = False
        self._log = LogOncePer(log)

    async def run(self, stop: asyncio.Event) -> None:
        connection = asyncio.create_task(self._connection_loop(), name="connection")
        stopper = asyncio.create_task(stop.wait(), name="stop")
        watchdog = asyncio.create_task(self._watchdog(), name="watchdog")
        self.notifier.ready(f"coordinator of {len(self.core.specs)} leaves, connecting")
        try:
            done, _ = await asyncio.wait({connection, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if connection in done:
                connection.result()
        finally:
            self.notifier.stopping()
            self._stopping = True
            await cancel_until_done({stopper, watchdog}, log)
            await self._step_down_on_exit()
            await cancel_until_done({connection}, log)
            self.link.close()
            log.info("coordinator stopped")

    async def _watchdog(self) -> None:
        """systemd watchdog pings from the event loop, broker or not (WatchdogSec=30s): a
        coordinator waiting for its broker is alive; a hung loop is restarted."""
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(min(self.config.heartbeat_s, 5.0))

    async def _connection_loop(self) -> None:
        await keep_connected(
            self._session,
            what=f"broker {self.config.broker.display}",
            backoff=Backoff(self.config.broker.reconnect_min_s, self.config.broker.reconnect_max_s),
            stopping=lambda: self._stopping,
            log=log,
            expected=(LinkError, *LINK_ERRORS),
            on_down=self._down,
            stats=self.stats,
        )

    def _down(self) -> None:
        self.link.close()
        if self.leadership.leading:
            log.warning("lost the broker: no longer leading until reconnected")
            self.leadership.leading = False
            self.leading.clear()

    async def _session(self, connected: Callable[[], None]) -> None:
        self._heartbeat_seen.clear()
        await self.link.connect()
        connected()
        log.info("connected to %s as coordinator %s", self.config.broker.display, self.config.name)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.epoch_discovery_s):
                await self._heartbeat_seen.wait()
        await self._loop(self.link)

    async def _loop(self, link: MqttLink) -> None:
        loop = asyncio.get_running_loop()
        next_period = next_beat = loop.time()
        assert link.lost is not None
        # Runs until the link is lost or the task is cancelled: on a stop, run() steps down
        # (a standby heartbeat, awaited) on this very link before it cancels us.
        while not link.lost.done():
            now = loop.time()
            if not self._stopping and self.leadership.should_lead(self._monotonic()):
                self.core.new_epoch(self.leadership.take_over(floor=int(self._wall() * 1000)))
                self.site_limit_record.publish(link, self.site_limits)
                self.leading.set()
                self.notifier.status(f"leading, epoch {self.leadership.epoch}")
                next_beat = next_period = now
            if self.leadership.leading and now >= next_beat:
                topic = self.topics.coordinator_heartbeat
                link.publish(topic, self._heartbeat("leader"), qos=1, retain=True)
                next_beat = now + self.config.heartbeat_s
            if now >= next_period:
                if self.leadership.leading and not self._stopping:
                    self._grant(link)
                next_period = max(next_period + self.config.period_s, now)
            wake = min(next_period, next_beat) if self.leadership.leading else next_period
            wake = min(wake, now + self.config.heartbeat_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, wake - loop.time())):
                    await asyncio.shield(link.lost)
        if link.lost.done():
            raise LinkError(f"connection lost: {link.lost.result()}")

    def _grant(self, link: MqttLink) -> None:
        threshold = self.site_limits.threshold_w(
            self._monotonic(),  # a limit's window is on this clock, from its receipt
            self.core.site_measured_w(),
            self.config.period_s,
            self.core.glide_ramp_w_per_s,
        )
        period = self.core.period(threshold)
        grant_topic, sign = self.topics.grant, self.signer.sign
        for grant in period.grants:
            topic = grant_topic(grant.scope)
            link.publish(topic, sign(topic, encode(grant)), qos=1, retain=True)
        self.periods = [*self.periods[-59:], period]
        for listener in self.period_listeners:
            try:
                listener(period)
            except Exception:
                log.exception("period listener %r failed", listener)
        c = period.counters
        log.info(
            "period %d: site %.1f kW measured, %d leaves heard, %d silent, %.1f kW reserved",
            self.core.seq,
            period.site_measured_w / 1e3,
            c.leaves_heard,
            c.leaves_silent,
            period.allocation.reserved_w / 1e3,
        )

    def _heartbeat(self, state: ControllerState) -> bytes:
        ts = self.leadership.beat_ts(self._monotonic(), self._wall())
        topic = self.topics.coordinator_heartbeat
        # seq: the last grant round's, a restarted leaf's floor against replayed grants
        return signed_heartbeat(self.signer, topic, self.leadership, state, ts, self.core.seq)

    async def _step_down_on_exit(self) -> None:
        await step_down_on_exit(
            self.link,
            self.leadership,
            self.topics.coordinator_heartbeat,
            self.signer,
            self.leadership.beat_ts(self._monotonic(), self._wall()),
            log,
        )

    def _on_message(
        self, topic: str, payload: bytes, _arrived: float, retained: bool = False
    ) -> None:
        now, live = self._monotonic(), not retained
        try:
            kind, name = self.topics.parse(topic)
            if kind == "coordinator":
                beat = self.heartbeats_from.decode(Heartbeat, topic, payload)
                if self.leadership.observe(beat, now, self._wall(), live):
                    self.leading.clear()
                self._heartbeat_seen.set()
            elif kind == "site_limit":
                if self.operators is None:
                    raise ProtocolError("no operator key is trusted (trust.operator_keys)")
                limit = self.operators.decode(SiteLimit, topic, payload)
                why = self.site_limits.take(limit, now, self._wall(), live=live)
                if why is not None:
                    self._log.warning("site-limit-order", now, "site limit ignored: %s", why)
                else:
                    log.warning("site limit taken: %s", self.site_limits.limit)
                    if self.leadership.leading:
                        self.site_limit_record.publish(self.link, self.site_limits)
            elif kind == "coordinator_site_limit_record":
                record = self.site_limit_record.take(self.site_limits, payload, now, self._wall())
                if record is not None:
                    log.info("site limit record taken: operator %s's of ts %.3f, seq %d",
                             record.operator, record.ts, record.seq)  # fmt: skip
            elif kind == "summary":
                summary = self.summaries_from.decode(Summary, topic, payload)
                if summary.scope != name:
                    raise ProtocolError(f"a summary of scope {summary.scope} on {topic}")
                ahead_s = summary.ts - self._wall()
                if not self.core.on_summary(summary, live=live) and ahead_s > 0:
                    self._log.warning(
                        f"summary-clock-{name}",
                        now,
                        "summary of %s not taken: its ts is %.1f s ahead of this clock "
                        "(a clock alarm past max_clock_skew_s %g s)",
                        name,
                        ahead_s,
                        self.config.max_clock_skew_s,
                    )
        except ProtocolError as exc:  # forged, unsigned or malformed: it counts for nothing
            self._log.warning(f"bad-{topic}", now, "refused %s: %s", topic, exc)
        except Exception:  # no payload stops the coordinator
            log.exception("unexpected error handling %s", topic)
