"""The rules both cycles share: the bands (``policies.capping``) and safety by caps
(``policies.allocation``) read the same sanitised arrays, know the same phases, judge the
same GPUs held at their caps, count the same rises of their own, and lock the same clocks.

Terms: ``span = cap_max - cap_min``, a GPU's range.

1. **Sanitise** (``sanitised``). Non-finite power or caps read as the GPU's failsafe cap
   (clipped into its range; ``cap_max`` where that is not finite either); negative power
   as 0; caps and floors are clipped into ``[cap_min_w, cap_max_w]``; priorities into the
   classes (LOW .. HIGH).

- **Staged phases** (``STAGED_PHASES``: ``startup``, ``checkpoint``): the synchronised
  swings of a job that hurt the site's ramp; their caps are held near the draw.
  **Waiting phases** (``WAITING_PHASES``: ``communication``, ``checkpoint``): a GPU that
  draws little now and rises with its job when compute resumes.
- **Held at its cap** (``held_at_cap``): controllable, capped below ``cap_max`` and drawing
  within ``stage_headroom_fraction * span`` below its cap: it wants more than it may have.
- **Rising on its own** (``own_rise_w_per_s``): under software grid smoothing
  (``startup_rise_w_per_s`` > 0), each controllable GPU in a staged phase, and the share
  ``rising_after_wait`` gives of one back from a long wait, rises by
  ``startup_rise_w_per_s`` without a raise; what the caps handed back must leave of a
  node's ramp.
- **Under a passed limit** (``under_a_passed_limit``): a node over the GPU (its server
  included) draws above its ``limit_w``: a breaker, not a budget, so its GPUs give at once.

5. **Clocks.** ``communication`` locks the SM clock of a controllable GPU to
   ``tree.comm_clock_mhz`` (NaN: no lock) when ``comm_clock_lock``; every
   other phase: NaN.
6. **Power floor cost.** With ``hold_floor_w_per_gpu`` set, the energy that
   holding it would cost this cycle: ``sum(max(0, floor - power_w)) * dt_s``
   over the controllable GPUs in a waiting phase (``communication``,
   ``checkpoint``). Reported only; the busy work itself is the agent's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from policies.settings import PolicySettings
from policies.tree import (
    HIGH,
    LOW,
    PHASE_CODES,
    RACK,
    ROW,
    SERVER,
    SITE,
    ClusterState,
    Tree,
    in_codes,
    phase_codes,
)

N_PRIORITIES = HIGH - LOW + 1
LEVELS_BOTTOM_UP = (SERVER, RACK, ROW, SITE)
STAGED_PHASES = ("startup", "checkpoint")
WAITING_PHASES = ("communication", "checkpoint")
STAGED_CODES = phase_codes(STAGED_PHASES)
WAITING_CODES = phase_codes(WAITING_PHASES)
COMM_CODE = PHASE_CODES["communication"]
IDLE_CODE = PHASE_CODES["idle"]
_COMPUTE_CODE = PHASE_CODES["compute"]
# Needs below this are rounding, not overload (a site sums ~1e8 W: ~1e-8 W of float noise).
NEGLIGIBLE_W = 1e-7


@dataclass(frozen=True)
class Sanitised:
    """Rule 1's arrays: what every rule reads (float copies; priorities clipped)."""

    power: np.ndarray
    cap: np.ndarray
    floor: np.ndarray
    priority: np.ndarray
    phase: np.ndarray
    ctl: np.ndarray
    cap_min: np.ndarray
    cap_max: np.ndarray


def staged_gpus(s: Sanitised) -> np.ndarray:
    """(n_gpus,) bool: controllable and in a staged phase (``startup``, ``checkpoint``)."""
    staged: np.ndarray = s.ctl & in_codes(s.phase, STAGED_CODES)
    return staged


def stage_headroom_w(span_w: np.ndarray, dt_s: float, settings: PolicySettings) -> np.ndarray:
    """How far above its draw a staged GPU's cap stands (rule 2 of ``policies.capping``,
    rule 3 of ``policies.allocation``): ``stage_headroom_fraction * span``, plus, under
    software grid smoothing (``startup_rise_w_per_s`` > 0), ``startup_rise_w_per_s *
    stage_fill_s`` (``2 * dt_s`` where that is 0): what the GPU's fill rises by in two
    cycles (the draw the cap is set on is up to a cycle old, and the next cap lands a cycle
    later; an early cycle changes neither, so the controller gives its period). With the
    headroom alone the cap, not the GPU's share of the ramp, paced a start: 25 W a 0.5 s
    cycle, 50 W/s a GPU against its 70 W/s share in ``powerd demo --smoothing``. The
    controller counts the whole headroom as drawn at once (what a staged GPU whose compute
    begins takes)."""
    head: np.ndarray = settings.stage_headroom_fraction * np.asarray(span_w, dtype=float)
    if settings.startup_rise_w_per_s > 0:
        fill_s = settings.stage_fill_s if settings.stage_fill_s > 0 else 2.0 * dt_s
        head = head + settings.startup_rise_w_per_s * fill_s
    return head


def sanitised_power(tree: Tree, state: ClusterState) -> np.ndarray:
    """Rule 1 for power alone: non-finite read as the failsafe cap, negative as 0."""
    cap_min = np.asarray(tree.cap_min_w, dtype=float)
    cap_max = np.asarray(tree.cap_max_w, dtype=float)
    power = _finite_or(state.power_w, tree.failsafe_cap_w, cap_min, cap_max)
    np.maximum(power, 0.0, out=power)
    return power


def sanitised(tree: Tree, state: ClusterState) -> Sanitised:
    """Rule 1: non-finite power or caps read as the failsafe cap, negative power as 0,
    caps and floors clipped into the GPU's range, priorities into the classes."""
    cap_min = np.asarray(tree.cap_min_w, dtype=float)
    cap_max = np.asarray(tree.cap_max_w, dtype=float)
    power = sanitised_power(tree, state)
    cap = _finite_or(state.cap_w, tree.failsafe_cap_w, cap_min, cap_max)
    np.clip(cap, cap_min, cap_max, out=cap)
    floor = _finite_or(state.floor_w, cap_min, cap_min, cap_max)
    np.clip(floor, cap_min, cap_max, out=floor)
    priority = np.asarray(state.priority)
    if len(priority) and (priority.min() < LOW or priority.max() > HIGH):
        priority = np.clip(priority, LOW, HIGH)
    ctl = np.asarray(state.controllable, dtype=bool)
    return Sanitised(power, cap, floor, priority, np.asarray(state.phase), ctl, cap_min, cap_max)


def clocks_and_floor(
    tree: Tree,
    power: np.ndarray,
    phase: np.ndarray,
    ctl: np.ndarray,
    dt_s: float,
    settings: PolicySettings,
) -> tuple[np.ndarray, float]:
    """Rules 5 and 6: the SM clock locks (NaN: none) and the energy holding a floor costs."""
    clock = np.full(len(power), np.nan)
    if settings.comm_clock_lock:
        comm = np.flatnonzero(ctl & (phase == COMM_CODE))
        clock[comm] = np.asarray(tree.comm_clock_mhz, dtype=float)[comm]
    floor_energy = 0.0
    if settings.hold_floor_w_per_gpu is not None:
        waiting = ctl & in_codes(phase, WAITING_CODES)
        shortfall = np.maximum(settings.hold_floor_w_per_gpu - power[waiting], 0.0)
        floor_energy = float(shortfall.sum() * dt_s)
    return clock, floor_energy


def held_at_cap(
    ctl: np.ndarray,
    power: np.ndarray,
    cap: np.ndarray,
    cap_max: np.ndarray,
    span: np.ndarray,
    settings: PolicySettings,
) -> np.ndarray:
    """GPUs held at their caps: controllable, capped below their maximum, and drawing within
    ``stage_headroom_fraction`` of their range below the cap (they want more). Rule 3b's
    test, and what a leaf reports as held to the coordinator (``policies.coordination``)."""
    held = ctl & (cap < cap_max - NEGLIGIBLE_W)
    held &= power >= cap - settings.stage_headroom_fraction * span
    return held


def rising_after_wait(
    state: ClusterState, phase: np.ndarray, controllable: np.ndarray, settings: PolicySettings
) -> np.ndarray:
    """(n_gpus,) the share of ``startup_rise_w_per_s`` that rule 4 counts each controllable
    GPU as rising by on its own after a wait, 0 to 1. With ``h = wait_rise_after_s`` (the
    smoothing profile's hysteresis) and ``a`` when a waiting GPU's draw starts falling:
    ``h`` where hardware of its own ramps it (``ClusterState.ramps_in_hardware``; unknown
    reads as such), at once (``a = 0``) where software does (``powerd.jobhook.fill``: ready
    for a step of one window's share, no more). In ``communication``, ``min(1, down ×
    (t - a) / (up × h))`` after ``t`` in it (what it fell by comes back up as a step when
    compute resumes), 1 from ``h`` on (fallen further, it fills back up first at the
    ramp-up share); in ``compute`` for up to ``h`` after a wait of ``w > a``, ``min(1, down
    × (w - a) / (up × h))`` (that step spread over the window after it; with the full share
    before it, every window holding the step holds a reserve at least as large). ``down``
    is ``cut_fall_w_per_s`` where finite (grid smoothing sets it to the ramp-down share),
    else ``up``. A GPU whose times are unknown (None, NaN): 0."""
    after_s = settings.wait_rise_after_s
    share = np.zeros(len(phase))
    if state.phase_s is None or not np.isfinite(after_s):
        return share
    falls_after_s = np.full(len(phase), after_s)
    if state.ramps_in_hardware is not None:
        falls_after_s[~np.asarray(state.ramps_in_hardware, dtype=bool)] = 0.0
    up, down = settings.startup_rise_w_per_s, settings.cut_fall_w_per_s
    rates = down / up if np.isfinite(down) and up > 0 else 1.0

    def step_share(fell_s: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # tiny h: whole
            fell = np.where(fell_s > 0, rates * fell_s / after_s, 0.0)
        return np.where(np.isnan(fell), 1.0, np.minimum(1.0, fell))

    phase_s = np.asarray(state.phase_s, dtype=float)
    comm = phase == COMM_CODE
    share[comm] = step_share(phase_s - falls_after_s)[comm]
    share[comm & (phase_s > after_s)] = 1.0
    if state.wait_before_s is not None and after_s > 0:
        wait_s = np.asarray(state.wait_before_s, dtype=float)
        resumed = (phase == _COMPUTE_CODE) & (phase_s <= after_s)  # no fall, no step: 0
        share = np.where(resumed, step_share(wait_s - falls_after_s), share)
    return np.where(controllable, share, 0.0)


def own_rise_w_per_s(
    tree: Tree,
    state: ClusterState,
    phase: np.ndarray,
    controllable: np.ndarray,
    staged: np.ndarray,
    settings: PolicySettings,
) -> np.ndarray:
    """(n_nodes,) W/s the GPUs under each node rise by on their own under grid smoothing,
    each at ``startup_rise_w_per_s``: a ``staged`` start filling up, and a GPU rising back
    after a wait (``rising_after_wait``, its share); what the caps handed back must leave
    of a node's ramp; and a GPU that may start a job (``may_start_rise_w_per_s``). Zeros
    without grid smoothing."""
    if not settings.startup_rise_w_per_s > 0:
        return np.zeros(tree.n_nodes)
    rising = np.maximum(staged, rising_after_wait(state, phase, controllable, settings))
    own: np.ndarray = settings.startup_rise_w_per_s * rising
    own += may_start_rise_w_per_s(tree, state, phase, controllable, settings)
    return tree.node_sum(own)


def may_start_rise_w_per_s(
    tree: Tree,
    state: ClusterState,
    phase: np.ndarray,
    controllable: np.ndarray,
    settings: PolicySettings,
) -> np.ndarray:
    """(n_gpus,) W/s a controllable GPU that may start a job at any moment is counted as
    rising by on its own: one ``stage_headroom_fraction`` of its range per window
    (``wait_rise_after_s``, the smoothing profile's hysteresis: the spec's window). A job's
    first step from idle (loading, before any cap is staged) is its own, not the caps', and
    lands on whatever the window's raises were. Such a GPU is ``idle`` (announced, or
    jobless in a replay), or has no announced phase and draws under its ``cap_min``
    (jobless, as a controller sees it: idle draws are under every model's least cap), and
    whose draw no hardware of its own ramps (``ClusterState.ramps_in_hardware``). Zeros
    without a window."""
    window_s = settings.wait_rise_after_s
    if not (math.isfinite(window_s) and window_s > 0):
        return np.zeros(len(phase))
    power = np.nan_to_num(np.asarray(state.power_w, dtype=float), nan=np.inf)
    unannounced = (
        np.ones(len(phase), dtype=bool)
        if state.phase_s is None
        else ~np.isfinite(np.asarray(state.phase_s, dtype=float))
    )
    may_start = controllable & (
        (phase == IDLE_CODE) | (unannounced & (phase == _COMPUTE_CODE) & (power < tree.cap_min_w))
    )
    if state.ramps_in_hardware is not None:
        may_start &= ~np.asarray(state.ramps_in_hardware, dtype=bool)
    span = np.asarray(tree.cap_max_w, dtype=float) - np.asarray(tree.cap_min_w, dtype=float)
    with np.errstate(over="ignore"):  # a window of a few ulps: inf, every raise kept
        per_s = settings.stage_headroom_fraction * span / window_s
    rise: np.ndarray = np.where(may_start, per_s, 0.0)
    return rise


def under_a_passed_limit(tree: Tree, node_power: np.ndarray) -> np.ndarray:
    """(n_gpus,) bool: a node over the GPU (its server included) draws above its limit."""
    return tree.gpus_under(node_power > tree.limit_w)


def _finite_or(
    values: np.ndarray | float, fallback: np.ndarray | float, low: np.ndarray, high: np.ndarray
) -> np.ndarray:
    """A float copy of ``values``; non-finite entries read as ``fallback`` clipped into
    ``[low, high]`` (``high`` where the fallback is not finite either)."""
    out = np.array(values, dtype=float)
    bad = ~np.isfinite(out)
    if bad.any():
        fallback = np.asarray(fallback, dtype=float)[bad]
        out[bad] = np.clip(
            np.where(np.isfinite(fallback), fallback, high[bad]), low[bad], high[bad]
        )
    return out


def ratio(num: np.ndarray, den: np.ndarray, cap: bool = True) -> np.ndarray:
    """``num / den`` where ``den > 0``, else 0; at most 1 unless ``cap`` is False."""
    out = np.zeros(np.shape(num))
    np.divide(num, den, out=out, where=den > 0)
    return np.minimum(out, 1.0) if cap else out
