"""The agent's decisions, with no I/O: commands, heartbeats, deadlines, failsafe.

The async daemon (``powerd.agent.daemon``) feeds it payloads and ticks and
publishes what it returns. Keeping this synchronous and clock-injected is what
lets the safety rules be tested exhaustively without a broker.

Safety rules (docs/PROTOCOL.md):
1. ``start()`` applies failsafe caps before anything else happens.
2. Commands and heartbeats count only when signed by a trusted controller key
   (``powerd.signing``); anything else is rejected and counted.
3. Commands are applied only in ``(epoch, seq)`` order, and only from a
   controller whose heartbeat is live and whose epoch is not older than the
   newest epoch seen; everything else is acknowledged as stale or rejected. The
   first live heartbeat of an epoch sets the order's floor at its ``seq`` (the
   highest the controller sent): a restarted agent takes no replayed older command.
3a. Liveness is by receipt (docs/PROTOCOL.md, "Clocks"): a heartbeat delivered
   live keeps the controller live for ``failsafe_after_s`` of the monotonic clock;
   a retained one only says who leads in which epoch. A heartbeat whose ``ts`` runs
   more than ``max_clock_skew_s`` ahead is refused (a clock alarm), and one of the
   followed epoch not newer than the newest seen is a replay. A live leader of an
   older epoch is followed once the newest epoch's has been silent for
   ``failsafe_after_s`` (the deposed-epoch rule).
4. A command holds at most ``max_command_ttl_s``, whatever its ``ttl_s`` says.
5. Every cap is clamped into the device range before it is written.
6. No payload can raise out of ``on_command``/``on_heartbeat``/``on_phase``.
7. A job's phase announcement (not signed) moves a clock only under a clock policy the
   newest command granted for that job (``powerd.agent.phase_clock``); failsafe and a
   newer epoch end every policy.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from powerd import __version__
from powerd.agent import rules
from powerd.agent.config import DEFAULT_MAX_COMMAND_TTL_S, AgentMode, FailsafeConfig
from powerd.agent.controls import apply_failsafe, apply_gpu_command, smoothing_state
from powerd.agent.following import Following, Taken
from powerd.agent.phase_clock import PhaseClocks
from powerd.clock_skew import DEFAULT_MAX_CLOCK_SKEW_S, SkewWatch
from powerd.gpu import Gpu, GpuError, PowerLimitRange
from powerd.gpu.software_smoothing import SoftwareSmoothing
from powerd.protocol import (
    SMOOTHING_STATE_EVERY_SAMPLES,
    Ack,
    AckError,
    AckResult,
    Command,
    FillRequest,
    GpuAck,
    GpuFill,
    GpuSmoothingState,
    GpuTelemetry,
    Heartbeat,
    M,
    Mode,
    NodeState,
    ProtocolError,
    Status,
    Telemetry,
    Topics,
    peek_order,
)
from powerd.ratelimit import LogOncePer
from powerd.signing import SignatureError, Verifier
from powerd.vocabulary import PROTOCOL_VERSION

log = logging.getLogger("powerd.agent")


@dataclass
class AgentCounters:
    commands_applied: int = 0
    commands_partial: int = 0
    commands_stale: int = 0
    payloads_rejected: int = 0  # malformed: failed validation
    commands_refused: int = 0  # well-formed, but no live controller or local mode
    unverified: int = 0  # commands and heartbeats not signed by a trusted key
    heartbeats_ignored: int = 0
    heartbeats_replayed: int = 0  # of the followed epoch, not newer than the newest seen
    clock_alarms: int = 0  # heartbeats refused: their ts ran ahead of this clock
    deposed_epochs: int = 0  # times a live leader of an older epoch was followed
    failsafe_entries: int = 0
    gpu_read_errors: int = 0


class AgentCore:
    """Everything the agent decides, for one node's GPUs."""

    def __init__(
        self,
        node: str,
        gpus: Sequence[Gpu],
        failsafe: FailsafeConfig,
        failsafe_after_s: float,
        verifier: Verifier | None,
        mode: AgentMode = "controlled",
        cluster: str = "default",
        scope: str | None = None,
        max_command_ttl_s: float = DEFAULT_MAX_COMMAND_TTL_S,
        period_s: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S,
    ) -> None:
        """``verifier``: the controller keys this node trusts (None only in local mode)."""
        if mode == "controlled" and verifier is None:
            raise ValueError("a controlled agent needs the controllers' public keys to verify")
        self.node = node
        self._verifier = verifier
        topics = Topics(cluster, scope=scope)  # with a scope: its leaf controllers' heartbeat
        self._command_topic = topics.command(node)
        self._heartbeat_topic = topics.heartbeat
        self.max_command_ttl_s = max_command_ttl_s
        self.period_s = period_s  # the telemetry period, reported in the status
        self.gpus = {gpu.index: gpu for gpu in gpus}
        if len(self.gpus) != len(gpus):
            raise ValueError("two GPUs share an index")
        self.failsafe_after_s = failsafe_after_s
        self.configured_mode = mode
        self._monotonic = monotonic
        self._wall = wall
        self._limits: dict[int, PowerLimitRange] = {
            i: g.power_limit_range() for i, g in self.gpus.items()
        }
        self.failsafe_caps_w = {
            i: lim.clamp(failsafe.cap_for(i, lim.max_w)) for i, lim in self._limits.items()
        }
        self.mode: Mode = "local" if mode == "local" else "failsafe"
        self.counters = AgentCounters()
        self.telemetry_seq = 0
        self._last_applied: rules.Order = rules.NO_ORDER
        # which controller it follows, and whether it lives (heartbeats by receipt)
        self.following = Following(failsafe_after_s, max_clock_skew_s, log, monotonic())
        self._heartbeat_deadline = float("-inf")  # monotonic time the live heartbeat expires
        self.heartbeat_heard_mono: float | None = None  # the last live heartbeat's receipt
        self._command_deadline: float | None = None  # set once a command has a ttl running
        self._command_ttl_s: float | None = None
        self._failsafe_raise_at: float | None = None  # GPUs below their failsafe caps rise
        # clock policies the controller granted: the jobs' announcements move those clocks
        self.phase_clocks = PhaseClocks(self.gpus, topics, monotonic)
        self._bad_input_log = LogOncePer(log)
        self._read_error_log = LogOncePer(log)
        # software smoothing: what the node's jobs should fill, after the last sample
        self.fill: FillRequest | None = None
        # GPUs found to have power smoothing (asked once: it does not change)
        self._smoothing_gpus: set[int] = set()
        # per such GPU: the state its telemetry last carried, and how many samples ago
        self._smoothing_sent: dict[int, tuple[GpuSmoothingState, int]] = {}
        for index, gpu in self.gpus.items():
            try:
                if gpu.supports_smoothing():
                    self._smoothing_gpus.add(index)
            except GpuError as exc:
                log.warning("gpu %d: cannot tell whether it has power smoothing: %s", index, exc)

    # --- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Apply the failsafe caps. Called before connecting anywhere."""
        for index, gpu in self.gpus.items():
            apply_failsafe(gpu, self.failsafe_caps_w[index])
        log.info(
            "failsafe caps applied at start: %s",
            ", ".join(f"gpu{i}={w:.0f}W" for i, w in self.failsafe_caps_w.items()),
        )

    def stop(self, on_exit: str) -> None:
        """Leave the GPUs as configured: ``keep`` the current caps, clock locks and power
        smoothing, or ``restore`` default caps, unlocked clocks and the smoothing as the
        agent found it (``Gpu.restore_defaults``)."""
        if on_exit != "restore":
            log.info("exit: keeping current caps, clock locks and smoothing (on_exit = keep)")
            return
        for gpu in self.gpus.values():
            try:
                gpu.restore_defaults()
            except GpuError as exc:
                log.error("gpu %d: could not restore defaults on exit: %s", gpu.index, exc)
        log.info(
            "exit: default power limits restored, clock locks removed, power smoothing "
            "put back as found"
        )

    # --- inputs ------------------------------------------------------------

    def on_heartbeat(self, payload: bytes, live: bool = True) -> None:
        """A controller heartbeat, delivered ``live`` or retained (on subscribe): a signed
        leader's refreshes liveness if live, current and fresh (rule 3a,
        ``powerd.agent.following``). Deadlines are checked first: a heartbeat read after
        the agent itself stalled (suspended, starved) past them does not cover the gap."""
        self.tick()
        now_mono, now_wall = self._monotonic(), self._wall()
        try:
            beat = self._open(Heartbeat, self._heartbeat_topic, payload)
        except ProtocolError as exc:
            self._bad_input_log.warning("heartbeat", now_mono, "rejected heartbeat: %s", exc)
            return
        taken = self.following.heartbeat(beat, now_mono, now_wall, live)
        self._count(taken)
        if taken.new_epoch:
            self._new_epoch(beat.epoch)
        if taken.verdict != "live":
            return
        self._last_applied = rules.order_after_live(self._last_applied, taken.floor)
        self.heartbeat_heard_mono = now_mono
        self._heartbeat_deadline = rules.live_until(
            self._heartbeat_deadline, now_mono, self.failsafe_after_s
        )
        if self._command_ttl_s is not None:
            self._command_deadline = now_mono + self._command_ttl_s
        if self.mode == "failsafe":
            log.info("live controller %s (epoch %d): leaving failsafe", beat.controller, beat.epoch)
            self.mode = "controlled"
            self._failsafe_raise_at = None  # the controller says what they hold

    def _count(self, taken: Taken) -> None:
        c = self.counters
        if taken.verdict == "clock_alarm":
            c.clock_alarms += 1
        elif taken.verdict == "replay":
            c.heartbeats_replayed += 1
        elif taken.verdict != "live":
            c.heartbeats_ignored += 1  # a standby, a deposed leader, or retained
        c.deposed_epochs = self.following.deposed_epochs

    def _new_epoch(self, epoch: int) -> None:
        """Another epoch is followed: its clock policies end, every smoothing state is told
        again, and an older one (deposed-epoch rule) starts the command order afresh."""
        self.phase_clocks.end_all(f"controller epoch {epoch}")
        self._smoothing_sent.clear()  # a new leader: tell it every state at once
        self._last_applied = rules.order_after_new_epoch(self._last_applied, epoch)

    @property
    def _newest_epoch(self) -> int:
        return self.following.newest_epoch

    @property
    def last_applied(self) -> rules.Order:
        """The ``(epoch, seq)`` a command must exceed to be applied (the order's floor)."""
        return self._last_applied

    @property
    def skew(self) -> SkewWatch:
        """The controllers' clock skews as measured here, and the clock alarms."""
        return self.following.skew

    def _open(self, cls: type[M], topic: str, payload: bytes) -> M:
        """A signed, valid message, or ProtocolError (counted as unverified or rejected)."""
        if self._verifier is None:
            self.counters.unverified += 1
            raise SignatureError("this agent runs in local mode and trusts no controller key")
        try:
            return self._verifier.decode(cls, topic, payload)
        except SignatureError:
            self.counters.unverified += 1
            raise
        except ProtocolError:
            self.counters.payloads_rejected += 1
            raise

    def on_command(self, payload: bytes) -> Ack:
        """Apply a command if it is valid, current and in order; always return its ack."""
        now_mono = self._monotonic()
        try:
            command = self._open(Command, self._command_topic, payload)
        except ProtocolError as exc:
            self._bad_input_log.warning("command", now_mono, "rejected command: %s", exc)
            epoch, seq = peek_order(payload)
            return self._ack(epoch, seq, "rejected", [], [AckError(index=None, message=str(exc))])

        why = rules.refusal(self.mode, self.controller_live(now_mono))
        if why is not None:
            return self._reject(command, why)
        order = (command.epoch, command.seq)
        if rules.is_stale(command.epoch, command.seq, self._newest_epoch, self._last_applied):
            self.counters.commands_stale += 1
            return self._ack(command.epoch, command.seq, "stale", [], [])

        acks: list[GpuAck] = []
        errors: list[AckError] = []
        # before the controls: a lock whose policy ends is removed, then the command's own
        # clock (if any) is written, and every read-back sees both
        held = self.phase_clocks.after_command(command.gpus)
        for gpu_command in command.gpus:
            gpu = self.gpus.get(gpu_command.index)
            if gpu is None:
                errors.append(rules.unknown_gpu_error(gpu_command.index, self.gpus))
                continue
            result = apply_gpu_command(gpu, gpu_command)
            policy = held.get(gpu.index)
            if policy is not None:
                result.ack.comm_clock = policy
                result.ack.clamped |= self.phase_clocks.clamped(gpu.index)
            acks.append(result.ack)
            errors.extend(result.errors)
            if result.ack.clamped:
                log.info(
                    "command %d/%d: gpu %d: value clamped into device range", *order, gpu.index
                )

        self._last_applied = order
        self.following.command_epoch(command.epoch)
        self._command_ttl_s = min(command.ttl_s, self.max_command_ttl_s)
        self._command_deadline = now_mono + self._command_ttl_s
        if errors:
            self.counters.commands_partial += 1
            for error in errors:
                log.warning("command %d/%d: gpu %s: %s", *order, error.index, error.message)
        else:
            self.counters.commands_applied += 1
        return self._ack(command.epoch, command.seq, rules.applied_result(errors), acks, errors)

    def on_phase(self, topic: str, payload: bytes) -> None:
        """A message on a job's phase topic: it moves the clocks of the GPUs whose policy
        names that job, and nothing else (``powerd.agent.phase_clock``). Deadlines are
        checked first, so a policy whose controller is gone moves nothing."""
        self.tick()
        self.phase_clocks.on_phase(topic, payload)

    @property
    def phase_topics(self) -> frozenset[str]:
        """The job phase topics to subscribe to: those of the policies held now."""
        return self.phase_clocks.topics()

    def tick(self) -> None:
        """Check the deadlines; enter failsafe when the controller is gone; raise the GPUs
        left below their failsafe caps once the others have had time to come down."""
        now_mono = self._monotonic()
        raise_at = self._failsafe_raise_at
        if self.mode == "failsafe" and raise_at is not None and now_mono >= raise_at:
            self._failsafe_raise_at = None
            for index, gpu in self.gpus.items():
                apply_failsafe(gpu, self.failsafe_caps_w[index])
        if self.mode != "controlled":
            return
        if now_mono > self._heartbeat_deadline:
            self.enter_failsafe(f"no controller heartbeat for {self.failsafe_after_s:g} s")
        elif self._command_deadline is not None and now_mono > self._command_deadline:
            self.enter_failsafe(f"last command expired (ttl {self._command_ttl_s:g} s)")

    def enter_failsafe(self, reason: str) -> None:
        log.warning("entering failsafe: %s", reason)
        self.mode = "failsafe"
        self.counters.failsafe_entries += 1
        self._heartbeat_deadline = float("-inf")
        self._command_deadline = None
        self._command_ttl_s = None
        # Make before break, as the controller does: a cap above its failsafe comes down at
        # once, one below rises only FAILSAFE_RAISE_SHARE of the deadline later. Every
        # agent of a site misses the same heartbeats, so by then the GPUs a controller had
        # lent this one's watts to are back at their failsafe caps: the caps under every
        # breaker never add up to more than their failsafe caps or the controller's.
        later = False
        for index, gpu in self.gpus.items():
            failsafe_w = self.failsafe_caps_w[index]
            try:
                now_w = gpu.power_limit_w()
            except GpuError:
                now_w = failsafe_w  # unknown: the failsafe cap at once
            cap_w, below = rules.failsafe_cap_w(now_w, failsafe_w)
            apply_failsafe(gpu, cap_w)  # clocks unlocked either way
            later |= below
        self._failsafe_raise_at = rules.failsafe_raise_at(
            self._monotonic(), self.failsafe_after_s, later
        )
        self.phase_clocks.end_all("failsafe", release=False)  # apply_failsafe unlocked them

    @property
    def failsafe_raise_pending(self) -> bool:
        """In failsafe with GPUs still below their failsafe caps, to rise later."""
        return self.mode == "failsafe" and self._failsafe_raise_at is not None

    def controller_live(self, now_mono: float | None = None) -> bool:
        now_mono = self._monotonic() if now_mono is None else now_mono
        return rules.controller_live(self.mode, now_mono, self._heartbeat_deadline)

    # --- outputs -----------------------------------------------------------

    def telemetry(self) -> Telemetry:
        """One sample of every GPU that answers. A GPU that fails is left out and logged."""
        gpus: list[GpuTelemetry] = []
        fills: list[GpuFill] = []
        for index, gpu in self.gpus.items():
            try:
                s = gpu.sample()
            except GpuError as exc:
                self.counters.gpu_read_errors += 1
                self._read_error_log.warning(
                    f"gpu{index}",
                    self._monotonic(),
                    "gpu %d: read failed, left out of telemetry: %s",
                    index,
                    exc,
                )
                continue
            limits = self._limits[index]
            smoothing = self._smoothing_to_send(index, gpu)
            if isinstance(gpu, SoftwareSmoothing):
                target = gpu.fill_target(s.power_w, s.cap_w)
                if target is not None:
                    fills.append(GpuFill(index=index, **dataclasses.asdict(target)))
            gpus.append(
                GpuTelemetry(
                    index=s.index,
                    uuid=s.uuid,
                    power_w=max(0.0, s.power_w),
                    energy_j=s.energy_j,
                    cap_w=s.cap_w,
                    cap_min_w=limits.min_w,
                    cap_max_w=limits.max_w,
                    sm_clock_mhz=s.sm_clock_mhz,
                    max_sm_clock_mhz=s.max_sm_clock_mhz,
                    util_pct=min(100.0, max(0.0, s.util_pct)),
                    temp_c=s.temp_c,
                    power_reading=s.power_reading.value,
                    smoothing=smoothing,
                )
            )
        self.telemetry_seq += 1
        self.fill = None
        if fills:
            self.fill = FillRequest(
                v=PROTOCOL_VERSION,
                node=self.node,
                ts=self._wall(),
                seq=self.telemetry_seq,
                gpus=fills,
            )
        return Telemetry(
            v=PROTOCOL_VERSION,
            node=self.node,
            ts=self._wall(),
            seq=self.telemetry_seq,
            mode=self.mode,
            gpus=gpus,
            epoch=self._newest_epoch if self._newest_epoch >= 0 else None,
        )

    def _smoothing_to_send(self, index: int, gpu: Gpu) -> GpuSmoothingState | None:
        """The smoothing state this sample carries for a GPU: its state when it differs from
        the one last carried, when that was ``SMOOTHING_STATE_EVERY_SAMPLES`` samples ago, or
        when no sample has carried one since a new controller epoch; else None
        (docs/PROTOCOL.md)."""
        if index not in self._smoothing_gpus:
            return None
        state = self._smoothing_state(index, gpu)
        if state is None:
            return None
        sent = self._smoothing_sent.get(index)
        if sent is not None and sent[0] == state and sent[1] < SMOOTHING_STATE_EVERY_SAMPLES - 1:
            self._smoothing_sent[index] = (sent[0], sent[1] + 1)
            return None
        self._smoothing_sent[index] = (state, 0)
        return state

    def _smoothing_state(self, index: int, gpu: Gpu) -> GpuSmoothingState | None:
        """The smoothing in force on a GPU that has it; None (left out) if it cannot be read."""
        try:
            profile = gpu.smoothing()
        except GpuError as exc:
            self.counters.gpu_read_errors += 1
            self._read_error_log.warning(
                f"gpu{index}-smoothing",
                self._monotonic(),
                "gpu %d: power smoothing read failed, left out of telemetry: %s",
                index,
                exc,
            )
            return None
        if profile is None:
            return None
        return smoothing_state(profile, software=isinstance(gpu, SoftwareSmoothing))

    @property
    def node_state(self) -> NodeState:
        return "failsafe" if self.mode == "failsafe" else "online"

    def status(self, state: NodeState | None = None) -> Status:
        return Status(
            v=PROTOCOL_VERSION,
            node=self.node,
            state=state or self.node_state,
            ts=self._wall(),
            gpus=len(self.gpus),
            agent_version=__version__,
            failsafe_cap_w=max(self.failsafe_caps_w.values(), default=None),
            period_s=self.period_s,
        )

    def _reject(self, command: Command, why: str) -> Ack:
        self.counters.commands_refused += 1
        self._bad_input_log.warning("command-state", self._monotonic(), "command refused: %s", why)
        return self._ack(
            command.epoch, command.seq, "rejected", [], [AckError(index=None, message=why)]
        )

    def _ack(
        self,
        epoch: int,
        seq: int,
        result: AckResult,
        gpus: list[GpuAck],
        errors: list[AckError],
    ) -> Ack:
        return rules.make_ack(self.node, epoch, seq, self._wall(), result, gpus, errors)
