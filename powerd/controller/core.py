"""The controller's bookkeeping and decisions, with no I/O: a clock-injected state machine.

It turns protocol messages into the arrays ``policies.decide`` takes, and the
decision into per-node commands: sent only when a node's caps or clock locks
change, resent when not acknowledged in time. A node that is silent (no
telemetry for ``stale_after_s``) or offline is counted at its failsafe power
and is not commanded: by construction it holds that cap on its own.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from policies import ClusterState, Decision, PolicySettings, Tree, infer_phases
from policies.allocation import caps_at_draw_w
from policies.capping import WAITING_PHASES
from policies.smoothing import with_cut_fall
from policies.tree import PHASE_CODES, PRIORITY_CODES
from policies.turns import (
    CAP_TOLERANCE_W,
    MAX_RAISES_PER_S,
    Turns,
    decide_in_turn,
    serve_raises,
)
from powerd.clock_skew import DEFAULT_MAX_CLOCK_SKEW_S
from powerd.controller.inbox import Waiting
from powerd.controller.ingest_health import IngestHealth
from powerd.controller.job_limits import AnnouncementGate, JobLimits
from powerd.controller.node_clocks import NodeClocks, node_clocks
from powerd.hostlist import MAX_HOSTS, SiteNames
from powerd.protocol import (
    Ack,
    Command,
    CommClock,
    GpuCommand,
    GpuSmoothing,
    GpuSmoothingState,
    PhaseEvent,
    ProtocolError,
    Status,
    Telemetry,
    decode,
)
from powerd.ratelimit import LogOncePer
from powerd.vocabulary import PHASES, PRIORITIES, PROTOCOL_VERSION

# A reported failsafe cap this far above the plan's is a disagreement (rounding is not).
FAILSAFE_TOLERANCE_W = 1.0

log = logging.getLogger("powerd.controller")
_M = TypeVar("_M", Telemetry, Status, Ack)

# Above its capping threshold, a tree node whose power rose by this share of its budget
# since the last cycle brings the next decision forward (crossed_threshold).
RISE_FRACTION = 0.01
# A node found holding other caps than commanded is commanded again at most this often.
DRIFT_RETRY_S = 10.0
# Caps a node reads back in a sample taken less than this after its ack may be the old ones: a
# GPU enforces a new power limit ~0.1 s after it is set (an H200 on driver 580: up to 92 ms,
# docs/HARDWARE.md). Such a sample's power counts; its caps are neither taken nor drift.
CAP_SETTLE_S = 0.5
# A jump in an agent's telemetry seq larger than this is a restart (or nonsense), not a loss.
MAX_SEQ_GAP = 3600
# Plausibility of a node's telemetry (issue 12). A node whose telemetry says what a GPU
# cannot do is treated as a node the controller cannot hear: counted at its caps (at
# least its failsafe caps), never commanded, so never handed watts back on its word.
POWER_OVER_CAP_RATIO = 1.15  # power may exceed the cap by this share (limiter lag, noise)
POWER_OVER_CAP_W = 25.0  # and by this many watts
# ... and by more while a load steps up: a GPU's limiter lets the first ~0.1-0.2 s through (an
# H200 read 911 W under its 700 W limit, and 648 W under 476 W, docs/HARDWARE.md). So a draw
# over that bound is doubted once it has lasted this long (by the controller's clock: a
# sample's own ts could be held still), and at once only beyond this multiple of the model's
# maximum cap, which no GPU draws.
POWER_OVER_CAP_FOR_S = 1.0
POWER_ABSURD_RATIO = 2.0
RANGE_TOLERANCE_W = 1.0  # a cap outside [cap_min, cap_max], or a range not the model's
SEQ_RESTART_MAX = 16  # seq back to this or below is an agent that restarted, not a replay
PLAUSIBLE_TO_CLEAR = 5  # consecutive plausible samples before a node is believed again
# A command still not acknowledged ack_timeout_s after it was sent is resent; each resend
# since the node's last ack doubles that wait, up to 2**this times: agents (or a broker) that
# are slow to answer are not sent every command again each ack_timeout_s
RESEND_MAX_DOUBLINGS = 3
# While nodes are handed watts back in turn, a raise smaller than this share of a GPU's range
# (20 W on a 200-1200 W GB200) is not sent, unless it is the last to its maximum: it is what
# is left of a breaker's room shared out (the site's last 100 kW to 82,944 GPUs, 20 W a
# command), and the nodes keep their caps, which is safe
RAISE_WORTH_FRACTION = 0.02
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
    # commands that only hand watts back, per cycle (cuts, clock changes, resends: all)
    max_raises_per_cycle: int = round(MAX_RAISES_PER_S)  # at the default 1 s cycle
    policy: PolicySettings = field(default_factory=PolicySettings)
    # A node sending telemetry faster than twice its reported rate (status period_s), or,
    # before it reported one, faster than this (Hz; agents' fastest period is 0.05 s), is
    # not believed: two senders share its login, or its agent is broken.
    telemetry_max_hz: float = 20.0
    # The site's agents' telemetry period (their agent.period_s, the fastest of them): a
    # node is judged against this, however fast its status says it sends; None: against
    # its status (at most telemetry_max_hz).
    telemetry_period_s: float | None = None
    # A node's clock more than this off the controller's (either way) is logged and counted
    # (nodes_skewed): its agent would refuse our heartbeats as from the future.
    max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S
    # What job announcements may cost (announcement rates, jobs kept, their expiry).
    jobs: JobLimits = field(default_factory=JobLimits)
    # Jobs (issue 12): the highest priority each owner may announce (owners not listed:
    # default_job_priority_max; "high" allows any), and whether jobs announced on the
    # unowned topic (jobs/{job}/phase, no login bound to them) are taken at all.
    job_priority_max: dict[str, str] = field(default_factory=dict)
    default_job_priority_max: str = "high"
    accept_unowned_jobs: bool = True
    # A leaf of a tree of controllers (a scope of the budgets file): jobs may name nodes of
    # other scopes, which are not ours to warn about.
    scoped: bool = False
    # Grid power smoothing (issue 14): the profile every GPU that reports hardware smoothing
    # is asked to hold (powerd.controller.smoothing); None: smoothing is left as it is.
    smoothing: GpuSmoothing | None = None
    # Clock policies (issue 16): the GPUs of a job whose announcements are live are granted
    # its comm clock in their commands (``CommClock``), and their agents lock and unlock them
    # on the job's own announcements, at once; the controller's own comm locks are for the
    # rest. Live: the job announced something within ``announced_live_s``; after that its
    # phases are inferred from power again, and the controller locks its clocks itself.
    agent_comm_clock: bool = True
    announced_live_s: float = 120.0

    def job_priority_allowed(self, owner: str | None, priority: str) -> bool:
        allowed = self.job_priority_max.get(owner or "", self.default_job_priority_max)
        return PRIORITIES.index(priority) >= PRIORITIES.index(allowed)


@dataclass
class Job:
    name: str
    nodes: list[str]
    priority: str
    phase: str  # as announced
    since_mono: float
    announces_waits: bool = False  # it has announced communication or checkpoint itself
    owner: str | None = None  # the login whose topic announced it first; None: unowned
    inferred_phase: str | None = None  # from power, for jobs that do not announce waits
    # when its phase last changed (a repeat of the same phase keeps it), and how long the
    # wait it left then lasted (0: it left no wait): policies.ClusterState's phase times
    phase_since_mono: float = math.nan
    wait_before_s: float = 0.0
    expected_s: float = math.nan  # how long it said its phase would last (NaN: not said)

    def enter(self, phase: str, now: float) -> None:
        """Take ``phase`` as announced at ``now``: a change starts its time, and one out of a
        wait into work remembers how long the wait lasted."""
        if phase == self.phase and not math.isnan(self.phase_since_mono):
            return
        left_wait = self.phase in WAITING_PHASES and phase not in WAITING_PHASES
        self.wait_before_s = now - self.phase_since_mono if left_wait else 0.0
        self.phase, self.phase_since_mono = phase, now

    @property
    def effective_phase(self) -> str:
        return self.inferred_phase or self.phase


@dataclass
class CycleCounters:
    commands_sent: int = 0
    resends: int = 0
    acks_received: int = 0
    acks_missing: int = 0
    acks_stale: int = 0  # our newest command acked stale: not applied, asked again
    # commands sent while the node's previous one was still unacknowledged (and not yet
    # overdue): the newer one replaces it, and the older one's ack, when it comes, is ignored
    superseded: int = 0
    stale_nodes: int = 0
    failsafe_nodes: int = 0
    offline_nodes: int = 0
    rejected_payloads: int = 0
    # telemetry (docs/CONTROLLER.md, "Scale"): received into the inbox, replaced there by a
    # newer sample before it was decoded (dropped), missing from agents' sequence numbers
    # (lost: never reached the controller), and nodes still waiting to be decoded
    telemetry_received: int = 0
    telemetry_dropped: int = 0
    telemetry_lost: int = 0
    telemetry_waiting: int = 0
    ingest_s: float = 0.0  # CPU time spent decoding telemetry since the last cycle
    # nodes whose raise (watts handed back) or clock lock waits for a later cycle
    # (max_raises_per_cycle, less the commands in flight)
    raises_deferred: int = 0
    # commands sent and not yet answered (nor overdue) when the cycle decided
    commands_in_flight: int = 0
    # acks of a node's newest command that came after the node went stale (its pending
    # command dropped): taken, so what it holds is known when it is back
    acks_late: int = 0
    # nodes holding caps below their maximum whose turn to be handed watts back is a later
    # cycle (``ControllerCore._uncap_in_turn``)
    uncap_waiting: int = 0
    # nodes under a node over its capping threshold (not its limit) whose turn to be cut
    # for it is a later cycle (``ControllerCore._cut_in_turn``)
    cut_waiting: int = 0
    # nodes found holding other caps or clock locks than commanded (commanded again)
    nodes_drifted: int = 0
    # nodes whose agents hold a failsafe cap above the budgets file's: the limits were
    # proven for the file's caps, so such a node is counted at its own when silent
    failsafe_over_plan: int = 0
    # nodes whose telemetry is implausible (seq going back, power above cap, caps outside
    # their range): counted at their caps, not commanded (POWER_OVER_CAP_RATIO ...)
    nodes_implausible: int = 0
    # GPUs whose clock lock follows their job's own announcements (a clock policy in force)
    clock_policy_gpus: int = 0
    # hostile or broken input, dropped unread since the last cycle (docs/CONTROLLER.md,
    # "Inputs"): telemetry frames over the stream's MAX_FRAME_BYTES; retained telemetry
    # and phase messages (no agent or job hook retains them); telemetry decoded no faster
    # than the site's telemetry period allows (a node flooding); phase announcements over
    # JobLimits' rates; new jobs beyond its bounds; announcements naming nodes another
    # owner's live job holds; and jobs forgotten, silent for JobLimits.expiry_s
    telemetry_oversized: int = 0
    telemetry_retained: int = 0
    telemetry_over_rate: int = 0
    phases_retained: int = 0
    phases_rate_limited: int = 0
    jobs_refused: int = 0
    job_claims_refused: int = 0
    jobs_expired: int = 0
    jobs_live: int = 0  # jobs kept, at the decision

    @property
    def inputs_refused(self) -> int:
        """Every message dropped for its size, retain flag or rate, or refused a claim."""
        return (
            self.telemetry_oversized
            + self.telemetry_retained
            + self.telemetry_over_rate
            + self.phases_retained
            + self.phases_rate_limited
            + self.jobs_refused
            + self.job_claims_refused
        )


@dataclass(frozen=True)
class ClockPolicies:
    """One cycle's clock policies. ``job``: per server, the (job, owner) whose announcements
    its GPUs follow, as its ``_policy_key`` (-1: none). Per GPU: ``granted`` (the command
    carries the policy), ``clock_mhz`` (its clock; NaN: none), ``changed`` (granted, ended
    or moved since the last command: that command says the controller's own clock),
    ``follows`` (in force, and the job's phase is announced, not inferred, in an
    announcement received after the agent acked the policy, so the agent heard it too:
    the controller leaves the clock alone)."""

    job: np.ndarray
    granted: np.ndarray
    clock_mhz: np.ndarray
    changed: np.ndarray
    follows: np.ndarray


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise equal, NaN equal to NaN (no lock, no policy)."""
    return (np.isnan(a) & np.isnan(b)) | (a == b)


@dataclass
class CycleResult:
    decision: Decision
    commands: list[tuple[str, Command]]
    counters: CycleCounters
    cycle_s: float
    state: ClusterState | None = None  # what the decision was taken on


class ControllerCore:
    def __init__(
        self,
        tree: Tree,
        settings: ControllerSettings,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.tree = tree
        self.settings = settings
        self._monotonic = monotonic
        self._wall = wall
        n_gpus, n_servers = tree.n_gpus, tree.n_servers
        # what a node that cannot be heard falls back to: the plan's failsafe caps, or the
        # agent's own where its status reports a higher one (FAILSAFE_TOLERANCE_W)
        self.failsafe_cap_w = tree.failsafe_cap_w.astype(float).copy()
        self.failsafe_over_plan = np.zeros(tree.n_servers, dtype=bool)
        self.period_s = np.full(tree.n_servers, np.inf)  # as each agent's status says; inf: unknown
        # telemetry that says what no GPU can do: per node, since when, and how often
        self.implausible = np.zeros(tree.n_servers, dtype=bool)
        self.implausible_samples = np.zeros(tree.n_servers, dtype=np.int64)
        # over its allowed telemetry rate at the last check: not believed again until not
        self._over_rate = np.zeros(tree.n_servers, dtype=bool)
        # with a site telemetry period: per node, the least time between two samples
        # decoded (a quarter of the period; 0: none), when the last was received, and how
        # many were dropped since (not lost: telemetry_over_rate)
        self._min_gap_s = [0.0] * tree.n_servers
        self._decoded_at = [-math.inf] * tree.n_servers
        self._rate_skipped = [0] * tree.n_servers
        self._plausible_streak = [0] * tree.n_servers
        self._gpu_cap_min = tree.cap_min_w.tolist()  # lists: read per message, per GPU
        self._gpu_cap_max = tree.cap_max_w.tolist()
        # per GPU, when (monotonic) its draw went over the plausibility bound; NaN: it is not
        self._over_cap_since = [math.nan] * n_gpus
        self.power_w = tree.failsafe_cap_w.astype(float).copy()
        self.cap_w = tree.failsafe_cap_w.astype(float).copy()  # read back from the devices
        self.clock_mhz = np.full(n_gpus, np.nan)  # locks in force, read back
        self.last_seen = np.full(n_servers, -math.inf)  # monotonic receipt of last telemetry
        self._last_seq = [-1] * n_servers  # each agent's last telemetry seq (any size)
        self.mode = np.full(n_servers, "unknown", dtype="<U10")  # as each node last reported
        self.offline = np.zeros(n_servers, dtype=bool)
        self.jobs: dict[str, Job] = {}
        self._owner_jobs: collections.Counter[str | None] = collections.Counter()
        self._gate = AnnouncementGate(settings.jobs)
        self._site_names = SiteNames(tree.server_names)  # what a host list expands against
        self._job_server_index: dict[str, tuple[list[str], np.ndarray]] = {}  # _servers_of
        self.server_job: list[str | None] = [None] * n_servers  # the job each server runs
        # what we asked of each server and whether it was acknowledged
        self.commanded_cap_w = np.full(n_gpus, np.nan)
        self.commanded_clock = np.full(n_gpus, np.nan)
        self.pending: dict[int, tuple[int, float]] = {}  # server -> (seq, sent at)
        # Grid smoothing, per GPU: it reports hardware smoothing; the seq of the command
        # that carried our profile (-1: not sent since we last knew what it holds); it
        # refused the profile (not asked again under this epoch).
        self.smoothing_capable = np.zeros(n_gpus, dtype=bool)
        self.smoothing_sent_seq = np.full(n_gpus, -1, dtype=np.int64)
        self.smoothing_refused = np.zeros(n_gpus, dtype=bool)
        # the smoothing state each GPU's telemetry last carried (telemetry carries it when it
        # changes and every SMOOTHING_STATE_EVERY_SAMPLES samples): for the records
        self.smoothing_last: list[GpuSmoothingState | None] = [None] * n_gpus
        # Clock policies, per server the (job, owner) and per GPU the clock of the policy the
        # last command carried (NaN: none); the seq of that command; the GPU's agent did not
        # take one (an older agent: its clock is locked by the controller, under this epoch).
        self.comm_clock_job = np.full(n_servers, -1, dtype=np.int64)  # a _policy_key index
        self._policy_keys: dict[tuple[str, str | None], int] = {}  # (job, owner) -> index
        self._policy_key_list: list[tuple[str, str | None]] = []
        self.comm_clock_sent_mhz = np.full(n_gpus, np.nan)
        self.comm_clock_sent_seq = np.full(n_gpus, -1, dtype=np.int64)
        self.comm_clock_refused = np.zeros(n_gpus, dtype=bool)
        # when each server's agent acknowledged its policy (monotonic; inf: not yet). Agents
        # subscribe to the job's topic before they ack: an announcement received after this
        # reached the agent too, one received before may not have.
        self.comm_clock_acked = np.full(n_servers, math.inf)
        # servers we could not command since they were last commanded: what they hold is
        # read back from their telemetry when they are back (_track_holdings)
        self._returning = np.zeros(n_servers, dtype=bool)
        # the round robins of the turns nodes take (policies.turns): the racks interleaved a
        # row at a time, so a turn spreads over the rows, each with a ramp of its own
        self.turns = Turns.of(tree)
        # per server: the seq of its newest command, and of the newest it acknowledged
        self._sent_seq = np.full(n_servers, -1, dtype=np.int64)
        self._acked_seq = np.full(n_servers, -1, dtype=np.int64)
        # per server, commands resent since its last ack: each doubles the wait for the next
        self._resends_unacked = np.zeros(tree.n_servers, dtype=np.int64)
        # agent clock (ts) of each node's newest decoded telemetry and of its last ack of ours
        self._sample_ts = np.full(n_servers, -math.inf)
        self._acked_ts = np.full(n_servers, -math.inf)
        self._drift_retry_at = np.full(n_servers, -math.inf)  # monotonic
        # found holding other caps than commanded: commanded back to our decision, never
        # re-decided from what they hold (a replayed command must not become ours)
        self._drifted = np.zeros(n_servers, dtype=bool)
        self._clock_drifted = np.zeros(self.tree.n_gpus, dtype=bool)  # its clock, per GPU
        self._last_node_power_w: np.ndarray | None = None  # tree node power, last decision
        self._last_node_predicted_w: np.ndarray | None = None  # ... and what it will draw
        self.site_limit_w: float | None = None  # an operator's temporary site limit in force
        # clocks (the service's, recorded): messages refused as from the future, and the
        # largest skew measured of a peer controller (powerd.clock_skew)
        self.clock_alarms = 0
        self.peer_skew_s: float | None = None
        self.node_clocks = NodeClocks(None, None, 0)  # the nodes' skews, at the last cycle
        # safety by caps, after each cycle: where the site's caps in force could be without
        # moving any draw (policies.allocation.caps_at_draw_w), overheads included
        self.site_caps_at_draw_w: float | None = None
        self.epoch = 0
        self.seq = 0
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
        self._ingest_health = IngestHealth()  # judged over seconds, not one cycle

    # --- inputs ----------------------------------------------------------------

    def on_telemetry(self, node: str, payload: bytes) -> Telemetry | None:
        """Take in one telemetry message now; the decoded message, or None if it was refused."""
        server = self.server_of(node, "telemetry")
        if server is None:
            return None
        samples = self.ingest([Waiting(server, payload, self._monotonic(), 0)])
        return samples[0] if samples else None

    def ingest(self, batch: Sequence[Waiting]) -> list[Telemetry]:
        """Decode and take in telemetry payloads taken from the inbox; the valid ones, decoded.

        The controller's hottest path (docs/CONTROLLER.md, "Scale"): per message only
        the decode (every field validated, as everywhere) and list appends; the arrays
        are written once per batch. A payload the protocol refuses is counted and
        logged, and changes nothing. A node's ``last_seen`` is when its payload was
        received, not when it was decoded. Gaps in a node's ``seq`` that the inbox did
        not replace are counted as ``telemetry_lost``: samples that never reached us.
        """
        names, slices, last_seq = self.tree.server_names, self.tree.server_gpus, self._last_seq
        acked_ts = self._acked_ts
        gpu_ids: list[int] = []
        held_ids: list[int] = []
        power: list[float] = []
        cap: list[float] = []
        clock: list[float | None] = []
        servers: list[int] = []
        arrivals: list[float] = []
        sampled: list[float] = []
        modes: list[str] = []
        samples: list[Telemetry] = []
        smoothing_ids: list[int] = []  # GPUs that report smoothing, and whether it is ours
        smoothing_held: list[bool] = []
        wanted = self.settings.smoothing
        min_gap_s, decoded_at, skipped = self._min_gap_s, self._decoded_at, self._rate_skipped
        lost = over_rate = 0
        for server, payload, arrived, replaced in batch:
            node = names[server]
            if arrived - decoded_at[server] < min_gap_s[server]:
                over_rate += 1  # faster than the site's agents send: not even decoded
                skipped[server] += 1 + replaced
                continue
            decoded_at[server] = arrived
            replaced += skipped[server]
            skipped[server] = 0
            try:
                sample = decode(Telemetry, payload, node)
            except ProtocolError as exc:
                self._reject(node, exc)
                continue
            gpus = slices[server]
            start, n_gpus = gpus.start, len(gpus)
            # Caps read back in a sample taken before the node acked our last command are
            # older than the ack's (they come on another connection), and those of one taken
            # just after it may not be enforced yet (CAP_SETTLE_S): power only.
            current = sample.ts >= acked_ts[server] + CAP_SETTLE_S
            doubt = self._doubt(
                sample, start, n_gpus, last_seq[server], settled=current, arrived=arrived
            )
            if doubt is not None:
                self._disbelieve(server, node, doubt)
            elif self.implausible[server] and not self._over_rate[server]:
                self._plausible_streak[server] += 1
                if self._plausible_streak[server] >= PLAUSIBLE_TO_CLEAR:
                    self.implausible[server] = False
                    log.info("node %s: telemetry plausible again", node)
            for g in sample.gpus:
                if g.index >= n_gpus:
                    self._log.warning(
                        f"gpuidx-{node}",
                        self._monotonic(),
                        "node %s reports GPU %d; the budgets file gives it %d",
                        node,
                        g.index,
                        n_gpus,
                    )
                    continue
                gpu_ids.append(start + g.index)
                power.append(g.power_w)
                if g.smoothing is not None:  # arrays written once per batch, below
                    # Any sample says the GPU has smoothing (agents send the state only on
                    # change and every SMOOTHING_STATE_EVERY_SAMPLES samples: waiting for a
                    # current one could take many); only a current one says it lost ours.
                    self.smoothing_last[start + g.index] = g.smoothing
                    smoothing_ids.append(start + g.index)
                    smoothing_held.append(
                        not current
                        or (
                            wanted is not None
                            and g.smoothing.enabled == wanted.enabled
                            and g.smoothing.preset == wanted.preset
                        )
                    )
                if current:
                    held_ids.append(start + g.index)
                    cap.append(g.cap_w)
                    clock.append(g.max_sm_clock_mhz)
            previous = last_seq[server]
            gap = sample.seq - previous - 1
            if 0 < gap <= MAX_SEQ_GAP and previous >= 0:  # lower: the agent restarted
                lost += max(0, gap - replaced)
            last_seq[server] = sample.seq
            servers.append(server)
            arrivals.append(arrived)
            sampled.append(sample.ts)
            modes.append(sample.mode)
            samples.append(sample)
        if gpu_ids:
            self.power_w[gpu_ids] = power
        if smoothing_ids:
            self._smoothing_seen(smoothing_ids, smoothing_held)
        if held_ids:
            self.cap_w[held_ids] = cap
            self.clock_mhz[held_ids] = np.array(clock, dtype=float)  # None (no lock): NaN
        if servers:
            # a batch may hold one node twice only if fed by hand: the newest arrival wins
            self.last_seen[servers] = np.maximum(self.last_seen[servers], arrivals)
            self._sample_ts[servers] = sampled
            self.mode[servers] = modes
            self.offline[servers] = False
        self.counters.telemetry_lost += lost
        self.counters.telemetry_over_rate += over_rate
        return samples

    def _smoothing_seen(self, gpu_ids: list[int], holds_ours: list[bool]) -> None:
        """GPUs that report smoothing (hardware or software) can be asked for ours; one
        that no longer holds ours (its agent restarted and restored its own, say) and has
        no command of ours in flight is asked again."""
        ids = np.asarray(gpu_ids, dtype=np.intp)
        self.smoothing_capable[ids] = True
        lost = ids[~np.asarray(holds_ours, dtype=bool)]
        if self.settings.smoothing is None or not len(lost):
            return
        lost = lost[self.smoothing_sent_seq[lost] >= 0]
        in_flight = np.isin(self.tree.gpu_server_ordinal[lost], list(self.pending))
        self.smoothing_sent_seq[lost[~in_flight]] = -1

    def _refuse_phase(self, job: Job | None, owner: str | None, event: PhaseEvent) -> str | None:
        """Why this announcement may not change the job, or None."""
        who = "the unowned topic" if owner is None else f"owner {owner}"
        if owner is None and not self.settings.accept_unowned_jobs:
            return f"job {event.job} announced on the unowned topic, which is not accepted"
        if job is not None and job.owner != owner:
            return (
                f"job {event.job} belongs to "
                f"{'the unowned topic' if job.owner is None else 'owner ' + job.owner}; "
                f"{who} may not change it"
            )
        if not self.settings.job_priority_allowed(owner, event.priority):
            return f"{who} may not announce priority {event.priority} (job {event.job})"
        return None

    def allowed_hz(self) -> np.ndarray:
        """Per node, the telemetry rate it may send at: twice the rate its status reports
        (else ``telemetry_max_hz``), and never more than twice the site's agents'
        (``telemetry_period_s``), whatever its status says."""
        known = np.isfinite(self.period_s)
        allowed_hz = np.where(known, 2.0 / self.period_s, self.settings.telemetry_max_hz)
        site_period_s = self.settings.telemetry_period_s
        if site_period_s is not None:
            allowed_hz = np.minimum(allowed_hz, 2.0 / site_period_s)
        return allowed_hz

    def check_rates(self, received: np.ndarray, seconds: float) -> None:
        """``received``: telemetry per node over the last ``seconds`` (the inbox's count). A
        node over the rate it may send at (``allowed_hz``) is implausible, as a sample no
        GPU could send is, until it is back under it; with a site telemetry period, its
        samples are decoded at most at twice that rate meanwhile."""
        if seconds <= 0:
            return
        allowed_hz = self.allowed_hz()
        limit = allowed_hz * seconds + 2  # +2: samples early or late by a little are no rate
        self._over_rate = received > limit
        if self.settings.telemetry_period_s is not None:
            self._min_gap_s = (0.5 / allowed_hz).tolist()
        for server in np.flatnonzero(self._over_rate).tolist():
            node = self.tree.server_names[server]
            seen_hz = float(received[server]) / seconds
            self._disbelieve(
                server,
                node,
                f"{seen_hz:.1f} telemetry messages a second, allowed {allowed_hz[server]:g}",
            )

    def _doubt(
        self,
        sample: Telemetry,
        start: int,
        n_gpus: int,
        previous_seq: int,
        settled: bool,
        arrived: float,
    ) -> str | None:
        """Why this sample cannot be true, or None. Cheap: a few comparisons per GPU.

        A GPU's draw may pass 1.15 x its cap + 25 W for a moment: its limiter lets the first
        ~0.1-0.2 s of a load step through (``POWER_OVER_CAP_FOR_S``). A sample taken less
        than ``CAP_SETTLE_S`` after the node's ack (not ``settled``) may also catch a GPU
        between a cut and its draw following it (an H200: the enforced limit reads the cut
        after up to 92 ms, the draw is within 2 % of it after 66-144 ms, docs/HARDWARE.md):
        its power is held to the GPU's maximum cap, not to the cap it reports. ``arrived``:
        when the sample was received (monotonic)."""
        if SEQ_RESTART_MAX < sample.seq <= previous_seq:
            return f"seq went back from {previous_seq} to {sample.seq}"
        cap_min, cap_max, over_since = self._gpu_cap_min, self._gpu_cap_max, self._over_cap_since
        why: str | None = None
        for g in sample.gpus:
            if g.index >= n_gpus:
                continue  # logged where the sample is taken in
            k = start + g.index
            if g.power_w > cap_max[k] * POWER_ABSURD_RATIO:
                return (
                    f"gpu {g.index} draws {g.power_w:.0f} W, over {POWER_ABSURD_RATIO:g} x its "
                    f"model's {cap_max[k]:.0f} W maximum cap"
                )
            bound_w = g.cap_w if settled else max(g.cap_w, cap_max[k])
            if g.power_w <= bound_w * POWER_OVER_CAP_RATIO + POWER_OVER_CAP_W:
                over_since[k] = math.nan
            elif math.isnan(over_since[k]):
                over_since[k] = arrived  # a load step, perhaps: doubted if it lasts
            elif why is None and arrived - over_since[k] >= POWER_OVER_CAP_FOR_S:
                why = (
                    f"gpu {g.index} draws {g.power_w:.0f} W over its {bound_w:.0f} W cap, "
                    f"over it for {arrived - over_since[k]:.1f} s"
                )
            if why is None and (
                abs(g.cap_min_w - cap_min[k]) > RANGE_TOLERANCE_W
                or abs(g.cap_max_w - cap_max[k]) > RANGE_TOLERANCE_W
                or not g.cap_min_w - RANGE_TOLERANCE_W <= g.cap_w <= g.cap_max_w + RANGE_TOLERANCE_W
            ):
                why = (
                    f"gpu {g.index} reports cap {g.cap_w:.0f} W in [{g.cap_min_w:.0f}, "
                    f"{g.cap_max_w:.0f}] W; its model's range is [{cap_min[k]:.0f}, "
                    f"{cap_max[k]:.0f}] W"
                )
        return why

    def _disbelieve(self, server: int, node: str, why: str) -> None:
        self.implausible[server] = True
        self.implausible_samples[server] += 1
        self._plausible_streak[server] = 0
        self._log.warning(
            f"implausible-{node}",
            self._monotonic(),
            "node %s: implausible telemetry (%s): counted at its caps and not commanded until "
            "%d plausible samples in a row (%d implausible so far)",
            node,
            why,
            PLAUSIBLE_TO_CLEAR,
            int(self.implausible_samples[server]),
        )

    def on_status(self, node: str, payload: bytes) -> None:
        got = self._decode_from(node, Status, payload, "status")
        if got is None:
            return
        server, status = got
        if status.failsafe_cap_w is not None:
            self._take_failsafe_cap(server, node, status.failsafe_cap_w)
        if status.period_s is not None:
            self.period_s[server] = status.period_s
        self.offline[server] = status.state == "offline"
        if status.state == "offline":
            log.warning(
                "node %s is offline: counted at its last caps (at least its failsafe caps)", node
            )

    def _take_failsafe_cap(self, server: int, node: str, reported_w: float) -> None:
        gpus = self.tree.server_gpus[server]
        planned_w = self.tree.failsafe_cap_w[gpus]
        over = reported_w > float(planned_w.max()) + FAILSAFE_TOLERANCE_W
        self.failsafe_over_plan[server] = over
        self.failsafe_cap_w[gpus] = np.maximum(planned_w, reported_w) if over else planned_w
        if over:
            self._log.warning(
                f"failsafe-{node}",
                self._monotonic(),
                "node %s falls back to failsafe caps up to %.0f W, above the budgets file's "
                "%.0f W: the budgets were proven for the file's caps; set failsafe.cap_w in its "
                "agent config to at most that (it is counted at its own meanwhile)",
                node,
                reported_w,
                float(planned_w.max()),
            )

    def on_ack(self, node: str, payload: bytes) -> None:
        got = self._decode_from(node, Ack, payload, "ack")
        if got is None:
            return
        server, ack = got
        pending = self.pending.get(server)
        newest_unacked = ack.seq == self._sent_seq[server] > self._acked_seq[server]
        if pending is None and ack.epoch == self.epoch and newest_unacked:
            # the ack of the newest command it was sent, late: the node went stale and its
            # command was dropped. What it holds now is this, not what older samples say.
            self.counters.acks_late += 1
        elif ack.epoch != self.epoch or pending is None or ack.seq < pending[0]:
            return  # an old command's ack (or one taken already)
        self.pending.pop(server, None)
        self._acked_seq[server] = ack.seq
        self._resends_unacked[server] = 0
        if ack.result == "stale":
            # It holds a newer command of this epoch than ours: not one we sent. Not
            # applied: asked again (a newer seq) next cycle, and drift checks what it holds.
            self.counters.acks_stale += 1
            self._log.warning(
                f"ack-{node}",
                self._monotonic(),
                "node %s: command %d acknowledged as stale: the node applied a command of "
                "epoch %d that this controller did not send",
                node,
                ack.seq,
                ack.epoch,
            )
            self._forget_commanded(server)
            return
        self.counters.acks_received += 1
        self._acked_ts[server] = ack.ts
        gpus = self.tree.server_gpus[server]
        for g in ack.gpus:
            if g.index < len(gpus) and g.cap_w is not None:
                self.cap_w[gpus.start + g.index] = g.cap_w
                lock = g.max_sm_clock_mhz
                self.clock_mhz[gpus.start + g.index] = np.nan if lock is None else lock
            gpu = gpus.start + g.index
            carried = g.index < len(gpus) and self.smoothing_sent_seq[gpu] == ack.seq
            if carried and g.smoothing is None:  # carried our profile; not applied
                self.smoothing_refused[gpu] = True
            granted = g.index < len(gpus) and self.comm_clock_sent_seq[gpu] == ack.seq
            if granted and g.comm_clock is not None and ack.result != "rejected":
                acked = self.comm_clock_acked
                acked[server] = min(acked[server], self._monotonic())
            if granted and g.comm_clock is None:  # an agent that does not know clock policies
                self.comm_clock_refused[gpu] = True
                self._log.warning(
                    f"comm-clock-{node}",
                    self._monotonic(),
                    "node %s takes no clock policy (an older agent?): the controller locks "
                    "its clocks in communication itself",
                    node,
                )
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

    def on_phase(
        self, job_name: str, payload: bytes, owner: str | None = None
    ) -> PhaseEvent | None:
        """Take in one phase event; the decoded event, or None if it was refused or ignored.

        ``owner``: the owner level of the topic it came on (``jobs/{owner}/{job}/phase``,
        bound to a login by the broker's ACL), None for the unowned topic. A job belongs
        to whoever announced it first until its shutdown: anyone else's phases for it are
        refused, as is a priority above the owner's allowance (ControllerSettings), a
        node list naming nodes another owner's live job holds, and a new job beyond
        ``JobLimits.max_jobs_per_owner`` or the site's node count. Announcements over
        the rates of ``JobLimits`` are dropped before they are decoded.
        """
        now = self._monotonic()
        why = self._gate.refusal(owner, job_name, now)
        if why is not None:
            self.counters.phases_rate_limited += 1
            self._log.warning("phase-rate", now, "phase announcement dropped: %s", why)
            return None
        try:
            event = decode(PhaseEvent, payload, job_name)
            job = self.jobs.get(job_name)
            refusal = self._refuse_phase(job, owner, event)
            if refusal is not None:
                raise ProtocolError(refusal)
            named = self._named_servers(job_name, owner, event)
        except ProtocolError as exc:
            self._reject(job_name, exc, key=f"owner-{owner}")  # owners are few, names not
            return None
        if job is None:
            if named is None or not named:
                self._ignore_jobless(job_name, owner, event, named is None)
                return event if named is not None else None
            job = self._new_job(job_name, owner, event, now)
            if job is None:
                return None
        if named is not None:
            self._give_nodes(job, named)
        job.priority, job.since_mono = event.priority, now
        job.enter(event.phase, job.since_mono)
        job.expected_s = math.nan if event.expected_s is None else float(event.expected_s)
        if event.phase in WAITING_PHASES:
            job.announces_waits = True
        job.inferred_phase = None  # an announcement overrides an inference until the next cycle
        log.info(
            "job %s: %s (%d nodes, %s priority)",
            job_name,
            event.phase,
            len(job.nodes),
            job.priority,
        )
        if event.phase == "shutdown" or not job.nodes:
            self._forget_job(job)
        return event

    def _named_servers(
        self, job_name: str, owner: str | None, event: PhaseEvent
    ) -> list[int] | None:
        """The servers of ours an announcement names (None: it names none), expanded only
        against our node names; ProtocolError for a list longer than a job can be, or one
        naming nodes another owner's live job holds."""
        limit = MAX_HOSTS if self.settings.scoped else len(self._site_names)
        try:
            got = event.node_names_within(self._site_names, limit)
        except ValueError as exc:
            raise ProtocolError(f"job {job_name}: {exc}") from None
        if got is None:
            return None
        names, unknown = got
        if unknown and not self.settings.scoped:
            self._log.warning(
                f"jobnodes-{owner}",
                self._monotonic(),
                "job %s names %d nodes not in the budgets file: ignored",
                job_name,
                unknown,
            )
        ordinal = self.tree.server_ordinal
        servers = [ordinal[n] for n in names]
        held = self._held_by_others(job_name, owner, servers)
        if held is not None:
            self.counters.job_claims_refused += 1
            raise ProtocolError(f"job {job_name} names nodes of {held}: refused")
        return servers

    def _held_by_others(self, job_name: str, owner: str | None, servers: list[int]) -> str | None:
        """Another owner's live job holding one of ``servers`` (what to say), or None."""
        now = self._monotonic()
        for server in servers:
            holder = self.server_job[server]
            if holder is None or holder == job_name:
                continue
            other = self.jobs.get(holder)
            if other is not None and other.owner != owner and self.announcements_live(other, now):
                who = "the unowned topic" if other.owner is None else f"owner {other.owner}"
                return f"job {holder} of {who} ({self.tree.server_names[server]} first)"
        return None

    def _ignore_jobless(
        self, job_name: str, owner: str | None, event: PhaseEvent, unlisted: bool
    ) -> None:
        """A new job with no node list, or none of ours: not kept (a leaf's jobs of
        other scopes name none of its nodes)."""
        if unlisted:
            self._log.warning(
                f"job-{owner}",
                self._monotonic(),
                "phase %s for unknown job %s without its node list: ignored",
                event.phase,
                job_name,
            )

    def _new_job(
        self, job_name: str, owner: str | None, event: PhaseEvent, now: float
    ) -> Job | None:
        """A new job, kept; None (refused, counted) beyond the bounds on jobs."""
        limits = self.settings.jobs
        why = None
        if self._owner_jobs[owner] >= limits.max_jobs_per_owner:
            who = "the unowned topic" if owner is None else f"owner {owner}"
            why = f"{who} has {limits.max_jobs_per_owner} jobs (jobs.max_per_owner)"
        elif len(self.jobs) >= self.tree.n_servers:
            why = f"{len(self.jobs)} jobs already, one a node"
        if why is not None:
            self.counters.jobs_refused += 1
            self._log.warning(f"jobs-{owner}", now, "new job %s refused: %s", job_name, why)
            return None
        job = Job(job_name, [], event.priority, event.phase, now, owner=owner)
        self.jobs[job_name] = job
        self._owner_jobs[owner] += 1
        return job

    def _give_nodes(self, job: Job, servers: list[int]) -> None:
        """``servers`` are ``job``'s now, and no other job's: a job they are taken from
        keeps the rest, and one left with none is forgotten."""
        names = self.tree.server_names
        for server in self._job_servers(job):
            if self.server_job[server] == job.name:
                self.server_job[server] = None
        losers: set[str] = set()
        for server in servers:
            holder = self.server_job[server]
            if holder is not None and holder != job.name:
                losers.add(holder)
            self.server_job[server] = job.name
        job.nodes = [names[server] for server in servers]
        for name in losers:
            other = self.jobs.get(name)
            if other is not None:
                other.nodes = [n for n in other.nodes if self.job_of(n) == name]
                if not other.nodes:
                    self._forget_job(other)

    def _forget_job(self, job: Job) -> None:
        if self.jobs.pop(job.name, None) is None:
            return
        self._owner_jobs[job.owner] -= 1
        if not self._owner_jobs[job.owner]:
            del self._owner_jobs[job.owner]
        self._job_server_index.pop(job.name, None)
        for server in self._job_servers(job):
            if self.server_job[server] == job.name:
                self.server_job[server] = None

    def _expire_jobs(self, now: float) -> None:
        """Forget the jobs that have announced nothing for ``JobLimits.expiry_s``."""
        expiry_s = self.settings.jobs.expiry_s
        for job in [j for j in self.jobs.values() if now - j.since_mono > expiry_s]:
            log.warning("job %s: nothing announced for %.0f s: forgotten", job.name, expiry_s)
            self._forget_job(job)
            self.counters.jobs_expired += 1

    def _job_servers(self, job: Job) -> list[int]:
        return [self.tree.server_ordinal[n] for n in job.nodes]

    def _gpus_on(self, servers: np.ndarray) -> np.ndarray:
        """The GPU indices of ``servers``, in order (each server's run of GPUs)."""
        first = self.tree.gpu_start[servers]
        count = self.tree.gpu_start[servers + 1] - first
        starts = np.cumsum(count) - count
        return np.repeat(first - starts, count) + np.arange(int(count.sum()))

    def _servers_of(self, job: Job) -> np.ndarray:
        """``_job_servers`` as an index array, kept until the job's node list is replaced
        (every cycle needs it; a 150 MW job names 10,000 nodes)."""
        cached = self._job_server_index.get(job.name)
        if cached is None or cached[0] is not job.nodes:
            cached = (job.nodes, np.asarray(self._job_servers(job), dtype=np.intp))
            self._job_server_index[job.name] = cached
        return cached[1]

    def announcements_live(self, job: Job, now: float) -> bool:
        """The job announced something within ``announced_live_s``: its announcements, not
        the controller's inference, say what it does (and may move granted clocks)."""
        return now - job.since_mono <= self.settings.announced_live_s

    # --- the cycle -------------------------------------------------------------

    def cycle(self, waiting: tuple[np.ndarray, np.ndarray] | None = None) -> CycleResult:
        """Decide on what has been taken in; ``waiting``: the inbox's servers with a payload
        not yet decoded, and when each arrived (they have been heard from: not stale)."""
        started = time.perf_counter()
        now = self._monotonic()
        dt_s = (
            self.settings.cycle_s
            if self._last_cycle_mono is None
            else max(1e-3, now - self._last_cycle_mono)
        )
        self._last_cycle_mono = now
        self.last_dt_s = dt_s
        self._expire_jobs(now)
        counters, self.counters = self.counters, CycleCounters()
        counters.jobs_live = len(self.jobs)
        heard = self.last_seen
        if waiting is not None and len(waiting[0]):
            servers, arrived = waiting
            heard = heard.copy()
            heard[servers] = np.maximum(heard[servers], arrived)
            counters.telemetry_waiting = len(servers)
        if self.settings.infer_phases:  # the power history is only for the inference
            self._remember_power(now, heard)
            self._infer_phases(now)
        state, live = self.cluster_state(now, counters, heard)
        self._check_node_clocks(now, live)
        wanting = live.copy()  # the nodes that may take turns, as heard (returning ones too)
        self._track_holdings(now, live, counters)
        state = self._as_commanded(state, now)
        decision, state = decide_in_turn(
            self.tree,
            state,
            wanting,
            dt_s,
            self.cycle_policy(dt_s),
            self.turns,
            self.settings.max_raises_per_cycle,
            self.settings.cycle_s,
        )
        counters.uncap_waiting = self.turns.uncap_waiting
        counters.cut_waiting = self.turns.cut_waiting
        self._last_node_power_w = decision.node_power_w
        self._last_node_predicted_w = decision.node_predicted_w
        if self.settings.policy.safety_by_caps:  # where an operator's line on the caps is
            self.site_caps_at_draw_w = caps_at_draw_w(self.tree, state, self.settings.policy)
        commands = self._commands(decision, live, now, counters)
        ingest = self._ingest_health.add(
            now,
            counters.telemetry_received,
            counters.telemetry_dropped,
            counters.telemetry_lost,
            counters.telemetry_waiting,
        )
        if ingest is not None:
            self._log.warning("telemetry-dropped", now, "%s", ingest)
        return CycleResult(decision, commands, counters, time.perf_counter() - started, state)

    def _check_node_clocks(self, now: float, live: np.ndarray) -> None:
        """The live nodes' clock skews (powerd.controller.node_clocks), logged once a minute
        while any is past the bound."""
        decoded = live & np.isfinite(self._sample_ts)
        clocks = node_clocks(
            self.last_seen, self._sample_ts, decoded, self._wall() - now,
            self.settings.max_clock_skew_s,
        )  # fmt: skip
        self.node_clocks = clocks
        if clocks.skewed and clocks.worst is not None and clocks.skew_s is not None:
            self._log.warning(
                "node-clocks",
                now,
                "%d nodes' clocks more than max_clock_skew_s %g s off this one; the worst, "
                "%s, by %+.1f s (this clock minus its): check NTP there",
                clocks.skewed,
                self.settings.max_clock_skew_s,
                self.tree.server_names[clocks.worst],
                clocks.skew_s,
            )

    def cycle_policy(self, dt_s: float) -> PolicySettings:
        """The policy a cycle ``dt_s`` after the last decides under: the configured one;
        under grid smoothing, starting GPUs rise on their own at their share of the grid's
        ramp-up (software smoothing fills a start up at it), so it is taken out of the ramp
        the caps are handed back under, and caps are cut, where no limit is passed, no
        faster than the GPUs' share of its ramp-down; an early cycle hands back no more
        watts per second."""
        policy = self.settings.policy
        smoothing = self.settings.smoothing
        if smoothing is not None and smoothing.enabled:
            rise = max(policy.startup_rise_w_per_s, smoothing.ramp_up_w_per_s)
            after_s = min(policy.wait_rise_after_s, smoothing.ramp_down_hysteresis_ms / 1000)
            policy = dataclasses.replace(
                policy, startup_rise_w_per_s=rise, wait_rise_after_s=after_s
            )
            policy = with_cut_fall(policy, smoothing.ramp_down_w_per_s)
        if dt_s < self.settings.cycle_s:
            scale = dt_s / self.settings.cycle_s
            policy = dataclasses.replace(
                policy,
                uncap_step_fraction=policy.uncap_step_fraction * scale,
                uncap_min_step_w=policy.uncap_min_step_w * scale,
            )
        return policy

    def _track_holdings(self, now: float, live: np.ndarray, counters: CycleCounters) -> None:
        """What each node holds, as far as commands go.

        A node in failsafe holds its failsafe caps, not what we last asked: it is asked
        again (every cycle, until it leaves failsafe). A node we cannot command (silent,
        offline, local) keeps no pending command; when it is back, what it holds is read
        from its first fresh telemetry and it is commanded only where that differs from
        the decision. So a node that was only stale (or a controller that fell behind)
        costs no command at all, and a burst of returning nodes is no burst of commands.

        Drift: a node with no command pending whose telemetry, sampled after it acked our
        last command, shows caps or a clock lock other than what we asked (an old
        leader's command applied late, a replayed one, a hand-set cap, a restart we did not
        see) is commanded back to what we asked: the decision starts from our command, not
        from what it holds (a drifted cap is never adopted as our own: ``cluster_state``),
        and where it drifted up, that command is a cut, sent at once. At most once
        per ``DRIFT_RETRY_S`` per node, since a GPU that refuses a value would drift forever.
        """
        failsafe = live & self._in_mode("failsafe")
        for server in np.flatnonzero(failsafe).tolist():
            self._forget_commanded(server)
        self._returning[failsafe] = False
        for silent in [s for s in self.pending if not live[s]]:
            del self.pending[silent]
            self._resends_unacked[silent] = 0  # back, it starts afresh
        self._returning |= ~live
        decoded_fresh = (now - self.last_seen) <= self.settings.stale_after_s
        back = live & self._returning & decoded_fresh
        if back.any():
            self._adopt_read_back(back)
            self._returning[back] = False
        # heard from (a payload waiting) but not yet decoded since it was away: not yet
        live &= ~self._returning
        self._check_drift(now, live & decoded_fresh & ~failsafe, counters)

    def _as_commanded(self, state: ClusterState, now: float) -> ClusterState:
        """``state`` with the GPUs of nodes found drifted within ``DRIFT_RETRY_S`` at the
        caps we commanded: the decision starts from our command, never from the drifted
        caps (``_track_holdings``), and a GPU that refuses our cap is not re-decided from
        what it holds every cycle until the next retry."""
        recent = now < self._drift_retry_at[self.tree.gpu_server_ordinal]
        drifted = recent & ~np.isnan(self.commanded_cap_w)
        if not drifted.any():
            return state
        cap_w = np.where(drifted, self.commanded_cap_w, state.cap_w)
        return dataclasses.replace(state, cap_w=cap_w)

    def _check_drift(self, now: float, candidates: np.ndarray, counters: CycleCounters) -> None:
        pending = np.zeros(len(candidates), dtype=bool)
        pending[list(self.pending)] = True
        settled = candidates & ~pending & (self._sample_ts >= self._acked_ts + CAP_SETTLE_S)
        settled &= now >= self._drift_retry_at
        if not settled.any():
            return
        gpus = settled[self.tree.gpu_server_ordinal]
        commanded_cap, commanded_clock = self.commanded_cap_w, self.commanded_clock
        known = ~np.isnan(commanded_cap)
        cap_off = known & ~(np.abs(self.cap_w - commanded_cap) <= CAP_TOLERANCE_W)
        clock_off = known & ~(
            (np.isnan(commanded_clock) & np.isnan(self.clock_mhz))
            | (commanded_clock == self.clock_mhz)
        )
        clock_off &= np.isnan(self.comm_clock_sent_mhz)  # under a policy: the job's announcements
        off = gpus & (cap_off | clock_off)
        if not off.any():
            return
        drifted = (
            np.bincount(self.tree.gpu_server_ordinal, weights=off, minlength=len(candidates)) > 0
        )
        self._drifted |= drifted
        self._clock_drifted |= gpus & clock_off
        self._drift_retry_at[drifted] = now + DRIFT_RETRY_S
        counters.nodes_drifted += int(drifted.sum())
        first = self.tree.server_names[int(np.flatnonzero(drifted)[0])]
        self._log.warning(
            "drift",
            now,
            "%d nodes hold caps or clock locks other than commanded (%s first): commanded again",
            int(drifted.sum()),
            first,
        )

    def _adopt_read_back(self, servers: np.ndarray) -> None:
        """Take what these servers report they hold as what they were commanded."""
        gpus = servers[self.tree.gpu_server_ordinal]
        self.commanded_cap_w[gpus] = self.cap_w[gpus]
        self.commanded_clock[gpus] = self.clock_mhz[gpus]

    @property
    def site_power_w(self) -> float | None:
        """The site's measured power at the last decision (None before the first)."""
        last = self._last_node_power_w
        return None if last is None else float(last[0])

    @property
    def site_predicted_w(self) -> float | None:
        """What the site will draw once the last decision's caps hold (None before it)."""
        last = self._last_node_predicted_w
        return None if last is None else float(last[0])

    def crossed_threshold(self) -> bool:
        """A reason to decide now, before the next period: in the telemetry taken in since
        the last cycle, a tree node is above its capping threshold and was not then, or
        is and has risen by more than ``RISE_FRACTION`` of its budget since (more of a
        rack's nodes reporting a load that came on all at once).

        Measured power only (silent nodes as last heard), so it only says when to decide;
        the decision itself counts every node as ``cluster_state`` does.
        """
        last = self._last_node_power_w
        if last is None:
            return False
        power = self.tree.node_sum(self.power_w) + self.tree.overhead_below_w
        tree = self.tree
        over = power > tree.cap_threshold_w
        news = over & (
            (last <= tree.cap_threshold_w) | (power > last + RISE_FRACTION * tree.budget_w)
        )
        return bool(np.any(news))

    def count_dropped_unread(
        self, oversized: int, telemetry_retained: int, phases_retained: int
    ) -> None:
        """What the connections dropped unread since the last cycle: telemetry frames too
        large, retained telemetry and retained phase messages (none is legitimate)."""
        self.counters.telemetry_oversized += oversized
        self.counters.telemetry_retained += telemetry_retained
        self.counters.phases_retained += phases_retained
        if oversized or telemetry_retained or phases_retained:
            self._log.warning(
                "dropped-unread",
                self._monotonic(),
                "dropped unread: %d telemetry frames over the size limit, %d retained "
                "telemetry and %d retained phase messages (no agent or job hook retains them)",
                oversized,
                telemetry_retained,
                phases_retained,
            )

    def count_ingest(self, received: int, dropped: int, seconds: float) -> None:
        """What the service's telemetry path did since the last cycle (the inbox's counts)."""
        self.counters.telemetry_received += received
        self.counters.telemetry_dropped += dropped
        self.counters.ingest_s += seconds

    def cluster_state(
        self, now: float, counters: CycleCounters, heard: np.ndarray | None = None
    ) -> tuple[ClusterState, np.ndarray]:
        """Arrays for the policy, and which servers may be commanded.

        Silent or offline servers count at their failsafe cap, or at their last
        read-back caps while they may still hold them; local-mode ones at what they
        draw. None of them is commanded. ``heard``: when each server was last heard
        from (default ``last_seen``).
        """
        heard = self.last_seen if heard is None else heard
        fresh = (now - heard) <= self.settings.stale_after_s
        live = fresh & ~self.offline & ~self.implausible
        counters.stale_nodes = int(np.sum(~fresh & ~self.offline))
        counters.nodes_implausible = int(np.sum(self.implausible))
        counters.offline_nodes = int(np.sum(self.offline))
        counters.failsafe_nodes = int(np.sum(self._in_mode("failsafe") & live))
        gpu_live = live[self.tree.gpu_server_ordinal]
        # What a node we cannot hear holds: its failsafe caps, or its last caps if they
        # were higher while it may still be holding them (silent for less than the
        # agents' failsafe_after_s; or stopped, with on_exit = keep).
        silent_s = now - heard
        holding_last = (
            ~live & ((silent_s <= self.settings.agent_failsafe_after_s) | self.offline)
        )[self.tree.gpu_server_ordinal]
        counters.failsafe_over_plan = int(np.sum(self.failsafe_over_plan))
        failsafe = self.failsafe_cap_w
        held_w = np.where(holding_last, np.maximum(failsafe, self.cap_w), failsafe)
        if counters.nodes_implausible:  # its read-back caps may be a lie: what we asked, too
            doubted = self.implausible[self.tree.gpu_server_ordinal]
            held_w = np.where(doubted, np.fmax(held_w, self.commanded_cap_w), held_w)
        power = np.where(gpu_live, self.power_w, held_w)
        # A node with a command in flight is taken at what it was asked (a read-back may
        # predate the command), and asks for no more watts until it answers: one raise in
        # flight a node. Deciding from the old caps undid commands whenever acks took longer
        # than a cycle (a raise whose turn had passed went out again as a "cut" back to the
        # old cap), and stepping on from the asked caps would pile raises on a slow node.
        # (An agent in failsafe or local mode refuses commands: it holds what it reports.)
        n_servers = self.tree.n_servers
        in_flight = np.zeros(n_servers, dtype=bool)
        in_flight[list(self.pending)] = True
        local = self._in_mode("local")
        in_flight &= ~self._in_mode("failsafe") & ~local
        asked = in_flight[self.tree.gpu_server_ordinal] & ~np.isnan(self.commanded_cap_w)
        asked_w = self.commanded_cap_w
        if self.settings.policy.safety_by_caps:  # in force: the higher of old and new
            asked_w = np.fmax(asked_w, self.cap_w)
        cap = np.where(gpu_live, np.where(asked, asked_w, self.cap_w), held_w)
        uncap_cycles = np.where(asked, 0.0, 1.0) if asked.any() else None
        pending = np.where(asked & gpu_live, self.commanded_cap_w, np.nan) if asked.any() else None
        # a local-mode agent reports but refuses commands: its power counts, it is not capped
        commandable = live & ~local
        # per server, then per GPU: a job's servers at once (a later job over an earlier one)
        priority = np.full(n_servers, PRIORITY_CODES["normal"], dtype=np.int8)
        phase = np.full(n_servers, PHASE_CODES["compute"], dtype=np.int8)
        phase_s = np.full(n_servers, np.nan)  # announced phases only
        wait_before_s = np.zeros(n_servers)
        expected_s = np.full(n_servers, np.nan)
        for job in self.jobs.values():
            servers = self._servers_of(job)
            priority[servers] = PRIORITY_CODES[job.priority]
            phase[servers] = PHASE_CODES[job.effective_phase]
            phase_s[servers] = now - job.phase_since_mono if job.inferred_phase is None else np.nan
            wait_before_s[servers] = job.wait_before_s
            expected_s[servers] = job.expected_s if job.inferred_phase is None else np.nan
        on_server = self.tree.gpu_server_ordinal
        priority, phase = priority[on_server], phase[on_server]
        phase_s, wait_before_s = phase_s[on_server], wait_before_s[on_server]
        expected_s = expected_s[on_server]
        state = ClusterState(
            power_w=power,
            cap_w=cap,
            priority=priority,
            floor_w=self.tree.cap_min_w.astype(float).copy(),
            phase=phase,
            controllable=commandable[self.tree.gpu_server_ordinal],
            phase_s=phase_s,
            wait_before_s=wait_before_s,
            phase_expected_s=expected_s,
            heard=gpu_live,
            uncap_cycles=uncap_cycles,
            pending_cap_w=pending,
        )
        return state, commandable

    def _commands(
        self, decision: Decision, live: np.ndarray, now: float, counters: CycleCounters
    ) -> list[tuple[str, Command]]:
        """Commands for the nodes whose caps or clock locks change, and resends.

        Cuts and clocks unlocked (or raised) go out at once, whatever their number, but
        for a levelling's (rule 3c of ``policies.capping``: watts moved between GPUs of one
        class between the bands, which no limit needs; after a glide cut in turn,
        ``_cut_in_turn``, every node of a site may be levelled). A
        command that only hands watts back, or levels, locks a clock (or lowers a lock), restates
        what a node holds after a new epoch, or resends one not acknowledged waits its
        turn when more than ``max_raises_per_cycle`` want one: resends first, then the
        nodes whose GPUs still need the grid smoothing profile, then those whose turn to
        be handed watts back it is (``_uncap_in_turn``), then the rest round robin.
        Those left keep their lower caps, or their clocks unlocked, a cycle or more
        longer, which is safe. The bound is a window: the commands still in flight (sent,
        unanswered, not yet overdue; resends not counted) count against it, so raises
        follow the pace at which agents and the broker answer (with acks within a cycle,
        the whole bound). That bounds the flood when a whole site
        uncaps at once, when a job of 10,000 nodes whose agents take no clock policy
        enters communication (a lock saves energy and can wait; an unlock is what
        compute waits for), and when agents (or the broker) are slow to answer 20,000
        commands: each resend since a node's last ack doubles its wait for the next
        (``RESEND_MAX_DOUBLINGS``), and they go out a bounded number a cycle.
        """
        n_servers = self.tree.n_servers
        ordinal = self.tree.gpu_server_ordinal
        cap_changed = ~(np.abs(decision.cap_w - self.commanded_cap_w) <= CAP_TOLERANCE_W)
        # the last fraction of a watt back to cap_max is sent too: else the GPU stays "capped"
        cap_max = self.tree.cap_max_w
        cap_changed |= (decision.cap_w >= cap_max) & ~(self.commanded_cap_w >= cap_max)
        want_clock, had_clock = decision.max_sm_clock_mhz, self.commanded_clock
        clock_moved = ~_same(want_clock, had_clock)
        policies = self._clock_policies(now)
        clock_moved &= ~policies.follows  # the job's announcements move those clocks
        counters.clock_policy_gpus = int(policies.follows.sum())
        # What a node holds is unknown (new epoch, forgotten): say its clock explicitly, so a
        # lock left by an earlier leader or command is removed (null) rather than kept (absent).
        # So does a command that grants or ends a clock policy: the controller's own lock,
        # until the job's next announcement.
        unknown = np.isnan(self.commanded_cap_w)
        drifted = self._drifted[ordinal]  # commanded back; a clock that drifted said again
        cap_changed |= drifted
        clock_changed = clock_moved | unknown | policies.changed | self._clock_drifted
        holds = np.where(unknown | drifted, self.cap_w, self.commanded_cap_w)
        levelled = decision.levelled if len(decision.levelled) else np.zeros_like(cap_changed)
        if self.turns.uncap_turn is not None:  # in turn, a raise of a few watts is not worth one,
            worth_w = RAISE_WORTH_FRACTION * (cap_max - self.tree.cap_min_w)  # nor the cut
            rise_w = decision.cap_w - holds  # a levelling trades for it
            small = (np.abs(rise_w) < worth_w) & (decision.cap_w < cap_max)
            cap_changed &= ~(small & ((rise_w > 0) | levelled))
        # a levelling's cut gives watts no limit needs: it waits its turn with the raises
        cut = cap_changed & (decision.cap_w < holds - CAP_TOLERANCE_W) & ~levelled
        with np.errstate(invalid="ignore"):  # NaN: no lock
            freed = clock_moved & (np.isnan(want_clock) | (want_clock > had_clock))
        urgent_gpu = cut | (freed & ~(unknown & np.isnan(want_clock)))
        smoothing = self.settings.smoothing
        smooth = np.zeros(self.tree.n_gpus, dtype=bool)
        if smoothing is not None:  # not urgent: served with the raises, round robin
            smooth = self.smoothing_capable & ~self.smoothing_refused
            smooth &= self.smoothing_sent_seq < 0

        def any_per_server(mask: np.ndarray) -> np.ndarray:
            return np.bincount(ordinal, weights=mask, minlength=n_servers) > 0

        overdue = np.zeros(n_servers, dtype=bool)
        backoff = 2.0 ** np.minimum(self._resends_unacked, RESEND_MAX_DOUBLINGS)
        # in flight: sent and still expected; a resend is not counted, so nodes that never
        # answer (their acks refused by the broker, say) do not hold the window shut
        n_in_flight = 0
        for server, (_, sent_at) in self.pending.items():
            overdue[server] = now - sent_at > self.settings.ack_timeout_s * backoff[server]
            n_in_flight += int(not overdue[server] and self._resends_unacked[server] == 0)
        counters.commands_in_flight = n_in_flight
        needs_profile = any_per_server(smooth)
        wanted = live & (any_per_server(cap_changed | clock_changed) | needs_profile | overdue)
        must = wanted & any_per_server(urgent_gpu)
        raises = np.flatnonzero(wanted & ~must)
        # a window: no more than max_raises_per_cycle commands in flight (cuts go anyway)
        budget = max(0, self.settings.max_raises_per_cycle - n_in_flight)
        raises, counters.raises_deferred = serve_raises(
            raises, overdue[raises], needs_profile[raises], budget, self.turns
        )
        send = np.sort(np.concatenate([np.flatnonzero(must), raises]))
        # a resend (no ack) says our profile again where it was carried and not refused
        resmooth = self.smoothing_capable & ~self.smoothing_refused
        out: list[tuple[str, Command]] = []
        for server in send:
            pending = self.pending.get(server)
            if overdue[server]:
                counters.acks_missing += 1
                counters.resends += 1
                self._forget_commanded(server)
                self._resends_unacked[server] += 1
            elif pending is not None:
                counters.superseded += 1
            gpus = self.tree.server_gpus[server]
            self.seq += 1
            entries = []
            for local, i in enumerate(gpus):
                clock = want_clock[i]
                entry = GpuCommand(index=local, cap_w=float(decision.cap_w[i]))
                if overdue[server] or clock_changed[i]:
                    entry.max_sm_clock_mhz = None if np.isnan(clock) else float(clock)
                if smoothing is not None and (smooth[i] or (overdue[server] and resmooth[i])):
                    entry.smoothing = smoothing
                    self.smoothing_sent_seq[i] = self.seq
                if policies.granted[i]:
                    job, owner = self._policy_key_list[policies.job[server]]
                    entry.comm_clock = CommClock(
                        job=job, owner=owner, max_sm_clock_mhz=float(policies.clock_mhz[i])
                    )
                    self.comm_clock_sent_seq[i] = self.seq
                entries.append(entry)
            command = Command(
                v=PROTOCOL_VERSION,
                epoch=self.epoch,
                seq=self.seq,
                ts=self._wall(),
                ttl_s=self.settings.command_ttl_s,
                gpus=entries,
            )
            out.append((self.tree.server_names[server], command))
            self.pending[server] = (self.seq, now)
            self._sent_seq[server] = self.seq
            self._drifted[server] = False
            self._clock_drifted[gpus.start : gpus.stop] = False
            self.commanded_cap_w[gpus.start : gpus.stop] = decision.cap_w[gpus.start : gpus.stop]
            self.commanded_clock[gpus.start : gpus.stop] = want_clock[gpus.start : gpus.stop]
            if self.comm_clock_job[server] != policies.job[server]:
                self.comm_clock_acked[server] = math.inf  # the new one is not acked yet
            self.comm_clock_job[server] = policies.job[server]
            self.comm_clock_sent_mhz[gpus.start : gpus.stop] = policies.clock_mhz[
                gpus.start : gpus.stop
            ]
            counters.commands_sent += 1
        return out

    def _clock_policies(self, now: float) -> ClockPolicies:
        """The clock policies the commands of this cycle carry (``ClockPolicies``)."""
        n_servers, ordinal = self.tree.n_servers, self.tree.gpu_server_ordinal
        job_of = np.full(n_servers, -1, dtype=np.int64)
        # its phase is announced (not inferred), since its agent listens (acked the policy)
        announced = np.zeros(n_servers, dtype=bool)
        settings = self.settings
        if settings.agent_comm_clock and settings.policy.comm_clock_lock:
            for job in self.jobs.values():
                if self.announcements_live(job, now):
                    servers = self._job_servers(job)
                    job_of[servers] = self._policy_key(job.name, job.owner)
                    heard = job.since_mono > self.comm_clock_acked[servers]
                    announced[servers] = heard & (job.inferred_phase is None)
        clock_mhz = np.asarray(self.tree.comm_clock_mhz, dtype=float)
        granted = (job_of >= 0)[ordinal] & np.isfinite(clock_mhz) & ~self.comm_clock_refused
        clock_mhz = np.where(granted, clock_mhz, np.nan)
        moved_job = (job_of != self.comm_clock_job)[ordinal]
        changed = ~_same(clock_mhz, self.comm_clock_sent_mhz) | (moved_job & granted)
        follows = granted & ~changed & announced[ordinal]
        return ClockPolicies(job_of, granted, clock_mhz, changed, follows)

    def _policy_key(self, job: str, owner: str | None) -> int:
        """A small integer for (job, owner), the same every time: policies compared as arrays."""
        key = (job, owner)
        found = self._policy_keys.get(key)
        if found is None:
            found = self._policy_keys[key] = len(self._policy_key_list)
            self._policy_key_list.append(key)
        return found

    # --- phase inference -------------------------------------------------------

    def _remember_power(self, now: float, heard: np.ndarray) -> None:
        fresh = ((now - heard) <= self.settings.stale_after_s) & ~self.offline
        # A capped GPU drawing (nearly) its cap says nothing about its phase: left out (NaN),
        # else a job the controller has just capped would look like a synchronised wait.
        capped = self.cap_w < self.tree.cap_max_w - CAP_TOLERANCE_W
        cap_bound = capped & (self.power_w >= CAP_BOUND_FRACTION * self.cap_w)
        column = np.where(fresh[self.tree.gpu_server_ordinal] & ~cap_bound, self.power_w, np.nan)
        self._history_w[:, self._history_next] = column
        self._history_next = (self._history_next + 1) % self._history_w.shape[1]

    def _infer_phases(self, now: float) -> None:
        """Phases from power for jobs that announce themselves but not their waits, or whose
        announcements are no longer live (``announced_live_s``)."""
        quiet = [
            j
            for j in self.jobs.values()
            if (not j.announces_waits or not self.announcements_live(j, now))
            and j.phase in INFERRED_FROM
        ]
        if not quiet:
            return
        gpu_ids = [self._gpus_on(self._servers_of(job)) for job in quiet]
        sizes = np.array([len(ids) for ids in gpu_ids], dtype=np.intp)
        if not sizes.sum():
            return
        index = np.concatenate(gpu_ids)
        history = np.roll(self._history_w[index], -self._history_next, axis=1)  # oldest first
        codes = infer_phases(
            history,
            np.repeat(np.arange(len(quiet)), sizes),
            sample_period_s=self.settings.cycle_s,
        )
        firsts = np.cumsum(sizes) - sizes  # every GPU of a job has the job's phase
        per_job = {k: int(codes[firsts[k]]) for k in range(len(quiet)) if sizes[k]}
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
        server = self.tree.server_ordinal.get(node)
        return None if server is None else self.server_job[server]

    def new_epoch(self, epoch: int) -> None:
        """Lead under a new epoch: every node is commanded afresh."""
        self.epoch = epoch
        self.seq = 0
        self.pending.clear()
        self._resends_unacked[:] = 0  # nothing of ours is unanswered: backoffs start afresh
        self._returning[:] = False
        self._acked_ts[:] = -math.inf
        self._drifted[:] = False
        self._clock_drifted[:] = False
        self._sent_seq[:] = -1
        self._acked_seq[:] = -1
        self.commanded_cap_w[:] = np.nan
        self.commanded_clock[:] = np.nan
        self.smoothing_sent_seq[:] = -1
        self.smoothing_refused[:] = False
        self.comm_clock_job[:] = -1
        self.comm_clock_sent_mhz[:] = np.nan
        self.comm_clock_sent_seq[:] = -1
        self.comm_clock_refused[:] = False
        self.comm_clock_acked[:] = math.inf

    def _in_mode(self, mode: str) -> np.ndarray:
        return self.mode == mode

    def _forget_commanded(self, server: int) -> None:
        gpus = self.tree.server_gpus[server]
        self.commanded_cap_w[gpus.start : gpus.stop] = np.nan
        self.commanded_clock[gpus.start : gpus.stop] = np.nan
        self.smoothing_sent_seq[gpus.start : gpus.stop] = -1
        self.comm_clock_job[server] = -1
        self.comm_clock_acked[server] = math.inf
        self.comm_clock_sent_mhz[gpus.start : gpus.stop] = np.nan
        self.comm_clock_sent_seq[gpus.start : gpus.stop] = -1
        self.pending.pop(server, None)
        self._drifted[server] = False  # what it holds is read back: nothing to command back
        self._clock_drifted[gpus.start : gpus.stop] = False

    def with_last_smoothing(self, sample: Telemetry) -> Telemetry:
        """``sample`` with each GPU that carries no smoothing state given the one its
        telemetry last carried, if any: what it holds, for a record of it (a state is sent
        when it changes and every SMOOTHING_STATE_EVERY_SAMPLES samples, not every time)."""
        server = self.tree.server_ordinal.get(sample.node)
        if server is None:
            return sample
        start, count = self.tree.server_gpus[server].start, len(self.tree.server_gpus[server])
        for g in sample.gpus:
            if g.smoothing is None and g.index < count:
                g.smoothing = self.smoothing_last[start + g.index]
        return sample

    def server_of(self, node: str, what: str) -> int | None:
        server = self.tree.server_ordinal.get(node)
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
        server = self.server_of(node, what)
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

    def _reject(self, sender: str, exc: ProtocolError, key: str | None = None) -> None:
        """Count and log (once a minute per ``key``, by default ``sender``) a refusal."""
        self.count_rejected()
        self._log.warning(
            f"bad-{sender if key is None else key}",
            self._monotonic(),
            "rejected payload from %s: %s",
            sender,
            exc,
        )
