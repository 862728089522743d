"""`powerd controller`: a thin asyncio shell around ``ControllerCore`` and ``Leadership``.

Two connections to the broker (``powerd.mqtt.link``), one event loop, one thread:

- the control connection: heartbeats (ours out, others' in), commands out,
  acks, statuses and phases in;
- the telemetry connection (``powerd.mqtt.stream``, a receive-only client
  for the one QoS 0 subscription): every node's telemetry into the
  ``TelemetryInbox``, newest sample per node. Control traffic never waits
  behind telemetry, in the broker's queue for a client or in a socket, and
  each connection keeps its own keepalive.

The ingest loop decodes what waits in the inbox into the core every
``INGEST_PERIOD_S``, within ``ingest_share`` of the time (the rest waits,
newer samples replacing older ones: counted as dropped); the cycle loop,
every ``cycle_s`` while leading, takes in what is left, runs the policy,
queues the commands that changed and hands what happened to the recorder;
the heartbeat goes out every ``heartbeat_s`` beside it. Nothing here waits
for the broker to acknowledge a publish. docs/CONTROLLER.md, "Scale", says
why and what one controller holds.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable

from policies.in_force import SiteLine, tree_in_force
from powerd.controller.config import ControllerConfig
from powerd.controller.core import ControllerCore, CycleResult
from powerd.controller.inbox import TelemetryInbox
from powerd.controller.records import Records
from powerd.controller.reload import changes, refusal
from powerd.controller.scoping import LeafGrants
from powerd.controller.smoothing import file_tree_in_force, grid_ramp_w_per_s
from powerd.leadership.shell import LeaderShell
from powerd.leadership.state import Leadership
from powerd.leadership.state_report import StateReport, levels_over, node_counts
from powerd.mqtt.link import LINK_ERRORS, LinkError, MqttLink
from powerd.mqtt.session import SessionStats, cancel_until_done, keep_connected
from powerd.mqtt.stream import MqttStream, StreamError
from powerd.protocol import (
    Command,
    GpuSmoothing,
    Grant,
    Heartbeat,
    ProtocolError,
    Topics,
    encode,
)
from powerd.ratelimit import LogOncePer
from powerd.recorder import Recorder
from powerd.signing import Signer, Verifier
from powerd.site_limits.limits import SiteLimits, glide_ramp_w_per_s
from powerd.site_limits.record import SiteLimitRecord, operator_limit
from powerd.systemd import SystemdNotifier
from powerd.topology import Topology

log = logging.getLogger("powerd.controller")

# How often the ingest loop decodes what waits in the inbox (at most; a cycle also does).
INGEST_PERIOD_S = 0.1
# Payloads decoded between two looks at the clock (the budget's granularity).
INGEST_BATCH = 256
# Commands signed and queued before the loop reads its sockets again (~20 ms of CPU).
COMMANDS_PER_SLICE = 250


class ControllerService:
    def __init__(
        self,
        config: ControllerConfig,
        core: ControllerCore,
        recorder: Recorder | None = None,
        records: Records | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        notifier: SystemdNotifier | None = None,
        signer: Signer | None = None,
        leaf: LeafGrants | None = None,
        topology: Topology | None = None,
    ) -> None:
        """``signer``: the role's key; by default loaded from ``config.signing_key``.
        ``leaf``: a scoped controller's grants (a leaf of a tree of controllers).
        ``topology``: the budgets ``core.tree`` came from (what ``reload`` compares with)."""
        self.config = config
        self.leaf = leaf
        self.topology = topology
        self.signer = signer if signer is not None else config.signer()
        self.verifier = config.verifier(self.signer)  # whose heartbeats count
        self.grant_verifier = _grant_verifier(config, leaf)  # whose grants count (a leaf's)
        self.notifier = notifier or SystemdNotifier()
        self.core = core
        self.recorder = recorder
        self.records = records  # builds the recorder's points
        self.topics = t = Topics(config.cluster, scope=None if leaf is None else leaf.scope)
        client_id = f"powerd-controller-{config.cluster}-{config.name}"
        if leaf is not None:  # leaves of several scopes may run on one host, under its name
            client_id += f"-{leaf.scope}"
        nodes = core.tree.server_names
        subscriptions, telemetry_filters = _subscriptions(t, leaf, nodes)
        self.telemetry_what = _telemetry_what(t, leaf, nodes)  # for people: what it reads
        self.control = MqttLink(
            config.broker,
            client_id,
            subscriptions,
            self._on_control_message,
            monotonic=monotonic,
            refuse_retained=self._is_phase_topic,  # no job hook retains one: a stranger's
        )
        self.inbox = TelemetryInbox(t.telemetry(n) for n in nodes)
        self.telemetry = MqttStream(
            config.broker,
            f"{client_id}-telemetry",
            telemetry_filters,  # QoS 0, as agents publish it: a lost sample is replaced next period
            self._on_telemetry_message,
            monotonic=monotonic,
        )
        self._summary_seq = 0
        self.reloads = 0  # budgets files put in force at run time (SIGHUP)
        # demand response: an operator's temporary site limit (a site's controller only; in
        # a tree, the coordinator applies it)
        self.site_limits = SiteLimits(max_clock_skew_s=config.max_clock_skew_s)
        self.operator_verifier = config.operator_verifier()
        self.site_limit_record = SiteLimitRecord(
            t.site_limit_record, self.signer, self.verifier, log
        )
        # the leader's state, for people (powerd status, powerd limit's confirmation)
        self.state_report = StateReport(
            t.state_of(t.scope), self.signer, "controller", config.name, t.scope
        )
        self._base_tree = core.tree  # the file's, under which a site limit lowers the site
        self._site_line: SiteLine | None = None  # the operator's line the core's tree is under
        self._summary_at = -math.inf  # monotonic time of the last summary
        self.ingest_period_s = min(INGEST_PERIOD_S, config.cycle_s / 4)
        self._counted = (0, 0)  # the inbox's received and replaced, as last counted
        self._unread_counted = (0, 0, 0)  # oversized, retained telemetry, retained phases
        self._ingest_allowance_s = 0.0  # decode time left in the budget's bucket
        self._ingest_filled_at = time.monotonic()
        self._rates_since = monotonic()  # start of the per-node telemetry count
        self.lead = LeaderShell(
            config,
            self.control,
            t.heartbeat,
            self.signer,
            self.verifier,
            on_take_over=self._took_over,
            seq=lambda: self._seq_sent,
            watchdog_s=min(config.cycle_s, 5.0),
            notifier=self.notifier,
            monotonic=monotonic,
            wall=wall,
            log=log,
        )
        self._seq_sent = 0  # the highest command seq published this epoch (heartbeat seq)
        self.cycles: list[CycleResult] = []  # the last few
        # commands signed and queued a slice at a time (_send_commands), in order
        self._outbox: collections.deque[tuple[str, Command]] = collections.deque()
        self._outbox_link: MqttLink | None = None
        self._draining = False
        # called with every cycle's result as soon as it is decided (the demo's trace, tests)
        self.cycle_listeners: list[Callable[[CycleResult], None]] = []
        self.telemetry_stats = SessionStats()  # the telemetry connection's sessions
        self._monotonic = monotonic
        self._wall = wall
        self._decide_now = asyncio.Event()  # a threshold crossed: decide before the period ends
        self._cycled = asyncio.Condition()
        self._log = LogOncePer(log)

    @property
    def leadership(self) -> Leadership:
        return self.lead.leadership

    @property
    def leading(self) -> asyncio.Event:
        """Set while leading."""
        return self.lead.leading

    @property
    def control_stats(self) -> SessionStats:
        """The control connection's sessions; ``.up`` set while up."""
        return self.lead.stats

    async def run(self, stop: asyncio.Event) -> None:
        telemetry = asyncio.create_task(self._telemetry_loop(), name="telemetry")
        ingest = asyncio.create_task(self._ingest_loop(), name="ingest")
        ready = f"cluster {self.config.cluster}, connecting to the broker"
        try:
            await self.lead.serve(stop, self._control_loop, ready, helpers={ingest})
        finally:
            self.telemetry.close()  # ends its read even if the cancel is lost
            await cancel_until_done({telemetry}, log)
            if self.recorder is not None:  # flushes what is buffered, for at most 5 s
                await asyncio.to_thread(self.recorder.close, 5.0)
            log.info("controller stopped")

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Wait until ``predicate()`` holds after a control cycle (for tests and the demo)."""
        async with self._cycled:
            await asyncio.wait_for(self._cycled.wait_for(predicate), timeout_s)

    # --- connections -------------------------------------------------------------

    async def _telemetry_loop(self) -> None:
        await keep_connected(
            self._telemetry_session,
            what=f"telemetry connection to {self.config.broker.display}",
            backoff=self.lead.backoff(),
            stopping=lambda: self.lead.stopping,
            log=log,
            expected=(StreamError, *LINK_ERRORS),
            bugs_reconnect=True,  # a bug here must not end telemetry for good, silently
            on_down=self.telemetry.close,
            stats=self.telemetry_stats,
        )

    async def _telemetry_session(self, connected: Callable[[], None]) -> None:
        await self.telemetry.connect()
        connected()
        log.info("telemetry connection up: %s", self.telemetry_what)
        why = await self.telemetry.run()
        log.warning("telemetry connection lost (%s): nodes look stale after %g s",
                    why, self.config.stale_after_s)  # fmt: skip

    @property
    def connected(self) -> asyncio.Event:
        """Set while the control connection is up."""
        return self.lead.stats.up

    @property
    def telemetry_up(self) -> asyncio.Event:
        """Set while the telemetry connection is up."""
        return self.telemetry_stats.up

    async def _control_loop(self, link: MqttLink) -> None:
        """A session's loop: take the lead when due, heartbeats, cycles while leading."""
        loop, lead = asyncio.get_running_loop(), self.lead
        next_cycle = loop.time()
        last_cycle = -math.inf
        self._decide_now.clear()
        assert link.lost is not None
        link.lost.add_done_callback(lambda _: self._decide_now.set())  # wake up to leave
        # Runs until the link is lost or the task is cancelled: on a stop, the shell steps
        # down (a standby heartbeat, awaited) on this very link before it cancels us; a
        # loop that left on its own at the stop would close the link under that step-down.
        while not link.lost.done():
            now = loop.time()
            lead.take_over_if_due(now)
            lead.beat(now)
            periodic = now >= next_cycle
            early = self._decide_now.is_set() and now - last_cycle >= self.config.cycle_s / 4
            if periodic or early:
                self._decide_now.clear()
                if self.leadership.leading and not lead.stopping:
                    self._cycle(link)
                    last_cycle = now
                    async with self._cycled:
                        self._cycled.notify_all()
                if periodic:  # an early cycle leaves the period's schedule as it was
                    next_cycle += self.config.cycle_s
                    if next_cycle < now:
                        next_cycle = now + self.config.cycle_s
            wake = lead.wake(next_cycle)  # a standby wakes every cycle: should it lead?
            if self._decide_now.is_set():  # decided too recently: not before the gap is over
                wake = min(wake, last_cycle + self.config.cycle_s / 4)
                await asyncio.sleep(max(0.0, wake - loop.time()))
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, wake - loop.time())):
                    await self._decide_now.wait()
        if link.lost.done():
            raise LinkError(f"connection lost: {link.lost.result()}")

    # --- telemetry ---------------------------------------------------------------

    def _on_telemetry_message(self, topic: str, payload: bytes, arrived: float) -> None:
        if self.inbox.put(topic, payload, arrived) is None:
            self._on_unknown_telemetry(topic)

    def _on_unknown_telemetry(self, topic: str) -> None:
        """Telemetry on a topic of no node in the budgets file: a bad name, or a stranger."""
        try:
            _, node = self.topics.parse(topic)
        except ProtocolError:
            self.core.count_rejected()
            return
        assert node is not None
        self.core.server_of(node, "telemetry")  # not in the budgets file: logged, ignored

    async def _ingest_loop(self) -> None:
        heard, heard_at = self.inbox.received, time.monotonic()
        while not self.lead.stopping:
            await asyncio.sleep(self.ingest_period_s)
            self._ingest()
            if self.leadership.leading and self.core.crossed_threshold():
                self._decide_now.set()
            now = time.monotonic()
            if self.inbox.received != heard or not self.telemetry_up.is_set():
                heard, heard_at = self.inbox.received, now
            elif now - heard_at > self.config.stale_after_s:
                self._log.warning(
                    "no-telemetry",
                    now,
                    "no telemetry for %.0f s on a live telemetry connection: are the agents up, "
                    "and may this login read %s (broker ACL)?",
                    now - heard_at,
                    self.telemetry_what,
                )

    def _ingest(self) -> None:
        """Decode what waits in the inbox, oldest first, within the decode budget.

        The budget is a bucket of CPU time that fills at ``ingest_share`` seconds a
        second of wall time (up to one cycle's worth) and empties by the CPU time the
        decoding takes: a share of a core whatever the ingest loop's timer does (a busy
        loop runs it late, and then it has more to do and more budget for it), and
        whatever else runs on the machine (counted in wall time, a controller that
        another process keeps off the CPU would starve its own decoding).
        """
        now, cpu = time.monotonic(), time.thread_time()
        share = self.config.ingest_share
        allowance = min(
            self._ingest_allowance_s + share * (now - self._ingest_filled_at),
            share * self.config.cycle_s,
        )
        budget_end = cpu + allowance
        inbox, recording = self.inbox, self.recorder is not None and self.records is not None
        while len(inbox) and time.thread_time() < budget_end:
            samples = self.core.ingest(inbox.take(INGEST_BATCH))
            if recording:
                assert self.recorder is not None and self.records is not None
                lines: list[str] = []
                for sample in samples:
                    lines += self.records.telemetry(self.core, sample)
                if lines:
                    self.recorder.write(lines)
        spent = time.thread_time() - cpu
        self._ingest_allowance_s = allowance - spent
        self._ingest_filled_at = now
        received, replaced = inbox.received, inbox.replaced
        self.core.count_ingest(received - self._counted[0], replaced - self._counted[1], spent)
        self._counted = (received, replaced)

    # --- the cycle ---------------------------------------------------------------

    def _cycle(self, link: MqttLink) -> None:
        self._ingest()  # the newest samples there are
        self._count_dropped_unread()
        now = self._monotonic()
        self.core.check_rates(self.inbox.count_per_node(), now - self._rates_since)
        self._rates_since = now
        if self.leaf is not None:  # the root's budget: a live grant, or the file's
            self.core.tree = self.leaf.tree_for(now)
        else:
            self._apply_site_limit()
        result = self.core.cycle(self.inbox.waiting_arrivals() if len(self.inbox) else None)
        for listener in self.cycle_listeners:
            try:
                listener(result)
            except Exception:  # an observer never stops the control loop
                log.exception("cycle listener %r failed", listener)
        self._send_commands(link, result.commands)
        summary_due = now - self._summary_at >= 0.999 * self.config.summary_every_s
        if self.leaf is not None and result.state is not None and summary_due:
            self._summary_at = now
            self._summarise(link, result, now)
        if self.recorder is not None and self.records is not None:
            # its points after the loop has read the sockets again (~3,000 lines at site
            # scale, tens of ms): the broker's queue for us does not fill meanwhile
            asyncio.get_running_loop().call_soon(self._record_cycle, result, self._wall())
        self.cycles = [*self.cycles[-59:], result]
        if self.state_report.due(now, self.leadership.epoch):
            self._publish_state(link)

    def _count_dropped_unread(self) -> None:
        """What the connections dropped unread since the last cycle, into the core's counts."""
        unread = (self.telemetry.oversized, self.telemetry.retained, self.control.retained_refused)
        (oversized, retained, phases), was = unread, self._unread_counted
        self.core.count_dropped_unread(oversized - was[0], retained - was[1], phases - was[2])
        self._unread_counted = unread

    def _send_commands(self, link: MqttLink, commands: list[tuple[str, Command]]) -> None:
        """Sign and queue ``commands`` after those still waiting, ``COMMANDS_PER_SLICE`` at a
        time: between slices the loop reads its sockets. Signing and queueing 2,000
        commands is ~160 ms of CPU, and the site's telemetry (20,000 messages a second at
        150 MW) would meanwhile overflow the broker's queue for this controller, which
        drops what does not fit (``bench_scale --jobs 2``: 30 % of it lost while the jobs'
        caps were handed back). One queue, in order: a node's newer command never
        overtakes its older one (the agent would refuse the older as stale). A command
        due after this controller stopped leading, or of an older epoch, is not sent:
        it is no longer its to give.

        Queued, not awaited: the broker's PUBACKs are paho's business, and an
        unacknowledged command is resent by the core after ack_timeout_s anyway."""
        self._outbox.extend(commands)
        self._outbox_link = link
        if not self._draining:
            self._drain_outbox()

    def _drain_outbox(self) -> None:
        link, outbox = self._outbox_link, self._outbox
        leading, epoch = self.leadership.leading, self.core.epoch
        sign, command_topic = self.signer.sign, self.topics.command
        sent = 0
        while outbox and sent < COMMANDS_PER_SLICE:
            node, command = outbox.popleft()
            if not leading or command.epoch != epoch or link is None:
                continue
            topic = command_topic(node)
            link.publish(topic, sign(topic, encode(command)), qos=1)
            self._seq_sent = max(self._seq_sent, command.seq)  # the heartbeat's seq
            sent += 1
        self._draining = bool(outbox)
        if outbox:
            asyncio.get_running_loop().call_soon(self._drain_outbox)

    def _apply_site_limit(self) -> None:
        """The site's bands under an operator's limit in force, gliding down at the site's
        ramp limit (powerd.site_limits.limits); the file's when none is. Under safety
        by caps the line is on the caps in force (``SiteLimits.line``)."""
        base, core = self._base_tree, self.core
        by_caps = core.settings.policy.safety_by_caps
        measured = core.site_power_w
        now = self._monotonic()  # a limit's window is on this clock, from its receipt
        line = self.site_limits.line(
            base,
            now,
            float(base.cap_threshold_w[0]) if measured is None else measured,
            core.last_dt_s,
            self._ramp_down_w_per_s(),
            committed_w=core.site_caps_at_draw_w if by_caps else core.site_predicted_w,
            window_s=self._grid_window_s(),
            by_caps=by_caps,
        )
        if line is None:
            core.tree = base
        elif line != self._site_line:
            core.tree = tree_in_force(base, site_line=line, by_caps=by_caps)
        self._site_line = line
        core.site_limit_w = self.site_limits.active_w(now)

    def _grid_window_s(self) -> float:
        """The window the grid measures the site's ramps over ([site.grid]; 1 s without)."""
        grid = None if self.topology is None else self.topology.grid
        return 1.0 if grid is None else float(grid.window_s)

    def _ramp_down_w_per_s(self) -> float:
        """How fast a site limit may bring the site down: the grid spec's ramp-down limit
        ([site.grid]), else the site's ramp limit on the sum of caps."""
        grid = None if self.topology is None else self.topology.grid
        return glide_ramp_w_per_s(grid, float(self._base_tree.ramp_w_per_s[0]))

    def _on_site_limit(self, topic: str, payload: bytes, live: bool = True) -> None:
        now = self._monotonic()
        try:
            limit = operator_limit(self.operator_verifier, topic, payload)
        except ProtocolError as exc:
            self.core.count_rejected()
            self._log.warning("site-limit", now, "site limit refused: %s", exc)
            return
        why = self.site_limits.take(limit, now, self._wall(), live=live)
        self._count_clocks()
        if why is not None:
            self.state_report.refuse(limit, why, self.site_limits.holds(limit))
            if self.leadership.leading:  # the operator's `powerd limit` waits for it
                self._publish_state(self.control)
            self._log.warning("site-limit-order", now, "site limit ignored: %s", why)
            return
        if self.leadership.leading:
            self.site_limit_record.publish(self.control, self.site_limits)
            self._publish_state(self.control)
        what = "cleared" if limit.limit_w is None else f"{limit.limit_w / 1e3:,.1f} kW"
        log.warning(
            "site limit from %s: %s from %s until %s%s",
            limit.operator,
            what,
            time.strftime("%H:%M:%S", time.localtime(limit.starts_ts)),
            time.strftime("%H:%M:%S", time.localtime(limit.expires_ts)),
            f" ({limit.reason})" if limit.reason else "",
        )

    def _publish_state(self, link: MqttLink) -> None:
        """The leader's state, retained (``powerd.leadership.state_report``): the limit it
        holds, the last it refused, nodes by mode, levels over their (breaker) limits."""
        now, core = self._monotonic(), self.core
        tree = self._base_tree
        last = self.cycles[-1].decision if self.cycles else None
        over = None if last is None else levels_over(tree.level, last.node_power_w, tree.limit_w)
        self.state_report.publish(
            link,
            now,
            epoch=self.leadership.epoch,
            wall=self._wall(),
            limit=self.site_limits.held(now),
            nodes=node_counts(core.views.by_mode(now, self.config.stale_after_s)),
            over_limit=over,
        )

    def _on_site_limit_record(self, payload: bytes) -> None:
        """The limit a leader held (``powerd.site_limits.record``): the order's floor."""
        now = self._monotonic()
        try:
            self.site_limit_record.take(self.site_limits, payload, now, self._wall())
        except ProtocolError as exc:
            self.core.count_rejected()
            self._log.warning("site-limit-record", now, "site limit record refused: %s", exc)

    def reload(self, new: Topology, smoothing: GpuSmoothing | None = None) -> str | None:
        """Put a reloaded budgets file (already loaded and checked, scoped for a leaf) in
        force from the next cycle on; why not, if it cannot be (powerd.controller.reload):
        then the running budgets stay, and the log says why. ``smoothing``: the grid
        smoothing profile of the new file (with ``grid_smoothing``); a new one is sent to
        every GPU that has smoothing, with the raises (round robin)."""
        if self.topology is None:
            return "this controller was built without its budgets (no reload)"
        why = refusal(self.topology, new)
        if why is not None:
            log.error("budgets reload refused: %s; the running budgets stay in force", why)
            return why
        lines = changes(self.topology, new)
        self.topology = new
        if self.records is not None:  # the grid limits it records come from the topology
            self.records.topology = new
        if self.leaf is not None:  # its file budget may have changed; a live grant stays
            self.leaf = self.leaf.rebased(new, grid_ramp_w_per_s(smoothing, new.tree.n_gpus))
            self.core.tree = self.leaf.tree_for(self._monotonic())
        else:
            by_caps = self.core.settings.policy.safety_by_caps
            base = file_tree_in_force(new, smoothing is not None, by_caps)
            self._base_tree = self.core.tree = base
            self._site_line = None  # the next cycle puts the line over the new file
        if smoothing != self.core.settings.smoothing:
            self.core.settings = dataclasses.replace(self.core.settings, smoothing=smoothing)
            self.core.smoothing_sent_seq[:] = -1
            lines.append("grid smoothing profile changed")
        self.reloads += 1
        log.warning(
            "budgets reloaded (%s): %s", new.source, "; ".join(lines) or "no number changed"
        )
        return None

    def _summarise(self, link: MqttLink, result: CycleResult, now: float) -> None:
        """The leaf's summary for the coordinator, signed and retained (a coordinator that
        takes over reads every leaf's newest at once)."""
        assert self.leaf is not None and result.state is not None
        self._summary_seq += 1
        summary = self.leaf.summary(
            self.core.tree,
            result.state,
            result.decision,
            controller=self.config.name,
            epoch=self.leadership.epoch,
            seq=self._summary_seq,
            ts=self._wall(),
            now_mono=now,
            stale_nodes=result.counters.stale_nodes,
            policy=self.config.policy,
        )
        topic = self.topics.summary(self.leaf.scope)
        link.publish(topic, self.signer.sign(topic, encode(summary)), qos=1, retain=True)

    def _record_cycle(self, result: CycleResult, ts: float) -> None:
        assert self.recorder is not None and self.records is not None
        self.recorder.write(self.records.cycle(self.core, result, ts))

    def _took_over(self, epoch: int) -> None:
        """Our part of taking the lead: the core's new epoch, the site limit's record."""
        self.core.new_epoch(epoch)
        self._seq_sent = 0
        self.site_limit_record.publish(self.control, self.site_limits)

    # --- control messages --------------------------------------------------------

    def _is_phase_topic(self, topic: str) -> bool:
        try:
            return self.topics.parse(topic)[0] == "phase"
        except ProtocolError:
            return False

    def _on_control_message(
        self, topic: str, payload: bytes, _arrived: float, retained: bool = False
    ) -> None:
        try:
            kind, name = self.topics.parse(topic)
            if kind == "heartbeat":
                self._on_heartbeat(payload, live=not retained)
            elif kind == "ack" and name:
                self.core.on_ack(name, payload)
            elif kind == "status" and name:
                self.core.on_status(name, payload)
            elif kind == "grant" and name and self.leaf is not None:
                self._on_grant(topic, payload, live=not retained)
            elif kind == "coordinator" and self.leaf is not None:
                self._on_coordinator_heartbeat(topic, payload)
            elif kind == "site_limit" and self.leaf is None:
                self._on_site_limit(topic, payload, live=not retained)
            elif kind == "site_limit_record" and self.leaf is None:
                self._on_site_limit_record(payload)
            elif kind == "phase" and name:
                owner, _ = self.topics.job_of(topic)
                event = self.core.on_phase(name, payload, owner)
                if event is not None and self.recorder is not None and self.records:
                    self.recorder.write(self.records.phase(event))
        except ProtocolError:
            self.core.count_rejected()
        except Exception:  # no payload stops the controller
            log.exception("unexpected error handling %s", topic)

    def _on_grant(self, topic: str, payload: bytes, live: bool = True) -> None:
        assert self.leaf is not None
        now = self._monotonic()
        try:
            if self.grant_verifier is None:
                raise ProtocolError("no coordinator key is trusted (trust.coordinator_keys)")
            grant = self.grant_verifier.decode(Grant, topic, payload)
        except ProtocolError as exc:  # forged, unsigned or malformed: it moves no watt
            self.core.count_rejected()
            self._log.warning("grant", now, "grant refused: %s", exc)
            return
        why = self.leaf.on_grant(grant, now, self._wall(), live=live)
        if why is not None:
            self._log.warning("grant-order", now, "grant ignored: %s", why)
        elif self.leaf.grants_taken == 1:
            log.info("first grant from coordinator %s: %.1f kW for scope %s",
                     grant.coordinator, grant.budget_w / 1e3, grant.scope)  # fmt: skip

    def _on_coordinator_heartbeat(self, topic: str, payload: bytes) -> None:
        """The coordinator's current grant round (its heartbeat's epoch and seq): grants of
        older rounds are replays (``LeafGrants.on_coordinator_round``). Its liveness is the
        grants' business (their ttl_s), not this."""
        assert self.leaf is not None
        if self.grant_verifier is None:
            return  # every grant is refused anyway, and said so at start
        beat = self.grant_verifier.decode(Heartbeat, topic, payload)
        if beat.seq is not None:
            self.leaf.on_coordinator_round(beat.epoch, beat.seq)

    def _on_heartbeat(self, payload: bytes, live: bool = True) -> None:
        """Another controller's heartbeat; liveness by receipt (``Leadership.observe``)."""
        try:
            self.lead.on_heartbeat(payload, live)
        except ProtocolError as exc:  # forged, unsigned or malformed: it leads nobody
            self.core.count_rejected()
            self._log.warning("heartbeat", self._monotonic(), "heartbeat refused: %s", exc)
            return
        self._count_clocks()

    def _count_clocks(self) -> None:
        """The clock alarms and the largest peer skew, where the recorder reads them."""
        alarms = self.leadership.skew.alarms + self.site_limits.clock_alarms
        if self.leaf is not None:
            alarms += self.leaf.clock_alarms
        self.core.clock_alarms = alarms
        self.core.peer_skew_s = self.leadership.skew.largest_s


def _grant_verifier(config: ControllerConfig, leaf: LeafGrants | None) -> Verifier | None:
    """``trust.coordinator_keys``; a leaf without them is told at start that every grant
    is refused."""
    verifier = config.grant_verifier()
    if leaf is not None and verifier is None:
        log.warning(
            "scope %s: no trust.coordinator_keys: every grant is refused and the rows' "
            "file budgets hold",
            leaf.scope,
        )
    return verifier


def _subscriptions(
    t: Topics, leaf: LeafGrants | None, nodes: tuple[str, ...]
) -> tuple[list[tuple[str, int]], str | list[str]]:
    """The control connection's subscriptions (QoS 1) and the telemetry connection's
    filters: the whole site's for a site's controller; a leaf's own nodes only (the
    broker does not send it the rest of the site), its grant and the coordinator's
    heartbeat (its round: the floor against replayed grants)."""
    subscriptions = [(t.heartbeat, 1), (t.all_phases, 1), (t.all_owned_phases, 1)]
    if leaf is None:
        subscriptions += [(t.all_acks, 1), (t.all_status, 1), (t.site_limit, 1)]
        subscriptions += [(t.site_limit_record, 1)]  # the limits' order, across restarts
        return subscriptions, t.all_telemetry
    subscriptions += [(t.grant(leaf.scope), 1), (t.coordinator_heartbeat, 1)]
    subscriptions += [(t.ack(n), 1) for n in nodes] + [(t.status(n), 1) for n in nodes]
    return subscriptions, [t.telemetry(n) for n in nodes]


def _telemetry_what(t: Topics, leaf: LeafGrants | None, nodes: tuple[str, ...]) -> str:
    """What the telemetry subscription is, for people (the logs)."""
    if leaf is None:
        return t.all_telemetry
    return f"the telemetry of its {len(nodes)} nodes (scope {leaf.scope})"
