"""What a demo run recorded, and what it adds up to: pure functions over numpy arrays.

The runner fills a :class:`RunRecord` (ground truth sampled from the simulated
GPUs, what the controller decided every cycle, what the jobs did);
:func:`summarize` turns it into a :class:`Summary`, the numbers printed at the
end, written by ``--summary-json`` and behind the exit code. No I/O and no
clocks here, so the tests build traces by hand.

Definitions
-----------
- *Power of a tree node*: the power every GPU under it draws (read from the
  simulated devices, not from telemetry: what the breaker sees) plus every
  overhead under it (node CPUs and fans, rack switches, site facility).
- *Seconds over*: sample ``i`` stands for ``[t_i, t_{i+1})``; a level is over
  its budget (limit) during a sample when any tree node of that level draws
  more than its ``budget_w`` (``limit_w``). ``any`` counts a sample once when
  any tree node at any level is over.
- *Site ramp* and *the grid*: measured by ``policies.grid`` (the functions
  ``powerplan whatif`` uses; one definition of each metric, docs/BUDGETS.md
  "The grid spec"), which wants one series at a fixed step. The samples are
  put on a regular grid first (:func:`regular_series`: the median sample step
  to the millisecond, each point the samples around it interpolated linearly, as
  a meter reading at that instant would see a draw that moves between them;
  regular samples come back unchanged). The ramp is then ``(p[t] - p[t - w]) /
  (w dt)`` over ``w`` whole steps: the largest rise (and fall) of site power
  over ``RAMP_WINDOW_S`` (1 s), in W/s. Holding the last sample instead reads a
  steady 18 kW/s fall as 20 kW/s wherever the sampler slips a step (a 1 s
  window then spans 1.1 s of samples); interpolation's own error: a step of
  power between two samples is spread over the time between them (under 0.15
  s), so a window whose end falls inside that time sees part of it, and those
  around it all of it. Beside it, the
  largest 1 s rise of the sum of the GPUs' caps, which is what the site's
  ``ramp_w_per_s`` limits (power itself jumps when a job leaves a wait under
  caps set while it waited). With a ``[site.grid]`` (``RunRecord.grid``) the
  site's power is measured against it (``Summary.grid``): ramp up and down
  over the spec's window (max and p99), the share of its variance in the
  oscillation band (the part the step can see: 0.1 s steps see up to 5 Hz),
  the worst peak-to-peak, the seconds outside each limit, and ``breaches``
  lists every limit broken. Without one the same is measured with the
  defaults, ``spec`` says "no grid spec" and nothing is a breach. Breaches are
  warnings (``Summary.verdict``: "ok, with warnings"), not failures: the exit
  code is about breakers (limits), not the grid.
- *Energy*: the GPUs' energy counters (exact) plus every overhead times the
  run's length.
- *Throughput relative to uncapped*: over the GPU-seconds a job spends in a
  phase that does training work (``compute``, ``eval``), the mean of each
  GPU's speed relative to the same GPU in the same phase with no cap and no
  clock lock (``SimulatedGpu.throughput_rel``). 1.0 means capping cost
  nothing; the phases themselves follow the job's script, so communication and
  checkpoints (no progress, capped or not) do not count either way.
  What was lost is split by cause (``policies.causes``): a GPU-sample below
  full speed is charged to the clock lock if its clock was locked, else to
  the rule that last lowered its cap as of the newest controller cycle at or
  before the sample (``RunRecord.cycle_cause``; failsafe start before the
  first). The causes add up to ``1 - throughput_rel``; ``held_share`` is the
  share of the job's progress GPU-seconds below full speed. A job's
  ``rise_first_s`` is how long its compute waited, after checkpoints and long
  waits, for its GPUs to fill back up (software grid smoothing): time the
  throughput, over progress phases, leaves out, so the summary states it beside
  (and ``rise_first_spans`` when); the grid report counts it as work lost to the
  grid (``_grid_need``), with what a grid rule held back.
- *Clock locks*: GPU-seconds with the SM clock locked, in all; in communication
  (and the share of communication GPU-time locked); outside it; and in a progress
  phase (``compute``, ``eval``: *locked compute*, a lock that outlived the wait it
  was for), with the throughput that cost (the ``clock lock`` cause above). All
  sampled, as everything above. Beside them, from ``RunRecord.phase_account``
  (exact, booked at every phase change, lock and unlock of every GPU): locked
  compute and locked outside communication again (``exact_...``), and the GPUs'
  energy in communication, what a comm lock is there to save. Samples cannot do
  these: an agent reacts to a job's announcement in tens of milliseconds, and a
  sample that falls between the switch and the reaction counts a whole step (the
  demo's jobs switch on the sampler's grid, so one does at every switch).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from policies import grid as grid_measure
from policies.causes import (
    CLOCK_LOCK,
    FAILSAFE,
    LOST_CAUSES,
    NOT_HELD,
    grid_held_w,
    loss_by_cause,
)
from policies.rules import WAITING_PHASES
from policies.tree import LEVEL_NAMES, PHASE_CODES, in_codes, phase_codes
from powerd.topology.grid import GridSpec, grid_report
from powerd.vocabulary import PHASES, PROGRESS_PHASES

RAMP_WINDOW_S = 1.0
EXIT_OK, EXIT_LIMIT_VIOLATED = 0, 1
VERDICT_OK, VERDICT_WARNED, VERDICT_FAILED = "ok", "ok, with warnings", "limit violated"


@dataclass(frozen=True)
class JobRecord:
    """One synthetic job: what it was and the phases it went through."""

    name: str
    priority: str
    nodes: int
    gpus: int
    phases: list[tuple[float, str]]  # (seconds since the start, phase), in order
    # seconds its compute waited, after long waits, for its GPUs to fill back up (software
    # grid smoothing: FillFollower.fill_back_up); not in throughput_rel, which counts
    # progress phases only
    rise_first_s: float = 0.0
    rise_first_spans: list[tuple[float, float]] = field(default_factory=list)  # (from, to) s


@dataclass(frozen=True)
class PhaseAccount:
    """Exact totals over every GPU of a run, per job phase (``PHASES``): GPU-seconds with the
    SM clock locked, and the GPUs' energy, J. Booked at every event, not sampled."""

    locked_gpu_s: dict[str, float]
    energy_j: dict[str, float]


@dataclass
class RunRecord:
    """Everything a run recorded. Times are seconds since the jobs' clock started.

    Samples (``n_samples``) are ground truth read from the simulated GPUs every
    ``sample_s``; cycles (``n_cycles``) are the controller's decisions.
    """

    # --- the tree (n_nodes,) and GPUs (n_gpus,) ---
    names: tuple[str, ...]
    level: np.ndarray  # int: SITE, ROW, RACK, SERVER
    limit_w: np.ndarray
    budget_w: np.ndarray
    cap_threshold_w: np.ndarray
    gpu_job: np.ndarray  # int: index into ``jobs``, -1 for none
    overhead_total_w: float  # every overhead in the tree
    site_ramp_limit_w_per_s: float  # inf: none
    # --- samples ---
    t: np.ndarray  # (n_samples,)
    node_power_w: np.ndarray  # (n_samples, n_nodes)
    gpu_cap_w: np.ndarray  # (n_samples, n_gpus) enforced
    gpu_locked: np.ndarray  # (n_samples, n_gpus) bool: SM clock locked
    gpu_phase: np.ndarray  # (n_samples, n_gpus) int8 phase code
    gpu_throughput: np.ndarray  # (n_samples, n_gpus) relative to unconstrained
    gpu_energy_j: np.ndarray  # (n_samples,) sum of the GPUs' energy counters
    # --- controller cycles ---
    cycle_t: np.ndarray  # (n_cycles,)
    cycle_capping: np.ndarray  # (n_cycles, n_nodes) bool: took watts from GPUs under it
    cycle_cut: np.ndarray  # (n_cycles, n_gpus) bool: the cycle lowered this GPU's cap
    commands_sent: int = 0
    acks_received: int = 0
    resends: int = 0
    acks_missing: int = 0
    commands_pending_at_end: int = 0  # not acknowledged yet when the controller stopped
    commands_superseded: int = 0  # replaced by a newer command before their ack came
    jobs: list[JobRecord] = field(default_factory=list)
    duration_s: float = 0.0
    gpu_row: np.ndarray | None = None  # (n_gpus,) tree index of each GPU's row, for the plot
    grid: GridSpec | None = None  # the budgets file's [site.grid]; None: none
    # grid smoothing on: the GPUs' energy above their phases' own draw (floors, ramp-downs,
    # the jobs' busy work), (n_samples,) cumulative; None: smoothing off
    gpu_fill_energy_j: np.ndarray | None = None
    # per GPU: what each drew, (n_samples, n_gpus); and its fill energy, cumulative, with
    # smoothing on. None: not recorded (no least ready floor)
    gpu_power_w: np.ndarray | None = None
    gpu_fill_energy_each_j: np.ndarray | None = None
    # per GPU: what each would draw in its phase at its max limit, no cap (under its clock
    # lock), (n_samples, n_gpus): the demand lost work is counted from. None: not recorded
    gpu_demand_w: np.ndarray | None = None
    # (n_cycles, n_gpus) int8: after each cycle, the rule that last lowered each GPU's cap
    # (policies.causes); None: not recorded (every GPU then counts as at its failsafe cap)
    cycle_cause: np.ndarray | None = None
    # (n_cycles, n_gpus): the budget's cap a stage cut found (policies.causes.CarriedCauses;
    # inf: none); None: not recorded (a stage holds all the demand above its cap)
    cycle_staged_from_w: np.ndarray | None = None
    # exact per-phase totals over the recording (None: not kept; no energy by phase)
    phase_account: PhaseAccount | None = None

    @property
    def n_nodes(self) -> int:
        return len(self.names)


@dataclass
class Summary:
    duration_s: float
    samples: int
    cycles: int
    over_budget_s: dict[str, float]  # per level, and "any"
    over_limit_s: dict[str, float]
    peak_fraction_of_budget: dict[str, float]  # per level: max power / budget
    peak_fraction_of_limit: dict[str, float]
    limit_violations: list[dict[str, Any]]  # per tree node over its limit: when, how much
    peak_site_w: float
    peak_site_ramp_up_w_per_s: float
    peak_site_ramp_down_w_per_s: float
    peak_site_cap_ramp_up_w_per_s: float  # the same for the sum of the GPUs' caps
    site_ramp_limit_w_per_s: float | None  # on the sum of caps, what the controller enforces
    grid: dict[str, Any]  # site power measured as the grid sees it (module docstring)
    energy_gpu_wh: float
    energy_site_wh: float
    throughput_rel: float | None  # every job together; None if no job did any work
    # 1 - throughput_rel split by cause (policies.causes), of every job's progress GPU-seconds
    throughput_lost_by_cause: dict[str, float]
    jobs: dict[str, dict[str, Any]]
    commands: dict[str, int]
    capping: dict[str, Any]
    clock_locks: dict[str, float | None]
    phases_seen: list[str]

    @property
    def limit_violated(self) -> bool:
        return bool(self.limit_violations)

    @property
    def grid_breaches(self) -> list[str]:
        """'ramp up 12.3 s', ... : every grid limit the site's power broke (none without
        a grid spec)."""
        return list(self.grid.get("breaches", []))

    @property
    def exit_code(self) -> int:
        return EXIT_LIMIT_VIOLATED if self.limit_violated else EXIT_OK

    @property
    def verdict(self) -> str:
        """``limit violated`` (exit 1), ``ok, with warnings`` (exit 0: the site's power broke
        the grid spec, or the sum of caps rose faster than its ramp limit: the grid's
        concern, not the breakers') or ``ok``: what the outcome's last line says."""
        if self.limit_violated:
            return VERDICT_FAILED
        return VERDICT_WARNED if self.warnings else VERDICT_OK

    @property
    def warnings(self) -> list[str]:
        """'grid spec', 'ramp limit': what went wrong short of a limit."""
        ramp = self.site_ramp_limit_w_per_s
        over_ramp = ramp is not None and self.peak_site_cap_ramp_up_w_per_s > ramp
        return [
            w for w, hit in (("grid spec", self.grid_breaches), ("ramp limit", over_ramp)) if hit
        ]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["limit_violated"] = self.limit_violated
        out["verdict"] = self.verdict
        out["warnings"] = self.warnings
        out["exit_code"] = self.exit_code
        return out


def sample_durations(t: np.ndarray) -> np.ndarray:
    """How long each sample stands for: up to the next one; the last, the median step."""
    t = np.asarray(t, dtype=float)
    if len(t) < 2:
        return np.zeros(len(t))
    steps = np.diff(t)
    return np.append(steps, np.median(steps))


def regular_series(t: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, float]:
    """``values`` sampled at ``t`` on a regular grid: (series, step), the step the median
    sample step to the millisecond; the point at ``t[0] + k step`` interpolated linearly
    between the samples around it (the module docstring says why). Regular samples come
    back as they are; fewer than two give (``values``, 0)."""
    t = np.asarray(t, dtype=float)
    v = np.asarray(values, dtype=float)
    if len(t) < 2:
        return v.copy(), 0.0
    median = float(np.median(np.diff(t)))
    step = round(median, 3) or median  # to the millisecond: the sampler's lateness is noise
    if not step > 0:
        return v.copy(), 0.0
    n = math.floor((t[-1] - t[0]) / step + 1e-6) + 1
    at = np.minimum(t[0] + np.arange(n) * step, t[-1])
    return np.interp(at, t, v), step


def _ramp(
    series: np.ndarray, step: float, window_s: float, spec: GridSpec | None = None
) -> grid_measure.RampStats:
    """``policies.grid.ramp_stats`` of a regular series (limits from ``spec``, if any)."""
    if step <= 0 or len(series) < 2:
        return grid_measure.RampStats(window_s, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    up = spec.ramp_up_w_per_s if spec is not None else math.inf
    down = spec.ramp_down_w_per_s if spec is not None else math.inf
    return grid_measure.ramp_stats(series, step, window_s, up, down)


def summarize(trace: RunRecord) -> Summary:
    dt = sample_durations(trace.t)
    levels = [int(x) for x in np.unique(trace.level)]
    power = np.asarray(trace.node_power_w, dtype=float)
    n_samples = len(trace.t)
    over_budget = power > trace.budget_w[None, :]
    over_limit = power > trace.limit_w[None, :]

    def seconds(mask: np.ndarray) -> dict[str, float]:
        out = {
            LEVEL_NAMES[lvl]: float(dt[mask[:, trace.level == lvl].any(axis=1)].sum())
            for lvl in levels
        }
        out["any"] = float(dt[mask.any(axis=1)].sum()) if n_samples else 0.0
        return out

    def peak_fraction(of: np.ndarray) -> dict[str, float]:
        if not n_samples:
            return {LEVEL_NAMES[lvl]: 0.0 for lvl in levels}
        frac = power / of[None, :]
        return {LEVEL_NAMES[lvl]: float(frac[:, trace.level == lvl].max()) for lvl in levels}

    violations: list[dict[str, Any]] = []
    for k in np.flatnonzero(over_limit.any(axis=0)):
        hit = over_limit[:, k]
        first = int(np.argmax(hit))
        violations.append(
            {
                "name": trace.names[k],
                "level": LEVEL_NAMES[int(trace.level[k])],
                "limit_w": float(trace.limit_w[k]),
                "peak_w": float(power[hit, k].max()),
                "seconds": float(dt[hit].sum()),
                "first_at_s": float(trace.t[first]),
            }
        )
    violations.sort(key=lambda v: v["peak_w"] / v["limit_w"], reverse=True)

    site = power[:, 0] if n_samples else np.zeros(0)
    site_reg, step = regular_series(trace.t, site)
    ramp = _ramp(site_reg, step, RAMP_WINDOW_S)
    cap_sum = np.asarray(trace.gpu_cap_w, dtype=float).sum(axis=1) if n_samples else site
    cap_ramp = _ramp(regular_series(trace.t, cap_sum)[0], step, RAMP_WINDOW_S)
    elapsed = float(trace.t[-1] - trace.t[0]) if n_samples > 1 else 0.0
    gpu_j = float(trace.gpu_energy_j[-1] - trace.gpu_energy_j[0]) if n_samples > 1 else 0.0
    site_j = gpu_j + trace.overhead_total_w * elapsed

    jobs, throughput, lost_by_cause = _jobs(trace, dt)
    natural = _natural_site(trace, site)  # None: nothing burnt
    need = _grid_need(trace, site if natural is None else natural)
    gaps = _resume_gaps(trace)
    ramp_limit = float(trace.site_ramp_limit_w_per_s)
    return Summary(
        duration_s=float(trace.duration_s),
        samples=n_samples,
        cycles=len(trace.cycle_t),
        over_budget_s=seconds(over_budget),
        over_limit_s=seconds(over_limit),
        peak_fraction_of_budget=peak_fraction(trace.budget_w),
        peak_fraction_of_limit=peak_fraction(trace.limit_w),
        limit_violations=violations,
        peak_site_w=float(site.max()) if n_samples else 0.0,
        peak_site_ramp_up_w_per_s=ramp.up_max_w_per_s,
        peak_site_ramp_down_w_per_s=ramp.down_max_w_per_s,
        peak_site_cap_ramp_up_w_per_s=cap_ramp.up_max_w_per_s,
        site_ramp_limit_w_per_s=ramp_limit if np.isfinite(ramp_limit) else None,
        grid=grid_report(
            site_reg,
            step,
            trace.grid,
            gpu_j,
            smoothing_j=_fill_j(trace),
            demand_w=None if natural is None else regular_series(trace.t, natural)[0],
            resume_w=_resume_site(trace, site if natural is None else natural, gaps),
            job_parts=_job_parts(trace, gaps),
            need_w=None if need is None else need[0],
            lost_j=None if need is None else need[1],
        ),
        energy_gpu_wh=gpu_j / 3600.0,
        energy_site_wh=site_j / 3600.0,
        throughput_rel=throughput,
        throughput_lost_by_cause=lost_by_cause,
        jobs=jobs,
        commands={
            "sent": int(trace.commands_sent),
            "acked": int(trace.acks_received),
            "resent": int(trace.resends),
            "acks_missing": int(trace.acks_missing),
            "pending_at_end": int(trace.commands_pending_at_end),
            "superseded": int(trace.commands_superseded),
        },
        capping=_capping(trace, dt),
        clock_locks=_clock_locks(trace, dt, lost_by_cause["clock lock"]),
        phases_seen=[p for p in PHASES if any(p == ph for j in trace.jobs for _, ph in j.phases)],
    )


def _fill_j(trace: RunRecord) -> float | None:
    """Energy smoothing burnt between the first and last sample; None when it was off."""
    fill = trace.gpu_fill_energy_j
    if fill is None or len(fill) < 2:
        return None if fill is None else 0.0
    return float(fill[-1] - fill[0])


def _fill_power_w(t: np.ndarray, fill_j: np.ndarray) -> np.ndarray:
    """Fill power at each sample from cumulative fill energy (rows: samples): the energy
    since the sample before over the time since it; 0 at the first."""
    fill_w = np.zeros(np.shape(fill_j))
    step_s = np.maximum(np.diff(t), 1e-9)
    fill_w[1:] = np.diff(fill_j, axis=0) / (step_s if np.ndim(fill_j) == 1 else step_s[:, None])
    return fill_w


def _gpu_drawn_w(trace: RunRecord) -> np.ndarray | None:
    """(n_samples, n_gpus): what each GPU drew less what smoothing burnt on it (its fill
    power since the sample before); None without per-GPU samples."""
    power = trace.gpu_power_w
    if power is None or len(power) < 2:
        return None
    drawn: np.ndarray = np.asarray(power, dtype=float)
    if trace.gpu_fill_energy_each_j is not None:
        t = np.asarray(trace.t, dtype=float)
        drawn = drawn - _fill_power_w(t, np.asarray(trace.gpu_fill_energy_each_j, float))
    return drawn


def _natural_site(trace: RunRecord, site_w: np.ndarray) -> np.ndarray | None:
    """The site's draw at each sample without what smoothing burnt (each sample less the
    fill power since the one before); None when it was off."""
    fill = trace.gpu_fill_energy_j
    if fill is None or len(fill) < 2:
        return None
    t = np.asarray(trace.t, dtype=float)
    drawn_w: np.ndarray = site_w - _fill_power_w(t, fill)
    return drawn_w


def _resume_gaps(trace: RunRecord) -> tuple[np.ndarray, np.ndarray] | None:
    """(n_samples, n_gpus) each GPU's draw with no fill, and how far below what it would
    draw were it to resume at once it stands while it waits (in a ``WAITING_PHASES``
    phase): short of its own draw (no fill) at its last sample in a progress phase. None
    without per-GPU samples."""
    natural = _gpu_drawn_w(trace)
    if natural is None:
        return None
    working = _progress_mask(trace.gpu_phase)
    waiting = in_codes(np.asarray(trace.gpu_phase), phase_codes(WAITING_PHASES))
    levels = grid_measure.ResumeLevels(natural.shape[1])
    gaps = np.array([levels.gaps(natural[k], working[k], waiting[k]) for k in range(len(natural))])
    return natural, gaps


def _resume_site(
    trace: RunRecord, natural_site_w: np.ndarray, gaps: tuple[np.ndarray, np.ndarray] | None
) -> np.ndarray | None:
    """What the site would draw at each sample, with no fill, were every waiting GPU to
    resume at once: ``natural_site_w`` plus every GPU's gap (``_resume_gaps``). On the
    regular steps the grid is measured at; None without per-GPU samples."""
    if gaps is None:
        return None
    t = np.asarray(trace.t, dtype=float)
    return regular_series(t, natural_site_w + gaps[1].sum(axis=1))[0]


def _job_parts(
    trace: RunRecord, gaps: tuple[np.ndarray, np.ndarray] | None
) -> list[tuple[np.ndarray, np.ndarray, float]] | None:
    """Per job: its GPUs' draw with no fill, what they would draw were they to resume at
    once, on the regular steps, and its share of the site's GPUs (``grid_report``'s
    ``job_parts``). None without per-GPU samples."""
    if gaps is None or not len(trace.jobs):
        return None
    natural, gap = gaps
    t = np.asarray(trace.t, dtype=float)
    job = np.asarray(trace.gpu_job)
    parts = []
    for j in range(len(trace.jobs)):
        mine = job == j
        if mine.any():
            drawn = natural[:, mine].sum(axis=1)
            parts.append(
                (
                    regular_series(t, drawn)[0],
                    regular_series(t, drawn + gap[:, mine].sum(axis=1))[0],
                    float(mine.sum()) / len(job),
                )
            )
    return parts


def _grid_need(trace: RunRecord, drawn_site_w: np.ndarray) -> tuple[np.ndarray, float] | None:
    """What the site would have drawn with no grid spec, on the regular steps, and the work
    the grid held back (J): ``drawn_site_w`` (the site without what smoothing burnt) plus
    the demand a staged cap held back (``policies.causes.grid_held_w``, by the rule that
    last lowered its cap), and for every GPU of a job whose compute waited
    to fill back up (``rise_first_spans``), its compute demand (at its first sample after
    the wait) over what its wait drew meanwhile (the fill is burnt, not work). Budget
    capping stays in: its cost is not the grid's. None without per-GPU demand."""
    demand, power = trace.gpu_demand_w, _gpu_drawn_w(trace)
    if demand is None or power is None:
        return None
    demand, t = np.asarray(demand, float), np.asarray(trace.t, dtype=float)
    capped = np.minimum(demand, np.asarray(trace.gpu_cap_w, float))
    # no ramp part: software smoothing holds no draw below its cap but to fill back up
    # (the spans below), and a sample's fill is the mean since the one before, so its
    # draw less its fill is noise around its cap at every change of phase
    _, held = grid_held_w(
        capped, demand, capped, sample_cap_causes(trace), _sample_staged_from_w(trace)
    )
    for j, job in enumerate(trace.jobs):
        gpus = np.flatnonzero(trace.gpu_job == j)
        for start_s, end_s in job.rise_first_spans:
            first, after = np.searchsorted(t, [start_s, end_s])
            if after >= len(t) or first >= after:
                continue
            want_w = demand[after, gpus]  # its compute's demand, once it computed
            waited_w = np.maximum(want_w - power[first:after, gpus], 0.0)
            held[first:after, gpus] = waited_w
    held_w = held.sum(axis=1)  # what each drew shows none of it: all of it is need
    lost_j = float((held_w * sample_durations(t)).sum())
    return regular_series(t, drawn_site_w + held_w)[0], lost_j


def _progress_mask(phase: np.ndarray) -> np.ndarray:
    return in_codes(np.asarray(phase), phase_codes(PROGRESS_PHASES))


def _as_of_cycles(trace: RunRecord, per_cycle: np.ndarray | None, before: Any) -> np.ndarray:
    """(n_samples, n_gpus): ``per_cycle`` (n_cycles, n_gpus) as of the newest controller
    cycle at or before each sample; ``before`` before the first (and with none)."""
    out = np.full(np.shape(trace.gpu_throughput), before)
    if per_cycle is not None and len(per_cycle):
        newest = np.searchsorted(trace.cycle_t, trace.t, side="right") - 1
        seen = newest >= 0
        out[seen] = per_cycle[newest[seen]]
    return out


def sample_cap_causes(trace: RunRecord) -> np.ndarray:
    """(n_samples, n_gpus): the rule that last lowered each GPU's cap as of the newest
    controller cycle at or before each sample (``FAILSAFE`` before the first)."""
    return _as_of_cycles(trace, trace.cycle_cause, np.int8(FAILSAFE))


def _sample_staged_from_w(trace: RunRecord) -> np.ndarray | None:
    """(n_samples, n_gpus): the budget's cap a stage cut found, as of the newest controller
    cycle at or before each sample (inf: none); None when not recorded."""
    if trace.cycle_staged_from_w is None:
        return None
    return _as_of_cycles(trace, np.asarray(trace.cycle_staged_from_w, float), np.inf)


def sample_causes(trace: RunRecord) -> np.ndarray:
    """(n_samples, n_gpus): why each GPU ran below full speed at each sample
    (``policies.causes``; ``NOT_HELD`` at full speed or outside progress phases)."""
    cap_cause = sample_cap_causes(trace)
    cause = np.where(np.asarray(trace.gpu_locked, dtype=bool), CLOCK_LOCK, cap_cause)
    slow = (np.asarray(trace.gpu_throughput) < 1.0 - 1e-9) & _progress_mask(trace.gpu_phase)
    return np.where(slow, cause, NOT_HELD).astype(np.int8)


def _jobs(
    trace: RunRecord, dt: np.ndarray
) -> tuple[dict[str, dict[str, Any]], float | None, dict[str, float]]:
    progress = _progress_mask(trace.gpu_phase) if len(trace.t) else np.zeros((0, 0), bool)
    weights = dt[:, None] * progress if len(trace.t) else progress
    causes = sample_causes(trace) if len(trace.t) else np.zeros((0, 0), np.int8)
    lost_gpu_s = weights * (1.0 - trace.gpu_throughput) if len(trace.t) else weights * 0.0
    out: dict[str, dict[str, Any]] = {}
    work_all = time_all = 0.0
    lost_all = np.zeros(len(LOST_CAUSES))
    for k, job in enumerate(trace.jobs):
        mine = trace.gpu_job == k
        gpu_s = float(weights[:, mine].sum()) if len(trace.t) else 0.0
        work = float((weights[:, mine] * trace.gpu_throughput[:, mine]).sum()) if gpu_s else 0.0
        work_all += work
        time_all += gpu_s
        caps = trace.gpu_cap_w[:, mine][progress[:, mine]] if gpu_s else np.zeros(0)
        lost = (
            loss_by_cause(lost_gpu_s[:, mine], causes[:, mine])
            if gpu_s
            else np.zeros(len(LOST_CAUSES))
        )
        lost_all += lost
        held_s = float(weights[:, mine][causes[:, mine] != NOT_HELD].sum()) if gpu_s else 0.0
        out[job.name] = {
            "priority": job.priority,
            "nodes": job.nodes,
            "gpus": job.gpus,
            "throughput_rel": work / gpu_s if gpu_s else None,
            "throughput_lost_by_cause": {
                c: float(v) / gpu_s if gpu_s else 0.0
                for c, v in zip(LOST_CAUSES, lost, strict=True)
            },
            "held_share": held_s / gpu_s if gpu_s else 0.0,
            "progress_gpu_s": gpu_s,
            "mean_cap_in_compute_w": float(caps.mean()) if len(caps) else None,
            "phases": [[round(at, 2), phase] for at, phase in job.phases],
            "rise_first_s": job.rise_first_s,
            "rise_first_spans": [[round(a, 2), round(b, 2)] for a, b in job.rise_first_spans],
        }
    lost_site = {
        c: float(v) / time_all if time_all else 0.0
        for c, v in zip(LOST_CAUSES, lost_all, strict=True)
    }
    return out, (work_all / time_all if time_all else None), lost_site


def _capping(trace: RunRecord, dt: np.ndarray) -> dict[str, Any]:
    capping = np.asarray(trace.cycle_capping, dtype=bool)
    levels = [int(x) for x in np.unique(trace.level)]
    cycles_by_level, nodes_by_level = {}, {}
    for lvl in levels:
        at = trace.level == lvl
        cycles_by_level[LEVEL_NAMES[lvl]] = int(capping[:, at].any(axis=1).sum())
        nodes_by_level[LEVEL_NAMES[lvl]] = [
            trace.names[k] for k in np.flatnonzero(at & capping.any(axis=0))
        ]
    cut = np.asarray(trace.cycle_cut, dtype=bool)
    in_job = trace.gpu_job >= 0
    caps = trace.gpu_cap_w[:, in_job] if len(trace.t) else np.zeros((0, 0))
    return {
        "cycles_capping": int(capping.any(axis=1).sum()),
        "cycles_capping_by_level": cycles_by_level,
        "nodes_capping": nodes_by_level,
        "gpus_cut": int(cut.any(axis=0).sum()),
        "gpu_cuts": int(cut.sum()),
        "min_cap_w": float(caps.min()) if caps.size else None,
        "max_cap_w": float(caps.max()) if caps.size else None,
    }


def _clock_locks(trace: RunRecord, dt: np.ndarray, progress_lost: float) -> dict[str, float | None]:
    """The module docstring's *clock locks*; ``progress_lost``: the ``clock lock`` share of
    the throughput lost (``_jobs``)."""
    if not len(trace.t):
        return {"gpu_s": 0.0, "communication_gpu_s": 0.0, "communication_locked_share": 0.0}
    locked = np.asarray(trace.gpu_locked, dtype=bool)
    comm = trace.gpu_phase == PHASE_CODES["communication"]
    comm_s = float((dt[:, None] * comm).sum())
    return {
        "gpu_s": float((dt[:, None] * locked).sum()),
        "communication_gpu_s": comm_s,
        "communication_locked_share": (
            float((dt[:, None] * (comm & locked)).sum()) / comm_s if comm_s else 0.0
        ),
        "outside_communication_gpu_s": float((dt[:, None] * (locked & ~comm)).sum()),
        "progress_gpu_s": float((dt[:, None] * (locked & _progress_mask(trace.gpu_phase))).sum()),
        "progress_throughput_lost": progress_lost,
        **_exact_locks(trace.phase_account),
    }


def _exact_locks(account: PhaseAccount | None) -> dict[str, float | None]:
    """The clock locks' exact figures (module docstring); None where nothing was booked."""
    if account is None:
        return dict.fromkeys(
            ("exact_progress_gpu_s", "exact_outside_communication_gpu_s", "communication_energy_wh")
        )
    locked = account.locked_gpu_s
    return {
        "exact_progress_gpu_s": sum(locked.get(p, 0.0) for p in PROGRESS_PHASES),
        "exact_outside_communication_gpu_s": sum(
            s for p, s in locked.items() if p != "communication"
        ),
        "communication_energy_wh": account.energy_j.get("communication", 0.0) / 3600.0,
    }
