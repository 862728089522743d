"""`powerd controller`: a thin asyncio shell around ``ControllerCore`` and ``Leadership``.

One connection to the broker. The message loop feeds telemetry, acks,
statuses, phases and heartbeats to the core; the cycle loop, every
``cycle_s`` while leading, runs the policy, publishes the commands that
changed, the heartbeat, and hands what happened to the recorder.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import aiomqtt

from powerd.backoff import Backoff
from powerd.controller.config import ControllerConfig
from powerd.controller.core import ControllerCore, CycleResult, Layout
from powerd.controller.leadership import Leadership
from powerd.controller.records import Records
from powerd.protocol import Heartbeat, ProtocolError, Topics, decode, encode
from powerd.recorder import Recorder
from powerd.systemd import SystemdNotifier

log = logging.getLogger("powerd.controller")

# QoS 1 commands in flight at once on the controller's connection (paho's default is 20).
MAX_INFLIGHT = 1000


class ControllerService:
    def __init__(
        self,
        config: ControllerConfig,
        core: ControllerCore,
        layout: Layout,
        recorder: Recorder | None = None,
        records: Records | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        notifier: SystemdNotifier | None = None,
    ) -> None:
        self.config = config
        self.notifier = notifier or SystemdNotifier()
        self.core = core
        self.layout = layout
        self.recorder = recorder
        self.records = records  # builds the recorder's points
        self.topics = Topics(config.cluster)
        self.leadership = Leadership(config.name, config.takeover_after_s)
        self.cycles: list[CycleResult] = []  # the last few
        # called with every cycle's result as soon as it is decided (the demo's trace, tests)
        self.cycle_listeners: list[Callable[[CycleResult], None]] = []
        self.connected = asyncio.Event()
        self.leading = asyncio.Event()
        self._monotonic = monotonic
        self._wall = wall
        self._client: aiomqtt.Client | None = None
        self._heartbeat_seen = asyncio.Event()
        self._cycled = asyncio.Condition()
        # Set when run() ends: no taking (back) the lead, no reconnecting. The loops end on
        # their own even when a cancellation is lost (asyncio.wait_for in 3.11 can drop one).
        self._stopping = False
        self._backoff = Backoff(config.broker.reconnect_min_s, config.broker.reconnect_max_s)

    async def run(self, stop: asyncio.Event) -> None:
        connection = asyncio.create_task(self._connection_loop(), name="connection")
        stopper = asyncio.create_task(stop.wait(), name="stop")
        watchdog = asyncio.create_task(self._watchdog(), name="watchdog")
        self.notifier.ready(f"cluster {self.config.cluster}, connecting to the broker")
        try:
            done, _ = await asyncio.wait({connection, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if connection in done:
                connection.result()
        finally:
            self.notifier.stopping()
            self._stopping = True
            stopper.cancel()
            watchdog.cancel()
            await self._step_down_on_exit()
            connection.cancel()
            await asyncio.gather(connection, return_exceptions=True)
            if self.recorder is not None:  # flushes what is buffered, for at most 5 s
                await asyncio.to_thread(self.recorder.close, 5.0)
            log.info("controller stopped")

    async def _watchdog(self) -> None:
        """systemd watchdog pings from the event loop, broker or not: a hung loop gets restarted."""
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(min(self.config.cycle_s, 5.0))

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Wait until ``predicate()`` holds after a control cycle (for tests and the demo)."""
        async with self._cycled:
            await asyncio.wait_for(self._cycled.wait_for(predicate), timeout_s)

    # --- connection ------------------------------------------------------------

    async def _connection_loop(self) -> None:
        broker = self.config.broker
        while not self._stopping:
            try:
                async with aiomqtt.Client(
                    **broker.client_kwargs(),
                    identifier=f"powerd-controller-{self.config.cluster}-{self.config.name}",
                    clean_session=True,
                    timeout=5.0,
                    max_inflight_messages=MAX_INFLIGHT,
                ) as client:
                    # a cycle may command every node at once: that is no backlog to warn of
                    client.pending_calls_threshold = 2 * len(self.layout.server_names) + 10
                    self._client = client
                    self._backoff.reset()
                    await self._session(client)
            except aiomqtt.MqttError as exc:
                log.warning("broker %s: %s", broker.display, exc)
            finally:
                self._client = None
                self.connected.clear()
                if self.leadership.leading:
                    log.warning("lost the broker: no longer leading until reconnected")
                    self.leadership.leading = False
                    self.leading.clear()
            delay_s = self._backoff.next_delay_s()
            await asyncio.sleep(delay_s)

    async def _session(self, client: aiomqtt.Client) -> None:
        t = self.topics
        await client.subscribe(t.heartbeat, qos=1)
        for topic in (t.all_telemetry, t.all_acks, t.all_status, t.all_phases):
            await client.subscribe(topic, qos=1)
        self.connected.set()
        log.info("connected to %s as %s", self.config.broker.display, self.config.name)
        reader = asyncio.create_task(self._read(client))
        try:
            # learn the current epoch from the retained heartbeat, if there is one
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._heartbeat_seen.wait(), self.config.epoch_discovery_s)
            await self._control_loop(client, reader)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _control_loop(self, client: aiomqtt.Client, reader: asyncio.Task) -> None:
        loop = asyncio.get_running_loop()
        next_cycle = loop.time()
        next_beat = loop.time()
        while not reader.done() and not self._stopping:
            now = loop.time()
            if self.leadership.leading and self.core.newest_agent_epoch > self.leadership.epoch:
                # Agents follow a newer epoch than ours (the broker lost the retained
                # heartbeat we started from): they would ignore us. Lead above them.
                log.warning(
                    "agents follow epoch %d, above ours (%d): taking a new epoch",
                    self.core.newest_agent_epoch,
                    self.leadership.epoch,
                )
                self.leadership.outbid(self.core.newest_agent_epoch)
                self.core.new_epoch(self.leadership.take_over())
                next_beat = now
            if self.leadership.should_lead(self._monotonic()):
                self.core.new_epoch(self.leadership.take_over())
                self.leading.set()
                self.notifier.status(f"leading, epoch {self.leadership.epoch}")
                next_beat = now
            if self.leadership.leading and now >= next_beat:
                await self._publish_heartbeat(client, "leader")
                next_beat = now + self.config.heartbeat_s
            if now >= next_cycle:
                if self.leadership.leading:
                    await self._cycle(client)
                next_cycle += self.config.cycle_s
                if next_cycle < now:
                    next_cycle = now + self.config.cycle_s
            # A standby sends no heartbeat: its next_beat is stale, and waking for it would
            # spin. It wakes every cycle to see whether it should lead.
            wake = min(next_cycle, next_beat) if self.leadership.leading else next_cycle
            await asyncio.sleep(max(0.0, wake - loop.time()))
        if reader.done():
            reader.result()  # the reader ended: raise its error (a broker failure)

    async def _cycle(self, client: aiomqtt.Client) -> None:
        result = self.core.cycle()
        for listener in self.cycle_listeners:
            try:
                listener(result)
            except Exception:  # an observer never stops the control loop
                log.exception("cycle listener %r failed", listener)
        # All at once: awaiting each broker acknowledgement in turn took ~3 ms a command
        # (190 ms of the demo's 500 ms cycle; seconds at 20,000 nodes).
        await asyncio.gather(
            *(
                client.publish(self.topics.command(node), encode(command), qos=1)
                for node, command in result.commands
            )
        )
        if self.recorder is not None and self.records is not None:
            self.recorder.write(self.records.cycle(self.core, result, self._wall()))
        self.cycles = [*self.cycles[-59:], result]
        async with self._cycled:
            self._cycled.notify_all()

    async def _publish_heartbeat(self, client: aiomqtt.Client, state: str) -> None:
        beat = Heartbeat(
            v=1,
            epoch=self.leadership.epoch,
            ts=self._wall(),
            controller=self.config.name,
            state=state,  # type: ignore[arg-type]
        )
        await client.publish(self.topics.heartbeat, encode(beat), qos=1, retain=True)

    async def _step_down_on_exit(self) -> None:
        """A clean stop hands over at once: a retained standby heartbeat, not a stale leader one."""
        client = self._client
        if client is None or not self.leadership.leading:
            return
        self.leadership.leading = False
        try:
            await asyncio.wait_for(self._publish_heartbeat(client, "standby"), 2.0)
        except (aiomqtt.MqttError, TimeoutError) as exc:
            log.warning("could not publish the standby heartbeat on exit: %s", exc)

    # --- messages --------------------------------------------------------------

    async def _read(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            payload = message.payload if isinstance(message.payload, bytes) else b""
            try:
                kind, name = self.topics.parse(message.topic.value)
                if kind == "heartbeat":
                    self._on_heartbeat(payload)
                elif kind == "telemetry" and name:
                    sample = self.core.on_telemetry(name, payload)
                    if sample is not None and self.recorder is not None and self.records:
                        self.recorder.write(self.records.telemetry(self.core, sample))
                elif kind == "ack" and name:
                    self.core.on_ack(name, payload)
                elif kind == "status" and name:
                    self.core.on_status(name, payload)
                elif kind == "phase" and name:
                    event = self.core.on_phase(name, payload)
                    if event is not None and self.recorder is not None and self.records:
                        self.recorder.write(self.records.phase(event))
            except ProtocolError:
                self.core.count_rejected()
            except Exception:  # no payload stops the controller
                log.exception("unexpected error handling %s", message.topic.value)

    def _on_heartbeat(self, payload: bytes) -> None:
        try:
            beat = decode(Heartbeat, payload)
        except ProtocolError:
            self.core.count_rejected()
            return
        age_s = max(0.0, self._wall() - beat.ts)
        if self.leadership.observe(beat, self._monotonic(), age_s):
            self.leading.clear()
        self._heartbeat_seen.set()
