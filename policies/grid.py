"""Site power as the grid sees it: measured ramps, oscillation, the cost of a floor.

Pure functions over one power series ``power_w`` sampled at a fixed step
``dt_s`` (sub-second steps allowed). Utilities write two kinds of limit into
an interconnection agreement (docs/DOMAIN.md, Power Stabilization for AI
Training Datacenters): a ramp limit in MW/s and a cap on oscillation energy
in a band such as 0.1-20 Hz. A synchronous training job moves the whole site
at once (Llama 3 §3.3.4), so these are measured on the site's power, not on
the sum of caps the controller limits while uncapping.

What is measured
----------------
- **Ramp** over a window of ``w = round(window_s / dt_s)`` steps (at least
  one): ``rate[t] = (power[t] - power[t - w]) / (w dt_s)`` for every step that
  has a step ``w`` before it. Rises are ``max(rate, 0)``, falls
  ``max(-rate, 0)``; each is summarised by its maximum and its 99th
  percentile over all steps (the rise exceeded 1 % of the time).
- **Oscillation share**: the share of the series' variance (mean removed)
  that lies in the band, from a periodogram (numpy's real FFT;
  by Parseval the bins add up to the variance exactly). A series sampled every
  ``dt_s`` sees frequencies up to Nyquist, ``1 / (2 dt_s)``: 1 s steps see
  0.1-0.5 Hz of a 0.1-20 Hz band, and the rest of the band is simply not
  seen (``Band.note`` says so). A window of ``T`` seconds resolves ``1 / T``
  Hz, so it should be at least one period of the band's lower edge.
  Measured per window of ``oscillation_window_s``, the windows overlapping by
  half and each tapered (Hann) after its mean is taken off, as Welch's method
  does (a series shorter than one window is one window; what follows the last
  whole window is left out), and over the whole series (untapered). Why the
  taper and the overlap: a rectangular window sees its series as periodic, so a
  single fall at its edge (a job's end, within every ramp limit) reads as a
  pulse and its variance lands in the band, while the same fall in the middle
  of a window does not (``powerd demo`` at a real rhythm: 63 % of a window's
  variance in the band for a fall in its last 4 s, against 20 % allowed). The
  taper weighs a window's edges towards zero; the overlap puts every moment
  near the middle of some window.
- **Band RMS**: the square root of the variance in the band (W): how big the
  oscillation is. A window whose band RMS is below the spec's least
  (``min_rms_w``) is within the limit whatever its share: the share of a
  steady site's few-watt ripple is near 1 and means nothing.
- **Peak-to-peak** per oscillation window: ``max - min`` of the power in it.
- **Seconds outside**: steps whose rise (fall) is above the ramp limit, times
  ``dt_s``; for the oscillation, the stretch each window outside the limit
  stands for: the half window around its middle (the first and the last window
  also the quarter before or after it), so that the windows' stretches tile the
  series measured and a series shorter than a window counts whole. Counted
  separately: they are different limits.
- **Floor**: holding power at ``fraction`` of the running maximum of the last
  ``window_s`` seconds (busy work during communication, NVIDIA's power
  smoothing floor) burns ``sum(max(floor - power, 0)) dt_s``: in kWh and as a
  share of a given (the jobs') energy.
- **Least floor**: the lowest series above the power that meets the ramp
  limits (``least_ramp_floor``); what it burns is the least any floor, busy
  work or hardware smoothing can spend to meet them on that draw.
- **Least ready floor**: the same, but never more than one window's rise below
  what the site would draw were every waiting job to resume at once
  (``least_ready_floor``): the least a floor must burn when it cannot know
  when a wait ends. The gap between the two is the value of knowing it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

J_PER_KWH = 3.6e6


def window_steps(dt_s: float, window_s: float, least: int = 1) -> int:
    """Steps in a window: ``window_s / dt_s`` rounded, at least ``least``."""
    _check_step(dt_s)
    if not (math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"window_s must be a positive number, not {window_s}")
    return max(least, round(window_s / dt_s))


def check_ramp_limit(name: str, value_w_per_s: float) -> None:
    """ValueError naming ``name`` unless the ramp limit is a positive W/s (inf: no limit)."""
    if math.isnan(value_w_per_s) or value_w_per_s <= 0:
        raise ValueError(f"{name} must be a positive W/s (inf: no limit), not {value_w_per_s}")


def _check_step(dt_s: float) -> None:
    if not (math.isfinite(dt_s) and dt_s > 0):
        raise ValueError(f"dt_s must be a positive number, not {dt_s}")


def as_series(values: np.ndarray, name: str = "power_w") -> np.ndarray:
    """``values`` as one finite float series; ValueError naming ``name`` otherwise."""
    p = np.asarray(values, dtype=float)
    if p.ndim != 1:
        raise ValueError(f"{name} must be one series (1-d), not shape {p.shape}")
    if not np.all(np.isfinite(p)):
        raise ValueError(f"{name} must be finite")
    return p


# --- ramps -------------------------------------------------------------------------------


def ramp_rates(power_w: np.ndarray, dt_s: float, window_s: float) -> np.ndarray:
    """W/s over the window at every step that has a full window behind it (may be empty)."""
    p = as_series(power_w)
    w = window_steps(dt_s, window_s)
    if len(p) <= w:
        return np.zeros(0)
    rate: np.ndarray = (p[w:] - p[:-w]) / (w * dt_s)
    return rate


@dataclass(frozen=True)
class RampStats:
    """Measured ramps of one series (W/s, all ≥ 0) and the seconds above each limit."""

    window_s: float  # the window measured over: whole steps, at least one
    up_max_w_per_s: float
    up_p99_w_per_s: float
    down_max_w_per_s: float  # falls, as positive numbers
    down_p99_w_per_s: float
    s_up_over: float  # seconds whose rise was above the up limit (0 with no limit)
    s_down_over: float


def ramp_stats(
    power_w: np.ndarray,
    dt_s: float,
    window_s: float,
    up_limit_w_per_s: float = math.inf,
    down_limit_w_per_s: float = math.inf,
) -> RampStats:
    """Maximum and 99th percentile of rises and falls; steps over each limit, in seconds."""
    rate = ramp_rates(power_w, dt_s, window_s)
    up, down = np.maximum(rate, 0.0), np.maximum(-rate, 0.0)

    def top(x: np.ndarray) -> tuple[float, float]:
        if not len(x):
            return 0.0, 0.0
        return float(x.max()), float(np.percentile(x, 99))

    (up_max, up_p99), (down_max, down_p99) = top(up), top(down)
    return RampStats(
        window_s=float(window_steps(dt_s, window_s) * dt_s),
        up_max_w_per_s=up_max,
        up_p99_w_per_s=up_p99,
        down_max_w_per_s=down_max,
        down_p99_w_per_s=down_p99,
        s_up_over=float(np.count_nonzero(up > up_limit_w_per_s)) * dt_s,
        s_down_over=float(np.count_nonzero(down > down_limit_w_per_s)) * dt_s,
    )


# --- oscillation -------------------------------------------------------------------------


@dataclass(frozen=True)
class Band:
    """The part of a frequency band a series sampled every ``dt_s`` can see."""

    band_hz: tuple[float, float]  # as asked
    seen_hz: tuple[float, float] | None  # clipped to Nyquist; None: nothing of it is seen
    nyquist_hz: float

    @property
    def note(self) -> str:
        """'' when the whole band is seen; else what is not (Nyquist)."""
        lo, hi = self.band_hz
        step = f"{1 / (2 * self.nyquist_hz):g} s steps see up to {self.nyquist_hz:g} Hz"
        if self.seen_hz is None:
            return f"{step}: none of the {lo:g}-{hi:g} Hz band is seen"
        if self.seen_hz[1] < hi:
            return f"{step}: only {lo:g}-{self.seen_hz[1]:g} Hz of the {lo:g}-{hi:g} Hz band"
        return ""


def visible_band(dt_s: float, band_hz: tuple[float, float]) -> Band:
    _check_step(dt_s)
    lo, hi = float(band_hz[0]), float(band_hz[1])
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo < hi):
        raise ValueError(f"band must be 0 < lo < hi (Hz), not {band_hz}")
    nyquist = 1.0 / (2.0 * dt_s)
    seen = (lo, min(hi, nyquist)) if lo < nyquist else None
    return Band((lo, hi), seen, nyquist)


def oscillation_shares(rows_w: np.ndarray, dt_s: float, band_hz: tuple[float, float]) -> np.ndarray:
    """Share of variance in the band for each row of ``rows_w`` (windows × steps): in
    [0, 1]; 0 for a constant row; NaN for every row when none of the band is seen."""
    return oscillation_bands(rows_w, dt_s, band_hz)[0]


def hann(n: int) -> np.ndarray:
    """The periodic Hann taper of ``n`` steps (scipy's ``get_window('hann', n)``)."""
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)


def oscillation_bands(
    rows_w: np.ndarray, dt_s: float, band_hz: tuple[float, float], taper: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """For each row: the share of its variance in the band (``oscillation_shares``) and the
    RMS of the part of it in the band, W (the square root of the band's variance: how big
    the oscillation is; NaN when none of the band is seen). ``taper``: each row, its mean
    taken off, is weighed by a Hann taper first (the module docstring), and the variance
    is the tapered one over the taper's mean square, so that a steady sine keeps its RMS."""
    rows = np.asarray(rows_w, dtype=float)
    if rows.ndim != 2:
        raise ValueError(f"rows_w must be 2-d (windows × steps), not shape {rows.shape}")
    band = visible_band(dt_s, band_hz)
    n = rows.shape[1]
    if band.seen_hz is None:
        return np.full(len(rows), np.nan), np.full(len(rows), np.nan)
    if n < 2:
        return np.zeros(len(rows)), np.zeros(len(rows))
    x = rows - rows.mean(axis=1, keepdims=True)
    taper_w = hann(n) if taper else np.ones(n)
    spectrum = np.abs(np.fft.rfft(x * taper_w, axis=1)) ** 2
    # one-sided: every bin but DC (and Nyquist for even n) stands for two; with these
    # weights the bins add up to n × the sum of squares (Parseval). DC is 0 untapered (the
    # mean is off); tapered, it holds what the taper leaks from the slowest swings, which
    # are outside the band: counted in the total, so that they do not inflate the share
    weight = np.full(spectrum.shape[1], 2.0)
    weight[0] = 1.0
    if n % 2 == 0:
        weight[-1] = 1.0
    freq = np.fft.rfftfreq(n, dt_s)
    lo, hi = band.seen_hz
    in_band = (freq >= lo) & (freq <= hi)
    total = spectrum @ weight
    inside = spectrum[:, in_band] @ weight[in_band]
    # a constant row leaves only rounding noise of its mean: no variance, no share
    scale = np.maximum(np.abs(rows).max(axis=1), 1.0)
    tiny = total <= n * n * (1e-12 * scale) ** 2
    share: np.ndarray = np.divide(inside, total, out=np.zeros(len(rows)), where=~tiny)
    # Parseval: the sum of squares is Σ/n, the variance that over Σ taper² (n untapered)
    rms_w = np.where(tiny, 0.0, np.sqrt(np.maximum(inside, 0.0) / (n * float(taper_w @ taper_w))))
    return np.clip(share, 0.0, 1.0, out=share), rms_w


def oscillation_share(power_w: np.ndarray, dt_s: float, band_hz: tuple[float, float]) -> float:
    """Share of one series' variance (mean removed) in the part of the band it can see."""
    return float(oscillation_shares(as_series(power_w)[None, :], dt_s, band_hz)[0])


def windows(power_w: np.ndarray, dt_s: float, window_s: float) -> np.ndarray:
    """Windows (rows) of ``window_s``, each starting half a window after the one before;
    the whole series if it is shorter; what follows the last whole window is left out."""
    p = as_series(power_w)
    w = min(window_steps(dt_s, window_s, least=2), len(p))
    if w == 0:
        return np.zeros((0, 0))
    starts = np.arange(0, len(p) - w + 1, _window_hop(w))
    rows: np.ndarray = p[starts[:, None] + np.arange(w)[None, :]]
    return rows


def _window_hop(window_steps_n: int) -> int:
    """Steps from one oscillation window's start to the next's: half a window."""
    return max(window_steps_n // 2, 1)


def window_stretches_s(n_windows: int, window_steps_n: int, dt_s: float) -> np.ndarray:
    """The seconds each of ``windows``' rows stands for: half a window around its middle,
    the first and the last also the quarter before or after; together, the series
    measured (one window: all of it)."""
    if n_windows == 0:
        return np.zeros(0)
    hop = _window_hop(window_steps_n)
    out = np.full(n_windows, hop * dt_s)
    edge_s = (window_steps_n - hop) * dt_s / 2.0
    out[0] += edge_s
    out[-1] += edge_s
    return out


@dataclass(frozen=True)
class OscillationStats:
    band: Band
    window_s: float  # the windows measured (whole steps; the series if shorter)
    n_windows: int
    share: float  # the whole series
    share_max: float  # the worst window
    peak_to_peak_max_w: float  # the worst window
    band_rms_max_w: float  # the largest RMS of the power in the band, of any window
    s_over: float  # seconds the windows outside the limit stand for (share and RMS ≥ its least)


def oscillation_stats(
    power_w: np.ndarray,
    dt_s: float,
    band_hz: tuple[float, float],
    window_s: float,
    max_share: float | None = None,
    min_rms_w: float = 0.0,
) -> OscillationStats:
    """``min_rms_w``: a window whose oscillation in the band is smaller than this (RMS, W)
    is within the limit whatever its share: a ripple of a few watts on a steady site is
    all in the band and harmless."""
    p = as_series(power_w)
    band = visible_band(dt_s, band_hz)
    rows = windows(p, dt_s, window_s)
    if not rows.size:
        return OscillationStats(band, 0.0, 0, 0.0, 0.0, 0.0, 0.0, 0.0)
    shares, rms_w = oscillation_bands(rows, dt_s, band_hz, taper=True)
    big = ~(rms_w < min_rms_w)  # NaN (band unseen) counts: it is never "small"
    outside = np.zeros(len(rows), dtype=bool) if max_share is None else (shares > max_share) & big
    stretch_s = window_stretches_s(len(rows), rows.shape[1], dt_s)
    return OscillationStats(
        band=band,
        window_s=float(rows.shape[1] * dt_s),
        n_windows=len(rows),
        share=oscillation_share(p, dt_s, band_hz),
        share_max=float(np.max(shares)),  # NaN when the band is unseen
        peak_to_peak_max_w=float(np.max(np.ptp(rows, axis=1))),
        band_rms_max_w=float(np.max(rms_w)),
        s_over=float(stretch_s[outside].sum()),
    )


# --- a power floor -----------------------------------------------------------------------


def running_max(power_w: np.ndarray, dt_s: float, window_s: float) -> np.ndarray:
    """Maximum of the last ``window_s`` seconds (this step included) at every step."""
    return _trailing_max(as_series(power_w), window_steps(dt_s, window_s))


def _trailing_max(y: np.ndarray, w: int) -> np.ndarray:
    """``max(y[t - w + 1 : t + 1])`` at every ``t`` (-inf entries count as absent).
    Vectorised, O(n): van Herk / Gil-Werman, block prefix and suffix maxima."""
    n = len(y)
    if n == 0 or w == 1:
        return y.copy()
    padded = np.concatenate([np.full(w - 1, -np.inf), y, np.full((-(n + w - 1)) % w, -np.inf)])
    blocks = padded.reshape(-1, w)
    prefix = np.maximum.accumulate(blocks, axis=1).ravel()
    suffix = np.maximum.accumulate(blocks[:, ::-1], axis=1)[:, ::-1].ravel()
    return np.maximum(suffix[:n], prefix[w - 1 : w - 1 + n])


def floor_series(
    power_w: np.ndarray,
    dt_s: float,
    fraction: float,
    window_s: float,
    running: np.ndarray | None = None,
) -> np.ndarray:
    """The floor to hold: ``fraction`` of the maximum running power of the last
    ``window_s`` seconds; 0 where ``running`` (bool per step, default all) is False."""
    if not (math.isfinite(fraction) and 0 < fraction < 1):
        raise ValueError(f"floor fraction must be in (0, 1), not {fraction}")
    p = as_series(power_w)
    on = np.ones(len(p), dtype=bool) if running is None else np.asarray(running, dtype=bool)
    if on.shape != p.shape:
        raise ValueError(f"running has shape {on.shape}, power_w {p.shape}")
    top = _trailing_max(np.where(on, p, -np.inf), window_steps(dt_s, window_s))
    return np.where(on, fraction * top, 0.0)


def least_ramp_floor(
    power_w: np.ndarray,
    dt_s: float,
    window_s: float,
    up_w_per_s: float = math.inf,
    down_w_per_s: float = math.inf,
) -> np.ndarray:
    """The lowest series at or above ``power_w`` whose every rise and fall over the window
    (``ramp_rates``) is within the limits: what a floor must hold, at the least, for a site
    drawing ``power_w`` to meet the ramp spec by burning power alone (no storage).

    The window links step ``t`` only to ``t - w``, so each residue class of steps modulo
    ``w`` is one chain, and on a chain the answer is exact: ``g[k] = max_j (p[j] -
    cost(j, k))`` with ``cost = (k - j) * down * w * dt_s`` for ``j <= k`` (a fall after a
    peak can be no faster) and ``(j - k) * up * w * dt_s`` for ``j >= k`` (a rise to a peak
    must start early enough). It is feasible (the cost adds up along the chain) and no
    feasible series is lower anywhere (chain the limits from the ``j`` that sets ``g[k]``).
    Its energy above ``power_w`` is therefore a lower bound for any floor or ramp-down hold,
    hardware smoothing included; it ignores the oscillation limit, which can only raise it.
    """
    p = as_series(power_w)
    w = window_steps(dt_s, window_s)
    check_ramp_limit("up_w_per_s", up_w_per_s)
    check_ramp_limit("down_w_per_s", down_w_per_s)
    out = p.copy()
    for r in range(min(w, len(p))):
        chain = p[r::w]
        lifted = chain.copy()
        if math.isfinite(down_w_per_s):  # falls: what a past peak still holds up
            np.maximum(lifted, _held_by_past_peaks(chain, down_w_per_s * w * dt_s), out=lifted)
        if math.isfinite(up_w_per_s):  # rises: what a coming peak already holds up
            ahead = _held_by_past_peaks(chain[::-1], up_w_per_s * w * dt_s)[::-1]
            np.maximum(lifted, ahead, out=lifted)
        out[r::w] = lifted
    return out


def _held_by_past_peaks(chain: np.ndarray, step_w: float) -> np.ndarray:
    """``max over j <= k of chain[j] - (k - j) * step_w`` at every ``k``.

    Taken from the index of the peak that sets it, not as ``running max of (chain + k *
    step_w) - k * step_w``: adding and taking back a large ``k * step_w`` loses the low
    digits of the chain (a 26 MW/s limit over 0.15 W lifted a step 2e-11 W above itself,
    and the rise to it broke a 1 W/s limit by 2e-9 W/s). A step that is its own peak is
    returned exactly."""
    k = np.arange(len(chain))
    score = chain + k * step_w
    is_peak = score >= np.maximum.accumulate(score)
    peak_at = np.maximum.accumulate(np.where(is_peak, k, 0))
    held: np.ndarray = chain[peak_at] - (k - peak_at) * step_w
    return held


def least_ready_floor(
    power_w: np.ndarray,
    resume_w: np.ndarray,
    dt_s: float,
    window_s: float,
    up_w_per_s: float = math.inf,
    down_w_per_s: float = math.inf,
) -> np.ndarray:
    """The lowest series at or above ``power_w`` that meets the ramp limits
    (``least_ramp_floor``) and is, at every step, ready for every waiting job to resume:
    no lower than ``resume_w`` (what the site would draw were they all to resume at that
    step; ``power_w`` where none waits) less one window's allowed rise, ``up_w_per_s *
    w * dt_s``.

    ``least_ramp_floor`` knows the future: it lets a wait fall as far as the falls allow
    whenever the resumption is far enough ahead, or is met by another job's wait starting
    at the same moment. A floor that does not know when a wait ends must assume it ends
    at the next step, so what this one burns is the least such a floor burns. It is still
    a bound, not a schedule: rises other than resumptions (a job's start, caps handed
    back) it meets with the same foresight as ``least_ramp_floor``.
    """
    p = as_series(power_w)
    r = as_series(resume_w, "resume_w")
    if r.shape != p.shape:
        raise ValueError(f"resume_w has shape {r.shape}, power_w {p.shape}")
    check_ramp_limit("up_w_per_s", up_w_per_s)
    ready = p
    if math.isfinite(up_w_per_s):
        allowed_rise_w = up_w_per_s * window_steps(dt_s, window_s) * dt_s
        ready = np.maximum(p, r - allowed_rise_w)
    return least_ramp_floor(ready, dt_s, window_s, up_w_per_s, down_w_per_s)


class ResumeLevels:
    """What each GPU would draw were its job to resume now, step by step: its draw (with no
    floor held) at its last step in a phase that does training work. ``step`` gives the
    waiting GPUs' total shortfall from that, so the site's draw plus it is the
    ``resume_w`` of ``least_ready_floor``."""

    def __init__(self, n_gpus: int) -> None:
        self.resume_w = np.full(n_gpus, -np.inf)  # -inf: not worked yet, nothing to resume to

    def step(self, natural_w: np.ndarray, working: np.ndarray, waiting: np.ndarray) -> float:
        """How far below their resume levels the waiting GPUs draw, in all (W); then the
        working GPUs' levels move to what they draw."""
        return float(self.gaps(natural_w, working, waiting).sum())

    def gaps(self, natural_w: np.ndarray, working: np.ndarray, waiting: np.ndarray) -> np.ndarray:
        """``step``, GPU by GPU: how far below its resume level each waiting GPU draws (0
        for the others)."""
        with np.errstate(invalid="ignore"):  # -inf: nothing to resume to
            gap = np.where(waiting, self.resume_w - natural_w, 0.0)
        gap = np.where(gap > 0, gap, 0.0)
        np.copyto(self.resume_w, natural_w, where=working)
        return gap


def least_ready_floor_j_by_shares(
    parts: list[tuple[np.ndarray, np.ndarray, float]],
    dt_s: float,
    window_s: float,
    up_w_per_s: float = math.inf,
    down_w_per_s: float = math.inf,
) -> float:
    """The least energy (J) floors burn when each part of a site (a job's GPUs: its draw,
    its ``resume_w`` as in ``least_ready_floor``, and its ``share`` of the site's GPUs) meets
    its own share of the ramp limits, as fixed per-GPU shares (``policies.smoothing.
    gpu_ramps``) make it: ``least_ready_floor`` of each part at ``share × limit``. It is at
    least ``least_ready_floor``'s of the whole: one job that waits may not use the
    allowance the others leave; the difference is what moving the allowance between jobs
    as they wait could save."""
    total_j = 0.0
    for demand_w, resume_w, share in parts:
        if not 0 < share <= 1:
            raise ValueError(f"a part's share of the site's GPUs is in (0, 1], not {share}")
        floor = least_ready_floor(
            demand_w, resume_w, dt_s, window_s, share * up_w_per_s, share * down_w_per_s
        )
        total_j += float(np.maximum(floor - as_series(demand_w), 0.0).sum()) * dt_s
    return total_j


@dataclass(frozen=True)
class FloorCost:
    energy_kwh: float  # burnt holding the floor
    share_of_reference: float  # of the reference energy (NaN without one)


def floor_cost(
    power_w: np.ndarray, floor_w: np.ndarray, dt_s: float, reference_j: float | None = None
) -> FloorCost:
    """Energy to lift ``power_w`` to ``floor_w`` wherever it is below: kWh and a share of
    ``reference_j`` (the jobs' energy, say)."""
    _check_step(dt_s)
    p, f = as_series(power_w), as_series(floor_w, "floor_w")
    if p.shape != f.shape:
        raise ValueError(f"floor_w has shape {f.shape}, power_w {p.shape}")
    joules = float(np.maximum(f - p, 0.0).sum()) * dt_s
    share = math.nan
    if reference_j is not None and reference_j > 0:
        share = joules / reference_j
    return FloorCost(joules / J_PER_KWH, share)
