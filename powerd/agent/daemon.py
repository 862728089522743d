"""The agent daemon: a thin asyncio shell around ``AgentCore``.

Two loops run side by side:
- the *sample loop*, every ``period_s`` whatever the network does: deadline
  checks (failsafe), a telemetry sample, the status when the mode changed, the
  systemd watchdog ping. It never waits on the broker, so a node stays safe
  and its watchdog fed while the broker is unreachable.
- the *connection loop*: connect with a last will (offline status, retained),
  subscribe, hand every message to the core, publish its acks; on any broker
  failure, reconnect with exponential backoff and jitter. It is subscribed to a
  job's phase topic only while the core holds a clock policy for that job
  (``powerd.agent.phase_clock``): before the ack of the command that granted it is
  published, so a controller that has the ack knows the agent listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Sequence

import aiomqtt

from powerd.agent.config import AgentConfig
from powerd.agent.core import AgentCore
from powerd.backoff import Backoff
from powerd.gpu import Gpu, PowerScope
from powerd.gpu.module_scope import with_module_scope
from powerd.gpu.software_smoothing import with_software_smoothing
from powerd.metrics.readings import AgentReading, GpuReading
from powerd.mqtt.session import SessionStats, cancel_until_done, keep_connected
from powerd.protocol import NodeState, Telemetry, Topics, encode
from powerd.ratelimit import TokenBucket
from powerd.signing import Verifier
from powerd.systemd import SystemdNotifier

log = logging.getLogger("powerd.agent")

PUBLISH_TIMEOUT_S = 5.0
# Acks for malformed commands: enough for a controller to see what is wrong,
# too few for a flood of garbage to become a flood of acks.
REJECTED_ACKS_PER_S = 5.0


class AgentDaemon:
    def __init__(
        self,
        config: AgentConfig,
        gpus: Sequence[Gpu],
        notifier: SystemdNotifier | None = None,
        rng: random.Random | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        verifier: Verifier | None = None,
    ) -> None:
        """``verifier``: the trusted controller keys; by default loaded from the config's
        ``controller_keys`` (ConfigError if they cannot be, before any GPU is touched)."""
        self.config = config
        self.topics = Topics(config.cluster, scope=config.controller_scope)
        if config.power_limit_scope == PowerScope.MODULE:
            gpus = with_module_scope(gpus)
        if config.software_smoothing:
            gpus = with_software_smoothing(gpus)
        self.core = AgentCore(
            node=config.node,
            gpus=gpus,
            failsafe=config.failsafe,
            failsafe_after_s=config.failsafe_after_s,
            verifier=verifier if verifier is not None else config.verifier(),
            mode=config.mode,
            cluster=config.cluster,
            scope=config.controller_scope,
            max_command_ttl_s=config.max_command_ttl_s,
            period_s=config.period_s,
            monotonic=monotonic,
            wall=wall,
            max_clock_skew_s=config.max_clock_skew_s,
        )
        self.notifier = notifier or SystemdNotifier()
        self.session = SessionStats()  # sessions up so far, failures, and whether one is up now
        self._sampled = asyncio.Condition()  # notified after every sample-loop pass
        self._client: aiomqtt.Client | None = None
        self._stopping = False
        self._published_state: NodeState | None = None
        self._backoff = Backoff(
            config.broker.reconnect_min_s, config.broker.reconnect_max_s, rng=rng
        )
        self._rejected_acks = TokenBucket(REJECTED_ACKS_PER_S, 2 * REJECTED_ACKS_PER_S, monotonic)
        self._phase_subscribed: set[str] = set()  # job phase topics subscribed this session
        self._subscribing = asyncio.Lock()
        self._resync: asyncio.Task[None] | None = None  # a sync the sample loop started
        self.last_telemetry: Telemetry | None = None  # the last sample (its /metrics reads it)
        self.acks_sent: dict[str, int] = {}  # by result (its /metrics reads them)

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set; then leave the GPUs as configured and say offline."""
        self.core.start()  # safety rule 1: failsafe caps before connecting anywhere
        self.last_telemetry = self.core.telemetry()  # /metrics shows those caps at once
        self.notifier.ready(f"failsafe caps applied on {len(self.core.gpus)} GPU(s)")
        tasks = {
            asyncio.create_task(self._sample_loop(), name="sample"),
            asyncio.create_task(self._connection_loop(), name="connection"),
        }
        stopper = asyncio.create_task(stop.wait(), name="stop")
        try:
            done, _ = await asyncio.wait(tasks | {stopper}, return_when=asyncio.FIRST_COMPLETED)
            for task in done - {stopper}:
                task.result()  # a loop that ended on its own is a bug: raise it
        finally:
            self.notifier.stopping()
            stopper.cancel()
            await self._shutdown(tasks)

    async def _shutdown(self, tasks: set[asyncio.Task[None]]) -> None:
        self._stopping = True
        sample = next(t for t in tasks if t.get_name() == "sample")
        await cancel_until_done({sample}, log)
        self.core.stop(self.config.on_exit)
        client = self._client
        if client is not None:
            try:
                await client.publish(
                    self.topics.status(self.config.node),
                    encode(self.core.status("offline")),
                    qos=1,
                    retain=True,
                    timeout=2.0,
                )
            except (aiomqtt.MqttError, TimeoutError) as exc:
                log.warning("could not publish offline status on exit: %s", exc)
        if self._resync is not None:
            tasks = tasks | {self._resync}
        await cancel_until_done(tasks, log)
        log.info("agent stopped")

    # --- the sample loop ---------------------------------------------------

    async def _sample_loop(self) -> None:
        period_s = self.config.period_s
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        topic = self.topics.telemetry(self.config.node)
        fill_topic = self.topics.fill(self.config.node)
        while not self._stopping:  # the flag too: see powerd.mqtt.session
            self.core.tick()
            self.last_telemetry = sample = self.core.telemetry()
            telemetry = encode(sample)
            fill = self.core.fill
            client = self._client
            if client is not None:
                # QoS 0 and never awaited for long: a slow broker costs samples
                # (seq shows the gap), never the deadline checks.
                with contextlib.suppress(aiomqtt.MqttError, TimeoutError):
                    await client.publish(topic, telemetry, qos=0, timeout=period_s)
                    if fill is not None:  # software smoothing: the jobs fill their waits
                        await client.publish(fill_topic, encode(fill), qos=0, timeout=period_s)
            await self._publish_status_if_changed()
            self._resync_if_needed()
            self.notifier.watchdog()
            async with self._sampled:
                self._sampled.notify_all()
            next_at += period_s
            delay = next_at - loop.time()
            if delay < 0:  # fell behind (suspended, overloaded): skip, don't burst
                next_at = loop.time()
                delay = 0
            await asyncio.sleep(delay)

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Wait until ``predicate()`` holds after a sample-loop pass (for tests and the demo)."""
        async with self._sampled:
            await asyncio.wait_for(self._sampled.wait_for(predicate), timeout_s)

    async def _publish_status_if_changed(self, force: bool = False) -> None:
        state = self.core.node_state
        client = self._client
        if client is None or (state == self._published_state and not force):
            return
        try:
            await client.publish(
                self.topics.status(self.config.node),
                encode(self.core.status(state)),
                qos=1,
                retain=True,
                timeout=PUBLISH_TIMEOUT_S,
            )
        except (aiomqtt.MqttError, TimeoutError) as exc:
            log.warning("could not publish status %s: %s", state, exc)
            return
        if state != self._published_state:
            log.info("status %s published", state)
        self._published_state = state
        self.notifier.status(f"{state}, mode {self.core.mode}")

    def metrics_reading(self) -> AgentReading:
        """What ``/metrics`` shows now (``powerd.metrics.agent``; read from its thread)."""
        core, sample = self.core, self.last_telemetry
        gpus = () if sample is None else sample.gpus
        return AgentReading(
            node=self.config.node,
            mode=core.mode,
            heartbeat_mono=core.heartbeat_heard_mono,
            gpus=tuple(GpuReading(g.index, g.power_w, g.cap_w) for g in gpus),
            acks=dict(self.acks_sent),
            rejected_signatures=core.counters.unverified,
            clock_alarms=core.counters.clock_alarms,
        )

    # --- the connection loop -----------------------------------------------

    @property
    def connected(self) -> asyncio.Event:
        """Set while a broker session is up."""
        return self.session.up

    async def _connection_loop(self) -> None:
        broker = self.config.broker
        await keep_connected(
            self._connect_and_serve,
            what=f"broker {broker.display}",
            backoff=self._backoff,
            stopping=lambda: self._stopping,
            log=log,
            expected=(aiomqtt.MqttError,),
            misconfigured=(ValueError, OSError),  # unreadable password or TLS files
            on_down=self._on_down,
            stats=self.session,
        )

    def _on_down(self) -> None:
        self._client = None
        self._published_state = None
        self._phase_subscribed = set()  # clean session: the broker keeps none of them

    async def _connect_and_serve(self, connected: Callable[[], None]) -> None:
        node = self.config.node
        will = aiomqtt.Will(
            topic=self.topics.status(node),
            payload=encode(self.core.status("offline")),
            qos=1,
            retain=True,
        )
        async with aiomqtt.Client(
            **self.config.broker.client_kwargs(),
            identifier=f"powerd-agent-{self.config.cluster}-{node}",
            will=will,
            clean_session=True,
            timeout=PUBLISH_TIMEOUT_S,
        ) as client:
            await self._session(client, connected)

    async def _session(self, client: aiomqtt.Client, connected: Callable[[], None]) -> None:
        node = self.config.node
        self._phase_subscribed = set()
        if self.config.mode == "controlled":
            await client.subscribe(self.topics.command(node), qos=1)
            await client.subscribe(self.topics.heartbeat, qos=1)
            await self._sync_phase_topics(client)
        self._client = client
        log.info("connected to %s as node %s", self.config.broker.display, node)
        await self._publish_status_if_changed(force=True)
        connected()
        command_topic = self.topics.command(node)
        async for message in client.messages:
            payload = message.payload
            if not isinstance(payload, bytes | bytearray):
                payload = b"" if payload is None else str(payload).encode()
            try:
                # deadlines first, and failsafe said before the message: after a stall the
                # backlog's heartbeats must not hide that this node was out of control
                self.core.tick()
                await self._publish_status_if_changed()
                topic = message.topic.value
                if topic == command_topic:
                    await self._on_command(client, bytes(payload))
                elif topic == self.topics.heartbeat:  # retained: on subscribe, not sent now
                    self.core.on_heartbeat(bytes(payload), live=not message.retain)
                else:  # a job's phase topic (the only others subscribed)
                    self.core.on_phase(topic, bytes(payload))
                await self._sync_phase_topics(client)  # a newer epoch or failsafe ends policies
                await self._publish_status_if_changed()
            except aiomqtt.MqttError:
                raise
            except Exception:  # safety rule 3: no input stops the agent
                log.exception("unexpected error handling a message on %s", message.topic.value)

    async def _on_command(self, client: aiomqtt.Client, payload: bytes) -> None:
        ack = self.core.on_command(payload)
        await self._sync_phase_topics(client)  # listening before the controller has the ack
        self.acks_sent[ack.result] = self.acks_sent.get(ack.result, 0) + 1
        if ack.result == "rejected" and not self._rejected_acks.take():
            return
        await client.publish(
            self.topics.ack(self.config.node), encode(ack), qos=1, timeout=PUBLISH_TIMEOUT_S
        )

    async def _sync_phase_topics(self, client: aiomqtt.Client) -> None:
        """Subscribe to the phase topics of the clock policies held now, and to no other."""
        async with self._subscribing:
            wanted = self.core.phase_topics
            for topic in sorted(wanted - self._phase_subscribed):
                granted = await client.subscribe(topic, qos=1)
                self._phase_subscribed.add(topic)
                if any(_refused(code) for code in granted):
                    log.warning(
                        "the broker refused a subscription to %s: this node's clocks will not "
                        "follow that job's announcements (let agents read phase topics in the "
                        "broker's ACL: docs/BROKERS.md)",
                        topic,
                    )
                else:
                    log.info("following announcements on %s (clock policy)", topic)
            for topic in sorted(self._phase_subscribed - wanted):
                await client.unsubscribe(topic)
                self._phase_subscribed.discard(topic)
                log.info("no longer following %s", topic)

    def _resync_if_needed(self) -> None:
        """From the sample loop, which never waits on the broker: when a deadline ended the
        policies, unsubscribe in a task of its own."""
        client = self._client
        if client is None or self.core.phase_topics == self._phase_subscribed:
            return
        if self._resync is not None and not self._resync.done():
            return
        self._resync = asyncio.create_task(self._resync_quietly(client))

    async def _resync_quietly(self, client: aiomqtt.Client) -> None:
        with contextlib.suppress(aiomqtt.MqttError, TimeoutError):
            await self._sync_phase_topics(client)


def _refused(code: object) -> bool:
    """A SUBACK's failure: 0x80 in MQTT 3.1.1, a failure reason code in MQTT 5."""
    return code == 0x80 or bool(getattr(code, "is_failure", False))
