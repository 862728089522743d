"""Thousands of agents as arrays: what ``powerd fleet`` simulates, with no I/O.

One :class:`FleetModel` stands for every node of a budgets file (or the first
N): GPUs with a demand, a cap and a clock lock, nodes with a telemetry
sequence number, a mode and the last command applied. It answers the same
messages the way ``powerd.agent.core.AgentCore`` does, in bulk:

- **Telemetry**: one protocol-valid ``Telemetry`` payload per node (what an
  agent publishes each period), power = ``min(demand, cap)``, scaled down
  under a clock lock; the newest controller epoch it has seen.
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
  holds them: every applied command replaces each of its node's GPUs' policy, the
  ack reads it back (its clock clamped into the device's range); the job's own
  announcements (``on_phase``; the fleet's jobs' through ``phase_events``) lock
  its GPUs' clocks in ``communication`` and unlock them in any other phase;
  failsafe and a newer controller epoch end every policy. So the controller
  leaves those clocks to the jobs, as it does with real agents, and sends no
  command at a phase change for them.

Not simulated: the agents' command TTL (refreshed by every live heartbeat,
so it only matters when heartbeats stop, which failsafe covers already); the
broker's hop for the fleet's own announcements (its agents hear them at once);
software smoothing (``agent.software_smoothing``: its GPUs report no smoothing); and
per-GPU workload curves (``powerd.gpu.simulated`` has those, at ~100 times
the cost per sample). ``tests/fleet/test_fleet_conformance.py`` holds the
simulated answers to a real ``AgentCore``'s on the same messages.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field

import numpy as np
from msgspec import UNSET

from policies.tree import RACK
from powerd.agent.controls import FAILSAFE_RAISE_SHARE, profile_of, smoothing_wire
from powerd.agent.following import Following
from powerd.agent.phase_clock import LOCKING_PHASE
from powerd.clock_skew import DEFAULT_MAX_CLOCK_SKEW_S
from powerd.gpu.base import SmoothingProfile, SmoothingRange, smoothed_draw
from powerd.gpu.clock_table import ClockTable
from powerd.gpu.errors import GpuValueError
from powerd.gpu.models import GPU_MODELS
from powerd.gpu.simulated import (
    SMOOTHING_FLOOR_MAX_PERCENT,
    SMOOTHING_FLOOR_MIN_PERCENT,
    SMOOTHING_PRESETS,
    default_smoothing_preset,
)
from powerd.gpu.workload_model import lock_response
from powerd.protocol import (
    SMOOTHING_STATE_EVERY_SAMPLES,
    Ack,
    AckError,
    Command,
    CommClock,
    GpuAck,
    GpuCommand,
    GpuSmoothing,
    Heartbeat,
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
from powerd.vocabulary import PRIORITIES, PROTOCOL_VERSION

log = logging.getLogger("powerd.fleet")

# Under a clock lock at a fraction s of the maximum clock, a GPU model without a clock
# table draws this share of what it would draw unlocked: P ~ p_static + p_dyn * s^2.5
# (powerd.gpu.workload_model); a model with one draws its table's power_rel at the lock,
# as the simulated GPU does (powerd.gpu.workload_model.lock_response).
_STATIC_SHARE = 0.3
_CLOCK_EXPONENT = 2.5


def locked_power_share(model: str, lock_mhz: float, table: ClockTable | None) -> float:
    """The share of its unlocked draw a GPU of ``model`` draws at ``lock_mhz``, by its clock
    ``table`` (``Topology.clock_table``) where it has one."""
    if table is not None:
        return min(1.0, lock_response(table, lock_mhz)[1])
    share = min(1.0, lock_mhz / GPU_MODELS[model].sm_clock_max_mhz)
    return _STATIC_SHARE + (1 - _STATIC_SHARE) * share**_CLOCK_EXPONENT


COMM_LOAD = 0.35  # a GPU waiting on a collective draws this share of its compute demand
STARTUP_S = 2.0  # a job announces startup, then compute this much later


@dataclass
class Job:
    name: str
    nodes: list[int]
    priority: str
    phase: str = "startup"
    next_at: float = 0.0  # monotonic time of its next phase change


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
        self._clock_min = self.clock_min_mhz.tolist()
        self._clock_max = self.clock_max_mhz.tolist()
        self._model = np.repeat([m.key for m in models], self.gpu_count).tolist()
        self._lock_share: dict[tuple[str, int], float] = {}  # (model, lock): a few entries
        self._cap_min = self.cap_min_w.tolist()
        self._cap_max = self.cap_max_w.tolist()
        self._first_gpu: list[int] = self.gpu_start.tolist()
        self._n_gpus: list[int] = self.gpu_count.tolist()
        self.failsafe = True
        self.seq = [0] * n_nodes
        self.last_applied: list[tuple[int, int]] = [(-1, -1)] * n_nodes
        # whom the agents follow, and whether it lives: as agents do (powerd.agent.following)
        self.following = self._following(-math.inf)
        self.heartbeat_deadline = -math.inf
        self.failsafe_raise_at: float | None = None  # failsafe: the caps below rise then
        pick = self._rng.permutation(n_nodes)
        n_silent = round(options.silent_fraction * n_nodes)
        n_offline = round(options.offline_fraction * n_nodes)
        self.silent = np.zeros(n_nodes, dtype=bool)
        self.silent[pick[:n_silent]] = True
        self.offline = np.zeros(n_nodes, dtype=bool)
        self.offline[pick[n_silent : n_silent + n_offline]] = True
        # racks: the tree node each GPU sits under, and the watts under it that are not GPUs
        self.gpu_rack = tree.gpu_ancestor[RACK][:n_gpus]
        self.racks = np.unique(self.gpu_rack)
        self._rack_overhead_w = self._rack_overheads()
        order = np.argsort(self.gpu_rack, kind="stable")
        bounds = np.searchsorted(self.gpu_rack[order], self.racks)
        self._rack_gpus = {
            int(r): order[a:b].tolist()
            for r, a, b in zip(self.racks, bounds, [*bounds[1:], self.n_gpus], strict=True)
        }
        # Hardware power smoothing, on the models that have it (GB200), as the simulated GPU
        # offers it: SMOOTHING_PRESETS presets a GPU, one active, and the switch. None: a
        # GPU without it. Presets are tuples shared until a GPU's are written.
        fresh = tuple(default_smoothing_preset(i) for i in range(SMOOTHING_PRESETS))
        has = np.repeat([m.has_power_smoothing for m in models], self.gpu_count).tolist()
        self._presets: list[tuple[SmoothingProfile, ...] | None] = [
            fresh if h else None for h in has
        ]
        self._smooth_preset: list[int] = [0] * n_gpus
        self._falling_s: list[float] = [0.0] * n_gpus  # how long each has wanted to fall
        # per GPU, for the hot loop: the active profile's (floor share of the cap, ramp up
        # W/s, ramp down W/s, hysteresis s) while the switch is on, None while it is off (the
        # switch itself); telemetry's state
        self._smooth_ramps: list[tuple[float, float, float, float] | None] = [None] * n_gpus
        self._smooth_json: dict[tuple[bool, int, float], str] = {}
        self._smooth_state: list[str | None] = [
            None if h is None else self._state_json(False, 0, h[0].floor_percent)
            for h in self._presets
        ]
        # what each GPU's telemetry last carried, and how many samples ago (an agent sends a
        # state when it changes and every SMOOTHING_STATE_EVERY_SAMPLES samples)
        self._smooth_sent: list[str | None] = [None] * n_gpus
        self._smooth_since: list[int] = [0] * n_gpus
        self.smoothing_gpus = sum(has)
        self.reported_w = list(self.power_w)  # what the last telemetry of each GPU said
        self.pushes: list[Push] = []
        self._pushed: dict[int, Push] = {}  # rack -> its open push
        self.counters = FleetCounters()
        self._templates = [self._template(i) for i in range(n_nodes)]
        self.jobs = self._split_into_jobs(options.jobs)

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
        its GPUs draw what they want this period under their caps and clock locks.

        The simulator's hot loop (every node, every period): plain lists and locals."""
        self.seq[node] += 1
        start = self._first_gpu[node]
        values: list[object] = [ts, self.seq[node], "failsafe" if self.failsafe else "controlled"]
        want, cap_w, lock_mhz, energy = self._want, self.cap_w, self.lock_mhz, self.energy_j
        clock_max, cap_max, power_w = self._clock_max, self._cap_max, self.power_w
        model, lock_share = self._model, self._lock_share
        ramps, states, falling = self._smooth_ramps, self._smooth_state, self._falling_s
        sent, since, every = self._smooth_sent, self._smooth_since, SMOOTHING_STATE_EVERY_SAMPLES
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
            if power > cap:
                power = cap
            elif power < 0.0:
                power = 0.0
            ramp = ramps[g]
            if ramp is not None:  # smoothing on: as powerd.gpu.simulated moves the draw
                floor_share, up_w_per_s, down_w_per_s, hysteresis_s = ramp
                target = max(power, cap * floor_share)  # every fleet GPU runs a job
                power, falling[g] = smoothed_draw(
                    power_w[g], target, cap, up_w_per_s, down_w_per_s, hysteresis_s,
                    falling[g], dt_s,
                )  # fmt: skip
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
            self._smooth_sent = [None] * self.n_gpus
            if previous >= 0:
                self._end_policies(release=True)
            self.last_applied = [  # a deposed epoch followed: its order starts afresh
                (beat.epoch, -1) if beat.epoch < last[0] else last for last in self.last_applied
            ]
        if taken.verdict != "live":
            return False
        if taken.floor is not None:
            self.last_applied = [max(last, taken.floor) for last in self.last_applied]
        self.heartbeat_ts = beat.ts
        self.heartbeat_deadline = max(self.heartbeat_deadline, now + self.options.failsafe_after_s)
        self.failsafe = False
        self.failsafe_raise_at = None
        return True

    def tick(self, now: float) -> bool:
        """Deadlines: True if the fleet has just entered failsafe. As agents do
        (``AgentCore.enter_failsafe``): caps above the failsafe cap come down at once, those
        below rise ``FAILSAFE_RAISE_SHARE`` of ``failsafe_after_s`` later."""
        if self.failsafe and self.failsafe_raise_at is not None and now >= self.failsafe_raise_at:
            self.failsafe_raise_at = None
            self.cap_w[:] = self.failsafe_cap_w.tolist()
        if self.failsafe or now <= self.heartbeat_deadline:
            return False
        self.failsafe = True
        self.counters.failsafe_entries += 1
        held = np.asarray(self.cap_w, dtype=float)
        below = held < self.failsafe_cap_w - 0.5
        self.cap_w[:] = np.where(below, held, self.failsafe_cap_w).tolist()
        self.failsafe_raise_at = (
            now + FAILSAFE_RAISE_SHARE * self.options.failsafe_after_s if below.any() else None
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
        if self.failsafe or now > self.heartbeat_deadline:
            why = "no live controller heartbeat: agent is in failsafe"
            return self._ack(node, command.epoch, command.seq, "rejected", [], why, wall)
        order = (command.epoch, command.seq)
        if command.epoch < self.newest_epoch or order <= self.last_applied[node]:
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
                cap = min(max(entry.cap_w, self._cap_min[g]), self._cap_max[g])
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
                clamped |= self._set_smoothing(g, entry.index, entry.smoothing, errors)
                active = self._active_smoothing(g)
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
        result = "partial" if errors else "applied"
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
                if new is None or old is None or (new.job, new.owner) != old[:2]:
                    self._phase_locked[g] = False
                    self.lock_mhz[g] = None
                else:
                    self.lock_mhz[g] = clock
            if new is None or clock is None:
                self.policy[g] = None
            else:
                self.policy[g] = (new.job, new.owner, clock)
                held[k] = CommClock(job=new.job, owner=new.owner, max_sm_clock_mhz=float(clock))
        return held

    def _clamp_clock(self, g: int, clock_mhz: float) -> int:
        """A lock as GPU ``g`` takes it: rounded, into the device's range."""
        return int(min(max(round(clock_mhz), self._clock_min[g]), self._clock_max[g]))

    def on_phase(self, job: str, owner: str | None, phase: str, now: float) -> int:
        """A job's announcement, heard by every node: the GPUs whose policy names the job
        lock their clocks in ``communication`` and unlock them in any other phase
        (``powerd.agent.phase_clock``); how many GPUs it moved. Nothing while in failsafe."""
        if self.failsafe or now > self.heartbeat_deadline:
            return 0
        moved = 0
        lock = phase == LOCKING_PHASE
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
        ramps, drawn = self._smooth_ramps, self.power_w  # smoothing on: as it ramped, sampled
        real = sum(
            min(self.demand_w[g] if ramps[g] is None else drawn[g], self.cap_w[g]) for g in gpus
        )
        return float(real) + self._rack_overhead_w[rack]

    # --- jobs -----------------------------------------------------------------------------

    def _split_into_jobs(self, count: int) -> list[Job]:
        """``count`` jobs of whole racks (the reporting nodes of consecutive racks)."""
        if count <= 0:
            return []
        reporting = set(self.reporting().tolist())
        by_rack: dict[int, list[int]] = {}
        for node in range(len(self.names)):
            if node in reporting:
                by_rack.setdefault(int(self.gpu_rack[self._first_gpu[node]]), []).append(node)
        racks = list(by_rack.values())
        count = min(count, len(racks))
        return [
            Job(
                name=f"{self.options.job_prefix}-job{k:03d}",
                nodes=[n for rack in racks[k::count] for n in rack],
                priority=self.options.job_priority or PRIORITIES[k % len(PRIORITIES)],
            )
            for k in range(count)
        ]

    def phase_events(self, now: float, wall: float) -> list[tuple[str, bytes]]:
        """The phase announcements due now, as (job, payload); demand follows the phase."""
        out = []
        for job in self.jobs:
            if now < job.next_at:
                continue
            if job.next_at == 0.0:  # first call: startup, with the node list
                phase, last_for = "startup", STARTUP_S
            elif job.phase in ("startup", "communication"):
                phase, last_for = "compute", self.options.compute_s
            else:
                phase, last_for = "communication", self.options.communication_s
            job.phase, job.next_at = phase, now + last_for
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
                phase=phase,  # type: ignore[arg-type]
                priority=job.priority,  # type: ignore[arg-type]
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

    _SMOOTHING_RANGE = SmoothingRange(
        SMOOTHING_FLOOR_MIN_PERCENT, SMOOTHING_FLOOR_MAX_PERCENT, SMOOTHING_PRESETS
    )

    def smoothing_on(self) -> int:
        """How many GPUs have power smoothing switched on now."""
        return sum(r is not None for r in self._smooth_ramps)

    def _active_smoothing(self, g: int) -> SmoothingProfile | None:
        """What the agent's ``Gpu.smoothing()`` reads back: the active preset, with the switch;
        None on a GPU without smoothing."""
        presets = self._presets[g]
        if presets is None:
            return None
        active = presets[self._smooth_preset[g]]  # written with the switch off
        return active if self._smooth_ramps[g] is None else _with_switch(active, True)

    def _set_smoothing(self, g: int, index: int, wire: GpuSmoothing, errors: list[str]) -> bool:
        """A command's profile for GPU ``g``, as ``powerd.agent.controls.set_smoothing`` and the
        simulated GPU take it: the floor clamped into the device's range, the preset written
        and activated, the switch set. Returns whether the floor was clamped."""
        presets = self._presets[g]
        if presets is None:
            model = self._model[g]
            errors.append(
                f"GPU {index}: power smoothing not supported on this GPU: "
                f"{model} has no power smoothing"
            )
            return False
        try:
            wanted = profile_of(wire)
        except GpuValueError as exc:
            errors.append(f"GPU {index}: power smoothing: {exc}")
            return False
        target = self._SMOOTHING_RANGE.clamp(wanted)
        problems = self._SMOOTHING_RANGE.problems(target)
        if problems:  # a preset beyond the device's: refused, nothing written
            errors.append(f"GPU {index}: power smoothing: {'; '.join(problems)}")
            return False
        active = self._active_smoothing(g)
        assert active is not None  # the GPU has presets
        if not active.close_to(target):
            written = _with_switch(target, False)
            self._presets[g] = (*presets[: target.preset], written, *presets[target.preset + 1 :])
            self._smooth_preset[g] = target.preset
            self._falling_s[g] = 0.0
            self._smooth_ramps[g] = (
                (
                    target.floor_percent / 100.0,
                    target.ramp_up_w_per_s,
                    target.ramp_down_w_per_s,
                    target.ramp_down_hysteresis_ms / 1000.0,
                )
                if target.enabled
                else None
            )
            self._smooth_state[g] = self._state_json(
                target.enabled, target.preset, target.floor_percent
            )
        return target.floor_percent != wanted.floor_percent

    def _state_json(self, enabled: bool, preset: int, floor_percent: float) -> str:
        """Telemetry's ``smoothing`` (switch, active preset, floor) as the JSON member that
        carries it; one string for each distinct state, shared by every GPU in it."""
        key = (enabled, preset, floor_percent)
        state = self._smooth_json.get(key)
        if state is None:
            state = self._smooth_json[key] = (
                ',"smoothing":{"enabled":%s,"preset":%d,"floor_percent":%s}'  # noqa: UP031
                % ("true" if enabled else "false", preset, repr(float(floor_percent)))
            )
        return state

    # --- internals --------------------------------------------------------------------------

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
        result: str,
        gpus: list[GpuAck],
        error: str | None,
        wall: float,
    ) -> bytes:
        self.counters.acks[result] = self.counters.acks.get(result, 0) + 1
        errors = [AckError(index=None, message=error)] if error else []
        return encode(
            Ack(
                v=PROTOCOL_VERSION,
                node=self.names[node],
                epoch=epoch,
                seq=seq,
                ts=wall,
                result=result,  # type: ignore[arg-type]
                gpus=gpus,
                errors=errors,
            )
        )

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
                + ("%s}" if self._presets[g] is not None else "}")
            )
        return (
            '{"v":1,"node":"'
            + name
            + '","ts":%.3f,"seq":%d,"mode":"%s","gpus":['
            + ",".join(gpus)
            + '],"epoch":%s}'
        )


def _with_switch(profile: SmoothingProfile, enabled: bool) -> SmoothingProfile:
    return dataclasses.replace(profile, enabled=enabled)
