"""The controller's bookkeeping and decisions, with no I/O: a clock-injected state machine.

It turns protocol messages into the arrays ``policies.decide`` takes, and the
decision into per-node commands: sent only when a node's caps or clock locks
change, resent when not acknowledged in time. A node that is silent (no
telemetry for ``stale_after_s``) or offline is counted at its failsafe power
and is not commanded: by construction it holds that cap on its own.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from policies import ClusterState, Decision, PolicySettings, Tree, decide, infer_phases
from policies.tree import PHASE_CODES, PHASES, PRIORITY_CODES, SERVER
from powerd.protocol import (
    Ack,
    Command,
    GpuCommand,
    PhaseEvent,
    ProtocolError,
    Status,
    Telemetry,
    decode,
)
from powerd.ratelimit import LogOncePer
from powerd.topology import Topology

log = logging.getLogger("powerd.controller")
_M = TypeVar("_M", Telemetry, Status, Ack)

CAP_TOLERANCE_W = 1.0  # smaller cap changes are not worth a command
CAP_BOUND_FRACTION = 0.9  # a capped GPU drawing this share of its cap is held by it
# Announced phases under which a job that never announces its waits has them inferred.
INFERRED_FROM = ("compute", "eval")


@dataclass(frozen=True)
class ControllerSettings:
    cycle_s: float = 1.0
    stale_after_s: float = 5.0
    ack_timeout_s: float = 3.0
    command_ttl_s: float = 30.0
    # The agents' failsafe_after_s: a silent agent may hold its last caps this long
    # before it falls back to its failsafe caps on its own.
    agent_failsafe_after_s: float = 10.0
    # Infer phases from power for jobs that announce themselves but never their waits.
    infer_phases: bool = True
    infer_window_s: float = 30.0
    policy: PolicySettings = field(default_factory=PolicySettings)


@dataclass
class Job:
    name: str
    nodes: list[str]
    priority: str
    phase: str  # as announced
    since_mono: float
    announces_waits: bool = False  # it has announced communication or checkpoint itself
    inferred_phase: str | None = None  # from power, for jobs that do not announce waits

    @property
    def effective_phase(self) -> str:
        return self.inferred_phase or self.phase


@dataclass
class CycleCounters:
    commands_sent: int = 0
    resends: int = 0
    acks_received: int = 0
    acks_missing: int = 0
    # commands sent while the node's previous one was still unacknowledged (and not yet
    # overdue): the newer one replaces it, and the older one's ack, when it comes, is ignored
    superseded: int = 0
    stale_nodes: int = 0
    failsafe_nodes: int = 0
    offline_nodes: int = 0
    rejected_payloads: int = 0


@dataclass
class CycleResult:
    decision: Decision
    commands: list[tuple[str, Command]]
    counters: CycleCounters
    cycle_s: float


class Layout:
    """Where each server's GPUs sit in the flat arrays, by node name."""

    def __init__(self, server_names: list[str], server_nodes: np.ndarray, gpu_slices: list[range]):
        self.server_names = server_names
        self.server_nodes = server_nodes  # tree node index of each server
        self.gpu_slices = gpu_slices
        self.by_name = {name: i for i, name in enumerate(server_names)}

    @classmethod
    def from_topology(cls, topology: Topology) -> Layout:
        first = topology.level_start[SERVER]
        servers = list(topology.servers)
        return cls(
            servers,
            np.arange(first, first + len(servers)),
            [topology.server_gpus(name) for name in servers],
        )


class ControllerCore:
    def __init__(
        self,
        tree: Tree,
        layout: Layout,
        settings: ControllerSettings,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.tree = tree
        self.layout = layout
        self.settings = settings
        self._monotonic = monotonic
        self._wall = wall
        n_gpus, n_servers = tree.n_gpus, len(layout.server_names)
        self.power_w = tree.failsafe_cap_w.astype(float).copy()
        self.cap_w = tree.failsafe_cap_w.astype(float).copy()  # read back from the devices
        self.clock_mhz = np.full(n_gpus, np.nan)  # locks in force, read back
        self.last_seen = np.full(n_servers, -math.inf)  # monotonic time of last telemetry
        self.mode = np.full(n_servers, "unknown", dtype="<U10")  # as each node last reported
        self.offline = np.zeros(n_servers, dtype=bool)
        self.jobs: dict[str, Job] = {}
        self.server_job: list[str | None] = [None] * n_servers  # the job each server runs
        # what we asked of each server and whether it was acknowledged
        self.commanded_cap_w = np.full(n_gpus, np.nan)
        self.commanded_clock = np.full(n_gpus, np.nan)
        self.pending: dict[int, tuple[int, float]] = {}  # server -> (seq, sent at)
        self.epoch = 0
        self.seq = 0
        self.newest_agent_epoch = -1  # the highest epoch any agent says it follows
        self.counters = CycleCounters()
        self.rejected_total = 0
        self.last_dt_s = settings.cycle_s
        self._last_cycle_mono: float | None = None
        window = max(2, round(settings.infer_window_s / settings.cycle_s))
        if not settings.infer_phases:
            window = 0  # no history kept (20 MB at 83K GPUs and a 30 s window)
        self._history_w = np.full((n_gpus, window), np.nan)  # ring of per-cycle power
        self._history_next = 0
        self._log = LogOncePer(log)

    # --- inputs ----------------------------------------------------------------

    def on_telemetry(self, node: str, payload: bytes) -> Telemetry | None:
        """Take in one telemetry message; the decoded message, or None if it was refused."""
        got = self._decode_from(node, Telemetry, payload, "telemetry")
        if got is None:
            return None
        server, sample = got
        gpus = self.layout.gpu_slices[server]
        for g in sample.gpus:
            if g.index >= len(gpus):
                self._log.warning(
                    f"gpuidx-{node}",
                    self._monotonic(),
                    "node %s reports GPU %d; the budgets file gives it %d",
                    node,
                    g.index,
                    len(gpus),
                )
                continue
            i = gpus.start + g.index
            self.power_w[i] = g.power_w
            self.cap_w[i] = g.cap_w
            self.clock_mhz[i] = np.nan if g.max_sm_clock_mhz is None else g.max_sm_clock_mhz
        self.last_seen[server] = self._monotonic()
        if sample.epoch is not None and sample.epoch > self.newest_agent_epoch:
            self.newest_agent_epoch = sample.epoch
        self.mode[server] = sample.mode
        self.offline[server] = False
        return sample

    def on_status(self, node: str, payload: bytes) -> None:
        got = self._decode_from(node, Status, payload, "status")
        if got is None:
            return
        server, status = got
        self.offline[server] = status.state == "offline"
        if status.state == "offline":
            log.warning(
                "node %s is offline: counted at its last caps (at least its failsafe caps)", node
            )

    def on_ack(self, node: str, payload: bytes) -> None:
        got = self._decode_from(node, Ack, payload, "ack")
        if got is None:
            return
        server, ack = got
        pending = self.pending.get(server)
        if ack.epoch != self.epoch or pending is None or ack.seq < pending[0]:
            return  # an old command's ack
        del self.pending[server]
        self.counters.acks_received += 1
        gpus = self.layout.gpu_slices[server]
        for g in ack.gpus:
            if g.index < len(gpus) and g.cap_w is not None:
                self.cap_w[gpus.start + g.index] = g.cap_w
        if ack.result in ("partial", "rejected"):
            self._log.warning(
                f"ack-{node}",
                self._monotonic(),
                "node %s: command %d %s: %s",
                node,
                ack.seq,
                ack.result,
                "; ".join(e.message for e in ack.errors),
            )
            if ack.result == "rejected":  # ask again next cycle
                self._forget_commanded(server)

    def on_phase(self, job_name: str, payload: bytes) -> PhaseEvent | None:
        """Take in one phase event; the decoded event, or None if it was refused or ignored."""
        try:
            event = decode(PhaseEvent, payload, job_name)
        except ProtocolError as exc:
            self._reject(job_name, exc)
            return None
        job = self.jobs.get(job_name)
        if job is None:
            if event.nodes is None:
                self._log.warning(
                    f"job-{job_name}",
                    self._monotonic(),
                    "phase %s for unknown job %s without its node list: ignored",
                    event.phase,
                    job_name,
                )
                return None
            job = Job(job_name, [], event.priority, event.phase, self._monotonic())
            self.jobs[job_name] = job
        if event.nodes is not None:
            unknown = [n for n in event.nodes if n not in self.layout.by_name]
            if unknown:
                self._log.warning(
                    f"jobnodes-{job_name}",
                    self._monotonic(),
                    "job %s names %d nodes not in the budgets file (%s): ignored",
                    job_name,
                    len(unknown),
                    ", ".join(unknown[:5]),
                )
            for server in self._job_servers(job):
                if self.server_job[server] == job_name:
                    self.server_job[server] = None
            job.nodes = [n for n in event.nodes if n in self.layout.by_name]
            for server in self._job_servers(job):
                self.server_job[server] = job_name
        job.priority, job.phase, job.since_mono = event.priority, event.phase, self._monotonic()
        if event.phase in ("communication", "checkpoint"):
            job.announces_waits = True
        job.inferred_phase = None  # an announcement overrides an inference until the next cycle
        log.info(
            "job %s: %s (%d nodes, %s priority)",
            job_name,
            event.phase,
            len(job.nodes),
            job.priority,
        )
        if event.phase == "shutdown":
            del self.jobs[job_name]
            for server in self._job_servers(job):
                if self.server_job[server] == job_name:
                    self.server_job[server] = None
        return event

    def _job_servers(self, job: Job) -> list[int]:
        return [self.layout.by_name[n] for n in job.nodes]

    # --- the cycle -------------------------------------------------------------

    def cycle(self) -> CycleResult:
        started = time.perf_counter()
        now = self._monotonic()
        dt_s = (
            self.settings.cycle_s
            if self._last_cycle_mono is None
            else max(1e-3, now - self._last_cycle_mono)
        )
        self._last_cycle_mono = now
        self.last_dt_s = dt_s
        counters, self.counters = self.counters, CycleCounters()
        if self.settings.infer_phases:  # the power history is only for the inference
            self._remember_power(now)
            self._infer_phases()
        state, live = self.cluster_state(now, counters)
        for server in np.flatnonzero(~live | self._in_mode("failsafe")):
            # it holds its failsafe caps, not what we last asked: ask again when it is back
            self._forget_commanded(server)
        decision = decide(self.tree, state, dt_s, self.settings.policy)
        commands = self._commands(decision, live, now, counters)
        return CycleResult(decision, commands, counters, time.perf_counter() - started)

    def cluster_state(self, now: float, counters: CycleCounters) -> tuple[ClusterState, np.ndarray]:
        """Arrays for the policy, and which servers may be commanded.

        Silent or offline servers count at their failsafe cap, or at their last
        read-back caps while they may still hold them; local-mode ones at what they
        draw. None of them is commanded.
        """
        fresh = (now - self.last_seen) <= self.settings.stale_after_s
        live = fresh & ~self.offline
        counters.stale_nodes = int(np.sum(~fresh & ~self.offline))
        counters.offline_nodes = int(np.sum(self.offline))
        counters.failsafe_nodes = int(np.sum(self._in_mode("failsafe") & live))
        gpu_live = live[self._gpu_server_ordinal]
        # What a node we cannot hear holds: its failsafe caps, or its last caps if they
        # were higher while it may still be holding them (silent for less than the
        # agents' failsafe_after_s; or stopped, with on_exit = keep).
        silent_s = now - self.last_seen
        holding_last = (
            ~live & ((silent_s <= self.settings.agent_failsafe_after_s) | self.offline)
        )[self._gpu_server_ordinal]
        failsafe = self.tree.failsafe_cap_w
        held_w = np.where(holding_last, np.maximum(failsafe, self.cap_w), failsafe)
        power = np.where(gpu_live, self.power_w, held_w)
        cap = np.where(gpu_live, self.cap_w, held_w)
        # a local-mode agent reports but refuses commands: its power counts, it is not capped
        commandable = live & ~self._in_mode("local")
        priority = np.full(self.tree.n_gpus, PRIORITY_CODES["normal"], dtype=np.int8)
        phase = np.full(self.tree.n_gpus, PHASE_CODES["compute"], dtype=np.int8)
        for job in self.jobs.values():
            for node in job.nodes:
                gpus = self.layout.gpu_slices[self.layout.by_name[node]]
                priority[gpus.start : gpus.stop] = PRIORITY_CODES[job.priority]
                phase[gpus.start : gpus.stop] = PHASE_CODES[job.effective_phase]
        state = ClusterState(
            power_w=power,
            cap_w=cap,
            priority=priority,
            floor_w=self.tree.cap_min_w.astype(float).copy(),
            phase=phase,
            controllable=commandable[self._gpu_server_ordinal],
        )
        return state, commandable

    def _commands(
        self, decision: Decision, live: np.ndarray, now: float, counters: CycleCounters
    ) -> list[tuple[str, Command]]:
        out: list[tuple[str, Command]] = []
        cap_changed = ~(np.abs(decision.cap_w - self.commanded_cap_w) <= CAP_TOLERANCE_W)
        # the last fraction of a watt back to cap_max is sent too: else the GPU stays "capped"
        cap_max = self.tree.cap_max_w
        cap_changed |= (decision.cap_w >= cap_max) & ~(self.commanded_cap_w >= cap_max)
        want_clock, had_clock = decision.max_sm_clock_mhz, self.commanded_clock
        clock_changed = ~((np.isnan(want_clock) & np.isnan(had_clock)) | (want_clock == had_clock))
        # What a node holds is unknown (new epoch, forgotten): say its clock explicitly, so a
        # lock left by an earlier leader or command is removed (null) rather than kept (absent).
        clock_changed |= np.isnan(self.commanded_cap_w)
        changed = (
            np.bincount(
                self._gpu_server_ordinal,
                weights=(cap_changed | clock_changed).astype(float),
                minlength=len(self.layout.server_names),
            )
            > 0
        )
        for server in np.flatnonzero(live):
            pending = self.pending.get(server)
            overdue = pending is not None and now - pending[1] > self.settings.ack_timeout_s
            if not changed[server] and not overdue:
                continue
            if overdue:
                counters.acks_missing += 1
                counters.resends += 1
                self._forget_commanded(server)
            elif pending is not None:
                counters.superseded += 1
            gpus = self.layout.gpu_slices[server]
            self.seq += 1
            entries = []
            for local, i in enumerate(gpus):
                clock = want_clock[i]
                entry = GpuCommand(index=local, cap_w=float(decision.cap_w[i]))
                if overdue or clock_changed[i]:
                    entry.max_sm_clock_mhz = None if np.isnan(clock) else float(clock)
                entries.append(entry)
            command = Command(
                v=1,
                epoch=self.epoch,
                seq=self.seq,
                ts=self._wall(),
                ttl_s=self.settings.command_ttl_s,
                gpus=entries,
            )
            out.append((self.layout.server_names[server], command))
            self.pending[server] = (self.seq, now)
            self.commanded_cap_w[gpus.start : gpus.stop] = decision.cap_w[gpus.start : gpus.stop]
            self.commanded_clock[gpus.start : gpus.stop] = want_clock[gpus.start : gpus.stop]
            counters.commands_sent += 1
        return out

    # --- phase inference -------------------------------------------------------

    def _remember_power(self, now: float) -> None:
        fresh = ((now - self.last_seen) <= self.settings.stale_after_s) & ~self.offline
        # A capped GPU drawing (nearly) its cap says nothing about its phase: left out (NaN),
        # else a job the controller has just capped would look like a synchronised wait.
        capped = self.cap_w < self.tree.cap_max_w - CAP_TOLERANCE_W
        cap_bound = capped & (self.power_w >= CAP_BOUND_FRACTION * self.cap_w)
        column = np.where(fresh[self._gpu_server_ordinal] & ~cap_bound, self.power_w, np.nan)
        self._history_w[:, self._history_next] = column
        self._history_next = (self._history_next + 1) % self._history_w.shape[1]

    def _infer_phases(self) -> None:
        """Phases from power for jobs that announce themselves but not their waits."""
        quiet = [
            j for j in self.jobs.values() if not j.announces_waits and j.phase in INFERRED_FROM
        ]
        if not quiet:
            return
        gpu_ids, job_ids = [], []
        for k, job in enumerate(quiet):
            for node in job.nodes:
                gpus = self.layout.gpu_slices[self.layout.by_name[node]]
                gpu_ids.append(np.arange(gpus.start, gpus.stop))
                job_ids.append(np.full(len(gpus), k))
        if not gpu_ids:
            return
        index = np.concatenate(gpu_ids)
        history = np.roll(self._history_w[index], -self._history_next, axis=1)  # oldest first
        codes = infer_phases(
            history, np.concatenate(job_ids), sample_period_s=self.settings.cycle_s
        )
        firsts = np.cumsum([0] + [len(a) for a in gpu_ids])
        per_job: dict[int, int] = {}
        for first, ids in zip(firsts[:-1], job_ids, strict=True):
            if len(ids):
                per_job[int(ids[0])] = int(codes[first])
        for k, job in enumerate(quiet):
            code = per_job.get(k)
            inferred = None if code is None else PHASES[code]
            if inferred == "compute":
                inferred = None
            if inferred != job.inferred_phase:
                log.info(
                    "job %s: %s inferred from power", job.name, inferred or f"back to {job.phase}"
                )
            job.inferred_phase = inferred

    # --- helpers ---------------------------------------------------------------

    def job_of(self, node: str) -> str | None:
        server = self.layout.by_name.get(node)
        return None if server is None else self.server_job[server]

    def new_epoch(self, epoch: int) -> None:
        """Lead under a new epoch: every node is commanded afresh."""
        self.epoch = epoch
        self.seq = 0
        self.pending.clear()
        self.commanded_cap_w[:] = np.nan
        self.commanded_clock[:] = np.nan

    @property
    def _gpu_server_ordinal(self) -> np.ndarray:
        ordinal = getattr(self, "_gpu_ordinal_cache", None)
        if ordinal is None:
            ordinal = np.empty(self.tree.n_gpus, dtype=np.int64)
            for server, gpus in enumerate(self.layout.gpu_slices):
                ordinal[gpus.start : gpus.stop] = server
            self._gpu_ordinal_cache = ordinal
        return ordinal

    def _in_mode(self, mode: str) -> np.ndarray:
        return self.mode == mode

    def _forget_commanded(self, server: int) -> None:
        gpus = self.layout.gpu_slices[server]
        self.commanded_cap_w[gpus.start : gpus.stop] = np.nan
        self.commanded_clock[gpus.start : gpus.stop] = np.nan
        self.pending.pop(server, None)

    def _server(self, node: str, what: str) -> int | None:
        server = self.layout.by_name.get(node)
        if server is None:
            self._log.warning(
                f"unknown-{node}",
                self._monotonic(),
                "%s from node %s, which is not in the budgets file: ignored",
                what,
                node,
            )
        return server

    def _decode_from(
        self, node: str, kind: type[_M], payload: bytes, what: str
    ) -> tuple[int, _M] | None:
        """The sending server's index and the decoded message; None (logged, counted if
        invalid) for a node not in the budgets file or a payload the protocol refuses."""
        server = self._server(node, what)
        if server is None:
            return None
        try:
            return server, decode(kind, payload, node)
        except ProtocolError as exc:
            self._reject(node, exc)
            return None

    def count_rejected(self) -> None:
        self.counters.rejected_payloads += 1
        self.rejected_total += 1

    def _reject(self, sender: str, exc: ProtocolError) -> None:
        self.count_rejected()
        self._log.warning(
            f"bad-{sender}", self._monotonic(), "rejected payload from %s: %s", sender, exc
        )
