"""policies.grid: site power measured as the grid sees it, on series whose answers are
known by hand, then properties over random series."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from policies import grid

BAND = (0.1, 20.0)


def test_a_ramp_of_known_slope():
    """100 W for 10 s, +5 W a second for 20 s, 200 W for 10 s: rises of 5 W/s for 20 s."""
    power = np.concatenate([np.full(10, 100.0), 100 + 5.0 * np.arange(1, 21), np.full(10, 200.0)])
    r = grid.ramp_stats(power, 1.0, 1.0, up_limit_w_per_s=4.0, down_limit_w_per_s=4.0)
    assert (r.up_max_w_per_s, r.down_max_w_per_s) == (5.0, 0.0)
    assert r.up_p99_w_per_s == 5.0  # half the steps rise 5 W/s
    assert (r.s_up_over, r.s_down_over) == (20.0, 0.0)
    assert grid.ramp_stats(power, 1.0, 1.0, 5.0, 5.0).s_up_over == 0.0  # at the limit is inside
    # the same series read at half-second steps over a 2 s window: 4 steps, still 5 W per step
    r2 = grid.ramp_stats(power, 0.5, 2.0)
    assert r2.window_s == 2.0 and r2.up_max_w_per_s == pytest.approx(10.0)


def test_a_fall_over_a_longer_window_is_averaged():
    """A 30 kW drop in one step reads 30 kW/s over 1 s and 10 kW/s over 3 s."""
    power = np.concatenate([np.full(10, 50e3), np.full(10, 20e3)])
    assert grid.ramp_stats(power, 1.0, 1.0).down_max_w_per_s == 30e3
    three = grid.ramp_stats(power, 1.0, 3.0, down_limit_w_per_s=10e3)
    assert three.down_max_w_per_s == pytest.approx(10e3)
    assert three.s_down_over == 0.0 and three.up_max_w_per_s == 0.0
    assert grid.ramp_stats(power, 1.0, 3.0, down_limit_w_per_s=9e3).s_down_over == 3.0


def test_a_window_below_the_step_is_one_step():
    assert grid.window_steps(1.0, 0.2) == 1
    assert grid.ramp_stats(np.array([0.0, 10.0]), 1.0, 0.2).window_s == 1.0


def test_a_1_hz_sine_at_10_hz_sampling_is_all_in_the_band():
    t = np.arange(0, 60, 0.1)
    power = 1e6 + 1e5 * np.cos(2 * np.pi * 1.0 * t)
    assert grid.oscillation_share(power, 0.1, BAND) == pytest.approx(1.0)
    stats = grid.oscillation_stats(power, 0.1, BAND, 60.0, max_share=0.2)
    assert stats.band.seen_hz == (0.1, 5.0)
    assert "0.1 s steps see up to 5 Hz" in stats.band.note
    assert stats.share_max == pytest.approx(1.0) and stats.s_over == 60.0
    assert stats.peak_to_peak_max_w == pytest.approx(2e5, rel=1e-3)
    # the taper keeps a steady sine's size: 100 kW of amplitude is 70.7 kW RMS
    assert stats.band_rms_max_w == pytest.approx(1e5 / math.sqrt(2), rel=1e-3)


def test_a_slow_sine_is_not_in_the_band():
    t = np.arange(0.0, 1000.0)
    power = 1e6 + 1e5 * np.sin(2 * np.pi * 0.01 * t)
    assert grid.oscillation_share(power, 1.0, BAND) == pytest.approx(0.0, abs=1e-12)


def test_half_and_half_splits_the_share():
    """Equal sines at 0.05 Hz (below) and 0.25 Hz (inside) share the variance equally."""
    t = np.arange(0.0, 200.0)
    power = np.sin(2 * np.pi * 0.05 * t) + np.sin(2 * np.pi * 0.25 * t)
    assert grid.oscillation_share(power, 1.0, BAND) == pytest.approx(0.5)


def test_what_one_second_steps_cannot_see():
    band = grid.visible_band(1.0, BAND)
    assert band.seen_hz == (0.1, 0.5) and band.nyquist_hz == 0.5
    assert band.note == "1 s steps see up to 0.5 Hz: only 0.1-0.5 Hz of the 0.1-20 Hz band"
    unseen = grid.visible_band(10.0, BAND)
    assert unseen.seen_hz is None and "none of the 0.1-20 Hz band" in unseen.note
    assert math.isnan(grid.oscillation_share(np.arange(100.0), 10.0, BAND))
    assert grid.visible_band(0.01, BAND).note == ""  # 50 Hz Nyquist sees all of it


def test_windows_and_seconds_outside():
    """120 s, the first half flat, the second a 0.25 Hz swing. 60 s windows overlap by half:
    0-60, 30-90, 60-120, standing for 0-45, 45-75 and 75-120 s. The last two are outside."""
    t = np.arange(120.0)
    power = np.where(t < 60, 5e5, 5e5 + 1e4 * np.sin(2 * np.pi * 0.25 * t))
    stats = grid.oscillation_stats(power, 1.0, BAND, 60.0, max_share=0.5)
    assert stats.n_windows == 3 and stats.window_s == 60.0
    assert stats.share_max == pytest.approx(1.0) and stats.s_over == 75.0
    assert grid.window_stretches_s(3, 60, 1.0).tolist() == [45.0, 30.0, 45.0]
    assert grid.window_stretches_s(1, 60, 1.0).tolist() == [60.0]
    # a series shorter than a window is one window; what follows the last whole one is left out
    assert grid.oscillation_stats(power[:30], 1.0, BAND, 60.0).n_windows == 1
    assert grid.oscillation_stats(power[:100], 1.0, BAND, 60.0).n_windows == 2
    assert grid.windows(power[:100], 1.0, 60.0)[1].tolist() == power[30:90].tolist()


def _site_that_steps_down(fall_at_s: float) -> np.ndarray:
    """10 Hz, 180 s: 170 kW with a 0.3 kW ripple at 0.5 Hz, falling 50 kW at 18 kW/s from
    ``fall_at_s`` (a job's end, within a 20 kW/s ramp limit)."""
    t = np.arange(0, 180, 0.1)
    fall = np.clip((t - fall_at_s) * 18e3, 0.0, 50e3)
    return 170e3 + 300 * np.sin(2 * np.pi * 0.5 * t) - fall


@pytest.mark.parametrize("fall_at_s", [29.0, 56.5, 58.0, 75.0, 88.0])
def test_one_fall_is_not_an_oscillation_wherever_the_windows_fall(fall_at_s):
    """A rectangular window reads a fall in its last seconds as a pulse: in non-overlapping
    untapered windows, this series with the fall at 56.5 s put 57 % of the first window's
    variance in the band (6.0 kW RMS), at 58 s 76 %, against 20 % and 2 kW allowed, while
    the same fall at 29 s read 5 %. Tapered and overlapping, no window is outside wherever
    the fall lies (untapered and overlapping, 4 of these 5 are)."""
    stats = grid.oscillation_stats(
        _site_that_steps_down(fall_at_s), 0.1, BAND, 60.0, max_share=0.2, min_rms_w=2e3
    )
    assert stats.s_over == 0.0
    assert stats.peak_to_peak_max_w == pytest.approx(50e3 + 600, rel=0.01)


@pytest.mark.parametrize("starts_s", [10.0, 45.0, 50.0, 100.0])
def test_a_swing_is_caught_wherever_it_lies(starts_s):
    """20 s of a 0.25 Hz, 10 kW swing on a steady 170 kW, at the edge of a window or across
    two: some window is outside, and it stands for at least the swing's 20 s."""
    t = np.arange(0, 180, 0.1)
    on = (t >= starts_s) & (t < starts_s + 20.0)
    power = 170e3 + np.where(on, 1e4 * np.sin(2 * np.pi * 0.25 * t), 0.0)
    stats = grid.oscillation_stats(power, 0.1, BAND, 60.0, max_share=0.2, min_rms_w=2e3)
    assert stats.share_max > 0.9 and stats.s_over >= 20.0


def test_a_floor_and_what_it_costs():
    """Floor 0.5 of the last 2 s's peak; the running mask skips a step and forgets it."""
    power = np.array([10.0, 5.0, 10.0, 2.0, 8.0])
    running = np.array([True, True, False, True, True])
    floor = grid.floor_series(power, 1.0, 0.5, 2.0, running)
    np.testing.assert_allclose(floor, [5.0, 5.0, 0.0, 1.0, 4.0])
    cost = grid.floor_cost(power, floor, 1.0, reference_j=10.0)
    assert cost.energy_kwh == pytest.approx(0.0)  # power never below this floor
    hold = grid.floor_series(np.array([100.0, 10.0, 100.0]), 3600.0, 0.8, 7200.0)
    np.testing.assert_allclose(hold, [80.0, 80.0, 80.0])
    cost = grid.floor_cost(np.array([100.0, 10.0, 100.0]), hold, 3600.0, reference_j=210 * 3600.0)
    assert cost.energy_kwh == pytest.approx(0.07)  # 70 W for an hour
    assert cost.share_of_reference == pytest.approx(70 / 210)


def test_running_max_is_the_trailing_maximum():
    x = np.random.default_rng(1).normal(size=101)
    for w in (1, 2, 7, 50, 200):
        expect = [x[max(0, i - w + 1) : i + 1].max() for i in range(len(x))]
        np.testing.assert_array_equal(grid.running_max(x, 1.0, float(w)), expect)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="dt_s"):
        grid.ramp_stats(np.zeros(3), 0.0, 1.0)
    with pytest.raises(ValueError, match="band"):
        grid.oscillation_share(np.zeros(3), 1.0, (20.0, 0.1))
    with pytest.raises(ValueError, match="finite"):
        grid.ramp_stats(np.array([1.0, np.nan]), 1.0, 1.0)
    with pytest.raises(ValueError, match="fraction"):
        grid.floor_series(np.zeros(3), 1.0, 1.0, 1.0)


# --- properties ----------------------------------------------------------------------------

powers = st.lists(st.floats(0.0, 2e8, allow_nan=False), min_size=0, max_size=300).map(
    lambda v: np.array(v, dtype=float)
)
steps = st.sampled_from([0.01, 0.1, 0.25, 1.0, 2.0])
windows = st.floats(0.01, 120.0)
limits = st.floats(1.0, 1e8)
many = settings(max_examples=200, deadline=None)


@many
@given(powers, steps, windows, windows, limits)
def test_measures_stay_in_their_ranges(power, dt, window, osc_window, limit):
    r = grid.ramp_stats(power, dt, window, limit, limit)
    assert r.up_max_w_per_s >= r.up_p99_w_per_s >= 0
    assert r.down_max_w_per_s >= r.down_p99_w_per_s >= 0
    duration = len(power) * dt
    assert 0 <= r.s_up_over + r.s_down_over <= duration + 1e-9
    stats = grid.oscillation_stats(power, dt, BAND, osc_window, max_share=0.1)
    for share in (stats.share, stats.share_max):
        assert math.isnan(share) or 0.0 <= share <= 1.0
    assert 0 <= stats.s_over <= duration + 1e-9
    assert stats.peak_to_peak_max_w >= 0


@many
@given(st.floats(0.0, 2e8), st.integers(0, 300), steps, windows)
def test_constant_power_has_no_ramp_and_no_share(level, n, dt, window):
    power = np.full(n, level)
    r = grid.ramp_stats(power, dt, window, 1.0, 1.0)
    assert (r.up_max_w_per_s, r.down_max_w_per_s, r.s_up_over, r.s_down_over) == (0, 0, 0, 0)
    stats = grid.oscillation_stats(power, dt, (0.01, 20.0), 60.0, max_share=0.01)
    assert stats.share == 0.0
    assert stats.s_over == 0.0 and stats.peak_to_peak_max_w == 0.0


@many
@given(powers, steps, windows, st.floats(0.01, 0.99))
def test_a_floor_never_exceeds_the_recent_peak_and_costs_nothing_when_held(
    power, dt, window, fraction
):
    floor = grid.floor_series(power, dt, fraction, window)
    assert np.all(floor >= 0)
    if len(power):
        assert np.all(floor <= fraction * power.max() + 1e-6)
    lifted = np.maximum(power, floor)
    assert grid.floor_cost(lifted, floor, dt).energy_kwh == 0.0
    assert grid.floor_cost(power, floor, dt).energy_kwh >= 0.0


def test_the_least_floor_of_a_short_dip_by_hand():
    """10 W with a one-step dip to 2 W and a six-step trough, 0.5 s steps, 1 s window (two
    steps): each chain of every other step falls 2 W a link (2 W/s) and rises 4 W a link
    (4 W/s), so the dip is held at 8 W and the trough is let down to 6 W only as far as its
    end allows: the rise back to 10 W must start 4 W early."""
    power = np.array([10, 10, 10, 2, 10, 10, 10, 10, 2, 2, 2, 2, 2, 2, 10, 10], dtype=float)
    least = grid.least_ramp_floor(power, 0.5, 1.0, up_w_per_s=4.0, down_w_per_s=2.0)
    want = [10, 10, 10, 8, 10, 10, 10, 10, 8, 8, 6, 6, 6, 6, 10, 10]
    np.testing.assert_allclose(least, want)
    rates = grid.ramp_rates(least, 0.5, 1.0)
    assert rates.max() == 4.0 and -rates.min() == 2.0
    # with no limit at all nothing needs holding; one limit alone holds only its side
    np.testing.assert_array_equal(grid.least_ramp_floor(power, 0.5, 1.0), power)
    falls_only = grid.least_ramp_floor(power, 0.5, 1.0, down_w_per_s=2.0)
    assert falls_only[13] == 4.0 and falls_only[3] == 8.0  # 10 W at step 7, 2 W a link down
    with pytest.raises(ValueError, match="up_w_per_s"):
        grid.least_ramp_floor(power, 0.5, 1.0, up_w_per_s=0.0)


def test_the_least_ready_floor_of_a_long_wait_by_hand():
    """10 W, then a six-step wait at 4 W whose job would resume to 10 W; 0.5 s steps, 1 s
    window, 4 W/s each way: 4 W a window. The least floor lets the middle of the wait down
    to 4 W (the rise back is two windows away); a floor that cannot know when the wait
    ends holds it 4 W under 10 W throughout, ready for a resumption at any step."""
    power = np.array([10, 10, 10, 4, 4, 4, 4, 4, 4, 10, 10], dtype=float)
    resume = np.where(power < 10, 10.0, power)
    least = grid.least_ramp_floor(power, 0.5, 1.0, 4.0, 4.0)
    np.testing.assert_allclose(least, [10, 10, 10, 6, 6, 4, 4, 6, 6, 10, 10])
    ready = grid.least_ready_floor(power, resume, 0.5, 1.0, 4.0, 4.0)
    np.testing.assert_allclose(ready, [10, 10, 10, 6, 6, 6, 6, 6, 6, 10, 10])
    # nobody waiting: nothing to be ready for, the least floor itself
    np.testing.assert_array_equal(grid.least_ready_floor(power, power, 0.5, 1.0, 4.0, 4.0), least)
    # no rise limit: a resumption may come at once, nothing to be ready for
    np.testing.assert_array_equal(
        grid.least_ready_floor(power, resume, 0.5, 1.0, down_w_per_s=4.0),
        grid.least_ramp_floor(power, 0.5, 1.0, down_w_per_s=4.0),
    )
    with pytest.raises(ValueError, match="resume_w has shape"):
        grid.least_ready_floor(power, resume[:-1], 0.5, 1.0, 4.0, 4.0)


def test_resume_levels_are_each_gpus_last_working_draw():
    """GPU 0 works at 100 W, then waits at 40 W: 60 W short of where it would resume. GPU 1
    keeps working (its level follows it). GPU 2 waits before it ever worked: nothing to
    resume to. A waiting GPU drawing above its level is short of nothing."""
    levels = grid.ResumeLevels(3)
    yes, no = True, False
    assert levels.step(np.array([100.0, 200.0, 30.0]), [yes, yes, no], [no, no, no]) == 0.0
    assert levels.step(np.array([40.0, 250.0, 50.0]), [no, yes, no], [yes, no, yes]) == 60.0
    assert levels.step(np.array([120.0, 90.0, 50.0]), [no, no, no], [yes, yes, yes]) == 160.0

    # GPU by GPU, the same gaps (0 where a GPU does not wait or stands above its level)
    again = grid.ResumeLevels(3)
    again.step(np.array([100.0, 200.0, 30.0]), [yes, yes, no], [no, no, no])
    gaps = again.gaps(np.array([40.0, 250.0, 50.0]), [no, yes, no], [yes, no, yes])
    np.testing.assert_array_equal(gaps, [60.0, 0.0, 0.0])


def test_the_least_floor_with_each_jobs_fixed_share_by_hand():
    """Two jobs of half the site's GPUs each at 1 s steps, ramps 40 W/s over 1 s. A draws
    100 W, waits two steps at 0 W, and resumes; B draws 100 W throughout. The whole site
    may stand 40 W under where A resumes: 200, 200, 160, 160, 200 W, 120 J. With each job
    keeping its half of the ramp (20 W/s), A stands 20 W under: 80 W twice, 160 J."""
    a = np.array([100.0, 100.0, 0.0, 0.0, 100.0])
    b = np.full(5, 100.0)
    a_resume = np.full(5, 100.0)
    whole = grid.least_ready_floor(a + b, a_resume + b, 1.0, 1.0, 40.0, 40.0)
    np.testing.assert_array_equal(whole, [200.0, 200.0, 160.0, 160.0, 200.0])
    parts = [(a, a_resume, 0.5), (b, b, 0.5)]
    assert grid.least_ready_floor_j_by_shares(parts, 1.0, 1.0, 40.0, 40.0) == pytest.approx(160.0)
    # one job with all the GPUs: the whole site's bound
    assert grid.least_ready_floor_j_by_shares(
        [(a + b, a_resume + b, 1.0)], 1.0, 1.0, 40.0, 40.0
    ) == pytest.approx(120.0)
    with pytest.raises(ValueError, match="share"):
        grid.least_ready_floor_j_by_shares([(a, a, 0.0)], 1.0, 1.0, 40.0, 40.0)


@many
@given(powers, steps, windows, limits, limits, st.data())
def test_the_least_ready_floor_is_ready_meets_the_ramps_and_is_above_the_least_floor(
    power, dt, window, up, down, data
):
    lift = np.array(
        data.draw(st.lists(st.floats(0, 1e4), min_size=len(power), max_size=len(power)))
    )
    resume = power + lift
    ready = grid.least_ready_floor(power, resume, dt, window, up, down)
    least = grid.least_ramp_floor(power, dt, window, up, down)
    slack = 1e-9 * max(1.0, float(np.abs(resume).max(initial=0.0)))
    assert np.all(ready >= least - slack)
    allowed_rise = up * grid.window_steps(dt, window) * dt
    assert np.all(ready >= resume - allowed_rise - slack)
    rates = grid.ramp_rates(ready, dt, window)
    if len(rates):
        assert rates.max() <= up + slack and -rates.min() <= down + slack


@many
@given(powers, steps, windows, limits, limits)
# found by CI: a huge fall limit added and taken back lost the low digits of a small draw
@example(np.array([0.0, 0.15]), 0.01, 0.01171875, 1.0, 26214400.0)
def test_the_least_floor_meets_the_ramps_and_no_lower_series_does(power, dt, window, up, down):
    """Above the power, within both limits, and minimal: lowering any held step by a little
    (staying above the power) breaks a limit."""
    least = grid.least_ramp_floor(power, dt, window, up, down)
    assert np.all(least >= power)
    rates = grid.ramp_rates(least, dt, window)
    slack = 1e-9 * max(1.0, float(np.abs(power).max(initial=0.0)))
    if len(rates):
        assert rates.max() <= up + slack and -rates.min() <= down + slack
    for i in np.flatnonzero(least - power > 1e-3 * max(1.0, float(least.max(initial=0.0))))[:30]:
        lower = least.copy()
        lower[i] -= min(1e-4 * (least[i] - power[i]) + 1e-6 * abs(least[i]), least[i] - power[i])
        r = grid.ramp_rates(lower, dt, window)
        assert r.max() > up or -r.min() > down
