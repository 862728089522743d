"""The synthetic training jobs of the demo: who runs where, and the phases they go through.

A synchronous data-parallel LLM job moves all its GPUs together: a start
(loading the model and data: GPUs nearly idle), then steps of compute followed
by *exposed* communication (the part of the gradient all-reduce that
computation does not hide: every GPU waits on the network), a checkpoint now
and then (GPUs nearly idle, storage busy), and a stop. This synchronisation is
what makes a training site's power swing (docs/DOMAIN.md: Llama 3,
Meta's "large, synchronized power oscillations").

Each job announces its phases through :class:`powerd.jobhook.PhaseReporter`,
the documented client a real training loop uses, and switches every simulated
GPU it runs on to the same phase at the same moment.

Time is compressed so the whole story fits in well under a minute: a step is
a few seconds of compute and one second of exposed communication, a
checkpoint a few seconds (a real job computes for seconds to minutes per step
and checkpoints for tens of seconds every half hour or so). One second of
waiting is still two controller cycles, so the controller sees every phase.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from policies.rules import WAITING_PHASES
from powerd.gpu.simulated import SimulatedGpu
from powerd.jobhook import FillFollower, PhaseReporter
from powerd.topology import Topology

MIN_DURATION_S = 20.0  # what the shortest script needs to show every phase
COMPUTE_S = 3.0  # the high-priority job's compute per step; the low-priority one's is longer
LOW_COMPUTE_EXTRA_S = 0.5  # so the two jobs' communication drifts in and out of step
COMM_S = 1.5  # exposed communication per step
CHECKPOINT_S = 3.0  # each job's one checkpoint (compressed: a real one takes tens of seconds)
COME_BACK_S = 1.0  # compute a job needs after its checkpoint before it stops, or it skips it
FILL_DONE_MARGIN_W = 10.0  # a GPU filled to within this of its idle power is done
RAMP_DOWN_TIMEOUT_S = 30.0  # a job gives up filling down the ramp after this
RISE_TIMEOUT_S = 30.0  # a job gives up filling back up after a long wait after this

log = logging.getLogger("powerd.demo")


@dataclass(frozen=True)
class JobPlan:
    """When a job does what, in seconds since the demo's clock started."""

    name: str
    priority: str  # high, normal, low
    nodes: tuple[str, ...]
    start_s: float
    startup_s: float
    compute_s: float
    comm_s: float
    checkpoint_after_s: float  # the first step boundary after this starts the checkpoint
    checkpoint_s: float
    stop_s: float

    def timeline(self) -> list[tuple[float, str]]:
        """(at, phase) for every phase change, ``startup`` first and ``shutdown`` last."""
        out = [(self.start_s, "startup")]
        t = self.start_s + self.startup_s
        out.append((t, "compute"))
        checkpointed = False
        while True:
            comm_at = t + self.compute_s
            if comm_at + self.comm_s > self.stop_s:
                break
            out.append((comm_at, "communication"))
            t = comm_at + self.comm_s
            out.append((t, "compute"))
            if not checkpointed and t >= self.checkpoint_after_s:
                if t + self.checkpoint_s + COME_BACK_S > self.stop_s:  # no time to come back
                    break
                out.append((t, "checkpoint"))
                t += self.checkpoint_s
                out.append((t, "compute"))
                checkpointed = True
        out.append((self.stop_s, "shutdown"))
        # a checkpoint replaces the compute that began at the same instant
        return [(at, ph) for k, (at, ph) in enumerate(out) if not _superseded(out, k)]


def _superseded(events: list[tuple[float, str]], k: int) -> bool:
    return k + 1 < len(events) and events[k + 1][0] == events[k][0]


def default_jobs(
    topology: Topology,
    duration_s: float,
    staged_starts: bool = False,
    compute_s: float = COMPUTE_S,
    comm_s: float = COMM_S,
    checkpoint_s: float = CHECKPOINT_S,
) -> list[JobPlan]:
    """Two jobs: a high-priority one on the first row, a low-priority one on the others.

    The high-priority job starts staged (its caps rise gradually from the
    staged start cap, so it never needs capping); the low-priority one jumps
    straight into compute a few seconds later, so capping must bite.

    Each row's budget bounds its own job's swings; the site, which both share,
    is where priorities decide: when it must come down, the low-priority job
    gives first. Their steps differ in length, so their communication phases
    drift in and out of step with each other, as two independent jobs' do.
    With a single row, its racks are split in half between the two jobs.

    ``staged_starts`` (the demo with grid smoothing): the low-priority job starts
    staged too, as a grid-friendly site asks of every job: a jump from idle to full
    compute is a rise no smoothing of the falls can bound.

    ``compute_s`` and ``comm_s``: the rhythm of a step, compute then exposed
    communication (the low-priority job computes ``LOW_COMPUTE_EXTRA_S`` longer).
    The default is compressed: a third of each step waits. A real job computes for
    seconds to minutes and waits a small share of that (the 150 MW whatif's rhythm:
    0.5 s in every 10 s, docs/PLANNER.md). ``checkpoint_s``: each job's one checkpoint,
    which begins at the first step boundary after about half the run (the 150 MW
    whatif's take 30 s).
    """
    if duration_s < MIN_DURATION_S:
        raise ValueError(f"the demo needs at least {MIN_DURATION_S:g} s, not {duration_s:g}")
    check_rhythm(duration_s, compute_s, comm_s)
    check_checkpoint(duration_s, compute_s, comm_s, checkpoint_s, staged_starts)
    by_rack: dict[str, list[str]] = {}
    for name in topology.servers:
        by_rack.setdefault(topology.parent_of(name) or "", []).append(name)
    racks_by_row: dict[str, list[str]] = {}
    for rack in by_rack:
        racks_by_row.setdefault(topology.parent_of(rack) or "", []).append(rack)
    rows = list(racks_by_row.values())
    if len(rows) >= 2:
        first_racks, other_racks = rows[0], [r for racks in rows[1:] for r in racks]
    else:
        half = max(1, len(rows[0]) // 2)
        first_racks, other_racks = rows[0][:half], rows[0][half:]
    first = [n for rack in first_racks for n in by_rack[rack]]
    rest = [n for rack in other_racks for n in by_rack[rack]]
    high, low = _timings(duration_s, compute_s, comm_s, checkpoint_s, staged_starts)
    plans = [
        dataclasses.replace(high, nodes=tuple(first)),
        dataclasses.replace(low, nodes=tuple(rest)),
    ]
    return [p for p in plans if p.nodes]


def _timings(
    duration_s: float, compute_s: float, comm_s: float, checkpoint_s: float, staged_starts: bool
) -> tuple[JobPlan, JobPlan]:
    """The two jobs' plans on no nodes yet: when each does what (``default_jobs``)."""
    d = duration_s
    high = JobPlan(
        name="llm-high",
        priority="high",
        nodes=(),
        start_s=1.0,
        startup_s=2.5,
        compute_s=compute_s,
        comm_s=comm_s,
        checkpoint_after_s=0.50 * d,
        checkpoint_s=checkpoint_s,
        stop_s=d - 3.5,
    )
    # The low-priority job starts once its idle racks have had their caps handed
    # back, and skips the staged start (it announces startup and computes at once,
    # as a job resumed from an in-memory checkpoint does): its racks and row jump
    # from idle to full compute under high caps, and the controller must cap them.
    low = JobPlan(
        name="llm-low",
        priority="low",
        nodes=(),
        start_s=max(3.0, 0.15 * d),
        startup_s=2.5 if staged_starts else 0.1,
        compute_s=compute_s + LOW_COMPUTE_EXTRA_S,
        comm_s=comm_s,
        checkpoint_after_s=0.45 * d,
        checkpoint_s=checkpoint_s,
        stop_s=d - 2.0,
    )
    return high, low


def check_rhythm(duration_s: float, compute_s: float, comm_s: float) -> None:
    """ValueError unless a step (compute, then communication) is within range and the run
    holds two of the low-priority job's steps: fewer show no rhythm."""
    if not (math.isfinite(compute_s) and 0.5 <= compute_s <= 600):
        raise ValueError(f"compute per step must be 0.5 to 600 s, not {compute_s:g}")
    if not (math.isfinite(comm_s) and 0.1 <= comm_s <= 60):
        raise ValueError(f"communication per step must be 0.1 to 60 s, not {comm_s:g}")
    step_s = compute_s + LOW_COMPUTE_EXTRA_S + comm_s
    if 2 * step_s > 0.5 * duration_s:
        raise ValueError(
            f"a step of {step_s:g} s (the low-priority job's) needs a run of at least "
            f"{4 * step_s:g} s to show two before its checkpoint, not {duration_s:g}"
        )


def check_checkpoint(
    duration_s: float,
    compute_s: float,
    comm_s: float,
    checkpoint_s: float,
    staged_starts: bool = False,
) -> None:
    """ValueError unless the checkpoint is within range and both jobs take it: it begins at
    the first step boundary after about half the run and needs a second of compute after
    it before the job stops (``JobPlan.timeline``), so where the boundaries fall decides.
    Call ``check_rhythm`` first."""
    if not (math.isfinite(checkpoint_s) and 0.5 <= checkpoint_s <= 600):
        raise ValueError(f"a checkpoint must take 0.5 to 600 s, not {checkpoint_s:g}")
    plans = _timings(duration_s, compute_s, comm_s, checkpoint_s, staged_starts)
    missed = [p.name for p in plans if "checkpoint" not in {ph for _, ph in p.timeline()}]
    if missed:
        # enough whatever the boundaries, from the high-priority job's plan (the later
        # checkpoint and the earlier stop): it begins within a step after its share of the
        # run, and the second back and the time left after its stop are what it needs more
        high = plans[0]
        after_share = high.checkpoint_after_s / duration_s
        needed_s = checkpoint_s + COME_BACK_S + (duration_s - high.stop_s) + compute_s + comm_s
        enough_s = needed_s / (1.0 - after_share)
        raise ValueError(
            f"a checkpoint of {checkpoint_s:g} s does not fit in {', '.join(missed)} in a "
            f"{duration_s:g} s run (it begins after half the run and needs a second to come "
            f"back before the job stops); a run of {math.ceil(enough_s)} s always fits it"
        )


class TrainingJob:
    """Runs one plan: announces each phase and switches the job's GPUs to it."""

    def __init__(
        self,
        plan: JobPlan,
        gpus: Sequence[SimulatedGpu],
        reporter: PhaseReporter,
        t0: float,
        on_phase: Callable[[JobPlan, float, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        fill: FillFollower | None = None,
    ) -> None:
        """``fill``: software power smoothing, the job's side: its GPUs are kept busy up to
        the agents' fill targets, and at its end down the ramp before it exits."""
        self.plan = plan
        self.fill = fill
        self.gpus = list(gpus)
        self.reporter = reporter
        self.t0 = t0
        self.clock = clock
        self.on_phase = on_phase
        self.phases: list[tuple[float, str]] = []  # (at, phase) as it happened
        self.rise_first_s = 0.0  # spent filling back up after long waits, before compute
        self.rise_first_spans: list[tuple[float, float]] = []  # (from, to), since t0

    @property
    def phase(self) -> str | None:
        return self.phases[-1][1] if self.phases else None

    async def run(self) -> None:
        plan, reporter = self.plan, self.reporter
        try:
            for at, phase in plan.timeline():
                await asyncio.sleep(max(0.0, self.t0 + at - self.clock()))
                if self.phase in WAITING_PHASES and phase not in (*WAITING_PHASES, "shutdown"):
                    await self._rise_first()  # a job that stops does not fill back up
                if phase == "startup":
                    reporter.startup(nodes=plan.nodes, expected_s=plan.startup_s)
                elif phase in WAITING_PHASES:
                    reporter.set_phase(phase, expected_s=self._expected_s(phase))
                elif phase != "shutdown":
                    reporter.set_phase(phase)
                self._tell_fill(phase, self._left_s(at, phase))
                self._switch(phase)
                if phase == "shutdown":  # announces it, then flushes: blocking, so in a thread
                    await asyncio.to_thread(reporter.shutdown, 2.0)
                    await self._ramp_down()
        finally:
            self._stop_filling()
            if self.phase is None:  # cut short before it started
                await asyncio.to_thread(reporter.close, 1.0)
            elif self.phase != "shutdown":  # cut short: the job is gone all the same
                self._switch("shutdown")
                await asyncio.to_thread(reporter.shutdown, 1.0)

    def _expected_s(self, phase: str) -> float | None:
        """How long the job expects ``phase`` to last, as it announces it."""
        return {"communication": self.plan.comm_s, "checkpoint": self.plan.checkpoint_s}.get(phase)

    def _left_s(self, at: float, phase: str) -> float | None:
        """How long ``phase``, due at ``at``, has left now: its expected length from when it
        was due, not from now. Told from now, a wait whose announcement came late (a
        loaded machine: tens of ms) planned its end that much after compute resumed, and
        compute waited to fill back up the difference (0.002 kWh lost in a demo)."""
        expected_s = self._expected_s(phase)
        if expected_s is None:
            return None
        return max(0.0, self.t0 + at + expected_s - self.clock())

    def _tell_fill(self, phase: str, expected_s: float | None = None) -> None:
        """The job's side of software smoothing: only the job knows when it waits (and, as
        it announces, for how long it expects to)."""
        if self.fill is None:
            return
        if phase == "shutdown":
            self.fill.stopping()  # fall down the ramp, no floor
        elif phase == "startup":
            self.fill.starting()  # rise slowly to the cap before the first step
        elif phase in WAITING_PHASES:
            self.fill.waiting(expected_s, checkpoint=phase == "checkpoint")
        else:
            self.fill.working()

    async def _rise_first(self) -> None:
        """After a checkpoint, or a wait that lets compute step up by more than a window's
        share (``FillFollower.must_rise_first``), fill the GPUs back up at the ramp-up rate
        before computing, still announced as the wait. The controller counts a checkpoint's
        GPUs, and a collective's once it outlasts the hysteresis, as rising on their own
        until compute is announced, and then only for the step a short wait leaves (rule 4
        of policies/capping.py): a larger step at once would come on top of the caps it
        hands back. The time it takes comes out of the compute that follows."""
        if self.fill is None:
            return
        started = self.clock()
        after_checkpoint = self.phase == "checkpoint"
        if self.fill.fill_back_up(0.0, after_checkpoint):  # nothing to fill, or filled up
            return
        # it has started filling up (starting()): wait for it, not for fill_back_up again,
        # which a job already starting would take as nothing to fill
        if not await asyncio.to_thread(self.fill.wait_risen, RISE_TIMEOUT_S):
            log.warning("%s: the fill did not rise in %g s", self.plan.name, RISE_TIMEOUT_S)
        ended = self.clock()
        self.rise_first_s += ended - started
        self.rise_first_spans.append((started - self.t0, ended - self.t0))

    async def _ramp_down(self) -> None:
        """Keep filling down the agents' ramp until every GPU is back near its idle power."""
        if self.fill is None or not self.gpus:
            return
        idle_w = max(g.model.idle_power_w for g in self.gpus)
        done_w = idle_w + FILL_DONE_MARGIN_W
        if not await asyncio.to_thread(self.fill.wait_ramped, done_w, RAMP_DOWN_TIMEOUT_S):
            log.warning(
                "%s: the fill targets did not ramp down in %g s",
                self.plan.name,
                RAMP_DOWN_TIMEOUT_S,
            )

    def _stop_filling(self) -> None:
        if self.fill is None:
            return
        self.fill.close()
        for gpu in self.gpus:
            gpu.set_fill_w(None)

    def _switch(self, phase: str) -> None:
        gpu_phase = "idle" if phase == "shutdown" else phase
        for gpu in self.gpus:
            gpu.set_phase(gpu_phase)
        at = self.clock() - self.t0
        self.phases.append((at, phase))
        if self.on_phase is not None:
            self.on_phase(self.plan, at, phase)
