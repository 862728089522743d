"""The controller's bookkeeping and decisions, with no I/O: a clock-injected state machine.

It turns protocol messages into the arrays ``policies.decide`` takes, and the
decision into per-node commands: sent only when a node's caps or clock locks
change, resent when not acknowledged in time. A node that is silent (no
telemetry for ``stale_after_s``) or offline is counted at its failsafe power
and is not commanded: by construction it holds that cap on its own.

``ControllerCore`` is the facade the service, records, demo and planner use; the
work is done by its parts, each owning its data:

- ``node_views.NodeViews``: what each node reported (telemetry, statuses) and whether
  it is believed (plausibility, telemetry rates);
- ``jobs.JobRegistry``: the jobs announced, their owners, nodes and phases;
- ``phase_inference.PowerHistory``: phases inferred from power for quiet jobs;
- ``commands.CommandPlanner``: what each node was commanded, the command window,
  acks, resends and drift, with the clock policies of ``clock_grants.ClockGrants``.

The core's ``cycle`` takes them in turn and calls ``policies.decide_in_turn``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

import numpy as np

from policies import ClusterState, Decision, PolicySettings, Tree
from policies.allocation import caps_at_draw_w
from policies.smoothing import with_cut_fall
from policies.tree import SITE
from policies.turns import CAP_TOLERANCE_W, Turns, decide_in_turn
from powerd.controller.clock_grants import ClockGrants, ClockPolicies
from powerd.controller.commands import (
    DRIFT_RETRY_S,
    RAISE_WORTH_FRACTION,
    RESEND_MAX_DOUBLINGS,
    CommandPlanner,
)
from powerd.controller.counters import CycleCounters
from powerd.controller.inbox import Waiting
from powerd.controller.ingest_health import IngestHealth
from powerd.controller.job_causes import JobCauses, job_index, root_level
from powerd.controller.job_limits import AnnouncementGate
from powerd.controller.jobs import Job, JobRegistry
from powerd.controller.node_clocks import NodeClocks, node_clocks
from powerd.controller.node_views import (
    CAP_SETTLE_S,
    FAILSAFE_TOLERANCE_W,
    MAX_SEQ_GAP,
    PLAUSIBLE_TO_CLEAR,
    POWER_ABSURD_RATIO,
    POWER_OVER_CAP_FOR_S,
    POWER_OVER_CAP_RATIO,
    POWER_OVER_CAP_W,
    RANGE_TOLERANCE_W,
    SEQ_RESTART_MAX,
    NodeViews,
)
from powerd.controller.phase_inference import CAP_BOUND_FRACTION, INFERRED_FROM, PowerHistory
from powerd.controller.ramp_window import RampWindow
from powerd.controller.settings import ControllerSettings
from powerd.protocol import (
    Ack,
    Command,
    GpuSmoothing,
    GpuSmoothingState,
    PhaseEvent,
    ProtocolError,
    Status,
    Telemetry,
    decode,
)
from powerd.ratelimit import LogOncePer

# What this module has always offered its importers, now kept by the parts.
__all__ = [
    "CAP_BOUND_FRACTION",
    "CAP_SETTLE_S",
    "CAP_TOLERANCE_W",
    "DRIFT_RETRY_S",
    "FAILSAFE_TOLERANCE_W",
    "INFERRED_FROM",
    "MAX_SEQ_GAP",
    "PLAUSIBLE_TO_CLEAR",
    "POWER_ABSURD_RATIO",
    "POWER_OVER_CAP_FOR_S",
    "POWER_OVER_CAP_RATIO",
    "POWER_OVER_CAP_W",
    "RAISE_WORTH_FRACTION",
    "RANGE_TOLERANCE_W",
    "RESEND_MAX_DOUBLINGS",
    "RISE_FRACTION",
    "SEQ_RESTART_MAX",
    "ClockPolicies",
    "ControllerCore",
    "ControllerSettings",
    "CycleCounters",
    "CycleResult",
    "Job",
]

log = logging.getLogger("powerd.controller")
_M = TypeVar("_M", Telemetry, Status, Ack)
_T = TypeVar("_T")

# Above its capping threshold, a tree node whose power rose by this share of its budget
# since the last cycle brings the next decision forward (crossed_threshold).
RISE_FRACTION = 0.01


@dataclass
class CycleResult:
    decision: Decision
    commands: list[tuple[str, Command]]
    counters: CycleCounters
    cycle_s: float
    state: ClusterState | None = None  # what the decision was taken on


class _Kept(Generic[_T]):
    """An attribute of the core that one of its parts keeps: ``core.x`` reads and writes
    ``core.<part>.<name>`` (by default the same name)."""

    def __init__(self, part: str, name: str = "") -> None:
        self._part, self._name = part, name

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = self._name or name

    def __get__(self, core: object, owner: type | None = None) -> _T:
        return cast(_T, getattr(getattr(core, self._part), self._name))

    def __set__(self, core: object, value: _T) -> None:
        setattr(getattr(core, self._part), self._name, value)


class ControllerCore:
    # what each node reported
    failsafe_cap_w = _Kept[np.ndarray]("views")
    failsafe_over_plan = _Kept[np.ndarray]("views")
    period_s = _Kept[np.ndarray]("views")
    implausible = _Kept[np.ndarray]("views")
    implausible_samples = _Kept[np.ndarray]("views")
    power_w = _Kept[np.ndarray]("views")
    cap_w = _Kept[np.ndarray]("views")
    clock_mhz = _Kept[np.ndarray]("views")
    last_seen = _Kept[np.ndarray]("views")
    mode = _Kept[np.ndarray]("views")
    offline = _Kept[np.ndarray]("views")
    smoothing_last = _Kept[list[GpuSmoothingState | None]]("views")
    # the jobs
    jobs = _Kept[dict[str, Job]]("registry")
    server_job = _Kept[list[str | None]]("registry")
    _gate = _Kept[AnnouncementGate]("registry", "gate")
    # what each node was commanded
    epoch = _Kept[int]("planner")
    seq = _Kept[int]("planner")
    commanded_cap_w = _Kept[np.ndarray]("planner")
    commanded_clock = _Kept[np.ndarray]("planner")
    pending = _Kept[dict[int, tuple[int, float]]]("planner")
    smoothing_capable = _Kept[np.ndarray]("planner")
    smoothing_sent_seq = _Kept[np.ndarray]("planner")
    smoothing_refused = _Kept[np.ndarray]("planner")
    _resends_unacked = _Kept[np.ndarray]("planner", "resends_unacked")
    comm_clock_job = _Kept[np.ndarray]("grants", "job")
    comm_clock_sent_mhz = _Kept[np.ndarray]("grants", "sent_mhz")
    comm_clock_sent_seq = _Kept[np.ndarray]("grants", "sent_seq")
    comm_clock_refused = _Kept[np.ndarray]("grants", "refused")
    comm_clock_acked = _Kept[np.ndarray]("grants", "acked")

    def __init__(
        self,
        tree: Tree,
        settings: ControllerSettings,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._tree = tree
        self._settings = settings
        self._monotonic = monotonic
        self._wall = wall
        self._log = LogOncePer(log)
        self.views = NodeViews(tree, settings, monotonic, self._log, self._reject)
        self.registry = JobRegistry(tree, settings, monotonic, self._log, self._reject)
        self.history = PowerHistory(tree.n_gpus, settings)
        # the round robins of the turns nodes take (policies.turns): the racks interleaved a
        # row at a time, so a turn spreads over the rows, each with a ramp of its own
        self.turns = Turns.of(tree)
        self.planner = CommandPlanner(
            tree, settings, self.views, self.turns, (monotonic, wall), self._log
        )
        self.grants: ClockGrants = self.planner.grants
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
        self.counters = CycleCounters()
        self.job_causes = JobCauses(tree.n_gpus)  # what held each job's GPUs, and why
        self.rejected_total = 0
        self.last_dt_s = settings.cycle_s
        self._last_cycle_mono: float | None = None
        self.ramp_window = RampWindow(settings.ramp_window_s)  # each cycle's seconds of ramp
        self._ingest_health = IngestHealth()  # judged over seconds, not one cycle

    @property
    def tree(self) -> Tree:
        return self._tree

    @tree.setter
    def tree(self, tree: Tree) -> None:
        """The tree in force (the service replaces it under site limits and grants)."""
        self._tree = self.views.tree = self.registry.tree = tree
        self.planner.tree = self.grants.tree = tree

    @property
    def settings(self) -> ControllerSettings:
        return self._settings

    @settings.setter
    def settings(self, settings: ControllerSettings) -> None:
        self._settings = self.views.settings = self.registry.settings = settings
        if settings.ramp_window_s != self.ramp_window.window_s:
            self.ramp_window = RampWindow(settings.ramp_window_s)
        self.history.settings = self.planner.settings = self.grants.settings = settings

    # --- inputs ----------------------------------------------------------------

    def on_telemetry(self, node: str, payload: bytes) -> Telemetry | None:
        """Take in one telemetry message now; the decoded message, or None if it was refused."""
        server = self.server_of(node, "telemetry")
        if server is None:
            return None
        samples = self.ingest([Waiting(server, payload, self._monotonic(), 0)])
        return samples[0] if samples else None

    def ingest(self, batch: Sequence[Waiting]) -> list[Telemetry]:
        """Decode and take in telemetry payloads taken from the inbox; the valid ones,
        decoded (``NodeViews.ingest``, the controller's hottest path)."""
        got = self.views.ingest(batch, self.counters)
        if got.smoothing_ids:
            self.planner.smoothing_seen(got.smoothing_ids, got.smoothing_held)
        return got.samples

    def allowed_hz(self) -> np.ndarray:
        return self.views.allowed_hz()

    def check_rates(self, received: np.ndarray, seconds: float) -> None:
        self.views.check_rates(received, seconds)

    def on_status(self, node: str, payload: bytes) -> None:
        got = self._decode_from(node, Status, payload, "status")
        if got is not None:
            self.views.take_status(got[0], node, got[1])

    def on_ack(self, node: str, payload: bytes) -> None:
        got = self._decode_from(node, Ack, payload, "ack")
        if got is not None:
            self.planner.on_ack(got[0], node, got[1], self.counters)

    def on_phase(
        self, job_name: str, payload: bytes, owner: str | None = None
    ) -> PhaseEvent | None:
        """Take in one phase event; the decoded event, or None if it was refused or ignored
        (``JobRegistry.on_phase``)."""
        return self.registry.on_phase(job_name, payload, owner, self.counters)

    def announcements_live(self, job: Job, now: float) -> bool:
        return self.registry.announcements_live(job, now)

    def job_of(self, node: str) -> str | None:
        return self.registry.job_of(node)

    def new_epoch(self, epoch: int) -> None:
        """Lead under a new epoch: every node is commanded afresh."""
        self.planner.new_epoch(epoch)

    def with_last_smoothing(self, sample: Telemetry) -> Telemetry:
        return self.views.with_last_smoothing(sample)

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
        self.registry.expire(now, self.counters)
        counters, self.counters = self.counters, CycleCounters()
        counters.jobs_live = len(self.jobs)
        heard = self.last_seen
        if waiting is not None and len(waiting[0]):
            servers, arrived = waiting
            heard = heard.copy()
            heard[servers] = np.maximum(heard[servers], arrived)
            counters.telemetry_waiting = len(servers)
        if self.settings.infer_phases:  # the power history is only for the inference
            self.history.remember(now, heard, self.views)
            self.history.infer(now, self.registry)
        state, live = self.cluster_state(now, counters, heard)
        state.ramp_s = self.ramp_window.take(
            now, dt_s, self._drawn_for_the_window(), float(self.tree.ramp_w_per_s[SITE])
        )
        self._check_node_clocks(now, live)
        wanting = live.copy()  # the nodes that may take turns, as heard (returning ones too)
        self.planner.track_holdings(now, live, counters)
        state = self.planner.as_commanded(state, now)
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
        self.job_causes.step(
            self.tree,
            state,
            decision,
            self.settings.policy,
            job_index(self.registry),
            locked=np.isfinite(self.views.clock_mhz),
            root=root_level(self.site_limit_w, self.tree),
        )
        counters.uncap_waiting = self.turns.uncap_waiting
        counters.cut_waiting = self.turns.cut_waiting
        self._last_node_power_w = decision.node_power_w
        self._last_node_predicted_w = decision.node_predicted_w
        if self.settings.policy.safety_by_caps:  # where an operator's line on the caps is
            self.site_caps_at_draw_w = caps_at_draw_w(self.tree, state, self.settings.policy)
        commands = self.planner.commands(decision, live, now, counters, self.registry)
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
        views = self.views
        decoded = live & np.isfinite(views.sample_ts)
        clocks = node_clocks(
            views.last_seen, views.sample_ts, decoded, self._wall() - now,
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

    def _drawn_for_the_window(self) -> float | None:
        """Under grid smoothing, the draw the ramp window counts (``RampWindow.take``): the
        GPUs' last reports, not the stand-ins a silent GPU counts as (a node heard late is no
        rise), of the GPUs no smoothing hardware of their own ramps (theirs rises at its share
        whatever the caps). None without: the rises it is for (a staged start's headroom, a
        job's first step) are grid smoothing's, and the draw, reported a sample late, would
        count a raise of the window before as this one's."""
        if self._grid_smoothing() is None:
            return None
        return float(np.sum(self.power_w, where=~self.views.ramps_in_hardware))

    def _grid_smoothing(self) -> GpuSmoothing | None:
        """The profile the GPUs are asked for when grid smoothing is on; None when off."""
        smoothing = self.settings.smoothing
        return smoothing if smoothing is not None and smoothing.enabled else None

    def cycle_policy(self, dt_s: float) -> PolicySettings:
        """The policy a cycle ``dt_s`` after the last decides under: the configured one;
        under grid smoothing, starting GPUs rise on their own at their share of the grid's
        ramp-up (software smoothing fills a start up at it), so it is taken out of the ramp
        the caps are handed back under, and caps are cut, where no limit is passed, no
        faster than the GPUs' share of its ramp-down, and a staged GPU's cap stands two
        cycle periods of its rise over its draw (an early cycle lands no sooner); an early
        cycle hands back no more watts per second."""
        policy = self.settings.policy
        smoothing = self._grid_smoothing()
        if smoothing is not None:
            rise = max(policy.startup_rise_w_per_s, smoothing.ramp_up_w_per_s)
            after_s = min(policy.wait_rise_after_s, smoothing.ramp_down_hysteresis_ms / 1000)
            fill_s = max(policy.stage_fill_s, 2.0 * self.settings.cycle_s)
            policy = dataclasses.replace(
                policy, startup_rise_w_per_s=rise, wait_rise_after_s=after_s, stage_fill_s=fill_s
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
        views, on_server = self.views, self.tree.gpu_server_ordinal
        heard = views.last_seen if heard is None else heard
        fresh = (now - heard) <= self.settings.stale_after_s
        live = fresh & ~views.offline & ~views.implausible
        counters.stale_nodes = int(np.sum(~fresh & ~views.offline))
        counters.nodes_implausible = int(np.sum(views.implausible))
        counters.offline_nodes = int(np.sum(views.offline))
        counters.failsafe_nodes = int(np.sum(views.in_mode("failsafe") & live))
        counters.failsafe_over_plan = int(np.sum(views.failsafe_over_plan))
        gpu_live = live[on_server]
        held_w = self._held_w(now - heard, live, counters)
        power = np.where(gpu_live, views.power_w, held_w)
        # A node with a command in flight is taken at what it was asked (a read-back may
        # predate the command), and asks for no more watts until it answers: one raise in
        # flight a node: deciding from the old caps would undo a raise whose turn has passed
        # (a "cut" back to the old cap), stepping on from the asked caps would pile raises on
        # a slow node.
        # (An agent in failsafe or local mode refuses commands: it holds what it reports.)
        commanded_cap_w = self.planner.commanded_cap_w
        in_flight = np.zeros(self.tree.n_servers, dtype=bool)
        in_flight[list(self.planner.pending)] = True
        local = views.in_mode("local")
        in_flight &= ~views.in_mode("failsafe") & ~local
        asked = in_flight[on_server] & ~np.isnan(commanded_cap_w)
        asked_w = commanded_cap_w
        if self.settings.policy.safety_by_caps:  # in force: the higher of old and new
            asked_w = np.fmax(asked_w, views.cap_w)
        cap = np.where(gpu_live, np.where(asked, asked_w, views.cap_w), held_w)
        uncap_cycles = np.where(asked, 0.0, 1.0) if asked.any() else None
        pending = np.where(asked & gpu_live, commanded_cap_w, np.nan) if asked.any() else None
        # a local-mode agent reports but refuses commands: its power counts, it is not capped
        commandable = live & ~local
        jobs = self.registry.server_arrays(now)
        state = ClusterState(
            power_w=power,
            cap_w=cap,
            priority=jobs.priority[on_server],
            floor_w=self.tree.cap_min_w.astype(float).copy(),
            phase=jobs.phase[on_server],
            controllable=commandable[on_server],
            phase_s=jobs.phase_s[on_server],
            wait_before_s=jobs.wait_before_s[on_server],
            phase_expected_s=jobs.expected_s[on_server],
            heard=gpu_live,
            ramps_in_hardware=views.ramps_in_hardware.copy(),
            uncap_cycles=uncap_cycles,
            pending_cap_w=pending,
        )
        return state, commandable

    def _held_w(
        self, silent_s: np.ndarray, live: np.ndarray, counters: CycleCounters
    ) -> np.ndarray:
        """Per GPU, what a node we cannot hear holds: its failsafe caps, or its last caps if
        they were higher while it may still be holding them (silent for less than the
        agents' failsafe_after_s; or stopped, with on_exit = keep); an implausible node's
        read-back caps may be a lie: at least what we asked, too."""
        views, on_server = self.views, self.tree.gpu_server_ordinal
        holding_last = (
            ~live & ((silent_s <= self.settings.agent_failsafe_after_s) | views.offline)
        )[on_server]
        failsafe = views.failsafe_cap_w
        held_w = np.where(holding_last, np.maximum(failsafe, views.cap_w), failsafe)
        if counters.nodes_implausible:
            doubted = views.implausible[on_server]
            held_w = np.where(doubted, np.fmax(held_w, self.planner.commanded_cap_w), held_w)
        return held_w

    # --- helpers ---------------------------------------------------------------

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
