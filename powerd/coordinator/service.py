"""`powerd coordinator`: a thin asyncio shell around ``CoordinatorCore`` and ``LeaderShell``.

One connection to the (site) broker: summaries, coordinator heartbeats and the
operator's site limits in, grants, our heartbeat and our record of the site limit
(``powerd.site_limits.record``) out, every one signed. A leader/standby pair works as
the controllers' does (``powerd.leadership``) on its own heartbeat
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

from powerd.coordinator.config import CoordinatorConfig
from powerd.coordinator.core import CoordinatorCore, Period
from powerd.leadership.shell import LeaderShell
from powerd.leadership.state import Leadership
from powerd.leadership.state_report import StateReport
from powerd.mqtt.link import LinkError, MqttLink
from powerd.mqtt.session import SessionStats
from powerd.protocol import ProtocolError, Summary, Topics, encode
from powerd.ratelimit import LogOncePer
from powerd.signing import Signer
from powerd.site_limits.limits import SiteLimits
from powerd.site_limits.record import SiteLimitRecord, operator_limit
from powerd.systemd import SystemdNotifier

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
        self.lead = LeaderShell(
            config,
            self.link,
            t.coordinator_heartbeat,
            self.signer,
            self.heartbeats_from,
            on_take_over=self._took_over,
            # seq: the last grant round's, a restarted leaf's floor against replayed grants
            seq=lambda: self.core.seq,
            # WatchdogSec=30s: a coordinator waiting for its broker is alive
            watchdog_s=min(config.heartbeat_s, 5.0),
            notifier=self.notifier,
            monotonic=monotonic,
            wall=wall,
            log=log,
            who=f"coordinator {config.name}",
        )
        # an operator's temporary site limit (demand response)
        self.site_limits = SiteLimits(max_clock_skew_s=config.max_clock_skew_s)
        core.max_clock_skew_s = config.max_clock_skew_s
        self.operators = config.operator_verifier()
        self.site_limit_record = SiteLimitRecord(
            t.coordinator_site_limit_record, self.signer, self.heartbeats_from, log
        )
        # the leader's state, for people (powerd status, powerd limit's confirmation)
        self.state_report = StateReport(
            t.coordinator_state, self.signer, "coordinator", config.name
        )
        self.periods: list[Period] = []  # the last few
        self.period_listeners: list[Callable[[Period], None]] = []
        self._monotonic = monotonic
        self._wall = wall
        self.rejected = 0  # payloads refused: unsigned, forged or malformed (its /metrics)
        self._log = LogOncePer(log)

    @property
    def leadership(self) -> Leadership:
        return self.lead.leadership

    @property
    def leading(self) -> asyncio.Event:
        """Set while leading."""
        return self.lead.leading

    @property
    def stats(self) -> SessionStats:
        """The connection's sessions; ``.up`` set while up."""
        return self.lead.stats

    async def run(self, stop: asyncio.Event) -> None:
        ready = f"coordinator of {len(self.core.specs)} leaves, connecting"
        try:
            await self.lead.serve(stop, self._loop, ready)
        finally:
            log.info("coordinator stopped")

    async def _loop(self, link: MqttLink) -> None:
        loop, lead = asyncio.get_running_loop(), self.lead
        next_period = loop.time()
        assert link.lost is not None
        # Runs until the link is lost or the task is cancelled: on a stop, the shell steps
        # down (a standby heartbeat, awaited) on this very link before it cancels us.
        while not link.lost.done():
            now = loop.time()
            if lead.take_over_if_due(now):
                next_period = now
            lead.beat(now)
            if now >= next_period:
                if self.leadership.leading and not lead.stopping:
                    self._grant(link)
                next_period = max(next_period + self.config.period_s, now)
            wake = min(lead.wake(next_period), now + self.config.heartbeat_s)
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
        if self.state_report.due(self._monotonic(), self.leadership.epoch):
            self._publish_state(link)
        c = period.counters
        log.info(
            "period %d: site %.1f kW measured, %d leaves heard, %d silent, %.1f kW reserved",
            self.core.seq,
            period.site_measured_w / 1e3,
            c.leaves_heard,
            c.leaves_silent,
            period.allocation.reserved_w / 1e3,
        )

    def _publish_state(self, link: MqttLink) -> None:
        """The leader's state, retained (``powerd.leadership.state_report``)."""
        now = self._monotonic()
        silent = self.periods[-1].counters.leaves_silent if self.periods else None
        self.state_report.publish(
            link,
            now,
            epoch=self.leadership.epoch,
            wall=self._wall(),
            limit=self.site_limits.held(now),
            leaves_silent=silent,
        )

    def _took_over(self, epoch: int) -> None:
        """Our part of taking the lead: the core's new epoch, the site limit's record."""
        self.core.new_epoch(epoch)
        self.site_limit_record.publish(self.link, self.site_limits)

    def _on_message(
        self, topic: str, payload: bytes, _arrived: float, retained: bool = False
    ) -> None:
        now, live = self._monotonic(), not retained
        try:
            kind, name = self.topics.parse(topic)
            if kind == "coordinator":
                self.lead.on_heartbeat(payload, live)
            elif kind == "site_limit":
                limit = operator_limit(self.operators, topic, payload)
                why = self.site_limits.take(limit, now, self._wall(), live=live)
                if why is not None:
                    self.state_report.refuse(limit, why, self.site_limits.holds(limit))
                    self._log.warning("site-limit-order", now, "site limit ignored: %s", why)
                else:
                    log.warning("site limit taken: %s", self.site_limits.limit)
                    if self.leadership.leading:
                        self.site_limit_record.publish(self.link, self.site_limits)
                if self.leadership.leading:  # the operator's `powerd limit` waits for it
                    self._publish_state(self.link)
            elif kind == "coordinator_site_limit_record":
                self.site_limit_record.take(self.site_limits, payload, now, self._wall())
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
            self.rejected += 1
            self._log.warning(f"bad-{topic}", now, "refused %s: %s", topic, exc)
        except Exception:  # no payload stops the coordinator
            log.exception("unexpected error handling %s", topic)
