"""Thousands of agents as arrays: what ``powerd fleet`` simulates, with no I/O.

One :class:`FleetModel` stands for every node of a budgets file (or the first
N): GPUs with a demand, a cap and a clock lock, nodes with a telemetry
sequence number, a mode and the last command applied. It answers the same
messages the way ``powerd.agent.core.AgentCore`` does, in bulk, by the agent's own
rules (``powerd.agent.rules``, ``powerd.agent.following``) called for each node:

- **Telemetry**: one protocol-valid ``Telemetry`` payload per node (what an
  agent publishes each period), power = ``min(demand, cap)``, scaled down
  under a clock lock as the simulated GPU's default workload is
  (``powerd.gpu.workload_model.locked_power_share``); the newest controller epoch
  it has seen.
- **Commands** (``on_command``): signature verified against the trusted
  controller keys (``powerd.signing``), validated by ``powerd.protocol``; refused
  (``rejected``) in failsafe; ``stale`` if older than the newest epoch or not
  after the last applied ``(epoch, seq)``; else every cap clamped into
  ``[cap_min, cap_max]``, clocks locked (clamped) or unlocked, and the ack
  reads back what is held. The next telemetry shows the new caps.
- **Power smoothing** (a command's ``smoothing``), on the models that have it
  (GB200): the floor clamped into the simulated device's range, the preset
  written and activated, the switch set, the ack reading the active profile
  back; refused as unsupported on the others (the ack's ``partial``, with no
  profile), as ``powerd.agent.controls`` and ``powerd.gpu.simulated`` answer.
  Telemetry carries each such GPU's state (switch, preset, floor) when it
  changes and every ``SMOOTHING_STATE_EVERY_SAMPLES`` samples; while it is
  on, the draw ramps as the simulated GPU's does (rates, hysteresis, the floor).
- **Heartbeats** (``on_heartbeat``): verified too (one verification per
  distinct payload: every node receives the same one); a live leader's keeps every node
  controlled; none for ``failsafe_after_s`` puts every node in failsafe
  (failsafe caps, clocks unlocked) until the next live one, as agents do.
- **Load**: a base demand per GPU with a little noise; ``push(rack)`` sends a
  rack's GPUs to their maximum power (a job's sudden rise) and ``release``
  brings them back; the model reports, per pushed rack, when its power (what
  the GPUs really draw under the caps they hold) is back under the rack's
  capping threshold: the controller's reaction, measured end to end.
- **Failures**: nodes that never report (silent) and nodes that stopped
  (offline status, no telemetry).
- **Jobs** (optional, ``jobs``): the nodes split into that many jobs of
  whole racks, priorities high, normal, low in turn; each announces
  ``startup`` with its nodes, then alternates ``compute`` (``compute_s``) and
  ``communication`` (``communication_s``), as ``powerd.jobhook`` would. In
  communication its GPUs draw ``COMM_LOAD`` of their compute demand (they wait
  on collectives); the controller may lock their clocks meanwhile.

- **Clock policies** (a command's ``comm_clock``), as ``powerd.agent.phase_clock``
  holds them, by the same rules (``rules.lock_stays``, ``rules.phase_locks``): every
  applied command replaces each of its node's GPUs' policy, the ack reads it back (its
  clock clamped into the device's range); the job's own announcements (``on_phase``;
  the fleet's jobs' through ``phase_events``) lock its GPUs' clocks in
  ``communication`` and unlock them in any other phase; failsafe and a newer controller
  epoch end every policy. So the controller leaves those clocks to the jobs, as it does
  with real agents, and sends no command at a phase change for them.

Not simulated: the agents' command TTL (refreshed by every live heartbeat,
so it only matters when heartbeats stop, which failsafe covers already); the
broker's hop for the fleet's own announcements (its agents hear them at once);
software smoothing (``agent.software_smoothing``: its GPUs report no smoothing); and
per-GPU workloads (``powerd.gpu.simulated`` has those, at ~100 times the cost per
sample). ``tests/fleet/test_fleet_conformance.py`` holds the
simulated answers to a real ``AgentCore``'s on the same messages.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from msgspec import UNSET

from policies.tree import RACK
from powerd.agent import rules
from powerd.agent.controls import smoothing_wire
from powerd.agent.following import Following
from powerd.clock_skew import DEFAULT_MAX_CLOCK_SKEW_S
from powerd.fleet.jobs import COMM_LOAD, split_into_jobs
from powerd.fleet.smoothing import FleetSmoothing
from powerd.gpu.base import ClockRange, PowerLimitRange
from powerd.gpu.clock_table import ClockTable
from powerd.gpu.models import GPU_MODELS
from powerd.gpu.simulated import DEFAULT_WORKLOAD, workload_curve
from powerd.gpu.workload_model import Device
from powerd.gpu.workload_model import locked_power_share as curve_locked_share
from powerd.protocol import (
    SMOOTHING_STATE_EVERY_SAMPLES,
    AckError,
    AckResult,
    Command,
    CommClock,
    GpuAck,
    GpuCommand,
    GpuSmoothing,
    Heartbeat,
    Mode,
    PhaseEvent,
    ProtocolError,
    Status,
    Topics,
    decode,
    detach_signature,
    encode,
    job_nodes_fields,
    peek_order,
)
from powerd.signing import SignatureError, Verifier
from powerd.topology import Topology
from powerd.vocabulary import PROTOCOL_VERSION

log = logging.getLogger("powerd.fleet")

R = TypeVar("R")


def locked_power_share(model: str, lock_mhz: float, table: ClockTable | None) -> float:
    """The share of its unlocked draw a GPU of ``model`` draws at ``lock_mhz``: by its clock
    ``table`` (``Topology.clock_table``) where it has one, else by the simulated GPU's
    default workload curve (``powerd.gpu.workload_model.locked_power_share``)."""
    device = Device.of(GPU_MODELS[model])
    return curve_locked_share(workload_curve(DEFAULT_WORKLOAD), device, table, lock_mhz)


@dataclass(frozen=True)
class FleetOptions:
    nodes: int | None = None  # the first N servers of the budgets file; None: all
    # demand as a share of cap_max: 0.6 keeps the shipped 150 MW site below every
    # uncapping threshold, so GPUs are handed watts back and a pushed rack goes over
    base_load: float = 0.6
    noise: float = 0.02  # relative spread of the demand, redrawn every sample
    silent_fraction: float = 0.0  # nodes that never report
    offline_fraction: float = 0.0  # nodes that publish an offline status and no telemetry
    failsafe_after_s: float = 10.0  # as the agents' failsafe_after_s
    max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S  # as the agents' max_clock_skew_s
    # "fresh": agents that just started (failsafe caps, failsafe until a live heartbeat);
    # "running": agents of a site already under control (caps at their maximum, a live
    # controller until failsafe_after_s from the start: the one being replaced)
    start: str = "fresh"
    jobs: int = 0  # training jobs announcing phases (0: none)
    job_priority: str | None = None  # every job's; None: high, normal, low in turn
    job_prefix: str = "fleet"  # jobs are PREFIX-job000 ...: one prefix per fleet process
    compute_s: float = 20.0
    communication_s: float = 3.0
    seed: int = 1
    # Check the signature of one command in this many (1: every one). Each agent checks its
    # own on its own CPU (124 us on a 2-vCPU EPYC); one process playing 20,736 agents that
    # checks them all measures itself, not the controller, when jobs move thousands of
    # nodes at once. The rest are still refused unsigned or signed by an unknown key.
    verify_every: int = 1


@dataclass
class Push:
    """One rack sent to its maximum power, and when the controller had it back."""

    rack: int  # tree node index
    at: float  # monotonic time of the push
    visible_at: float | None = None  # first telemetry that put its reported power over
    back_at: float | None = None  # the ack that brought its real power under the threshold


@dataclass
class FleetCounters:
    telemetry: int = 0
    commands: int = 0
    acks: dict[str, int] = field(default_factory=dict)  # by result
    heartbeats: int = 0
    failsafe_entries: int = 0
    rejected_payloads: int = 0
    clock_locks: int = 0  # GPU clock locks applied by commands
    phase_locks: int = 0  # ... and by a job's announcements, under a clock policy
    signatures_unchecked: int = 0  # commands taken on their key id alone (verify_every)
    # applied commands: "cut" (some cap lowered by over 1 W), "raise", "no cap moved"
    applied_by_kind: dict[str, int] = field(default_factory=dict)
    phase_events: int = 0


class FleetModel:
    def __init__(
        self,
        topology: Topology,
        options: FleetOptions,
        verifier: Verifier,
        cluster: str = "default",
        scope: str | None = None,
    ) -> None:
        """``verifier``: the controller keys every simulated agent trusts; ``scope``: the
        leaf controllers the nodes follow (their agents' controller_scope), None: the site's."""
        self.topology = topology
        self.verifier = verifier
        self.topics = Topics(cluster, scope=scope)
        self._verified_heartbeat: tuple[bytes, Heartbeat] | None = None
        self.heartbeat_ts = math.nan  # the sender's wall time in the last live heartbeat
        self.options = options
        self.tree = tree = topology.tree
        servers = list(topology.servers)
        n_nodes = len(servers) if options.nodes is None else min(options.nodes, len(servers))
        self.names = servers[:n_nodes]
        self.index = {name: i for i, name in enumerate(self.names)}
        slices = [topology.server_gpus(name) for name in self.names]
        self.gpu_start = np.array([s.start for s in slices], dtype=np.int64)
        self.gpu_count = np.array([len(s) for s in slices], dtype=np.int64)
        n_gpus = int(self.gpu_start[-1] + self.gpu_count[-1]) if n_nodes else 0
        self.n_gpus = n_gpus
        self.gpu_node = np.repeat(np.arange(n_nodes), self.gpu_count)
        self.cap_min_w = tree.cap_min_w[:n_gpus].astype(float)
        self.cap_max_w = tree.cap_max_w[:n_gpus].astype(float)
        self.failsafe_cap_w = tree.failsafe_cap_w[:n_gpus].astype(float)
        models = [GPU_MODELS[topology.server(name).model] for name in self.names]
        self.clock_min_mhz = np.repeat([m.sm_clock_min_mhz for m in models], self.gpu_count)
        self.clock_max_mhz = np.repeat([m.sm_clock_max_mhz for m in models], self.gpu_count)
        self._rng = np.random.default_rng(options.seed)
        self.base_w = options.base_load * self.cap_max_w
        self.demand_w = self.base_w.copy()
        # Per-GPU state that changes message by message is kept in lists: a numpy scalar
        # read or write costs ~10 times a list's, and the telemetry of one node is a loop.
        # Agents start at their failsafe caps, clocks unlocked (AgentCore.start).
        if options.start not in ("fresh", "running"):
            raise ValueError(f"start must be fresh or running, not {options.start!r}")
        initial_w = self.failsafe_cap_w if options.start == "fresh" else self.cap_max_w
        self.cap_w: list[float] = initial_w.tolist()
        self.lock_mhz: list[int | None] = [None] * n_gpus
        # clock policies: per GPU, the (job, owner) whose announcements move its lock and
        # the clock it locks to (clamped), or None; and whether an announcement made the lock
        self.policy: list[tuple[str, str | None, int] | None] = [None] * n_gpus
        self._phase_locked: list[bool] = [False] * n_gpus
        self.power_w: list[float] = np.minimum(self.demand_w, initial_w).tolist()
        self.energy_j: list[float] = [0.0] * n_gpus
        self._want: list[float] = self.demand_w.tolist()  # this period's demand, noise included
        self._noise = np.ones(n_gpus)
        self._clock_max = self.clock_max_mhz.tolist()
        self._model = np.repeat([m.key for m in models], self.gpu_count).tolist()
        self._lock_share: dict[tuple[str, int], float] = {}  # (model, lock): a few entries
        self._cap_max = self.cap_max_w.tolist()
        # each GPU's ranges, as its agent clamps into them (equal ranges are one object)
        self._limits = _ranges(
            self.cap_min_w, self.cap_max_w, lambda lo, hi: PowerLimitRange(lo, hi, hi)
        )
        self._clocks = _ranges(
            self.clock_min_mhz, self.clock_max_mhz, lambda lo, hi: ClockRange(int(lo), int(hi))
        )
        self._first_gpu: list[int] = self.gpu_start.tolist()
        self._n_gpus: list[int] = self.gpu_count.tolist()
        self.failsafe = True
        self.seq = [0] * n_nodes
        self.last_applied: list[rules.Order] = [rules.NO_ORDER] * n_nodes
        # whom the agents follow, and whether it lives: as agents do (powerd.agent.following)
        self.following = self._following(-math.inf)
        self.heartbeat_deadline = -math.inf
        self.failsafe_raise_at: float | None = None  # failsafe: the caps below rise then
        self.silent, self.offline = self._failing(n_nodes)
        # racks: the tree node each GPU sits under, and the watts under it that are not GPUs
        self.gpu_rack = tree.gpu_ancestor[RACK][:n_gpus]
        self.racks = np.unique(self.gpu_rack)
        self._rack_overhead_w = self._rack_overheads()
        self._rack_gpus = self._gpus_by_rack()
        # hardware power smoothing, on the models that have it (GB200)
        has = np.repeat([m.has_power_smoothing for m in models], self.gpu_count).tolist()
        self.smoothing = FleetSmoothing(has)
        self.smoothing_gpus = self.smoothing.gpus
        self.reported_w = list(self.power_w)  # what the last telemetry of each GPU said
        self.pushes: list[Push] = []
        self._pushed: dict[int, Push] = {}  # rack -> its open push
        self.counters = FleetCounters()
        self._templates = [self._template(i) for i in range(n_nodes)]
        node_racks = [
            (n, int(self.gpu_rack[self._first_gpu[n]])) for n in self.reporting().tolist()
        ]
        self.jobs = split_into_jobs(
            options.jobs, node_racks, options.job_prefix, options.job_priority
        )

    # --- what the controller sees ------------------------------------------------------

    def reporting(self) -> np.ndarray:
        """Nodes that publish telemetry."""
        return np.flatnonzero(~self.silent & ~self.offline)

    def new_round(self) -> None:
        """A new telemetry period: every GPU's demand gets its noise for this period."""
        self._noise = 1.0 + self.options.noise * self._rng.standard_normal(self.n_gpus)
        self._want = (self.demand_w * self._noise).tolist()

    def _demand_changed(self, gpus: list[int]) -> None:
        """A push or release takes effect at once, not at the next period."""
        for g in gpus:
            self._want[g] = float(self.demand_w[g] * self._noise[g])

    def telemetry(self, node: int, ts: float, dt_s: float) -> bytes:
        """The node's telemetry payload now (protocol-valid JSON, as an agent sends it);
        its GPUs draw what they want this period under their caps and clock locks."""
        return self.telemetry_of([node], ts, dt_s)[0]

    def telemetry_of(self, nodes: list[int], ts: float, dt_s: float) -> list[bytes]:
        """:meth:`telemetry` of each of ``nodes``, in order: the GPUs with smoothing on are
        moved by the ramp rule in one call for them all (per call it costs as much for one
        node's GPUs as for thousands).

        The simulator's hot loop (every node, every period): plain lists and locals."""
        drawn = [self._drawn(node) for node in nodes]
        if self.smoothing.on:  # as powerd.gpu.simulated moves the draw
            self.smoothing.ramp(
                [self._first_gpu[node] for node in nodes], drawn, self.cap_w, self.power_w, dt_s
            )
        return [self._payload(node, d, ts, dt_s) for node, d in zip(nodes, drawn, strict=True)]

    def _drawn(self, node: int) -> list[float]:
        """What each of the node's GPUs draws before smoothing: its demand under its lock
        and cap."""
        start = self._first_gpu[node]
        want, cap_w, lock_mhz = self._want, self.cap_w, self.lock_mhz
        model, lock_share = self._model, self._lock_share
        drawn: list[float] = []
        for g in range(start, start + self._n_gpus[node]):
            lock = lock_mhz[g]
            power = want[g]
            if lock is not None:
                key = (model[g], lock)
                share = lock_share.get(key)
                if share is None:
                    table = self.topology.clock_table(model[g])
                    share = lock_share[key] = locked_power_share(model[g], lock, table)
                power *= share
            cap = cap_w[g]
            drawn.append(cap if power > cap else 0.0 if power < 0.0 else power)
        return drawn

    def _payload(self, node: int, drawn: list[float], ts: float, dt_s: float) -> bytes:
        """The node's telemetry with its GPUs at ``drawn``, their energy counted."""
        self.seq[node] += 1
        start = self._first_gpu[node]
        values: list[object] = [ts, self.seq[node], "failsafe" if self.failsafe else "controlled"]
        cap_w, lock_mhz, energy = self.cap_w, self.lock_mhz, self.energy_j
        clock_max, cap_max, power_w = self._clock_max, self._cap_max, self.power_w
        smoothing = self.smoothing
        states, sent, since = smoothing.state, smoothing.sent, smoothing.since
        every = SMOOTHING_STATE_EVERY_SAMPLES
        gpus = range(start, start + self._n_gpus[node])
        for g, power in zip(gpus, drawn, strict=True):
            lock, cap = lock_mhz[g], cap_w[g]
            power_w[g] = power
            used = energy[g] = energy[g] + power * dt_s
            if lock is None:
                values += (power, used, cap, clock_max[g], "null", 100.0 * power / cap_max[g])
            else:
                values += (power, used, cap, lock, lock, 100.0 * power / cap_max[g])
            state = states[g]
            if state is not None:  # a GPU with smoothing: its state, when it is due
                if state is sent[g] and since[g] < every - 1:
                    since[g] += 1
                    values.append("")
                else:
                    sent[g], since[g] = state, 0
                    values.append(state)
        values.append("null" if self.newest_epoch < 0 else self.newest_epoch)
        self.counters.telemetry += 1
        if self._pushed:
            self._reported(node, start, self._n_gpus[node])
        return (self._templates[node] % tuple(values)).encode()

    def offline_status(self, node: int, ts: float) -> bytes:
        return encode(
            Status(
                v=PROTOCOL_VERSION,
                node=self.names[node],
                state="offline",
                ts=ts,
                gpus=0,
                agent_version="",
            )
        )

    # --- what the controller says --------------------------------------------------------

    def _following(self, now: float) -> Following:
        return Following(self.options.failsafe_after_s, self.options.max_clock_skew_s, log, now)

    @property
    def newest_epoch(self) -> int:
        """The newest controller epoch the agents follow (-1: none yet)."""
        return self.following.newest_epoch

    @property
    def mode(self) -> Mode:
        """Every node's mode: the fleet's agents are controlled or in failsafe together."""
        return "failsafe" if self.failsafe else "controlled"

    def controller_live(self, now: float) -> bool:
        return rules.controller_live(self.mode, now, self.heartbeat_deadline)

    def start(self, now: float) -> None:
        """The run begins: a running site's agents still follow the controller being replaced."""
        self.following = self._following(now)
        if self.options.start == "running":
            self.failsafe = False
            self.heartbeat_deadline = now + self.options.failsafe_after_s

    def on_heartbeat(self, payload: bytes, now: float, wall: float, live: bool = True) -> bool:
        """A heartbeat, delivered ``live`` or retained; True if it proves a leader lives now
        (every node follows it). By the agents' rules (``powerd.agent.following``)."""
        self.counters.heartbeats += 1
        last = self._verified_heartbeat
        if last is not None and last[0] == payload:
            beat = last[1]
        else:
            try:
                beat = self.verifier.decode(Heartbeat, self.topics.heartbeat, payload)
            except ProtocolError:
                self.counters.rejected_payloads += 1
                return False
            self._verified_heartbeat = (bytes(payload), beat)
        previous = self.newest_epoch
        taken = self.following.heartbeat(beat, now, wall, live)
        if taken.new_epoch:  # a new leader: every state on the next sample
            self.smoothing.new_leader()
            if previous >= 0:
                self._end_policies(release=True)
            after = rules.order_after_new_epoch
            self.last_applied = [after(last, beat.epoch) for last in self.last_applied]
        if taken.verdict != "live":
            return False
        if taken.floor is not None:
            after_live, floor = rules.order_after_live, taken.floor
            self.last_applied = [after_live(last, floor) for last in self.last_applied]
        self.heartbeat_ts = beat.ts
        self.heartbeat_deadline = rules.live_until(
            self.heartbeat_deadline, now, self.options.failsafe_after_s
        )
        self.failsafe = False
        self.failsafe_raise_at = None
        return True

    def tick(self, now: float) -> bool:
        """Deadlines: True if the fleet has just entered failsafe. As agents do
        (``AgentCore.enter_failsafe``): caps above the failsafe cap come down at once, those
        below rise ``rules.FAILSAFE_RAISE_SHARE`` of ``failsafe_after_s`` later."""
        if self.failsafe and self.failsafe_raise_at is not None and now >= self.failsafe_raise_at:
            self.failsafe_raise_at = None
            self.cap_w[:] = self.failsafe_cap_w.tolist()
        if self.failsafe or now <= self.heartbeat_deadline:
            return False
        self.failsafe = True
        self.counters.failsafe_entries += 1
        caps = [
            rules.failsafe_cap_w(held_w, failsafe_w)
            for held_w, failsafe_w in zip(self.cap_w, self.failsafe_cap_w.tolist(), strict=True)
        ]
        self.cap_w[:] = [cap_w for cap_w, _ in caps]
        any_below = any(below for _, below in caps)
        self.failsafe_raise_at = rules.failsafe_raise_at(
            now, self.options.failsafe_after_s, any_below
        )
        self.lock_mhz[:] = [None] * self.n_gpus
        self._end_policies(release=False)  # the locks are gone already
        return True

    def _end_policies(self, release: bool) -> None:
        """Every clock policy ends (failsafe, a newer epoch); ``release``: remove the locks
        announcements made."""
        for g, locked in enumerate(self._phase_locked):
            if locked and release:
                self.lock_mhz[g] = None
        self._phase_locked = [False] * self.n_gpus
        self.policy = [None] * self.n_gpus

    def on_command(self, node_name: str, payload: bytes, now: float, wall: float) -> bytes | None:
        """Apply a command to one node as its agent would; its ack (None: not our node)."""
        node = self.index.get(node_name)
        if node is None:
            return None
        self.counters.commands += 1
        try:
            command = self._open_command(node_name, payload)
        except ProtocolError as exc:
            self.counters.rejected_payloads += 1
            epoch, seq = peek_order(payload)
            return self._ack(node, epoch, seq, "rejected", [], str(exc), wall)
        why = rules.refusal(self.mode, self.controller_live(now))
        if why is not None:
            return self._ack(node, command.epoch, command.seq, "rejected", [], why, wall)
        order = (command.epoch, command.seq)
        if rules.is_stale(command.epoch, command.seq, self.newest_epoch, self.last_applied[node]):
            return self._ack(node, command.epoch, command.seq, "stale", [], None, wall)
        start, count = int(self.gpu_start[node]), int(self.gpu_count[node])
        held = self._replace_policies(start, count, command.gpus)
        cut = rose = False  # whether any cap fell, or rose, by more than a watt
        acks: list[GpuAck] = []
        errors: list[str] = []
        for entry in command.gpus:
            if entry.index >= count:
                errors.append(f"unknown GPU index {entry.index}")
                continue
            g = start + entry.index
            clamped = False
            comm_clock = held.get(entry.index)
            if comm_clock is not None and entry.comm_clock is not UNSET:
                clamped = comm_clock.max_sm_clock_mhz != round(entry.comm_clock.max_sm_clock_mhz)
            if entry.cap_w is not UNSET:
                cap = self._limits[g].clamp(entry.cap_w)
                clamped |= cap != entry.cap_w
                cut |= cap < self.cap_w[g] - 1.0
                rose |= cap > self.cap_w[g] + 1.0
                self.cap_w[g] = cap
            if entry.max_sm_clock_mhz is None:
                self.lock_mhz[g] = None
            elif entry.max_sm_clock_mhz is not UNSET:
                lock = self._clamp_clock(g, entry.max_sm_clock_mhz)
                clamped |= lock != round(entry.max_sm_clock_mhz)
                self.lock_mhz[g] = lock
                self.counters.clock_locks += 1
            smoothing: GpuSmoothing | None = None
            if entry.smoothing is not UNSET:
                model = self._model[g]
                clamped |= self.smoothing.set(g, entry.index, model, entry.smoothing, errors)
                active = self.smoothing.active(g)
                smoothing = None if active is None else smoothing_wire(active)
            acks.append(
                GpuAck(
                    index=entry.index,
                    cap_w=float(self.cap_w[g]),
                    max_sm_clock_mhz=self.lock_mhz[g],
                    clamped=clamped,
                    smoothing=smoothing,
                    comm_clock=comm_clock,
                )
            )
        self.last_applied[node] = order
        kind = "cut" if cut else "raise" if rose else "no cap moved"
        self.counters.applied_by_kind[kind] = self.counters.applied_by_kind.get(kind, 0) + 1
        self.following.command_epoch(command.epoch)
        result = rules.applied_result(errors)
        ack = self._ack(node, command.epoch, command.seq, result, acks, "; ".join(errors), wall)
        self._check_pushes(now)
        return ack

    def _open_command(self, node_name: str, payload: bytes) -> Command:
        """The command in ``payload``, its signature checked (one in ``verify_every``) or
        only its key id (the others): unsigned or an unknown key is refused either way."""
        every = self.options.verify_every
        if every <= 1 or self.counters.commands % every == 0:
            return self.verifier.decode(Command, self.topics.command(node_name), payload)
        parts = detach_signature(bytes(payload))
        if parts is None or parts[1] not in self.verifier.keys:
            raise SignatureError("not signed by a trusted key")
        self.counters.signatures_unchecked += 1
        return decode(Command, payload)

    def _replace_policies(
        self, start: int, count: int, entries: list[GpuCommand]
    ) -> dict[int, CommClock]:
        """An applied command's clock policies replace every GPU's of its node, as
        ``PhaseClocks.after_command``; what each GPU holds now, by index, for the ack."""
        wanted: dict[int, CommClock] = {}
        for entry in entries:
            if entry.index >= count:
                continue
            if entry.max_sm_clock_mhz is not UNSET:
                self._phase_locked[start + entry.index] = False  # the command sets this lock
            if entry.comm_clock is not UNSET:
                wanted[entry.index] = entry.comm_clock
        held: dict[int, CommClock] = {}
        for k in range(count):
            g = start + k
            new, old = wanted.get(k), self.policy[g]
            clock = None if new is None else self._clamp_clock(g, new.max_sm_clock_mhz)
            if self._phase_locked[g]:
                new_job = None if new is None else (new.job, new.owner)
                if rules.lock_stays(True, None if old is None else old[:2], new_job):
                    self.lock_mhz[g] = clock
                else:
                    self._phase_locked[g] = False
                    self.lock_mhz[g] = None
            if new is None or clock is None:
                self.policy[g] = None
            else:
                self.policy[g] = (new.job, new.owner, clock)
                held[k] = CommClock(job=new.job, owner=new.owner, max_sm_clock_mhz=float(clock))
        return held

    def _clamp_clock(self, g: int, clock_mhz: float) -> int:
        """A lock as GPU ``g`` takes it: rounded, into the device's range."""
        return self._clocks[g].clamp(clock_mhz)

    def on_phase(self, job: str, owner: str | None, phase: str, now: float) -> int:
        """A job's announcement, heard by every node: the GPUs whose policy names the job
        lock their clocks in ``communication`` and unlock them in any other phase
        (``powerd.agent.phase_clock``); how many GPUs it moved. Nothing while in failsafe."""
        if not self.controller_live(now):
            return 0
        moved = 0
        lock = rules.phase_locks(phase)
        for g, policy in enumerate(self.policy):
            if policy is None or policy[0] != job or policy[1] != owner:
                continue
            if lock:
                if self.lock_mhz[g] != policy[2]:
                    self.lock_mhz[g] = policy[2]
                    moved += 1
                    self.counters.phase_locks += 1
                self._phase_locked[g] = True
            else:
                self._phase_locked[g] = False
                if self.lock_mhz[g] is not None:
                    self.lock_mhz[g] = None
                    moved += 1
        return moved

    # --- load -----------------------------------------------------------------------------

    def push(self, rack: int, now: float) -> Push:
        """Every GPU of ``rack`` wants its maximum power from now on."""
        gpus = self._rack_gpus[rack]
        self.demand_w[gpus] = self.cap_max_w[gpus]
        self._demand_changed(gpus)
        push = Push(rack, now)
        self.pushes.append(push)
        self._pushed[rack] = push
        return push

    def release(self, rack: int) -> None:
        gpus = self._rack_gpus[rack]
        self.demand_w[gpus] = self.base_w[gpus]
        self._demand_changed(gpus)
        self._pushed.pop(rack, None)

    def pushed(self) -> list[Push]:
        """Pushes still open (not released)."""
        return list(self._pushed.values())

    def rack_power_w(self, rack: int, gpu_power: list[float]) -> float:
        """A rack's power with its GPUs at ``gpu_power``: as the controller's tree sums it."""
        return sum(gpu_power[g] for g in self._rack_gpus[rack]) + self._rack_overhead_w[rack]

    def rack_real_w(self, rack: int) -> float:
        """What the rack draws when its GPUs draw what they want under the caps they hold."""
        gpus = self._rack_gpus[rack]
        ramps, drawn = self.smoothing.ramps, self.power_w  # smoothing on: as it ramped, sampled
        real = sum(
            min(self.demand_w[g] if ramps[g] is None else drawn[g], self.cap_w[g]) for g in gpus
        )
        return float(real) + self._rack_overhead_w[rack]

    # --- jobs -----------------------------------------------------------------------------

    def phase_events(self, now: float, wall: float) -> list[tuple[str, bytes]]:
        """The phase announcements due now, as (job, payload); demand follows the phase."""
        out = []
        for job in self.jobs:
            if now < job.next_at:
                continue
            last_for = job.advance(now, self.options.compute_s, self.options.communication_s)
            phase = job.phase
            gpus = [
                g
                for n in job.nodes
                for g in range(self._first_gpu[n], self._first_gpu[n] + self._n_gpus[n])
            ]
            load = COMM_LOAD if phase == "communication" else 1.0
            self.demand_w[gpus] = self.base_w[gpus] * load
            for rack in self._pushed:  # a pushed rack stays pushed
                self.demand_w[self._rack_gpus[rack]] = self.cap_max_w[self._rack_gpus[rack]]
            self._demand_changed(gpus)
            self.on_phase(job.name, None, phase, now)  # its agents hear it (no broker hop)
            names = [self.names[n] for n in job.nodes] if phase == "startup" else None
            event = PhaseEvent(
                v=PROTOCOL_VERSION,
                job=job.name,
                ts=wall,
                phase=phase,
                priority=job.priority,
                expected_s=last_for,
                **job_nodes_fields(names),  # a long list as a host list
            )
            try:
                payload = encode(event)
            except ProtocolError as exc:
                raise ValueError(
                    f"job {job.name} has {len(job.nodes)} nodes: its startup announcement is "
                    f"over the protocol's payload limit even as a host list ({exc}); run more, "
                    "smaller jobs"
                ) from None
            self.counters.phase_events += 1
            out.append((job.name, payload))
        return out

    # --- power smoothing ---------------------------------------------------------------------

    def smoothing_on(self) -> int:
        """How many GPUs have power smoothing switched on now."""
        return self.smoothing.on

    # --- internals --------------------------------------------------------------------------

    def _failing(self, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
        """Which nodes never report (silent) and which stopped (offline), drawn at random."""
        pick = self._rng.permutation(n_nodes)
        n_silent = round(self.options.silent_fraction * n_nodes)
        n_offline = round(self.options.offline_fraction * n_nodes)
        silent = np.zeros(n_nodes, dtype=bool)
        silent[pick[:n_silent]] = True
        offline = np.zeros(n_nodes, dtype=bool)
        offline[pick[n_silent : n_silent + n_offline]] = True
        return silent, offline

    def _gpus_by_rack(self) -> dict[int, list[int]]:
        """Each rack's GPUs, by the tree node index of the rack."""
        order = np.argsort(self.gpu_rack, kind="stable")
        bounds = np.searchsorted(self.gpu_rack[order], self.racks)
        return {
            int(r): order[a:b].tolist()
            for r, a, b in zip(self.racks, bounds, [*bounds[1:], self.n_gpus], strict=True)
        }

    def _rack_overheads(self) -> dict[int, float]:
        """Each rack's overhead plus its servers' (watts that are not GPUs)."""
        tree = self.tree
        overhead = tree.overhead_w.astype(float)
        out: dict[int, float] = {}
        for rack in self.racks:
            r = int(rack)
            children = np.flatnonzero(tree.parent == r)
            out[r] = float(overhead[r] + overhead[children].sum())
        return out

    def _reported(self, node: int, start: int, count: int) -> None:
        """Telemetry of ``node`` went out: a pushed rack may now look over its threshold."""
        self.reported_w[start : start + count] = self.power_w[start : start + count]
        rack = int(self.gpu_rack[start])
        push = self._pushed.get(rack)
        if push is not None and push.visible_at is None:
            threshold = float(self.tree.cap_threshold_w[rack])
            if self.rack_power_w(rack, self.reported_w) > threshold:
                push.visible_at = self._clock_now

    _clock_now = 0.0  # set by the runner before a batch of telemetry (monotonic)

    def _check_pushes(self, now: float) -> None:
        for rack, push in self._pushed.items():
            threshold = float(self.tree.cap_threshold_w[rack])
            if push.back_at is None and push.visible_at is not None:
                push.back_at = now if self.rack_real_w(rack) <= threshold else None

    def _ack(
        self,
        node: int,
        epoch: int,
        seq: int,
        result: AckResult,
        gpus: list[GpuAck],
        error: str | None,
        wall: float,
    ) -> bytes:
        self.counters.acks[result] = self.counters.acks.get(result, 0) + 1
        errors = [AckError(index=None, message=error)] if error else []
        return encode(rules.make_ack(self.names[node], epoch, seq, wall, result, gpus, errors))

    def _template(self, node: int) -> str:
        """The node's telemetry JSON with %-placeholders for what changes."""
        name = self.names[node]
        start, count = int(self.gpu_start[node]), int(self.gpu_count[node])
        gpus = []
        for k in range(count):
            g = start + k
            gpus.append(
                '{"index":%d,"uuid":"GPU-%s-%d",' % (k, name, k)  # noqa: UP031
                + '"power_w":%.1f,"energy_j":%.1f,"cap_w":%.1f,'
                + f'"cap_min_w":{self.cap_min_w[g]:.1f},"cap_max_w":{self.cap_max_w[g]:.1f},'
                + '"sm_clock_mhz":%d,"max_sm_clock_mhz":%s,"util_pct":%.1f,'
                + '"temp_c":60.0,"power_reading":"simulated"'
                + ("%s}" if self.smoothing.presets[g] is not None else "}")
            )
        return (
            '{"v":1,"node":"'
            + name
            + '","ts":%.3f,"seq":%d,"mode":"%s","gpus":['
            + ",".join(gpus)
            + '],"epoch":%s}'
        )


def _ranges(low: np.ndarray, high: np.ndarray, make: Callable[[float, float], R]) -> list[R]:
    """One range per GPU from its bounds; equal bounds share one object."""
    made: dict[tuple[float, float], R] = {}
    return [
        made.get(key) or made.setdefault(key, make(*key))
        for key in zip(low.tolist(), high.tolist(), strict=True)
    ]
