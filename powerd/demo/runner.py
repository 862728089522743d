"""Puts the demo together in one process: broker, controller, agents, jobs, and the recording.

Everything runs on one asyncio loop: an embedded amqtt broker, one
``AgentDaemon`` per node of the budgets file on simulated GPUs, the
``ControllerService`` (the same code as ``powerd controller``), and the
synthetic jobs announcing their phases through ``powerd.jobhook`` (a paho
thread each). They speak the wire protocol to each other over TCP on
127.0.0.1, exactly as on a cluster.

Two recorders run beside them: a sampler reads every simulated GPU (the
ground truth a breaker would see, not the telemetry) every ``sample_s``, and
a cycle listener keeps every controller cycle's decision.

Timings are shorter than in production so that the story fits in well under a
minute: agents sample every 0.5 s and the controller cycles every 0.5 s
(production: 1 s both), a silent controller is noticed after 5 s (10 s). The
policy's per-cycle uncapping step is halved with the cycle, so caps are handed
back as fast per second as with the production defaults, not twice as fast.
The jobs' phases are compressed far more than that (seconds instead of
minutes), so the controller looks slower against them than it would be.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from policies import PolicySettings
from policies.causes import carry_causes, initial_carried
from policies.tree import PHASE_CODES, ROW, SITE
from powerd.agent.config import AgentConfig, FailsafeConfig
from powerd.agent.daemon import AgentDaemon
from powerd.controller.app import build_service
from powerd.controller.config import ControllerConfig
from powerd.controller.core import CycleResult
from powerd.controller.service import ControllerService
from powerd.demo.scenario import (
    CHECKPOINT_S,
    COMM_S,
    COMPUTE_S,
    JobPlan,
    TrainingJob,
    default_jobs,
)
from powerd.demo.summary import JobRecord, PhaseAccount, RunRecord, Summary, summarize
from powerd.gpu import GpuError
from powerd.gpu.simulated import SimulatedGpu, parse_spec
from powerd.jobhook import FillFollower, PhaseReporter
from powerd.mqtt.embedded_broker import EmbeddedBroker
from powerd.mqtt.url import parse_broker_url
from powerd.recorder import open_recorder
from powerd.signing import Signer, Verifier
from powerd.topology import Topology, load_budgets

DEFAULT_DURATION_S = 40.0
SETUP_TIMEOUT_S = 20.0
TEARDOWN_TIMEOUT_S = 8.0
TOOK_W = 1.0  # less is rounding, not capping

log = logging.getLogger("powerd.demo")


def default_budgets_path() -> Path:
    return Path(str(resources.files("powerd.data").joinpath("budgets/demo.toml")))


@dataclass(frozen=True)
class DemoOptions:
    duration_s: float = DEFAULT_DURATION_S
    budgets: Path | None = None  # None: powerd/data/budgets/demo.toml
    # that file already loaded (the CLI reads it first, to warn before anything starts)
    topology: Topology | None = None
    cluster: str = "demo"
    agent_period_s: float = 0.5
    cycle_s: float = 0.5
    sample_s: float = 0.1
    failsafe_after_s: float = 5.0
    seed: int = 0
    # also record the controller's points: a .lp path or a recorder URL (powerd.recorder)
    record: str | None = None
    # grid smoothing: the controller asks every GPU for its share of [site.grid]; GPUs
    # without hardware smoothing get it in software (the jobs fill their waits)
    smoothing: bool = False
    # clock policies: the agents lock and unlock on the jobs' announcements (the
    # controller's controller.agent_comm_clock); off, the controller locks, a cycle late
    agent_comm_clock: bool = True
    # the jobs' rhythm: compute, then exposed communication, per step (scenario.default_jobs)
    compute_s: float = COMPUTE_S
    comm_s: float = COMM_S
    checkpoint_s: float = CHECKPOINT_S
    # the controller keeps every level within its limit by the caps in force
    # (policies/allocation.py, the default); False: the bands on measured power
    # (policies/capping.py)
    safety_by_caps: bool = True


@dataclass
class DemoRun:
    """A finished run: what was recorded and what it adds up to."""

    topology: Topology
    trace: RunRecord
    summary: Summary
    setup_s: float  # broker, agents and controller up, before the jobs' clock started
    wall_s: float  # the whole run, setup and teardown included
    recorded: dict[str, int] | None = None  # the recorder's counters, with options.record


@dataclass
class LiveState:
    """What the live view and the event log read while the demo runs."""

    topology: Topology
    duration_s: float
    t0: float = 0.0
    node_power_w: np.ndarray | None = None  # latest sample
    gpu_cap_w: np.ndarray | None = None
    gpu_locked: np.ndarray | None = None
    cycle: CycleResult | None = None
    cycles: int = 0
    commands_sent: int = 0
    acks_received: int = 0
    epoch: int = 0
    jobs: list[TrainingJob] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    cycle_s: float = 0.5
    last_capping_s: np.ndarray | None = None  # per tree node: when it last capped

    def elapsed_s(self) -> float:
        return max(0.0, time.monotonic() - self.t0) if self.t0 else 0.0


class _Sampler:
    """Reads every simulated GPU; keeps per-sample arrays for the trace."""

    def __init__(self, topology: Topology, gpus: Sequence[SimulatedGpu]) -> None:
        self.tree = topology.tree
        self.overhead = self.tree.overhead_below_w
        self.gpus = gpus
        self.t: list[float] = []
        self.power: list[np.ndarray] = []
        self.cap: list[np.ndarray] = []
        self.locked: list[np.ndarray] = []
        self.phase: list[np.ndarray] = []
        self.throughput: list[np.ndarray] = []
        self.energy: list[float] = []
        self.fill_energy: list[float] = []
        self.gpu_power: list[np.ndarray] = []
        self.gpu_fill_energy: list[np.ndarray] = []
        self.gpu_demand: list[np.ndarray] = []  # what each would draw with no cap (lost work)
        self._demand: list[tuple[tuple[Any, ...], float]] = [((), 0.0)] * len(gpus)
        # throughput_rel is deterministic in (phase, cap, lock) and costs an operating point
        self._speed: list[tuple[tuple[Any, ...], float]] = [((), 0.0)] * len(gpus)

    def sample(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = len(self.gpus)
        power, cap = np.empty(n), np.empty(n)
        locked = np.zeros(n, dtype=bool)
        phase = np.empty(n, dtype=np.int8)
        speed = np.empty(n)
        fill = np.empty(n)
        demand = np.empty(n)
        energy = 0.0
        for i, gpu in enumerate(self.gpus):
            power[i] = gpu.power_w()
            cap[i] = gpu.enforced_cap_w()
            lock = gpu.locked_max_sm_clock_mhz()
            locked[i] = lock is not None
            phase[i] = PHASE_CODES[gpu.phase]
            key = (gpu.phase, cap[i], lock)
            cached = self._speed[i]
            if cached[0] != key:
                cached = (key, gpu.throughput_rel())
                self._speed[i] = cached
            speed[i] = cached[1]
            wants = self._demand[i]
            if wants[0] != (gpu.phase, lock):  # an operating point: kept while they hold
                wants = ((gpu.phase, lock), gpu.demand_w())
                self._demand[i] = wants
            demand[i] = wants[1]
            energy += gpu.energy_j() or 0.0
            fill[i] = gpu.fill_energy_j()
        node_power = self.tree.node_sum(power) + self.overhead
        self.t.append(t)
        self.power.append(node_power)
        self.cap.append(cap)
        self.locked.append(locked)
        self.phase.append(phase)
        self.throughput.append(speed)
        self.energy.append(energy)
        self.fill_energy.append(float(fill.sum()))
        self.gpu_power.append(power)
        self.gpu_fill_energy.append(fill)
        self.gpu_demand.append(demand)
        return node_power, cap, locked


class _AccountedGpu(SimulatedGpu):
    """A simulated GPU that books, exactly, how long its clock was locked and the energy it
    drew in each job phase, at every phase change, lock and unlock: an agent reacts to a
    job's announcement in tens of milliseconds, which the sampler's steps cannot resolve."""

    def __init__(
        self, *args: Any, clock: Callable[[], float] = time.monotonic, **kwargs: Any
    ) -> None:
        super().__init__(*args, clock=clock, **kwargs)
        self._account_clock = clock
        self.start_account()

    def start_account(self) -> None:
        """Book from now on (the recording's start), from nothing."""
        self.locked_s: dict[str, float] = {}
        self.energy_by_phase_j: dict[str, float] = {}
        self._booked_at = self._account_clock()
        self._booked_j = 0.0
        self._booked_j = self._energy_now()

    def _energy_now(self) -> float:
        try:
            return self.energy_j() or 0.0
        except GpuError:
            return self._booked_j

    def book(self) -> None:
        """Book the time and energy since the last event to the phase and lock that held."""
        now, energy_j = self._account_clock(), self._energy_now()
        phase = self.phase
        try:
            locked = self.locked_max_sm_clock_mhz() is not None
        except GpuError:
            locked = False
        if locked:
            self.locked_s[phase] = self.locked_s.get(phase, 0.0) + now - self._booked_at
        spent = self.energy_by_phase_j.get(phase, 0.0) + energy_j - self._booked_j
        self.energy_by_phase_j[phase] = spent
        self._booked_at, self._booked_j = now, energy_j

    def set_phase(self, phase: str) -> None:
        self.book()
        super().set_phase(phase)

    def lock_max_sm_clock_mhz(self, max_mhz: int) -> None:
        self.book()
        super().lock_max_sm_clock_mhz(max_mhz)

    def unlock_sm_clock(self) -> None:
        self.book()
        super().unlock_sm_clock()


def phase_account(gpus: list[_AccountedGpu]) -> PhaseAccount:
    """Every GPU's books, closed now and summed by phase."""
    locked: dict[str, float] = {}
    energy: dict[str, float] = {}
    for gpu in gpus:
        gpu.book()
        for phase, seconds in gpu.locked_s.items():
            locked[phase] = locked.get(phase, 0.0) + seconds
        for phase, joules in gpu.energy_by_phase_j.items():
            energy[phase] = energy.get(phase, 0.0) + joules
    return PhaseAccount(locked_gpu_s=locked, energy_j=energy)


def took_watts(result: CycleResult) -> np.ndarray:
    """Per tree node: did it take watts from GPUs this cycle (capping that did something)?

    Above its capping threshold is not enough: before the agents' first telemetry
    the controller counts every node at its failsafe power, which is over the
    thresholds here, but has no GPU it may cut.
    """
    d = result.decision
    cut = np.asarray(d.node_cut_w)
    if len(cut):
        return cut > TOOK_W
    return np.asarray(d.node_capping, dtype=bool).copy()


class _Cycles:
    """Every controller cycle, as the service finishes it (it keeps only the last 60)."""

    def __init__(self, n_nodes: int, n_gpus: int) -> None:
        self.t: list[float] = []
        self.capping: list[np.ndarray] = []
        self.cut: list[np.ndarray] = []
        self.cause: list[np.ndarray] = []  # per GPU, the rule that last lowered its cap
        self.staged_from: list[np.ndarray] = []  # ... and the budget's cap a stage cut found
        self.carried = initial_carried(n_gpus)
        self.sent = self.acked = self.resent = self.missing = self.superseded = 0
        self.pending_at_end = 0  # sent in the last cycles, not acknowledged when it stopped
        self.n_nodes, self.n_gpus = n_nodes, n_gpus

    def add(self, t: float, result: CycleResult) -> None:
        d, c = result.decision, result.counters
        self.t.append(t)
        self.capping.append(took_watts(result))
        cut = np.asarray(d.cut_levels)
        self.cut.append(cut != 0 if len(cut) else np.zeros(self.n_gpus, dtype=bool))
        state = result.state
        if state is not None and len(d.cap_w) == self.n_gpus:
            self.carried = carry_causes(self.carried, state.cap_w, d, np.asarray(state.phase))
        self.cause.append(self.carried.cause)
        self.staged_from.append(self.carried.staged_from_w)
        self.sent += c.commands_sent
        self.acked += c.acks_received
        self.resent += c.resends
        self.missing += c.acks_missing
        self.superseded += c.superseded


def _all_gpus(topology: Topology, seed: int) -> dict[str, list[_AccountedGpu]]:
    """Each node's simulated GPUs (as ``open_simulated`` makes them), with their books; a
    clock lock acts on them as the budgets file's clock table says."""
    out = {}
    for k, name in enumerate(topology.servers):
        server = topology.server(name)
        count, model = parse_spec(f"{server.gpus}x{server.model}")
        table = topology.clock_table(model.key)  # as the controller chose its clock from
        out[name] = [
            _AccountedGpu(model, i, phase="idle", seed=seed * 100_003 + k, clock_table=table)
            for i in range(count)
        ]
    return out


async def run_demo(
    options: DemoOptions,
    on_tick: Callable[[LiveState], None] | None = None,
    tick_s: float = 0.25,
) -> DemoRun:
    """Run the demo for ``options.duration_s`` (plus setup and teardown).

    ``on_tick`` is called every ``tick_s`` with the live state (the live view,
    or the event log when there is none).
    """
    wall0 = time.monotonic()
    topology = options.topology or load_budgets(options.budgets or default_budgets_path())
    plans = default_jobs(
        topology,
        options.duration_s,
        staged_starts=options.smoothing,
        compute_s=options.compute_s,
        comm_s=options.comm_s,
        checkpoint_s=options.checkpoint_s,
    )
    gpus_by_node = _all_gpus(topology, options.seed)
    gpus = [g for name in topology.servers for g in gpus_by_node[name]]
    state = LiveState(topology, options.duration_s, cycle_s=options.cycle_s)
    sampler = _Sampler(topology, gpus)
    cycles = _Cycles(topology.n_nodes, topology.n_gpus)
    stop = asyncio.Event()
    tasks: list[asyncio.Task[Any]] = []
    jobs: list[TrainingJob] = []
    job_tasks: list[asyncio.Task[Any]] = []
    fills: dict[str, FillFollower | None] = {}
    account: PhaseAccount | None = None
    broker = EmbeddedBroker()
    await broker.__aenter__()
    try:
        # the controller role's key for this run only: agents obey what it signs, as in
        # production; nothing else on the embedded broker can move a simulated GPU
        signer = Signer.generate()
        agents = _agents(topology, gpus_by_node, broker.url, options, Verifier([signer.trusted()]))
        recorder = open_recorder(options.record) if options.record else None
        config = _controller_config(broker.url, options)
        service = build_service(config, topology, recorder, signer=signer)
        tasks += [asyncio.create_task(a.run(stop), name=a.config.node) for a in agents]
        tasks.append(asyncio.create_task(service.run(stop), name="controller"))
        await _wait_ready(agents, service, tasks)
        state.epoch = service.core.epoch
        state.t0 = t0 = time.monotonic()
        for gpu in gpus:
            gpu.start_account()
        setup_s = t0 - wall0

        def on_cycle(result: CycleResult) -> None:
            cycles.add(max(0.0, time.monotonic() - t0), result)
            state.cycle = result
            state.cycles += 1
            if state.last_capping_s is None:
                state.last_capping_s = np.full(topology.n_nodes, -np.inf)
            state.last_capping_s[took_watts(result)] = time.monotonic() - t0
            state.commands_sent = cycles.sent
            state.acks_received = cycles.acked

        def on_phase(plan: JobPlan, at: float, phase: str) -> None:
            state.events.append(f"{at:5.1f} s  {plan.name} ({plan.priority}): {phase}")

        # the jobs' fill followers are subscribed before their jobs start, so that none
        # misses its first fill targets. (This order also kept clear of an amqtt 0.12 race:
        # replaying retained messages on CONNECT, it walked every subscription of the
        # broker, awaiting, and a SUBSCRIBE adding a topic meanwhile ended the connection,
        # "dictionary changed size". powerd.mqtt.embedded_broker now replays a session's own
        # subscriptions only, so a clean session's CONNECT no longer awaits in that walk.)
        fills = {p.name: _fill_follower(p, broker.url, options, gpus_by_node) for p in plans}
        await _subscribed([f for f in fills.values() if f is not None])
        for plan in plans:
            job_gpus = _job_gpus(plan, gpus_by_node)
            reporter = _reporter(plan, broker.url, options)
            fill = fills[plan.name]
            jobs.append(TrainingJob(plan, job_gpus, reporter, t0, on_phase, fill=fill))
        state.jobs = jobs
        for result in service.cycles:  # the setup's cycles, before the jobs' clock started
            on_cycle(result)
        service.cycle_listeners.append(on_cycle)
        job_tasks = [asyncio.create_task(job.run(), name=job.plan.name) for job in jobs]
        record_s = options.duration_s + (_ramp_down_tail_s(service) if options.smoothing else 0.0)
        state.duration_s = record_s
        await _record(record_s, options, state, sampler, on_tick, tick_s, tasks + job_tasks)
        account = phase_account(gpus)
        # every job's script ends before the duration: they are done or about to be
        await asyncio.wait_for(asyncio.gather(*job_tasks), 10.0)
    finally:
        await _teardown(stop, job_tasks, tasks)
        for follower in fills.values():
            if follower is not None:
                follower.close()
        await _bounded(broker.__aexit__(None, None, None), "the embedded broker's shutdown")
    # the controller has stopped: the acks that came after its last cycle
    cycles.acked += service.core.counters.acks_received
    cycles.pending_at_end = len(service.core.pending)
    trace = _trace(topology, sampler, cycles, jobs, options, state.duration_s, account)
    recorded = None if service.recorder is None else service.recorder.stats()
    return DemoRun(topology, trace, summarize(trace), setup_s, time.monotonic() - wall0, recorded)


def _agents(
    topology: Topology,
    gpus_by_node: Mapping[str, Sequence[SimulatedGpu]],
    url: str,
    options: DemoOptions,
    verifier: Verifier,
) -> list[AgentDaemon]:
    """One agent per node, holding the failsafe cap the budgets file gives that node."""
    broker = parse_broker_url(url)
    return [
        AgentDaemon(
            AgentConfig(
                node=name,
                cluster=options.cluster,
                period_s=options.agent_period_s,
                failsafe_after_s=options.failsafe_after_s,
                broker=broker,
                failsafe=FailsafeConfig(cap_w=topology.failsafe_cap_w(name)),
                software_smoothing=options.smoothing,
            ),
            gpus_by_node[name],
            verifier=verifier,
        )
        for name in topology.servers
    ]


def _controller_config(url: str, options: DemoOptions) -> ControllerConfig:
    """The controller's defaults with every timing scaled to the demo's cycle."""
    cycle_s = options.cycle_s
    return dataclasses.replace(
        ControllerConfig(name="demo-controller", cluster=options.cluster),
        broker=parse_broker_url(url),
        cycle_s=cycle_s,
        heartbeat_s=cycle_s,
        stale_after_s=4 * cycle_s,
        ack_timeout_s=3 * cycle_s,
        command_ttl_s=20 * cycle_s,
        takeover_after_s=4 * cycle_s,
        epoch_discovery_s=0.2,
        policy=_policy_for(cycle_s, options.safety_by_caps),
        grid_smoothing=options.smoothing,
        agent_comm_clock=options.agent_comm_clock,
    )


async def _teardown(
    stop: asyncio.Event, job_tasks: list[asyncio.Task[Any]], tasks: list[asyncio.Task[Any]]
) -> None:
    """Stop the jobs, then agents and controller (they say goodbye on the broker); raise
    what failed. Every wait is bounded: a client stuck in its disconnect is cancelled."""
    for task in job_tasks:
        task.cancel()
    await _bounded(asyncio.gather(*job_tasks, return_exceptions=True), "the jobs' stop")
    stop.set()
    for task in tasks:
        if task.get_name() == "cycles":
            task.cancel()
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=TEARDOWN_TIMEOUT_S)
    for task in pending:
        log.warning("demo teardown: %s did not stop in %g s", task.get_name(), TEARDOWN_TIMEOUT_S)
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=2.0)
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise RuntimeError(f"{task.get_name()} failed") from task.exception()


async def _bounded(awaitable: Awaitable[Any], what: str) -> None:
    try:
        await asyncio.wait_for(awaitable, TEARDOWN_TIMEOUT_S)
    except TimeoutError:
        log.warning("demo teardown: %s took over %g s; left behind", what, TEARDOWN_TIMEOUT_S)


async def _record(
    record_s: float,
    options: DemoOptions,
    state: LiveState,
    sampler: _Sampler,
    on_tick: Callable[[LiveState], None] | None,
    tick_s: float,
    tasks: list[asyncio.Task[Any]],
) -> None:
    """Sample the GPUs every ``sample_s`` and tick the view for ``record_s``."""
    t0 = state.t0
    end = t0 + record_s
    next_sample = t0
    next_tick = t0 if on_tick is not None else end
    while (now := time.monotonic()) < end:
        if now >= next_sample:
            state.node_power_w, state.gpu_cap_w, state.gpu_locked = sampler.sample(now - t0)
            next_sample = max(next_sample + options.sample_s, now)
        if on_tick is not None and now >= next_tick:
            on_tick(state)
            next_tick = max(next_tick + tick_s, now)
        _raise_if_failed(tasks)
        await asyncio.sleep(max(0.0, min(next_sample, next_tick, end) - time.monotonic()))
    state.node_power_w, state.gpu_cap_w, state.gpu_locked = sampler.sample(time.monotonic() - t0)
    if on_tick is not None:
        on_tick(state)


def _policy_for(cycle_s: float, safety_by_caps: bool = True) -> PolicySettings:
    """The default policy, its per-cycle steps scaled so it hands watts back as fast per second
    as the defaults do at their 1 s cycle (not twice as fast at 0.5 s)."""
    default = PolicySettings(safety_by_caps=safety_by_caps)
    scale = min(1.0, cycle_s / 1.0)
    return dataclasses.replace(
        default,
        uncap_step_fraction=default.uncap_step_fraction * scale,
        uncap_min_step_w=default.uncap_min_step_w * scale,
    )


def _fill_follower(
    plan: JobPlan,
    url: str,
    options: DemoOptions,
    gpus_by_node: Mapping[str, Sequence[SimulatedGpu]],
) -> FillFollower | None:
    """With smoothing: the job's side of software smoothing, busy work on its own GPUs."""
    if not options.smoothing:
        return None

    def fill(node: str, targets: dict[int, float]) -> None:
        gpus = gpus_by_node[node]
        for index, watts in targets.items():
            if 0 <= index < len(gpus):
                gpus[index].set_fill_w(watts)

    return FillFollower(url, plan.nodes, fill, cluster=options.cluster)


async def _subscribed(followers: list[FillFollower]) -> None:
    """Start the followers one at a time: each subscribed before the next connects."""
    for follower in followers:
        follower.start()
        if not await asyncio.to_thread(follower.wait_subscribed, SETUP_TIMEOUT_S):
            raise RuntimeError(f"a fill follower did not subscribe in {SETUP_TIMEOUT_S:g} s")


def _ramp_down_tail_s(service: ControllerService) -> float:
    """How long the GPUs need to ramp down from their highest cap after the jobs stop: the
    demo records that much longer with smoothing, so the summary sees the end."""
    profile = service.core.settings.smoothing
    if profile is None or profile.ramp_down_w_per_s <= 0:
        return 0.0
    top_w = float(np.max(service.core.tree.cap_max_w))
    return top_w / profile.ramp_down_w_per_s + profile.ramp_down_hysteresis_ms / 1000.0 + 1.0


def _job_gpus(
    plan: JobPlan, gpus_by_node: Mapping[str, Sequence[SimulatedGpu]]
) -> list[SimulatedGpu]:
    return [g for node in plan.nodes for g in gpus_by_node[node]]


def _reporter(plan: JobPlan, url: str, options: DemoOptions) -> PhaseReporter:
    return PhaseReporter(
        url,
        job=plan.name,
        nodes=plan.nodes,
        priority=plan.priority,
        cluster=options.cluster,
        reconnect_max_s=1.0,
    )


async def _wait_ready(
    agents: list[AgentDaemon], service: ControllerService, tasks: list[asyncio.Task[Any]]
) -> None:
    """Every agent connected and the controller leading, or an error that says what is not."""
    waits = [a.connected.wait() for a in agents] + [service.leading.wait()]
    gathered = asyncio.gather(*waits)
    try:
        await asyncio.wait_for(gathered, SETUP_TIMEOUT_S)
    except TimeoutError:
        _raise_if_failed(tasks)
        down = [a.config.node for a in agents if not a.connected.is_set()]
        raise RuntimeError(
            f"demo setup took over {SETUP_TIMEOUT_S:g} s: "
            f"{len(down)} agents not connected ({', '.join(down[:3])}...), "
            f"controller {'leading' if service.leading.is_set() else 'not leading'}"
        ) from None


def _raise_if_failed(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise RuntimeError(f"{task.get_name()} stopped") from task.exception()


def _trace(
    topology: Topology,
    sampler: _Sampler,
    cycles: _Cycles,
    jobs: list[TrainingJob],
    options: DemoOptions,
    duration_s: float,
    account: PhaseAccount | None = None,
) -> RunRecord:
    tree = sampler.tree
    gpu_job = np.full(topology.n_gpus, -1)
    for k, job in enumerate(jobs):
        for node in job.plan.nodes:
            gpus = topology.server_gpus(node)
            gpu_job[gpus.start : gpus.stop] = k
    n_nodes, n_gpus = topology.n_nodes, topology.n_gpus

    def stack(rows: list[np.ndarray], width: int, dtype: type = float) -> np.ndarray:
        return np.array(rows, dtype=dtype) if rows else np.zeros((0, width), dtype=dtype)

    return RunRecord(
        names=topology.names,
        level=np.asarray(tree.level, dtype=int),
        limit_w=np.asarray(tree.limit_w, dtype=float),
        budget_w=np.asarray(tree.budget_w, dtype=float),
        cap_threshold_w=np.asarray(tree.cap_threshold_w, dtype=float),
        gpu_job=gpu_job,
        overhead_total_w=float(sampler.overhead[SITE]),
        site_ramp_limit_w_per_s=float(tree.ramp_w_per_s[SITE]),
        t=np.array(sampler.t),
        node_power_w=stack(sampler.power, n_nodes),
        gpu_cap_w=stack(sampler.cap, n_gpus),
        gpu_locked=stack(sampler.locked, n_gpus, bool),
        gpu_phase=stack(sampler.phase, n_gpus, np.int8),
        gpu_throughput=stack(sampler.throughput, n_gpus),
        gpu_energy_j=np.array(sampler.energy),
        phase_account=account,
        cycle_t=np.array(cycles.t),
        cycle_capping=stack(cycles.capping, n_nodes, bool),
        cycle_cut=stack(cycles.cut, n_gpus, bool),
        cycle_cause=stack(cycles.cause, n_gpus, np.int8),
        cycle_staged_from_w=stack(cycles.staged_from, n_gpus),
        commands_sent=cycles.sent,
        acks_received=cycles.acked,
        resends=cycles.resent,
        acks_missing=cycles.missing,
        commands_superseded=cycles.superseded,
        commands_pending_at_end=cycles.pending_at_end,
        jobs=[
            JobRecord(
                name=job.plan.name,
                priority=job.plan.priority,
                nodes=len(job.plan.nodes),
                gpus=len(job.gpus),
                phases=list(job.phases),
                rise_first_s=job.rise_first_s,
                rise_first_spans=list(job.rise_first_spans),
            )
            for job in jobs
        ],
        duration_s=duration_s,
        gpu_fill_energy_j=np.array(sampler.fill_energy) if options.smoothing else None,
        gpu_power_w=stack(sampler.gpu_power, n_gpus),
        gpu_demand_w=stack(sampler.gpu_demand, n_gpus),
        gpu_fill_energy_each_j=stack(sampler.gpu_fill_energy, n_gpus)
        if options.smoothing
        else None,
        gpu_row=np.asarray(tree.gpu_ancestor[ROW], dtype=int),
        grid=topology.grid,
    )
