"""What a control cycle is tuned by (:class:`PolicySettings`) and what it answers
(:class:`Decision`), for both cycles ``policies.decide`` may run: the bands
(``policies.capping``) and safety by caps (``policies.allocation``, the default).

Every setting is a number, a boolean or None, so a TOML file can give it; ``__post_init__``
refuses a value outside its range. A Decision's arrays are per GPU (n_gpus,) or per tree
node (n_nodes,); its diagnostics say which rule moved which cap, for the controller's
records and ``policies.causes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


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
    # Seconds of that rise a staged GPU's cap stands above its draw, on top of its headroom
    # (policies.rules.stage_headroom_w: the draw the cap is set on is up to a cycle old, and
    # the next cap lands a cycle later). 0: twice the time since the last cycle.
    # controller.grid_smoothing sets it to two cycle periods: an early cycle 0.09 s after
    # the last cut a checkpoint's cap 33 W under its fill, and compute resumed capped.
    stage_fill_s: float = 0.0
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
        if not (np.isfinite(self.stage_fill_s) and self.stage_fill_s >= 0.0):
            raise ValueError(f"stage_fill_s must be >= 0, not {self.stage_fill_s}")
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
