"""The site's grid spec (``[site.grid]`` in a budgets file): what the utility allows.

Interconnection agreements bound the *measured* site power, not the sum of
caps: how fast it may rise and fall (MW/s over a window), how much of its
variance may sit in a band of frequencies (0.1-20 Hz, where synchronised
training swings and the grid is sensitive), and, as a mitigation, a power
floor held while jobs run (docs/DOMAIN.md, Power Stabilization for AI
Training Datacenters). ``policies.grid`` measures a power series against it;
docs/BUDGETS.md ("The grid spec") gives the keys and how each is measured.
Every limit is optional: a key left out is no limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from policies import grid as grid_measure
from policies import grid_frontier
from powerd.units import fmt_w

DEFAULT_WINDOW_S = 1.0  # ramps are measured over a second, as MW/s limits are written
DEFAULT_FLOOR_WINDOW_S = 60.0
DEFAULT_OSCILLATION_BAND_HZ = (0.1, 20.0)  # arXiv 2508.14318's example band (DOMAIN.md)
DEFAULT_OSCILLATION_WINDOW_S = 60.0  # six periods of the band's 0.1 Hz lower edge

# Plausible windows: a millisecond (a sub-cycle swing) to an hour; longer is
# almost always milliseconds written as seconds.
WINDOW_PLAUSIBLE_S = (1e-3, 3600.0)
# Plausible band edges: below a millihertz is drift, not oscillation; above a
# kilohertz no power meter at a site's feed resolves it.
BAND_PLAUSIBLE_HZ = (1e-3, 1e3)


@dataclass(frozen=True)
class GridSpec:
    """What the grid allows the site's measured power; ``inf`` / ``None``: no limit."""

    ramp_up_w_per_s: float = math.inf  # max rise of measured power, over window_s
    ramp_down_w_per_s: float = math.inf  # max fall, as a positive number
    window_s: float = DEFAULT_WINDOW_S
    floor_fraction: float | None = None  # hold power ≥ this share of the recent peak
    floor_window_s: float = DEFAULT_FLOOR_WINDOW_S  # "recent"
    oscillation_band_hz: tuple[float, float] = DEFAULT_OSCILLATION_BAND_HZ
    oscillation_max_share: float | None = None  # of the variance, in the band
    oscillation_window_s: float = DEFAULT_OSCILLATION_WINDOW_S
    # a window whose oscillation in the band is smaller (RMS, W) is within the share limit
    oscillation_min_rms_w: float = 0.0

    def __post_init__(self) -> None:
        for name in ("ramp_up_w_per_s", "ramp_down_w_per_s"):
            value = getattr(self, name)
            if math.isnan(value) or value <= 0:
                raise ValueError(f"{name} must be positive (inf: no limit), not {value}")
        for name in ("window_s", "floor_window_s", "oscillation_window_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, not {value}")
        lo, hi = self.oscillation_band_hz
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo < hi):
            raise ValueError(f"oscillation_band_hz must be 0 < lo < hi, not {(lo, hi)}")
        if self.floor_fraction is not None and not 0 < self.floor_fraction < 1:
            raise ValueError(f"floor_fraction must be in (0, 1), not {self.floor_fraction}")
        if not (math.isfinite(self.oscillation_min_rms_w) and self.oscillation_min_rms_w >= 0):
            raise ValueError(
                f"oscillation_min_rms_w must be ≥ 0 W, not {self.oscillation_min_rms_w}"
            )
        share = self.oscillation_max_share
        if share is not None and not 0 < share <= 1:
            raise ValueError(f"oscillation_max_share must be in (0, 1], not {share}")

    @property
    def limits_ramp(self) -> bool:
        return math.isfinite(self.ramp_up_w_per_s) or math.isfinite(self.ramp_down_w_per_s)

    @property
    def can_smooth(self) -> bool:
        """Whether grid smoothing has anything to hold a GPU to: a ramp limit or a floor."""
        return self.limits_ramp or bool(self.floor_fraction)

    def oscillation(self, power_w: np.ndarray, step_s: float) -> grid_measure.OscillationStats:
        """``policies.grid.oscillation_stats`` of a series against this spec's band, window
        and limits."""
        return grid_measure.oscillation_stats(
            power_w,
            step_s,
            self.oscillation_band_hz,
            self.oscillation_window_s,
            self.oscillation_max_share,
            self.oscillation_min_rms_w,
        )

    def describe(self) -> str:
        """One line: 'ramp +20 kW/s, -20 kW/s over 1 s; ≤ 20 % of variance in 0.1-20 Hz
        per 60 s; floor 80 % of the last 60 s's peak'."""
        parts = []
        if self.limits_ramp:
            up, down = self.ramp_up_w_per_s, self.ramp_down_w_per_s
            shown = [
                f"{sign}{fmt_w(v)}/s" if math.isfinite(v) else f"{sign}no limit"
                for sign, v in (("+", up), ("-", down))
            ]
            parts.append(f"ramp {', '.join(shown)} over {self.window_s:g} s")
        lo, hi = self.oscillation_band_hz
        if self.oscillation_max_share is not None:
            least = self.oscillation_min_rms_w
            above = f" (oscillations above {fmt_w(least)} RMS)" if least > 0 else ""
            parts.append(
                f"≤ {self.oscillation_max_share * 100:g} % of variance in {lo:g}-{hi:g} Hz "
                f"per {self.oscillation_window_s:g} s{above}"
            )
        if self.floor_fraction is not None:
            share, last = self.floor_fraction * 100, self.floor_window_s
            parts.append(f"floor {share:g} % of the last {last:g} s's peak")
        return "; ".join(parts) or "no limits (measured only)"


NO_GRID_SPEC = "no grid spec"


def _finite(x: float | None) -> float | None:
    """JSON has no NaN or inf: None (no limit, or nothing seen)."""
    return None if x is None or not math.isfinite(x) else float(x)


def grid_report(
    site_w: np.ndarray,
    step_s: float,
    spec: GridSpec | None,
    energy_j: float | None = None,
    smoothing_j: float | None = None,
    demand_w: np.ndarray | None = None,
    resume_w: np.ndarray | None = None,
    need_w: np.ndarray | None = None,
    lost_j: float | None = None,
    job_parts: list[tuple[np.ndarray, np.ndarray, float]] | None = None,
) -> dict[str, Any]:
    """A site's regular power series (one value every ``step_s``) measured as the grid sees it
    (``policies.grid``), against ``spec`` when there is one: what ``powerplan whatif``
    and ``powerd demo`` report. NaN and inf become None (JSON); ``breaches`` names every
    limit broken ('ramp up 12.3 s', ...), empty without a spec; ``energy_j``: the jobs'
    energy, what a floor's cost is a share of. ``smoothing_j``: the energy smoothing
    *burnt* holding floors and ramp-downs (``policies.smoothing``); given, it is
    reported instead of what holding the spec's floor on this series would burn
    (``floor_source`` says which). ``demand_w``: what the site would draw with no floor
    held (default: ``site_w`` when nothing was burnt); under a ramp limit, the least any
    floor must burn on it to meet the limit is reported (``floor_least_*``,
    ``policies.grid.least_ramp_floor``). ``resume_w``: what the site would draw were
    every waiting job to resume at once; given, the least a floor that cannot know when
    waits end must burn is reported too (``floor_ready_*``,
    ``policies.grid.least_ready_floor``), with the seconds that floor's own series is
    outside the oscillation limit (``floor_ready_s_outside_oscillation``: the bound
    minds the ramps alone; where it is outside, it is below what the whole spec allows).
    ``need_w``: what the site would draw with no grid spec (its jobs' demand, uncapped);
    given, with a ramp limit, the work lost to the grid and its bound are reported
    (``_lost_work``); ``lost_j``: the work the grid held back counted GPU by GPU, when
    known (else the site's shortfall from ``need_w``). ``job_parts``: per job, its draw
    with no floor, its resume levels and its share of the site's GPUs; given, with
    ``resume_w``, the least floors burn when each job keeps a fixed share of the ramps
    (``floor_shared_kwh``, ``policies.grid.least_ready_floor_j_by_shares``: the bound for
    powerd's per-GPU shares) and what was burnt over it (``floor_ratio_to_shared``)."""
    g = spec or GridSpec()
    out: dict[str, Any] = {"spec": NO_GRID_SPEC if spec is None else spec.describe()}
    out["step_s"] = step_s
    if step_s <= 0 or len(site_w) < 2:
        out |= {"measured": False, "breaches": []}
        return out
    up = spec.ramp_up_w_per_s if spec is not None else math.inf
    down = spec.ramp_down_w_per_s if spec is not None else math.inf
    ramp = grid_measure.ramp_stats(site_w, step_s, g.window_s, up, down)
    osc = g.oscillation(site_w, step_s)
    out |= {
        "measured": True,
        "ramp_window_s": ramp.window_s,
        "ramp_up_max_w_per_s": ramp.up_max_w_per_s,
        "ramp_up_p99_w_per_s": ramp.up_p99_w_per_s,
        "ramp_down_max_w_per_s": ramp.down_max_w_per_s,
        "ramp_down_p99_w_per_s": ramp.down_p99_w_per_s,
        "oscillation_band_hz": list(osc.band.band_hz),
        "oscillation_band_seen_hz": None if osc.band.seen_hz is None else list(osc.band.seen_hz),
        "oscillation_note": osc.band.note,
        "oscillation_window_s": osc.window_s,
        "oscillation_windows": osc.n_windows,
        "oscillation_share": _finite(osc.share),
        "oscillation_share_max": _finite(osc.share_max),
        "peak_to_peak_max_w": osc.peak_to_peak_max_w,
        "oscillation_band_rms_max_w": _finite(osc.band_rms_max_w),
        "breaches": [],
    }
    if spec is None:
        return out
    out |= {
        "ramp_up_limit_w_per_s": _finite(spec.ramp_up_w_per_s),
        "ramp_down_limit_w_per_s": _finite(spec.ramp_down_w_per_s),
        "oscillation_max_share": spec.oscillation_max_share,
        "oscillation_min_rms_w": spec.oscillation_min_rms_w,
        "s_outside_ramp_up": ramp.s_up_over,
        "s_outside_ramp_down": ramp.s_down_over,
        "s_outside_oscillation": osc.s_over,
    }
    out["breaches"] = [
        f"{what} {seconds:.1f} s"
        for what, seconds in (
            ("ramp up", ramp.s_up_over),
            ("ramp down", ramp.s_down_over),
            ("oscillation", osc.s_over),
        )
        if seconds > 0
    ]
    out |= _floor_costs(site_w, step_s, spec, energy_j, smoothing_j, demand_w, resume_w)
    if job_parts and resume_w is not None and spec.limits_ramp:
        shared_j = grid_measure.least_ready_floor_j_by_shares(
            job_parts, step_s, spec.window_s, spec.ramp_up_w_per_s, spec.ramp_down_w_per_s
        )
        out["floor_shared_kwh"] = shared_j / grid_measure.J_PER_KWH
        out["floor_ratio_to_shared"] = (
            smoothing_j / shared_j if smoothing_j is not None and shared_j > 0 else None
        )
    if need_w is not None and spec.limits_ramp:
        ready_kwh = out.get("floor_ready_kwh")
        out |= _lost_work(site_w, step_s, spec, need_w, smoothing_j, ready_kwh, lost_j)
    return out


def _lost_work(
    site_w: np.ndarray,
    step_s: float,
    spec: GridSpec,
    need_w: np.ndarray,
    smoothing_j: float | None,
    floor_ready_kwh: float | None,
    held_j: float | None = None,
) -> dict[str, Any]:
    """``grid_report``'s lost-work part (``policies.grid_frontier``). ``lost_work_kwh``:
    the site's demand with no grid spec not served, ``sum((need_w - site_w)^+) step_s``.
    ``lost_least_kwh``: the least any schedule meeting the ramp limits loses while burning
    no more than this one did (``smoothing_j``; without it, what the site drew above
    ``need_w``): the bound at that energy. ``lost_ratio_to_bound``: the one over the
    other; ``floor_ratio_to_causal``: the floor energy burnt over ``floor_ready_kwh`` (the
    least a floor that cannot know when waits end burns). None where a bound is 0."""
    need, drawn = grid_measure.as_series(need_w, "need_w"), grid_measure.as_series(site_w)
    gap_w = need - drawn
    lost_j = float(np.maximum(gap_w, 0.0).sum()) * step_s if held_j is None else held_j
    burnt_j = (
        smoothing_j if smoothing_j is not None else float(np.maximum(-gap_w, 0.0).sum()) * step_s
    )
    least_j = grid_frontier.least_lost_j(
        need, step_s, spec.window_s, spec.ramp_up_w_per_s, spec.ramp_down_w_per_s, burnt_j
    )
    # the highest series meeting the limits under max(need, site): floors no higher than
    # these, every rise as fast as the limits allow (what "at its floors" means)
    ceiling = grid_frontier.least_ramp_ceiling(
        np.maximum(need, drawn),
        step_s,
        spec.window_s,
        spec.ramp_up_w_per_s,
        spec.ramp_down_w_per_s,
    )
    at_floors_j = float(np.maximum(need - ceiling, 0.0).sum()) * step_s
    kwh = grid_measure.J_PER_KWH
    floor_ratio = None
    if smoothing_j is not None and floor_ready_kwh:
        floor_ratio = smoothing_j / kwh / floor_ready_kwh
    return {
        "lost_work_kwh": lost_j / kwh,
        "lost_least_kwh": least_j / kwh,
        "lost_ratio_to_bound": lost_j / least_j if least_j > 0 else None,
        "lost_at_floors_kwh": at_floors_j / kwh,
        "lost_ratio_at_floors": lost_j / at_floors_j if at_floors_j > 0 else None,
        "floor_ratio_to_causal": floor_ratio,
    }


def _floor_costs(
    site_w: np.ndarray,
    step_s: float,
    spec: GridSpec,
    energy_j: float | None,
    smoothing_j: float | None,
    demand_w: np.ndarray | None,
    resume_w: np.ndarray | None,
) -> dict[str, Any]:
    """``grid_report``'s floor part: the least floors a ramp limit needs (``floor_least_*``,
    ``floor_ready_*``) and what the floor held, or the spec's, burns (``floor_*``)."""
    out: dict[str, Any] = {}
    up, down = spec.ramp_up_w_per_s, spec.ramp_down_w_per_s
    if demand_w is None and smoothing_j is None:
        demand_w = site_w
    if demand_w is not None and (math.isfinite(up) or math.isfinite(down)):
        least = grid_measure.least_ramp_floor(demand_w, step_s, spec.window_s, up, down)
        least_cost = grid_measure.floor_cost(demand_w, least, step_s, energy_j)
        out |= {
            "floor_least_kwh": least_cost.energy_kwh,
            "floor_least_share_of_jobs": _finite(least_cost.share_of_reference),
        }
        if resume_w is not None:
            ready = grid_measure.least_ready_floor(
                demand_w, resume_w, step_s, spec.window_s, up, down
            )
            ready_cost = grid_measure.floor_cost(demand_w, ready, step_s, energy_j)
            # the bound minds the ramps alone: where its own series breaks the oscillation
            # limit, no schedule within the whole spec can burn as little
            ready_osc = spec.oscillation(ready, step_s)
            out |= {
                "floor_ready_kwh": ready_cost.energy_kwh,
                "floor_ready_share_of_jobs": _finite(ready_cost.share_of_reference),
                "floor_ready_s_outside_oscillation": ready_osc.s_over,
            }
    if smoothing_j is not None:
        share = smoothing_j / energy_j if energy_j else math.nan
        out |= {
            "floor_fraction": spec.floor_fraction,
            "floor_source": "burnt by smoothing",
            "floor_energy_kwh": smoothing_j / grid_measure.J_PER_KWH,
            "floor_energy_share_of_jobs": _finite(share),
        }
    elif spec.floor_fraction is not None:
        floor = grid_measure.floor_series(site_w, step_s, spec.floor_fraction, spec.floor_window_s)
        cost = grid_measure.floor_cost(site_w, floor, step_s, energy_j)
        out |= {
            "floor_fraction": spec.floor_fraction,
            "floor_source": "if the floor were held",
            "floor_energy_kwh": cost.energy_kwh,
            "floor_energy_share_of_jobs": _finite(cost.share_of_reference),
        }
    return out
