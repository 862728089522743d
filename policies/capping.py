"""One control cycle: Dynamo-style three-band capping at every level of the power tree.

``decide(tree, state, dt_s, settings)`` is pure: arrays in, a :class:`Decision`
out. The controller calls it every cycle; the planner replays profiles through
it. Every step is vectorised over all GPUs and all tree nodes of a level; the
only Python loops run over the four levels.

The rules, in the order they are applied
----------------------------------------
Terms: a GPU's *predicted power* is ``min(power_w, cap)`` if it is
controllable, else its measured ``power_w`` (an offline or silent GPU does not
follow the controller; the controller already reports it at its failsafe cap).
A node's measured power is the measured power of every GPU under it plus its
``overhead_below_w``; its predicted power is the same with predicted GPU power.

1. **Sanitise.** Non-finite power or caps read as the GPU's failsafe cap;
   negative power as 0; caps and floors are clipped into
   ``[cap_min_w, cap_max_w]``.
2. **Staged phases** (``startup`` and ``checkpoint``; docs/DOMAIN.md, Llama 3:
   job start and checkpoints are the synchronised swings that hurt the site
   ramp). A controllable GPU in one of them has its cap *lowered* (never
   raised) to ``max(stage_cap, power_w + headroom, floor_w)`` with
   ``stage_cap = cap_min + startup_cap_fraction * (cap_max - cap_min)`` and
   ``headroom = stage_headroom_fraction * (cap_max - cap_min)``, and it is not
   handed watts back while it stays in that phase. So during a start or a
   checkpoint the caps sit just above what the GPU draws (never below the
   staged start cap), and when the phase ends the GPUs climb back through
   step 4, whose ramp limits hold at every level: the job's rise is bounded
   by the site, row, rack and server ramps. The rule is stateless: "entering
   startup" is every cycle spent in it.
3. **Capping, bottom-up** (servers, racks, rows, site). A node whose measured
   power is above ``cap_threshold_w`` must come down to ``cap_target_w``: it
   takes ``R = predicted - target`` (predicted after the cuts of the levels
   below, so a parent takes only what its children left) from the
   controllable GPUs under it: all of LOW first, then NORMAL, then HIGH, and
   inside the class that gives the last watts high-bucket-first, i.e. by
   water-filling ``a = predicted - floor_w``: every GPU above a level ``L``
   comes down to ``L`` where ``sum(max(a - L, 0)) = R``. Never below
   ``floor_w``, never from an uncontrollable GPU. A cut GPU's cap becomes its
   new predicted power (``min(power_w, cap) - cut``), so a cap that the GPU
   has not yet followed counts as watts already taken.
   With a finite ``cut_fall_w_per_s`` (grid power smoothing: each GPU's share
   of the grid's ramp-down), a GPU no node over which draws above its
   ``limit_w`` is cut no lower this cycle than ``min(power_w, cap) -
   cut_fall_w_per_s * dt_s``: a node between its capping threshold and its
   limit is over a budget, not a breaker, and comes down over several cycles
   no faster than the grid allows, where at once its GPUs' floors would show
   the whole cut as one step (found by ``bench_tree --grid-smoothing`` on the
   150 MW site: racks pushed across their thresholds by the 80 % floor cut
   3 kW each at once, 73-208 kW a row in the same second). A GPU in a waiting
   phase (``communication``, ``checkpoint``) is then not cut below what it
   draws: its smoothing lets its draw fall on its own at that same rate, and
   a cut would add to the fall (found by
   ``tests/controller/test_site_limit_under_smoothing.py``: a demand-response
   glide that began as a job waited fell 35 kW/s against the GPUs' 18 kW/s
   share). Above a limit the cut is whole, at once, as without smoothing.
   Rules 3b and 3c keep to the same bounds.
   **In turn** (``ClusterState.cut_turn``): under a node over its capping threshold and
   no node over its limit (a budget, not a breaker), only the GPUs in turn give, each at
   most ``cut_turn_max_fraction`` of its range (within the bounds above), class by class
   as above; what they could not give waits for later turns, and a class with watts left
   out of turn holds it back (the classes above it give nothing for it first). So a level
   takes at most what it took without turns, from fewer nodes, and a node over a budget
   may stay over it a few cycles: a budget is not a breaker. Why: a glide that cut the
   150 MW site's 82,944 GPUs by 11 W each every second (an operator's site limit at the
   grid's 1 MW/s) commanded all 20,736 nodes every cycle, ten times the controller's own
   bound on raises a second; and a need inflated by nodes it does not hear (counted at the
   caps they may hold) cut more nodes still, which fell behind, went unheard, and inflated
   it further (found by ``bench_scale --site-limit-mw``). Under a node over its limit every
   GPU gives at once, as without turns.
3b. **Priority shift, between the bands** (``priority_shift``). A GPU is *held*
   when it is controllable, not staged, not waiting, below ``cap_max``, not cut
   this cycle, and draws within ``stage_headroom_fraction`` of its range below
   its cap: it wants more than it may have. Bottom-up, a node known to be between
   its (finite) bands (see below) under which a GPU of class ``p`` is held (counting only GPUs
   no node between them blocks, i.e. every one is below its uncapping
   threshold) takes, from the classes below ``p`` only and in rule 3's order,
   ``min(predicted - uncap_threshold_w + margin, gaps of the held GPUs of class
   p less what the levels below took for them, what the lower classes hold
   above their floors)``. The node drops just under its uncapping threshold, so
   next cycle rule 4 hands watts back, to ``p`` first. Without it a high-priority
   job leaving a checkpoint (staged caps) while a low-priority job filled the
   room would stay at its staged caps indefinitely: the node is neither above
   its threshold (capping) nor below its uncapping threshold (uncapping).
   A node is *known* to be between its bands only while the power it counts for
   GPUs the controller does not hear (``ClusterState.heard``: silent, offline or
   implausible, at the caps they may hold) is at most ``GUESSED_BAND_SHARE``
   (a quarter) of its band, ``cap_threshold_w - uncap_threshold_w``; rules 3b
   and 3c act only under such nodes. Beyond it, the guess is what puts the node
   there: heard again, at what they draw, it is below its uncapping threshold,
   rule 4 hands the moved watts back, and the next guess moves them again (found
   by ``bench_scale --jobs 2`` on a machine that lost half the controller's
   telemetry: three quarters of ~2,000 cuts a second were such moves). Rule 4's
   hand-back between the bands is not bound by it: counting the unheard at their
   caps leaves a node less room, never more, and it cuts nobody.
3c. **Levelling within a class, between the bands** (``level_within_class``).
   Bottom-up, under a node known to be between its (finite) bands, the GPUs of one class
   held at their caps (rule 3b's test; not cut or shifted this cycle, and
   counting only GPUs no node between them blocks) move towards one level: the
   same share ``tau`` of each GPU's range, ``cap_min + tau * (cap_max -
   cap_min)``, with ``tau`` such that their caps keep their sum. A GPU within
   ``max(uncap_min_step_w, 1 % of its range)`` of its level does not move; the
   others move by ``max(uncap_step_fraction * distance, uncap_min_step_w)``,
   at most the distance, a donor never below how low rule 3 may cut it (its
   floor; ``cut_fall_w_per_s``). What the receivers gain (and will draw:
   they are held) is at most what the donors' predicted power loses, so the
   levelling node's predicted power does not rise; and at most the room of
   every node between them and the levelling node (``cap_target_w``,
   ``limit_w`` with every GPU at its cap, and ``ramp_w_per_s * dt_s``, which
   rule 4 then has that much less of). A GPU moves at most once a cycle: one
   levelled does not ask in rule 4 that cycle. Why:
   capping water-fills from the top and uncapping hands back in proportion
   to each gap, but between the bands nothing moves, so caps set when a
   node's GPUs were seen at different times stay unequal for as long as the
   node stays there. A synchronous job runs at its slowest GPU's pace, so
   watts on its other GPUs are wasted (found by the failover test under load:
   a new leader's first cycle heard one node late, counted it at its failsafe
   cap and cut its rack sibling for it; the two nodes of one rack stayed at
   508 W and 342 W caps).
4. **Uncapping.** A controllable GPU that is neither in a staged phase nor
   waiting (``communication``: it draws little now and all of a job's GPUs
   rise together when compute resumes, so watts handed back now overshoot the
   budget then; found by ``powerd demo``), nor shifted this cycle, and whose
   every ancestor is below its ``uncap_threshold_w`` asks for
   ``min(gap, max(uncap_step_fraction * gap, uncap_min_step_w))``, with
   ``gap = cap_max - cap``; where ``uncap_cycles`` gives it k cycles, what k
   such steps would give, ``min(gap, max((1 - (1 - uncap_step_fraction)^k) * gap,
   k * uncap_min_step_w))``, and with 0 nothing (its node is not served a raise
   this cycle: a controller bounds raises per cycle and serves nodes in turn, so
   a node's one command in k cycles carries their watts instead of one
   cycle's; the grants below bound the total as ever, and of a node's room to
   its capping target and its limit a turn gets only its share, what its GPUs
   ask over what every GPU that could ask would ask for k cycles, so the first
   turns under a breaker do not take what the later ones' share). Every node grants at most
   ``min(ramp_w_per_s * dt_s, cap_target_w - predicted)`` in total (0 if it
   is not below its uncapping threshold; ``ramp_w_per_s`` less
   ``startup_rise_w_per_s`` for every controllable GPU in a staged phase under
   it, which rises on its own under software grid smoothing: a start fills up
   to its caps, and a checkpoint ends filling back up to them before compute
   resumes, ``powerd.jobhook.FillFollower``; and for every controllable GPU in
   ``communication`` for longer than ``wait_rise_after_s``, and a share of it for every one
   in ``compute`` up to that long after such a wait, the share its step back up takes of a
   window's rise (``rising_after_wait``): past the smoothing profile's hysteresis its draw
   fell, and it comes back up as compute resumes, filling back up first when it fell far;
   never below 0):
   the ramp limit, and the headroom
   that keeps a node from being uncapped into capping again (that assumes
   every granted watt is drawn, so it is conservative). It also grants at
   most ``limit_w - cap_sum``, ``cap_sum`` being the sum of the caps under the
   node (uncontrollable GPUs at what they draw) plus its overhead: watts are
   never handed back beyond what the breaker takes with every GPU at its cap.
   Without it, a job's GPUs waiting on a collective (drawing little) are
   handed watts back, and when they all rise together the node overshoots its
   limit for a cycle before capping catches it (found by ``powerplan whatif``
   replaying a compute/communication rhythm). Classes are served in order,
   HIGH, NORMAL, LOW: each gets what the budgets left after the classes
   before it, and under a node where a higher class is still held after its
   grant the lower classes get nothing (it would be shifted back next cycle),
   unless a node between them has nothing left: that node holds the GPU,
   and watts from above could not reach it.
   With ``uncap_within_caps`` the headroom is ``cap_target_w - cap_sum``
   instead (GPUs in ``idle`` at what they draw: a job starting on them
   announces ``startup``, whose caps are staged): under grid power smoothing
   a GPU's draw climbs to its cap over seconds, so a node uncapped on what it
   draws now would climb across its threshold and be cut at once, a step the
   grid's ramp-down limit forbids
   (found by ``powerplan whatif --smoothing`` on the 150 MW site: every rack
   cut 3 kW in one cycle, 3.6 MW for the site).
   Within a class requests are reconciled exactly: bottom-up every node can pass on
   ``A = min(budget, sum of its children's A)``; top-down each child gets its
   share of the parent's grant in proportion to its ``A``; each GPU gets its
   request scaled by its server's grant over the server's demand. Every
   ancestor's grant limit holds and no node is starved by a sibling's limit.
   Between the bands (not above the threshold, not below the uncapping
   threshold) caps stay as they are, unless GPUs under the node are held at
   their caps (rule 3b's test) and ``uncap_between_bands``: then the node
   hands back too, within the same limits, so at most up to its capping
   target. That keeps the hysteresis (a node cut to its target has no
   headroom left, and nothing is handed back beyond the target, below the
   threshold that cuts) without leaving a node between its bands with GPUs
   that want more and room to give it: a synchronous start staged the caps,
   the GPUs climbed back until the node crossed its uncapping threshold, and
   there they would stay.
5. **Clocks.** ``communication`` locks the SM clock of a controllable GPU to
   ``tree.comm_clock_mhz`` (NaN: no lock) when ``comm_clock_lock``; every
   other phase: NaN.
6. **Power floor cost.** With ``hold_floor_w_per_gpu`` set, the energy that
   holding it would cost this cycle: ``sum(max(0, floor - power_w)) * dt_s``
   over the controllable GPUs in a waiting phase (``communication``,
   ``checkpoint``). Reported only; the busy work itself is the agent's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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
_WAITING_CODES = phase_codes(WAITING_PHASES)
_COMM_CODE = PHASE_CODES["communication"]
_IDLE_CODE = PHASE_CODES["idle"]
_COMPUTE_CODE = PHASE_CODES["compute"]
# Rules 3b and 3c move watts under a node between its bands only while the power it counts
# for GPUs it did not hear (silent, offline or implausible: at the caps they may hold) is at
# most this share of its band (cap_threshold_w - uncap_threshold_w). Beyond it, where the
# node stands between its bands is the guess's: hearing them again (at what they draw)
# puts it below, rule 4 hands the watts back, and the next guess shifts them again (found by
# bench_scale with two 10,368-node jobs on a 2-vCPU machine that lost half the telemetry: of
# ~2,000 cuts a second, three quarters were such shifts and levellings, each undone).
GUESSED_BAND_SHARE = 0.25
# Needs below this are rounding, not overload (a site sums ~1e8 W: ~1e-8 W of float noise).
NEGLIGIBLE_W = 1e-7


@dataclass(frozen=True)
class PolicySettings:
    """Tuning of :func:`decide`. Fields are numbers, booleans or None (they come from TOML).

    Defaults are chosen for a 1 s cycle on GB200-class GPUs (200-1200 W,
    docs/DOMAIN.md) and scale with each GPU's range.
    """

    # Per cycle, the fraction of a capped GPU's distance to cap_max it may regain
    # (before ramp limits). 0.2 at 1 s: ~90 % of the gap is back in 10 s, slower than
    # Dynamo's ~6 s capping response (docs/DOMAIN.md), so handing back never outruns taking.
    uncap_step_fraction: float = 0.2
    # Where caps stand for GPUs in `startup` (and the lowest they follow a GPU down to
    # during a `checkpoint`), as a fraction of the range above cap_min: 0.25 is 450 W
    # on a 200-1200 W GB200, well above its idle draw, so a starting job is not slowed.
    startup_cap_fraction: float = 0.25
    # Lock the SM clock to the tree's comm_clock_mhz during `communication` phases.
    comm_clock_lock: bool = True
    # During checkpoint/communication waits, a per-GPU power floor whose energy cost is
    # reported in Decision.floor_hold_energy_j; None: off.
    hold_floor_w_per_gpu: float | None = None
    # The smallest step a capped GPU regains per cycle (W), so the last watts of a gap
    # come back in finite time instead of shrinking geometrically.
    uncap_min_step_w: float = 5.0
    # In staged phases the cap stays this fraction of the range above the GPU's
    # measured power (50 W on a GB200), so the staged cap does not slow the phase.
    stage_headroom_fraction: float = 0.05
    # Between the bands, take watts from lower-priority GPUs for higher-priority ones held
    # at their caps (rule 3b). Off: caps between the bands stay, whatever the priorities.
    priority_shift: bool = True
    # Rule 4's headroom to the capping target counts every GPU at its cap, not at what it
    # draws: for GPUs whose draw follows their caps slowly (grid power smoothing,
    # policies.smoothing), which would otherwise climb into capping, and be cut at once.
    uncap_within_caps: bool = False
    # Rule 4 also hands watts back under a node between its bands (below its capping
    # threshold, not below its uncapping threshold) that has GPUs held at their caps, up to
    # the capping target: off, a site left between its bands by a synchronous start stays
    # there with its jobs held (found by `powerplan evaluate` on the 150 MW site: 129 MW of
    # a 149 MW demand, 21 MW of the feed unused, 6 % of the throughput lost).
    uncap_between_bands: bool = True
    # In turn (ClusterState.cut_turn), the most a GPU in turn gives for a budget in one
    # cycle, as a fraction of its range (150 W on a 200-1200 W GB200): the spread of caps
    # a turn leaves among GPUs of one job. At 0.15 the 150 MW site follows a glide at
    # 0.9 MW/s with ~1,500 node commands a second (the controller's bound is 2,000).
    cut_turn_max_fraction: float = 0.15
    # W/s each controllable GPU in a staged phase (`startup`, `checkpoint`) may rise by on
    # its own (software grid smoothing: the job fills up at its GPUs' ramp-up share while it
    # starts, and fills back up before it resumes from a checkpoint): every node's uncapping
    # ramp is less that for each such GPU under it, so a start or a checkpoint's end and the
    # caps handed back elsewhere share one ramp. controller.grid_smoothing sets it to the
    # share. (Named for the start, which it first covered; the name stays for the configs.)
    startup_rise_w_per_s: float = 0.0
    # Under software grid smoothing a GPU whose wait lasts longer than this (the profile's
    # ramp-down hysteresis) begins to fall, and rises back on its own when compute resumes:
    # by up to one window's share at once, or, fallen further, filling back up first
    # (FillFollower.must_rise_first). Rule 4 counts it as rising at startup_rise_w_per_s
    # from then until this long after its compute resumed. inf: never (no smoothing);
    # controller.grid_smoothing sets it to the profile's hysteresis.
    wait_rise_after_s: float = float("inf")
    # W/s a GPU's cap may be cut by where no node over it draws above its limit (rule 3):
    # under grid smoothing its share of the grid's ramp-down, so capping over a budget
    # comes down within the grid's limit; a node over its limit is cut at once whatever
    # this is. inf: every cut at once. controller.grid_smoothing sets it to the share.
    cut_fall_w_per_s: float = float("inf")
    # Between the bands, move the caps of a class's GPUs held at them towards one share of
    # their ranges, keeping their sum (rule 3c). Off: caps between the bands stay unequal
    # when they were cut at different times (one node heard late, say).
    level_within_class: bool = True
    # Safety by caps (policies.allocation), the default: every level kept within its limit
    # by the caps in force, not by bands on measured power; the caps reallocated every cycle
    # to the GPUs that would use them. Off: the three bands above (Dynamo's) on measured
    # power, which cap a node above its capping threshold down to its capping target.
    safety_by_caps: bool = True
    # Under safety_by_caps, a GPU in communication for longer than this lends its
    # headroom (s); a shorter wait keeps its cap: its job resumes before a loan is back.
    lend_after_s: float = 5.0
    # Under safety_by_caps, a GPU whose job announced how long its wait lasts
    # (``ClusterState.phase_expected_s``) gets its entitlement back this long before the
    # wait ends (s): the cut that pays for it and the raise are made by then, and the job
    # resumes at its static cap, not a cycle or two under it. 0: at the end.
    return_ahead_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0.0 < self.uncap_step_fraction <= 1.0:
            raise ValueError(
                f"uncap_step_fraction must be in (0, 1], not {self.uncap_step_fraction}"
            )
        if not 0.0 <= self.startup_cap_fraction <= 1.0:
            raise ValueError(
                f"startup_cap_fraction must be in [0, 1], not {self.startup_cap_fraction}"
            )
        if not 0.0 <= self.stage_headroom_fraction <= 1.0:
            raise ValueError(
                f"stage_headroom_fraction must be in [0, 1], not {self.stage_headroom_fraction}"
            )
        if not self.cut_fall_w_per_s > 0.0:  # inf allowed: at once; NaN refused
            raise ValueError(f"cut_fall_w_per_s must be > 0, not {self.cut_fall_w_per_s}")
        if not (np.isfinite(self.startup_rise_w_per_s) and self.startup_rise_w_per_s >= 0.0):
            raise ValueError(f"startup_rise_w_per_s must be >= 0, not {self.startup_rise_w_per_s}")
        if not self.wait_rise_after_s >= 0.0:  # inf allowed: never; NaN refused
            raise ValueError(f"wait_rise_after_s must be >= 0, not {self.wait_rise_after_s}")
        if not (np.isfinite(self.uncap_min_step_w) and self.uncap_min_step_w >= 0.0):
            raise ValueError(f"uncap_min_step_w must be >= 0, not {self.uncap_min_step_w}")
        if not 0.0 < self.cut_turn_max_fraction <= 1.0:
            raise ValueError(
                f"cut_turn_max_fraction must be in (0, 1], not {self.cut_turn_max_fraction}"
            )
        if not self.lend_after_s >= 0.0:  # inf allowed: never; NaN refused
            raise ValueError(f"lend_after_s must be >= 0, not {self.lend_after_s}")
        if not (np.isfinite(self.return_ahead_s) and self.return_ahead_s >= 0.0):
            raise ValueError(f"return_ahead_s must be >= 0, not {self.return_ahead_s}")
        if self.hold_floor_w_per_gpu is not None and not (
            np.isfinite(self.hold_floor_w_per_gpu) and self.hold_floor_w_per_gpu >= 0.0
        ):
            raise ValueError(
                f"hold_floor_w_per_gpu must be >= 0 or None, not {self.hold_floor_w_per_gpu}"
            )


@dataclass
class Decision:
    """What one cycle decided. Per GPU (n_gpus,) or per tree node (n_nodes,)."""

    cap_w: np.ndarray  # (n_gpus,) new caps, always within [cap_min_w, cap_max_w]
    max_sm_clock_mhz: np.ndarray  # (n_gpus,) NaN = no clock lock
    node_power_w: np.ndarray  # (n_nodes,) measured: GPU power under the node + overhead_below_w
    node_predicted_w: np.ndarray  # (n_nodes,) after the decision: predicted GPU power + overhead
    node_capping: np.ndarray  # (n_nodes,) bool: node above its capping threshold this cycle
    floor_hold_energy_j: float  # energy this cycle spent holding a power floor (0 if off)
    # Diagnostics; empty when a Decision is built by hand (in a test, say).
    # (n_nodes,) watts each node itself took this cycle, beyond what the levels below took:
    node_cut_w: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # (n_gpus,) uint8 bitmask: bit `level` (SITE=0 ... SERVER=3) set if that level cut the GPU:
    cut_levels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint8))
    # (n_nodes,) watts each node took from lower-priority GPUs between the bands, to make
    # room for higher-priority GPUs held at their caps (rule 3b); (n_gpus,) bool: those cut.
    node_shift_w: np.ndarray = field(default_factory=lambda: np.zeros(0))
    shifted: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # (n_gpus,) bool: caps moved (up or down) to level a class between the bands (rule 3c)
    levelled: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # (n_gpus,) bool, under safety by caps: asks for more than it was given, under a node
    # whose caps are at its limit (what holds it is the limit, shared: policies.causes)
    short: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))


def rising_after_wait(
    state: ClusterState, phase: np.ndarray, controllable: np.ndarray, settings: PolicySettings
) -> np.ndarray:
    """(n_gpus,) the share of ``startup_rise_w_per_s`` that rule 4 counts each controllable
    GPU as rising by on its own after a wait, 0 to 1. With ``h = wait_rise_after_s`` (the
    smoothing profile's hysteresis): in ``communication`` longer than ``h``, 1 (its draw has
    been falling since ``h``, at the ramp-down share, and comes back up as compute resumes:
    by a step of what it fell, or, fallen by more than a window's rise, filling back up
    first at the ramp-up share); in ``compute`` for up to ``h`` after a wait of ``w > h``,
    ``min(1, down × (w - h) / (up × h))`` (that step spread over the window after it; with
    the full share before it, every window holding the step holds a reserve at least as
    large). ``down`` is ``cut_fall_w_per_s`` where finite (grid smoothing sets it to the
    ramp-down share), else ``up``. A GPU whose times are unknown (None, NaN): 0."""
    after_s = settings.wait_rise_after_s
    share = np.zeros(len(phase))
    if state.phase_s is None or not np.isfinite(after_s):
        return share
    phase_s = np.asarray(state.phase_s, dtype=float)
    share[(phase == _COMM_CODE) & (phase_s > after_s)] = 1.0
    if state.wait_before_s is not None and after_s > 0:
        wait_s = np.asarray(state.wait_before_s, dtype=float)
        resumed = (phase == _COMPUTE_CODE) & (phase_s <= after_s) & (wait_s > after_s)
        up, down = settings.startup_rise_w_per_s, settings.cut_fall_w_per_s
        rates = down / up if np.isfinite(down) and up > 0 else 1.0
        with np.errstate(over="ignore", invalid="ignore"):  # a tiny after_s: a whole share
            step_share = np.minimum(1.0, rates * (wait_s - after_s) / after_s)
        share = np.where(resumed, step_share, share)
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
    of a node's ramp. Zeros without grid smoothing."""
    if not settings.startup_rise_w_per_s > 0:
        return np.zeros(tree.n_nodes)
    rising = np.maximum(staged, rising_after_wait(state, phase, controllable, settings))
    own: np.ndarray = settings.startup_rise_w_per_s * tree.node_sum(rising)
    return own


def may_ask_to_uncap(tree: Tree, state: ClusterState) -> np.ndarray:
    """Per GPU, whether rule 4 could hand it watts back at all: controllable, below its
    maximum cap, neither staged nor waiting (what its nodes, under their thresholds, might
    give it is the policy's to decide). A controller serving hand-backs in turn offers
    its turns to these (``ClusterState.uncap_cycles``)."""
    phase = np.asarray(state.phase)
    below = np.asarray(state.cap_w, dtype=float) < np.asarray(tree.cap_max_w, dtype=float)
    settled = ~in_codes(phase, STAGED_CODES) & ~in_codes(phase, _WAITING_CODES)
    return np.asarray(np.asarray(state.controllable, dtype=bool) & below & settled)


def decide(
    tree: Tree, state: ClusterState, dt_s: float, settings: PolicySettings | None = None
) -> Decision:
    """One control cycle over the whole tree; see the module docstring for the rules."""
    if settings is None:
        settings = PolicySettings()
    if not (np.isfinite(dt_s) and dt_s > 0):
        raise ValueError(f"dt_s must be a positive number of seconds, not {dt_s}")
    if settings.safety_by_caps:
        from policies.allocation import allocate  # it builds on this module's rule 1, 5, 6

        return allocate(tree, state, dt_s, settings)
    n_nodes, n_gpus = tree.n_nodes, tree.n_gpus
    overhead = tree.overhead_below_w

    # 1. sanitise
    s = sanitised(tree, state)
    power, cap, floor, priority, phase, ctl = s.power, s.cap, s.floor, s.priority, s.phase, s.ctl
    cap_min, cap_max = s.cap_min, s.cap_max

    node_power = tree.node_sum(power) + overhead
    capping = node_power > tree.cap_threshold_w

    # 2. staged phases: caps follow the GPU down, not below the staged start cap
    staged = ctl & in_codes(phase, STAGED_CODES)
    if staged.any():
        i = np.flatnonzero(staged)
        span = cap_max[i] - cap_min[i]
        stage_cap = np.maximum(cap_min[i] + settings.startup_cap_fraction * span, floor[i])
        np.maximum(stage_cap, power[i] + settings.stage_headroom_fraction * span, out=stage_cap)
        cap[i] = np.minimum(cap[i], stage_cap)

    # held at its cap (rule 3b): judged on the caps before this cycle's cuts
    waiting = in_codes(phase, _WAITING_CODES)
    span = cap_max - cap_min
    pressed = ~staged & ~waiting & held_at_cap(ctl, power, cap, cap_max, span, settings)

    # 3. capping, bottom-up
    pred = np.minimum(power, cap)
    if not ctl.all():
        pred[~ctl] = power[~ctl]
    node_pred = tree.node_sum(pred) + overhead
    node_cut = np.zeros(n_nodes)
    cut_levels = np.zeros(n_gpus, dtype=np.uint8)
    lowest = floor  # how low rules 3 and 3b may cut: only worked out when one may
    moves_between = settings.priority_shift or settings.level_within_class
    if capping.any() or (moves_between and pressed.any()):
        fall_w = settings.cut_fall_w_per_s * dt_s
        lowest = _lowest_cut(tree, node_power, pred, floor, fall_w, waiting)
    in_turn = None  # rule 3 in turn: how low each GPU may be cut before the others give
    class_gpus: list[np.ndarray] = []
    if state.cut_turn is not None and capping.any():
        in_turn = _lowest_in_turn(tree, node_power, pred, lowest, span, state.cut_turn, settings)
        class_gpus = [ctl & (priority == p) for p in range(LOW, HIGH + 1)]
        class_gpus = [mine for mine in class_gpus if mine.any()]
    for lvl in LEVELS_BOTTOM_UP:
        nodes = tree.level_nodes[lvl]
        over = nodes[capping[nodes]]
        if not len(over):
            continue
        need = np.zeros(n_nodes)
        need[over] = node_pred[over] - tree.cap_target_w[over]
        if not np.any(need[over] > NEGLIGIBLE_W):
            continue
        if in_turn is None:
            idx, taken = _cut(tree, lvl, need, pred, cap, node_pred, lowest, priority, ctl)
            cut_levels[idx] |= np.uint8(1 << lvl)
            node_cut[nodes] += taken[nodes]
            continue
        # in turn: class by class (LOW first), its GPUs in turn; a class with watts left
        # out of turn holds the rest of a budget's need back for later turns (the classes
        # above it give nothing first); under a node over its limit, every GPU is in turn
        for mine in class_gpus:
            idx, taken = _cut(tree, lvl, need, pred, cap, node_pred, in_turn, priority, mine)
            cut_levels[idx] |= np.uint8(1 << lvl)
            node_cut[nodes] += taken[nodes]
            need[over] -= taken[over]
            need[need <= NEGLIGIBLE_W] = 0.0
            if not need[over].any():
                break
            left = tree.node_sum(np.where(mine, np.maximum(pred - lowest, 0.0), 0.0))
            need[over[left[over] > NEGLIGIBLE_W]] = 0.0

    # 3b. between the bands, make room for higher-priority GPUs held at their caps
    pressed &= cut_levels == 0  # cut this cycle: held by a node over its threshold
    # what each node counts for GPUs it did not hear (3b and 3c), worked out only if needed
    node_guessed_w = np.zeros(n_nodes)
    if state.heard is not None and moves_between and pressed.any():
        node_guessed_w = tree.node_sum(np.where(np.asarray(state.heard, dtype=bool), 0.0, power))
    node_shift = np.zeros(n_nodes)
    shifted = np.zeros(n_gpus, dtype=bool)
    if settings.priority_shift and pressed.any():
        _shift(
            tree,
            node_power,
            node_guessed_w,
            node_pred,
            node_shift,
            shifted,
            cap,
            pred,
            lowest,
            cap_max,
            priority,
            ctl,
            pressed,
        )

    # 3c. between the bands, level the caps of a class's GPUs held at them
    levelled = np.zeros(n_gpus, dtype=bool)
    level_rise = np.zeros(n_nodes)
    if settings.level_within_class and pressed.any():
        levelled, level_rise = _level(
            tree,
            node_power,
            node_guessed_w,
            node_pred,
            cap,
            pred,
            power,
            lowest,
            cap_min,
            cap_max,
            priority,
            ctl,
            pressed & ~shifted,
            dt_s,
            settings,
        )

    # 4. uncapping, ramp-limited at every level, HIGH first
    below = node_power < tree.uncap_threshold_w
    between = np.zeros(n_nodes, dtype=bool)  # between the bands with GPUs held under it
    held = np.zeros(n_gpus, dtype=bool)  # ... and those GPUs
    if settings.uncap_between_bands and pressed.any():
        # held on a measured draw: a GPU whose power is unknown (read as its failsafe cap,
        # rule 1) is not known to want more
        held = pressed & np.isfinite(np.asarray(state.power_w, dtype=float))
        between = ~capping & ~below & (tree.node_sum(held.astype(float)) > 0)
    room = below | between
    for lvl in (ROW, RACK, SERVER):  # a node hands back only if all its ancestors do too
        below[tree.level_nodes[lvl]] &= below[tree.level_parent[lvl]]
        room[tree.level_nodes[lvl]] &= room[tree.level_parent[lvl]]
    server_of = tree.gpu_ancestor[SERVER]
    # under nodes all below their uncapping thresholds every GPU may ask; where some are
    # between their bands, only the GPUs held at their caps
    may_ask = below[server_of] | (room[server_of] & held)
    asking = ctl & ~staged & ~waiting & ~shifted & ~levelled & may_ask & (cap < cap_max)
    cycles = None if state.uncap_cycles is None else np.asarray(state.uncap_cycles, dtype=float)
    everyone = asking  # with turns: every GPU that would ask, its turn or not
    if cycles is not None:
        asking = asking & (cycles > 0)
    if asking.any():
        i = np.flatnonzero(asking)
        request = _uncap_request(
            cap_max[i] - cap[i], None if cycles is None else cycles[i], settings
        )
        # what every GPU under a node could draw at its cap (the others at what they draw)
        held = np.where(ctl, cap, power) if not ctl.all() else cap
        node_cap_sum = tree.node_sum(held) + overhead
        drawn = node_pred
        if settings.uncap_within_caps:  # GPUs at their caps; idle ones at what they draw
            at_caps = np.where(phase == _IDLE_CODE, power, held)
            drawn = tree.node_sum(at_caps) + overhead
        ramp = np.asarray(tree.ramp_w_per_s, dtype=float)
        ramp = np.maximum(ramp - own_rise_w_per_s(tree, state, phase, ctl, staged, settings), 0)
        cap_room = np.minimum(tree.cap_target_w - drawn, tree.limit_w - node_cap_sum)
        if cycles is not None:  # a turn takes its share of the room, the others' turns come
            j = np.flatnonzero(everyone)
            k_all = np.full(len(j), float(cycles[i].max()))
            wanted = np.bincount(
                server_of[j],
                weights=_uncap_request(cap_max[j] - cap[j], k_all, settings),
                minlength=n_nodes,
            )
            asked = np.bincount(server_of[i], weights=request, minlength=n_nodes)
            cap_room = cap_room * _ratio(tree.fold_up(asked), tree.fold_up(wanted))
        budget = np.minimum(ramp * dt_s - level_rise, cap_room)
        budget = np.where(room & (budget > NEGLIGIBLE_W), budget, 0.0)  # NaN (bad tree): none
        server = tree.gpu_ancestor[SERVER][i]
        classes = priority[i]
        for prio in range(HIGH, LOW - 1, -1):  # what HIGH leaves goes to NORMAL, then LOW
            mine = classes == prio
            if not mine.any():
                continue
            given = request[mine] * _ramp_grants(tree, server[mine], request[mine], budget)
            cap[i[mine]] = np.minimum(cap[i[mine]] + given, cap_max[i[mine]])
            used = np.bincount(server[mine], weights=given, minlength=n_nodes)
            budget = budget - tree.fold_up(used.astype(float, copy=False))
            # rounding residue (1e-14 W) is nothing left: whether a node "has nothing left"
            # must not depend on the order the GPUs' grants were summed in
            budget[budget <= NEGLIGIBLE_W] = 0.0
            # nothing for lower classes under a node where this class is still held at
            # its caps: those watts would be shifted back to it next cycle (churn); but a
            # node below it with nothing left is what holds the GPU, and its ancestors'
            # watts could not reach it: they stay for the other GPUs under them
            still = i[mine][pressed[i[mine]] & (cap[i[mine]] < cap_max[i[mine]])]
            if len(still):
                _close_for_lower_classes(tree, budget, still)

    pred = np.minimum(power, cap)
    if not ctl.all():
        pred[~ctl] = power[~ctl]
    node_predicted = tree.node_sum(pred) + overhead

    # 5. clocks; 6. what holding a power floor would cost
    clock, floor_energy = clocks_and_floor(tree, power, phase, ctl, dt_s, settings)

    return Decision(
        cap_w=cap,
        max_sm_clock_mhz=clock,
        node_power_w=node_power,
        node_predicted_w=node_predicted,
        node_capping=capping,
        floor_hold_energy_j=floor_energy,
        node_cut_w=node_cut,
        cut_levels=cut_levels,
        node_shift_w=node_shift,
        shifted=shifted,
        levelled=levelled,
    )


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
        comm = np.flatnonzero(ctl & (phase == _COMM_CODE))
        clock[comm] = np.asarray(tree.comm_clock_mhz, dtype=float)[comm]
    floor_energy = 0.0
    if settings.hold_floor_w_per_gpu is not None:
        waiting = ctl & in_codes(phase, _WAITING_CODES)
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


def _close_for_lower_classes(tree: Tree, budget: np.ndarray, still: np.ndarray) -> None:
    """Rule 4, in place: no budget left for lower classes under the nodes whose watts could
    reach a GPU of ``still`` (held after its class's grant): bottom-up from its server,
    every ancestor up to, not including, the first with nothing left, which holds it. Node
    by node (a few per rack), not GPU by GPU: every cycle of a 150 MW replay runs it."""
    reach = np.zeros(tree.n_nodes, dtype=bool)
    reach[tree.gpu_ancestor[SERVER][still]] = True
    for lvl in LEVELS_BOTTOM_UP:
        nodes = tree.level_nodes[lvl]
        if lvl != SERVER:  # reached from a child that let it through
            children = tree.level_nodes[lvl + 1]
            reach[tree.level_parent[lvl + 1][reach[children]]] = True
        through = reach[nodes] & (budget[nodes] > 0)
        budget[nodes[through]] = 0.0
        reach[nodes] = through


def _shift(
    tree: Tree,
    node_power: np.ndarray,
    guessed_w: np.ndarray,
    node_pred: np.ndarray,
    node_shift: np.ndarray,
    shifted: np.ndarray,
    cap: np.ndarray,
    pred: np.ndarray,
    floor: np.ndarray,
    cap_max: np.ndarray,
    priority: np.ndarray,
    ctl: np.ndarray,
    pressed: np.ndarray,
) -> None:
    """Rule 3b, in place: bottom-up, a node between its bands under which a GPU of class p
    is held at its cap takes from the classes below p (LOW first, water-filled, never below
    a floor) what brings it just under its uncapping threshold, at most the held GPUs'
    gaps less what the levels below already took for them. ``pred``/``cap`` of the cut
    GPUs, ``node_pred``, ``node_shift`` and ``shifted`` are updated."""
    n_nodes = len(node_pred)
    between = _between_bands(tree, node_power, guessed_w)
    p_idx = np.flatnonzero(pressed)
    taken_below = np.zeros(n_nodes)
    # a held GPU counts for a node only if no node between them blocks its uncapping
    # (every one is below its uncapping threshold): otherwise that node shifts first
    below = node_power < tree.uncap_threshold_w
    clear = np.ones(len(p_idx), dtype=bool)
    for lvl in LEVELS_BOTTOM_UP:
        nodes = tree.level_nodes[lvl]
        group = tree.gpu_ancestor[lvl]
        if lvl != SERVER:
            clear &= below[tree.gpu_ancestor[lvl + 1][p_idx]]
        held = p_idx[clear]
        # the highest class held at its cap under each node, and the gaps of that class
        top = np.full(n_nodes, -1)
        for prio in range(LOW, HIGH + 1):  # ascending: the highest class present wins
            top[group[held[priority[held] == prio]]] = prio
        in_top = held[priority[held] == top[group[held]]]
        gaps = np.bincount(group[in_top], weights=cap_max[in_top] - cap[in_top], minlength=n_nodes)
        # what the classes below it can give
        donor = ctl & (pred > floor) & (priority < top[group])
        spare = np.bincount(group[donor], weights=pred[donor] - floor[donor], minlength=n_nodes)
        need = np.zeros(n_nodes)
        want = nodes[between[nodes] & (top[nodes] > LOW)]
        if not len(want):
            continue
        margin = np.maximum(1.0, 1e-3 * np.abs(tree.uncap_threshold_w[want]))
        need[want] = np.minimum.reduce(
            [
                node_pred[want] - tree.uncap_threshold_w[want] + margin,
                gaps[want] - taken_below[want],
                spare[want],
            ]
        )
        need[~np.isfinite(need)] = 0.0
        if not np.any(need[want] > NEGLIGIBLE_W):
            continue
        need[need <= NEGLIGIBLE_W] = 0.0
        idx, taken = _cut(tree, lvl, need, pred, cap, node_pred, floor, priority, ctl)
        shifted[idx] = True
        node_shift[nodes] += taken[nodes]
        taken_below += taken


def _between_bands(tree: Tree, node_power: np.ndarray, guessed_w: np.ndarray) -> np.ndarray:
    """(n_nodes,) bool: neither capping nor handing back, and known to be: the power counted
    for its unheard GPUs (``guessed_w``) is at most ``GUESSED_BAND_SHARE`` of its band. A
    node that never uncaps (a non-finite uncapping threshold) is not: a shift or a
    levelling cannot unblock it."""
    between: np.ndarray = (node_power <= tree.cap_threshold_w) & (
        node_power >= tree.uncap_threshold_w
    )
    between &= np.isfinite(tree.uncap_threshold_w)
    with np.errstate(invalid="ignore"):  # inf - inf: not between anyway
        band_w = tree.cap_threshold_w - tree.uncap_threshold_w
        between &= guessed_w <= GUESSED_BAND_SHARE * band_w
    return between


# Rule 3c: a GPU this close to its class's level (a share of its range) does not move,
# whatever uncap_min_step_w is, so levelling settles instead of trading watts for ever.
LEVEL_TOLERANCE_FRACTION = 0.01


def _level(
    tree: Tree,
    node_power: np.ndarray,
    guessed_w: np.ndarray,
    node_pred: np.ndarray,
    cap: np.ndarray,
    pred: np.ndarray,
    power: np.ndarray,
    lowest: np.ndarray,
    cap_min: np.ndarray,
    cap_max: np.ndarray,
    priority: np.ndarray,
    ctl: np.ndarray,
    held: np.ndarray,
    dt_s: float,
    settings: PolicySettings,
) -> tuple[np.ndarray, np.ndarray]:
    """Rule 3c, in place on ``cap``, ``pred`` and ``node_pred``: bottom-up, under every node
    between its bands, the ``held`` GPUs of each class move towards one share of their
    ranges (see the module docstring). Returns the GPUs whose caps it moved, and per tree
    node how much the sum of the caps under it rose (what rule 4's ramp has left less)."""
    n_nodes, n_gpus = tree.n_nodes, tree.n_gpus
    risen = np.zeros(n_nodes)  # how much the sum of the caps under each node has risen
    # the sum of the caps under each node (uncontrollable GPUs at their draw) plus its
    # overheads, kept up to date once a level above the servers first needs it
    cap_sum: np.ndarray | None = None
    between = _between_bands(tree, node_power, guessed_w)
    below = node_power < tree.uncap_threshold_w
    span = cap_max - cap_min
    step_min = settings.uncap_min_step_w
    h_idx = np.flatnonzero(held)
    clear = np.ones(len(h_idx), dtype=bool)  # no node between it and this level blocks it
    moved = np.zeros(n_gpus, dtype=bool)
    for lvl in LEVELS_BOTTOM_UP:
        if lvl != SERVER:
            clear &= below[tree.gpu_ancestor[lvl + 1][h_idx]]
        if not between[tree.level_nodes[lvl]].any():
            continue
        group = tree.gpu_ancestor[lvl]
        g = h_idx[clear & ~moved[h_idx]]
        g = g[between[group[g]]]
        if len(g) < 2:
            continue
        share = (cap[g] - cap_min[g]) / np.maximum(span[g], NEGLIGIBLE_W)
        if share.max() - share.min() <= LEVEL_TOLERANCE_FRACTION:
            continue  # no GPU can be further than that from its class's level: all settled
        seg = group[g] * N_PRIORITIES + priority[g]  # (node, class); dense: no sort
        n_seg = n_nodes * N_PRIORITIES
        sum_cap = np.bincount(seg, weights=cap[g] - cap_min[g], minlength=n_seg)
        tau = _ratio(sum_cap, np.bincount(seg, weights=span[g], minlength=n_seg))
        distance = cap_min[g] + tau[seg] * span[g] - cap[g]
        far = np.abs(distance) > np.maximum(step_min, LEVEL_TOLERANCE_FRACTION * span[g])
        if not far.any():
            continue
        step = np.minimum(
            np.abs(distance), np.maximum(settings.uncap_step_fraction * np.abs(distance), step_min)
        )
        step[~far] = 0.0
        up = np.where(distance > 0, np.minimum(step, cap_max[g] - cap[g]), 0.0)
        down = np.where(distance < 0, np.clip(np.minimum(step, cap[g] - lowest[g]), 0.0, None), 0.0)
        if lvl != SERVER:  # every node between a receiver and this level has room for it
            if cap_sum is None:
                cap_sum = tree.node_sum(np.where(ctl, cap, power)) + tree.overhead_below_w
            room = np.minimum.reduce(
                [
                    tree.cap_target_w - node_pred,
                    tree.limit_w - cap_sum,
                    np.asarray(tree.ramp_w_per_s, dtype=float) * dt_s - np.maximum(risen, 0.0),
                ]
            )
            room = np.nan_to_num(np.maximum(room, 0.0), nan=0.0)
            for inner in range(lvl + 1, SERVER + 1):
                node = tree.gpu_ancestor[inner][g]
                gain = np.bincount(node, weights=up, minlength=n_nodes)
                up *= _ratio(room[node], gain[node])
        # donors give no more than receivers can take; receivers take no more than the
        # donors' predicted power loses (a donor drawing below its cap loses less)
        gained = np.bincount(seg, weights=up, minlength=n_seg)
        down *= _ratio(gained, np.bincount(seg, weights=down, minlength=n_seg))[seg]
        relief = np.maximum(pred[g] - (cap[g] - down), 0.0)
        up *= _ratio(np.bincount(seg, weights=relief, minlength=n_seg), gained)[seg]
        changed = (up > 0) | (down > 0)
        if not changed.any():
            continue
        g, up, down = g[changed], up[changed], down[changed]
        cap[g] += up - down
        # a receiver is held at its cap: it will draw what it gained
        new_pred = np.minimum(pred[g], cap[g]) + up
        node_pred += _sum_up(tree, g, new_pred - pred[g])
        pred[g] = new_pred
        cap_change = _sum_up(tree, g, up - down)
        risen += cap_change
        if cap_sum is not None:
            cap_sum += cap_change
        moved[g] = True
    return moved, np.maximum(risen, 0.0)


def _sum_up(tree: Tree, gpus: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(n_nodes,) ``values`` of a few ``gpus`` summed under every tree node."""
    server = tree.gpu_ancestor[SERVER][gpus]
    return tree.fold_up(np.bincount(server, weights=values, minlength=tree.n_nodes))


def _lowest_cut(
    tree: Tree,
    node_power: np.ndarray,
    pred: np.ndarray,
    floor: np.ndarray,
    fall_w: float,
    waiting: np.ndarray,
) -> np.ndarray:
    """How low rules 3, 3b and 3c may cut each GPU this cycle: its floor; with a finite
    ``fall_w`` (``cut_fall_w_per_s × dt_s``), also no lower than ``pred - fall_w``, and a
    ``waiting`` GPU no lower than ``pred`` (it falls on its own), unless a node over it
    (its server included) draws above its limit."""
    if not np.isfinite(fall_w):
        return floor
    urgent = under_a_passed_limit(tree, node_power)
    glide = np.maximum(floor, pred - np.where(waiting, 0.0, fall_w))
    lowest: np.ndarray = np.where(urgent, floor, glide)
    return lowest


def under_a_passed_limit(tree: Tree, node_power: np.ndarray) -> np.ndarray:
    """(n_gpus,) bool: a node over the GPU (its server included) draws above its limit."""
    return tree.gpus_under(node_power > tree.limit_w)


def _lowest_in_turn(
    tree: Tree,
    node_power: np.ndarray,
    pred: np.ndarray,
    lowest: np.ndarray,
    span: np.ndarray,
    cut_turn: np.ndarray,
    settings: PolicySettings,
) -> np.ndarray:
    """How low rule 3 may cut each GPU before the GPUs out of turn give (rule 3, "in
    turn"): under a node over its limit, ``lowest``; else in turn, no more than
    ``cut_turn_max_fraction`` of its range under what it draws; out of turn, nothing."""
    urgent = under_a_passed_limit(tree, node_power)
    step = np.where(np.asarray(cut_turn, dtype=bool), settings.cut_turn_max_fraction * span, 0.0)
    out: np.ndarray = np.where(urgent, lowest, np.maximum(lowest, pred - step))
    return out


def _cut(
    tree: Tree,
    lvl: int,
    need: np.ndarray,
    pred: np.ndarray,
    cap: np.ndarray,
    node_pred: np.ndarray,
    floor: np.ndarray,
    priority: np.ndarray,
    ctl: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Take ``need[node]`` under the nodes of level ``lvl`` (:func:`_take`) and apply it in
    place: the cut GPUs' predicted power and caps come down to what they keep, and every
    node's predicted power loses what was taken under it. Returns the GPUs cut and, per
    tree node, the watts taken under it (for the level's nodes: what each took)."""
    idx, spare, spare_after, took = _take(need, tree.gpu_ancestor[lvl], pred, floor, priority, ctl)
    was_cut = spare_after < spare
    idx = idx[was_cut]
    pred[idx] = floor[idx] + spare_after[was_cut]
    cap[idx] = np.minimum(cap[idx], pred[idx])
    taken = tree.fold_up(took)  # in place: the level's own values stay, ancestors gain
    node_pred -= taken  # ancestors (and the nodes) lose what was taken
    return idx, taken


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


def _take(
    need: np.ndarray,
    group: np.ndarray,
    pred: np.ndarray,
    floor: np.ndarray,
    priority: np.ndarray,
    ctl: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Take ``need[node]`` watts under every node of one level at once.

    Returns the GPUs that can give (controllable, above their floor, under a
    node that needs watts), what each had and has left above its floor, and
    the watts each node took. Priority classes are emptied in order (LOW,
    NORMAL, HIGH); the class that gives the last watts is water-filled.
    """
    needy = np.flatnonzero(need > 0)
    sel = need[group] > 0
    sel &= ctl
    sel &= pred > floor
    idx = np.flatnonzero(sel)
    spare = pred[idx]
    spare -= floor[idx]  # what each can give
    seg = group[idx]
    seg *= N_PRIORITIES
    seg += priority[idx]  # (node, class) segments
    n_seg = len(need) * N_PRIORITIES
    have = np.bincount(seg, weights=spare, minlength=n_seg).astype(float, copy=False)
    have = have.reshape(-1, N_PRIORITIES)[needy]
    before = np.cumsum(have, axis=1)
    before -= have  # what the classes taken earlier hold
    needy_take = np.clip(need[needy, None] - before, 0.0, have)
    needy_take[needy_take <= NEGLIGIBLE_W] = 0.0  # rounding left by an earlier class: no cut
    node_took = np.zeros(len(need))
    node_took[needy] = needy_take.sum(axis=1)
    take_by_class = np.zeros((len(need), N_PRIORITIES))
    take_by_class[needy] = needy_take
    take = take_by_class.ravel()
    full_class = np.zeros((len(need), N_PRIORITIES), dtype=bool)
    full_class[needy] = (needy_take >= have) & (have > 0)
    seg_take = take[seg]
    full = full_class.ravel()[seg]  # the whole class goes to its floor
    spare_after = spare.copy()
    spare_after[full] = 0.0
    part = seg_take > 0
    part &= ~full
    n_part = np.count_nonzero(part)
    if 0 < n_part == len(idx):  # every GPU is water-filled (one class per node): no gathers
        spare_after = _water_fill(spare, seg, take)
    elif n_part:
        part = np.flatnonzero(part)
        spare_after[part] = _water_fill(spare[part], seg[part], take)
    return idx, spare, spare_after, node_took


def _water_fill(spare: np.ndarray, seg: np.ndarray, take: np.ndarray) -> np.ndarray:
    """``min(spare, L)``, with per segment the level ``L``: ``sum(max(spare - L, 0)) == take[seg]``.

    One sort by (segment, spare descending) of an int64 key: the segment id in
    the high bits, the spare's float bits below it (positive floats order like
    their bit patterns; the dropped low bits only matter for near-ties, which
    the correction step absorbs). Segments are then contiguous runs, and every
    per-segment sum is an ``np.add.reduceat``. In a segment with sorted spares
    ``s_1 >= s_2 >= ...`` and running sums ``C_j``, cutting down to ``s_j``
    removes ``D_j = C_j - j s_j`` (non-decreasing in j). With ``k`` the number
    of positions with ``D_j < take``, the level is ``(C_k - take) / k``, which
    lies in ``[s_{k+1}, s_k]``. A final Newton step on the piecewise linear
    ``sum(max(spare - L, 0))`` makes the sum exact to rounding.
    """
    n = len(spare)
    seg_bits = max(1, int(seg.max()).bit_length())
    low_bits = 63 - seg_bits
    key = spare.view(np.int64) >> seg_bits  # spare > 0: order-preserving
    np.subtract(np.int64((1 << low_bits) - 1), key, out=key)  # descending spare
    key |= seg << low_bits
    order = np.argsort(key, kind="stable")  # stable sort: fast (runs) when GPUs come grouped
    del key
    s = spare[order]
    s_seg = seg[order]
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(s_seg[1:], s_seg[:-1], out=first[1:])
    start = np.flatnonzero(first)
    count = np.diff(np.append(start, n))
    seg_take = take[s_seg[start]]
    del s_seg, first
    running = np.cumsum(s)
    running -= np.repeat(running[start] - s[start], count)  # running sum inside each segment
    work = np.arange(1.0, n + 1.0)
    work -= np.repeat(start.astype(float), count)  # position j inside the segment
    work *= s
    np.subtract(running, work, out=work)  # D_j
    short = work < np.repeat(seg_take, count)
    k = np.maximum(np.add.reduceat(short, start, dtype=np.intp), 1)  # k >= 1 (D_1 = 0 < take)
    level = (running[start + k - 1] - seg_take) / k
    # Newton step: absorbs rounding and near-tie misordering
    np.subtract(s, np.repeat(level, count), out=work)
    above = work > 0
    np.maximum(work, 0.0, out=work)
    removed = np.add.reduceat(work, start)
    n_above = np.add.reduceat(above, start, dtype=np.intp)
    level += _ratio(removed - seg_take, n_above, cap=False)
    np.maximum(level, 0.0, out=level)
    np.minimum(s, np.repeat(level, count), out=work)
    out = np.empty(n)
    out[order] = work
    return out


def _ramp_grants(
    tree: Tree, server: np.ndarray, request: np.ndarray, budget: np.ndarray
) -> np.ndarray:
    """Per request, the fraction of it granted so every ancestor's budget holds.

    Bottom-up each node can pass on ``A = min(budget, demand)``, demand being
    the sum of its children's ``A`` (for a server, of its GPUs' requests);
    top-down a child gets ``A_child * grant_parent / demand_parent``, and a
    GPU its request times ``grant_server / demand_server``.
    """
    n_nodes = len(budget)
    demand = np.bincount(server, weights=request, minlength=n_nodes).astype(float, copy=False)
    allowed = np.zeros(n_nodes)
    for lvl in LEVELS_BOTTOM_UP:
        nodes = tree.level_nodes[lvl]
        allowed[nodes] = np.minimum(budget[nodes], demand[nodes])
        if lvl != SITE and len(nodes):
            demand += np.bincount(tree.level_parent[lvl], weights=allowed[nodes], minlength=n_nodes)
    grant = np.zeros(n_nodes)
    roots = tree.level_nodes[SITE]
    grant[roots] = allowed[roots]
    for lvl in (ROW, RACK, SERVER):
        nodes, parent = tree.level_nodes[lvl], tree.level_parent[lvl]
        grant[nodes] = allowed[nodes] * _ratio(grant[parent], demand[parent])
    share: np.ndarray = _ratio(grant, demand)[server]
    return share


def _uncap_request(
    gap_w: np.ndarray, cycles: np.ndarray | None, settings: PolicySettings
) -> np.ndarray:
    """Rule 4's request of GPUs ``gap_w`` below their maximum: one cycle's step, or with
    ``cycles`` (k per GPU) what k such steps would give."""
    fraction, least_w = settings.uncap_step_fraction, settings.uncap_min_step_w
    if cycles is None:
        step = np.maximum(fraction * gap_w, least_w)
    else:
        step = np.maximum((1.0 - (1.0 - fraction) ** cycles) * gap_w, cycles * least_w)
    return np.asarray(np.minimum(gap_w, step), dtype=float)


def _ratio(num: np.ndarray, den: np.ndarray, cap: bool = True) -> np.ndarray:
    """``num / den`` where ``den > 0``, else 0; at most 1 unless ``cap`` is False."""
    out = np.zeros(np.shape(num))
    np.divide(num, den, out=out, where=den > 0)
    return np.minimum(out, 1.0) if cap else out
