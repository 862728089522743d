"""policies.smoothing: each GPU's share of the grid spec, and a draw that moves within it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.smoothing import (
    NO_SMOOTHING,
    GpuRamps,
    gpu_profile_values,
    gpu_ramps,
    ramp_toward,
    wanted_w,
)

finite_w = st.floats(0.0, 2000.0, allow_nan=False)


def test_each_gpu_gets_its_share_of_the_site_limits_with_the_margin():
    ramps = gpu_ramps(1e6, 2e6, 0.8, site_gpus=82_944)
    assert ramps.up_w_per_s == pytest.approx(0.9 * 1e6 / 82_944)
    assert ramps.down_w_per_s == pytest.approx(0.9 * 2e6 / 82_944)
    assert ramps.floor_fraction == 0.8
    unlimited = gpu_ramps(math.inf, 5e3, None, site_gpus=4, margin=1.0)
    assert unlimited.up_w_per_s == math.inf and unlimited.down_w_per_s == 1250.0
    assert unlimited.floor_fraction == 0.0 and unlimited.limits_anything
    assert not NO_SMOOTHING.limits_anything


@pytest.mark.parametrize(
    "args",
    [(1e6, 1e6, None, 0), (0.0, 1e6, None, 4), (1e6, math.nan, None, 4), (1e6, 1e6, 1.0, 4)],
)
def test_nonsense_is_refused(args):
    with pytest.raises(ValueError):
        gpu_ramps(*args)


@settings(max_examples=300, deadline=None)
@given(
    now=st.lists(finite_w, min_size=1, max_size=20),
    seed=st.integers(0, 2**32 - 1),
    up=st.floats(0.1, 5000.0),
    down=st.floats(0.1, 5000.0),
    floor=st.floats(0.0, 0.95),
    dt=st.floats(0.01, 2.0),
)
def test_the_draw_moves_within_its_rates_and_never_above_its_cap(now, seed, up, down, floor, dt):
    rng = np.random.default_rng(seed)
    now_w = np.array(now)
    natural = rng.uniform(0.0, 2000.0, len(now))
    cap = rng.uniform(100.0, 2000.0, len(now))
    running = rng.random(len(now)) < 0.5
    ramps = GpuRamps(up, down, floor)
    want = wanted_w(natural, cap, running, ramps)
    drawn, falling = ramp_toward(now_w, want, cap, ramps, dt)
    start = np.minimum(now_w, cap)  # a lower cap bites at once
    assert np.array_equal(falling > 0, want < start)
    assert np.all(drawn <= cap + 1e-9)  # a floor is never above the cap
    assert np.all(want <= cap + 1e-9)
    assert np.all(want[running] >= np.minimum(floor * cap[running], cap[running]) - 1e-9)
    # from there, no faster than the rates
    assert np.all(drawn <= start + up * dt + 1e-9)
    assert np.all(drawn >= start - down * dt - 1e-9)
    # and it heads for what it wants: never past it
    lo, hi = np.minimum(now_w, want), np.maximum(now_w, want)
    assert np.all((drawn >= np.minimum(lo, cap) - 1e-9) & (drawn <= hi + 1e-9))


@settings(max_examples=300, deadline=None)
@given(
    floor=st.floats(0.0, 0.99),
    up=st.one_of(st.just(math.inf), st.floats(0.0, 1e7)),
    down=st.one_of(st.just(math.inf), st.floats(0.0, 1e7)),
    lo=st.floats(0.0, 50.0),
    span=st.floats(0.0, 50.0),
    most=st.floats(1.0, 1e6),
)
def test_a_preset_is_always_inside_the_devices_range(floor, up, down, lo, span, most):
    values = gpu_profile_values(GpuRamps(up, down, floor), lo, lo + span, most)
    assert lo <= values.floor_percent <= lo + span
    assert 0 <= values.ramp_up_w_per_s <= most and 0 <= values.ramp_down_w_per_s <= most
    assert values.ramp_down_hysteresis_ms == 0.0
    floor_in = lo <= floor * 100 <= lo + span
    rates_in = all(not math.isfinite(r) or r <= most for r in (up, down))
    assert values.clamped == (not (floor_in and rates_in))


def test_a_gpu_falls_only_after_the_hysteresis_then_at_its_rate():
    ramps = GpuRamps(up_w_per_s=100.0, down_w_per_s=50.0, floor_fraction=0.0, hysteresis_s=1.0)
    cap = np.array([700.0])
    drawn, falling = np.array([600.0]), None
    seen = []
    for _ in range(8):  # 0.5 s steps; it wants 100 W
        drawn, falling = ramp_toward(drawn, np.array([100.0]), cap, ramps, 0.5, falling)
        seen.append(float(drawn[0]))
    # held for the first second, then 25 W a step
    assert seen == [600.0, 600.0, 575.0, 550.0, 525.0, 500.0, 475.0, 450.0]
    # wanting to rise resets it: the next fall waits a whole hysteresis again
    drawn, falling = ramp_toward(drawn, np.array([700.0]), cap, ramps, 0.5, falling)
    assert drawn[0] == 500.0 and falling[0] == 0.0
    drawn, falling = ramp_toward(drawn, np.array([100.0]), cap, ramps, 0.5, falling)
    assert drawn[0] == 500.0
    assert gpu_profile_values(ramps, 0.0, 90.0, 1e6).ramp_down_hysteresis_ms == 1000.0


def test_an_unlimited_rate_is_the_devices_most_and_not_a_clamp():
    values = gpu_profile_values(GpuRamps(math.inf, math.inf, 0.5), 0.0, 90.0, 4e6)
    assert values.ramp_up_w_per_s == 4e6 and values.ramp_down_w_per_s == 4e6
    assert values.floor_percent == 50.0 and not values.clamped
    clamped = gpu_profile_values(GpuRamps(10.0, 10.0, 0.95), 0.0, 90.0, 4e6)
    assert clamped.floor_percent == 90.0 and clamped.clamped


def test_the_sites_cap_ramp_is_bounded_by_the_grids():
    from policies.smoothing import with_grid_ramp
    from tests.support.policy_trees import uniform_tree, with_ramp

    tree = with_ramp(uniform_tree(rows=2, racks=2), range(7), 5000.0)
    bounded = with_grid_ramp(tree, 1000.0)
    assert bounded.ramp_w_per_s[0] == pytest.approx(min(tree.ramp_w_per_s[0], 900.0))
    assert np.array_equal(bounded.ramp_w_per_s[1:], tree.ramp_w_per_s[1:])  # the site only
    assert with_grid_ramp(tree, math.inf) is tree
