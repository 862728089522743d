"""The asyncio shell of a service that leads by heartbeats (controller, leaf, coordinator).

One control connection to the broker (``powerd.mqtt.link``) kept up by
``keep_connected``; on every session the epoch is learnt afresh from the retained
heartbeat (waiting up to ``epoch_discovery_s``: a standby may have taken over while
we were away), then the service's own loop runs, and each pass calls
``take_over_if_due`` and ``beat``. A lost broker ends leading until the next session.
The systemd watchdog is pinged from the event loop, broker or not: a service waiting
for its broker is alive, a hung loop is restarted. A clean stop hands over at once:
a retained standby heartbeat on the same link, before it closes.

The rules of who leads are ``powerd.leadership.state``'s; this only does the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Protocol

from powerd.backoff import Backoff
from powerd.leadership.heartbeat import signed_heartbeat, step_down_on_exit
from powerd.leadership.state import Leadership
from powerd.mqtt.link import LINK_ERRORS, LinkError, MqttLink
from powerd.mqtt.session import SessionStats, cancel_until_done, keep_connected
from powerd.mqtt.url import BrokerSettings
from powerd.protocol import Heartbeat
from powerd.signing import Signer, Verifier
from powerd.systemd import SystemdNotifier
from powerd.vocabulary import ControllerState


class LeaderConfig(Protocol):
    """What the shell reads of a service's configuration (controller's or coordinator's)."""

    @property
    def name(self) -> str: ...
    @property
    def broker(self) -> BrokerSettings: ...
    @property
    def heartbeat_s(self) -> float: ...
    @property
    def takeover_after_s(self) -> float: ...
    @property
    def epoch_discovery_s(self) -> float: ...
    @property
    def max_clock_skew_s(self) -> float: ...


# The service's loop over one session's link: runs until the link is lost (LinkError)
# or the task is cancelled.
SessionLoop = Callable[[MqttLink], Awaitable[None]]


class LeaderShell:
    def __init__(
        self,
        config: LeaderConfig,
        link: MqttLink,
        topic: str,
        signer: Signer,
        verifier: Verifier,
        *,
        on_take_over: Callable[[int], None],
        seq: Callable[[], int | None],
        watchdog_s: float,
        notifier: SystemdNotifier,
        monotonic: Callable[[], float],
        wall: Callable[[], float],
        log: logging.Logger,
        who: str | None = None,
    ) -> None:
        """``link``: the control connection; ``topic``: our tier's heartbeat topic;
        ``verifier``: whose heartbeats count there (the tier's keys, ours among them);
        ``on_take_over(epoch)``: the service's part of a takeover (its core's new epoch,
        its records republished), before ``leading`` is set; ``seq()``: the number a
        leader heartbeat carries; ``watchdog_s``: between two systemd watchdog pings;
        ``who``: how the log names us on connecting (default: our name)."""
        self.config = config
        self.link = link
        self.topic = topic
        self.signer = signer
        self.verifier = verifier
        self.who = config.name if who is None else who
        self.notifier = notifier
        self.log = log
        self.leadership = Leadership(
            config.name, config.takeover_after_s, max_clock_skew_s=config.max_clock_skew_s
        )
        self.leading = asyncio.Event()  # set while leading
        self.stats = SessionStats()  # the control connection's sessions; .up while up
        # Set when serve() ends: no taking (back) the lead, no reconnecting. The loops end on
        # their own even when a cancellation is lost (asyncio.wait_for in 3.11 can drop one).
        self.stopping = False
        self.next_beat = 0.0  # loop time of the next leader heartbeat (while leading)
        self._on_take_over = on_take_over
        self._seq = seq
        self._watchdog_s = watchdog_s
        self._monotonic = monotonic
        self._wall = wall
        self._heartbeat_seen = asyncio.Event()

    async def serve(
        self,
        stop: asyncio.Event,
        loop: SessionLoop,
        ready: str,
        helpers: Collection[asyncio.Task[None]] = (),
    ) -> None:
        """Keep the connection up and run ``loop`` on each session until ``stop`` is set
        (or the connection loop fails); ``ready``: the status systemd is told at start.
        On the way out: ``helpers`` (the service's other tasks) are cancelled, a leader
        steps down on the link, then the link closes."""
        connection = asyncio.create_task(self._keep_connected(loop), name="connection")
        stopper = asyncio.create_task(stop.wait(), name="stop")
        watchdog = asyncio.create_task(self._watchdog(), name="watchdog")
        self.notifier.ready(ready)
        try:
            done, _ = await asyncio.wait({connection, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if connection in done:
                connection.result()
        finally:
            self.notifier.stopping()
            self.stopping = True
            await cancel_until_done({stopper, watchdog, *helpers}, self.log)
            await self.step_down_on_exit()
            await cancel_until_done({connection}, self.log)
            self.link.close()

    async def _watchdog(self) -> None:
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(self._watchdog_s)

    def backoff(self) -> Backoff:
        """A reconnect backoff of the broker's settings (one per connection kept up)."""
        broker = self.config.broker
        return Backoff(broker.reconnect_min_s, broker.reconnect_max_s)

    async def _keep_connected(self, loop: SessionLoop) -> None:
        await keep_connected(
            functools.partial(self._session, loop),
            what=f"broker {self.config.broker.display}",
            backoff=self.backoff(),
            stopping=lambda: self.stopping,
            log=self.log,
            expected=(LinkError, *LINK_ERRORS),
            on_down=self.down,
            stats=self.stats,
        )

    async def _session(self, loop: SessionLoop, connected: Callable[[], None]) -> None:
        # Every session learns the epoch afresh from the retained heartbeat: leading at once
        # on a flag left set by the last session would make two leaders.
        self._heartbeat_seen.clear()
        await self.link.connect()
        connected()
        self.log.info("connected to %s as %s", self.config.broker.display, self.who)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.epoch_discovery_s):
                await self._heartbeat_seen.wait()
        await loop(self.link)

    def down(self) -> None:
        """The session ended, however: the link closed, and no longer leading."""
        self.link.close()
        if self.leadership.leading:
            self.log.warning("lost the broker: no longer leading until reconnected")
            self.leadership.leading = False
            self.leading.clear()

    def take_over_if_due(self, now: float) -> bool:
        """Lead (a new epoch; the service's ``on_take_over``) if not stopping and no live
        leader was heard for ``takeover_after_s``; ``now``: loop time. True if it did."""
        if self.stopping or not self.leadership.should_lead(self._monotonic()):
            return False
        epoch = self.leadership.take_over(floor=int(self._wall() * 1000))
        self._on_take_over(epoch)
        self.leading.set()
        self.notifier.status(f"leading, epoch {epoch}")
        self.next_beat = now
        return True

    def beat(self, now: float) -> None:
        """A leader's heartbeat, retained, when one is due (every ``heartbeat_s``)."""
        if self.leadership.leading and now >= self.next_beat:
            self.link.publish(self.topic, self.heartbeat("leader"), qos=1, retain=True)
            self.next_beat = now + self.config.heartbeat_s

    def wake(self, due: float) -> float:
        """When the loop must wake: at ``due``, or sooner for a leader's next heartbeat. A
        standby sends none (its ``next_beat`` is stale: waking for it would spin)."""
        return min(due, self.next_beat) if self.leadership.leading else due

    def heartbeat(self, state: ControllerState) -> bytes:
        """Our heartbeat, signed, on this epoch's time base (``Leadership.beat_ts``)."""
        ts = self.leadership.beat_ts(self._monotonic(), self._wall())
        return signed_heartbeat(self.signer, self.topic, self.leadership, state, ts, self._seq())

    def on_heartbeat(self, payload: bytes, live: bool) -> None:
        """A heartbeat on our topic (``live`` or retained), liveness by receipt
        (``Leadership.observe``); ProtocolError when it is not a peer's, signed."""
        beat = self.verifier.decode(Heartbeat, self.topic, payload)
        if self.leadership.observe(beat, self._monotonic(), self._wall(), live):
            self.leading.clear()
        self._heartbeat_seen.set()

    async def step_down_on_exit(self) -> None:
        ts = self.leadership.beat_ts(self._monotonic(), self._wall())
        await step_down_on_exit(self.link, self.leadership, self.topic, self.signer, ts, self.log)
