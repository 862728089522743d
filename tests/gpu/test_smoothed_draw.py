"""One smoothing rule, ``policies.smoothing.ramp_toward``: stepped one GPU at a time (as
the simulated GPU and the fleet simulator call it) or over an array (the planner's
whatif), it moves a draw the same way, step after step, whatever the caps and targets do."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.smoothing import GpuRamps, ramp_toward


def smoothed_draw(
    was_w: float,
    target_w: float,
    cap_w: float,
    up_w_per_s: float,
    down_w_per_s: float,
    hysteresis_s: float,
    falling_s: float,
    dt_s: float,
) -> tuple[float, float]:
    """One GPU's step, as the simulated GPU takes it (``SimulatedGpu._ramped``)."""
    ramps = GpuRamps(up_w_per_s, down_w_per_s, 0.0, hysteresis_s)
    drawn, falling = ramp_toward(
        np.array(was_w), np.array(target_w), np.array(cap_w), ramps, dt_s, np.array(falling_s)
    )
    return float(drawn), float(falling)


watts = st.floats(0.0, 1200.0)
rates = st.sampled_from([math.inf, 0.0]) | st.floats(0.5, 2000.0)
steps = st.lists(st.tuples(watts, watts, st.floats(0.01, 2.0)), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    start=st.lists(watts, min_size=1, max_size=6),
    up=rates,
    down=rates,
    hysteresis_s=st.floats(0.0, 3.0),
    sequence=st.lists(steps, min_size=1, max_size=6),
)
def test_the_scalar_and_the_array_rule_agree(start, up, down, hysteresis_s, sequence):
    n = min(len(start), len(sequence))
    ramps = GpuRamps(up_w_per_s=up, down_w_per_s=down, floor_fraction=0.0,
                     hysteresis_s=hysteresis_s)  # fmt: skip
    length = min(len(s) for s in sequence[:n])
    drawn, falling = np.array(start[:n]), np.zeros(n)
    one = [(w, 0.0) for w in start[:n]]
    for k in range(length):
        cap = np.array([sequence[g][k][0] for g in range(n)])
        want = np.array([sequence[g][k][1] for g in range(n)])
        dt_s = sequence[0][k][2]  # one step for every GPU of the array
        drawn, falling = ramp_toward(drawn, want, cap, ramps, dt_s, falling)
        one = [
            smoothed_draw(w, want[g], cap[g], up, down, hysteresis_s, f, dt_s)
            for g, (w, f) in enumerate(one)
        ]
        np.testing.assert_allclose(drawn, [w for w, _ in one], rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(falling, [f for _, f in one], rtol=1e-12, atol=1e-12)
        assert np.all(drawn <= cap)


def test_a_lower_cap_bites_at_once_then_the_draw_falls_at_its_rate():
    # 700 W drawn, wants 300 W; the cap is cut to 600 W; 10 W/s down after 1 s
    w, f = smoothed_draw(700.0, 300.0, 600.0, 20.0, 10.0, 1.0, 0.0, 0.5)
    assert (w, f) == (600.0, 0.5)  # held: within the hysteresis
    w, f = smoothed_draw(w, 300.0, 600.0, 20.0, 10.0, 1.0, f, 1.0)
    assert (w, f) == (pytest.approx(595.0), 1.5)  # half of this second past the hysteresis
    w, f = smoothed_draw(w, 650.0, 600.0, 20.0, 10.0, 1.0, f, 1.0)
    assert (w, f) == (600.0, 0.0)  # wants more: rises at 20 W/s, to the cap at most


def test_infinite_rates_follow_at_once():
    assert smoothed_draw(700.0, 300.0, 800.0, math.inf, math.inf, 0.0, 0.0, 0.1) == (300.0, 0.1)
    assert smoothed_draw(300.0, 700.0, 800.0, math.inf, math.inf, 0.0, 0.0, 0.1) == (700.0, 0.0)
