"""policies.storage: rack energy storage dispatched over a site's demand. Hand-checked steps
first, then properties over random demand series."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import grid
from policies.storage import Storage, dispatch, trailing_mean

NONE = Storage(capacity_j=0.0, power_w=0.0)


def test_a_dip_goes_into_the_store_and_comes_back_out():
    """100 kW flat, one step at 40 kW. The grid draw falls 1 kW (its limit) and holds;
    the store takes the other 59 kW at 0.9 one way (round trip 0.81), then gives back."""
    demand = np.full(30, 100e3)
    demand[20] = 40e3
    store = Storage(capacity_j=1e6, power_w=100e3, round_trip=0.81)
    r = dispatch(demand, 1.0, store, 1e3, 1e3, horizon_s=10.0)
    assert np.all(r.grid_w[:20] == 100e3) and np.all(r.charge_j[:20] == 500e3)
    assert r.grid_w[20] == pytest.approx(99e3)  # wants 94 kW (the mean), falls 1 kW
    assert r.charge_j[20] == pytest.approx(500e3 + 0.9 * 59e3)
    assert r.loss_w[20] == pytest.approx(0.1 * 59e3) and r.burnt_w[20] == 0
    # next step: wants less still (mean 94 kW, charge above half), but the demand is back
    # above the draw, which then does not fall: the store gives the 1 kW
    assert r.grid_w[21] == pytest.approx(99e3)
    assert r.charge_j[21] == pytest.approx(500e3 + 0.9 * 59e3 - 1e3 / 0.9)
    assert r.held_back_j == 0 and r.burnt_j == 0


def test_the_charge_is_pulled_back_to_the_reference():
    """After the dip the store holds 53 kJ above half; with the demand flat again, the grid
    draws a little less than it, and the store gives the excess back over a few horizons."""
    demand = np.full(300, 100e3)
    demand[20] = 40e3
    store = Storage(capacity_j=1e6, power_w=100e3, round_trip=0.81)
    r = dispatch(demand, 1.0, store, 1e3, 1e3, horizon_s=10.0)
    assert r.charge_max_j > 550e3
    assert r.charge_j[-1] == pytest.approx(store.reference_j, abs=1e3)
    assert np.all(r.grid_w[25:] <= demand[25:])  # giving, not taking


def test_with_no_store_a_fall_is_burnt_and_a_rise_is_held_back():
    """Capacity 0, a one-step horizon (the target is the demand): a 10 kW drop at a 1 kW/s
    limit burns 9 + 8 + ... + 1 kJ; the 10 kW rise back holds back as much."""
    demand = np.concatenate([np.full(5, 50e3), np.full(20, 40e3), np.full(20, 50e3)])
    r = dispatch(demand, 1.0, NONE, 1e3, 1e3, horizon_s=1.0)
    assert r.burnt_j == pytest.approx(45e3) and r.held_back_j == pytest.approx(45e3)
    assert r.grid_w[5:16].tolist() == pytest.approx([49e3 - 1e3 * k for k in range(10)] + [40e3])
    assert r.conversion_loss_j == 0 and r.charge_max_j == 0


def test_a_full_store_burns_and_an_empty_one_holds_back():
    """10 kJ, 1 kW/s: a 10 kW dip for 20 s fills the store (half empty: 5 kJ at 1 way) and
    burns the rest; the rise back empties it and holds the rest back."""
    demand = np.concatenate([np.full(5, 50e3), np.full(20, 40e3), np.full(40, 50e3)])
    store = Storage(capacity_j=10e3, power_w=100e3, round_trip=1.0)
    r = dispatch(demand, 1.0, store, 1e3, 1e3, horizon_s=1.0)
    assert r.charge_max_j == pytest.approx(10e3) and r.charge_min_j == pytest.approx(0.0)
    assert r.burnt_j == pytest.approx(45e3 - 5e3)  # what the no-store case burns, less 5 kJ
    assert r.held_back_j > 0 and r.conversion_loss_j == 0


def test_the_trailing_mean_is_causal():
    assert trailing_mean(np.array([1.0, 3.0, 5.0, 7.0]), 1.0, 2.0).tolist() == [1, 2, 4, 6]
    assert trailing_mean(np.array([1.0, 3.0]), 0.5, 10.0).tolist() == [1, 2]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"capacity_j": -1.0, "power_w": 1.0}, "capacity_j"),
        ({"capacity_j": math.inf, "power_w": 1.0}, "capacity_j"),
        ({"capacity_j": 1.0, "power_w": math.nan}, "power_w"),
        ({"capacity_j": 1.0, "power_w": 1.0, "round_trip": 0.0}, "round_trip"),
        ({"capacity_j": 1.0, "power_w": 1.0, "round_trip": 1.1}, "round_trip"),
        ({"capacity_j": 1.0, "power_w": 1.0, "reference": 1.5}, "reference"),
    ],
)
def test_a_bad_store_is_refused_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Storage(**kwargs)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((np.ones(3), 0.0, 1.0, 1.0, 1.0), "dt_s"),
        ((np.ones(3), 1.0, 0.0, 1.0, 1.0), "ramp_up_w_per_s"),
        ((np.ones(3), 1.0, 1.0, math.nan, 1.0), "ramp_down_w_per_s"),
        ((np.ones(3), 1.0, 1.0, 1.0, 0.0), "horizon_s"),
        ((np.ones((2, 2)), 1.0, 1.0, 1.0, 1.0), "demand_w"),
        ((np.array([1.0, math.inf]), 1.0, 1.0, 1.0, 1.0), "demand_w"),
    ],
)
def test_bad_arguments_are_refused_by_name(args, name):
    demand, dt_s, up, down, horizon = args
    with pytest.raises(ValueError, match=name):
        dispatch(demand, dt_s, NONE, up, down, horizon)


# --- properties ------------------------------------------------------------------------------

demands = st.lists(
    st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False), min_size=2, max_size=200
).map(np.array)
stores = st.builds(
    Storage,
    capacity_j=st.floats(0.0, 1e7),
    power_w=st.floats(0.0, 2e6),
    round_trip=st.floats(0.5, 1.0),
    reference=st.floats(0.0, 1.0),
)
rates = st.floats(1e2, 1e6)
steps = st.sampled_from([0.1, 0.5, 1.0])


@settings(max_examples=300, deadline=None)
@given(demands, steps, stores, rates, rates, st.floats(0.1, 100.0), st.floats(0.1, 5.0))
def test_the_grid_draw_keeps_the_ramp_limits_and_the_books_balance(
    demand, dt_s, store, up, down, horizon_s, window_s
):
    r = dispatch(demand, dt_s, store, up, down, horizon_s)
    rate = grid.ramp_rates(r.grid_w, dt_s, window_s)
    scale = max(float(np.abs(r.grid_w).max()), 1.0) * 1e-9 / dt_s
    assert np.all(rate <= up + scale) and np.all(-rate <= down + scale)
    assert np.all(r.charge_j >= 0) and np.all(r.charge_j <= store.capacity_j)
    for series in (r.burnt_w, r.loss_w, r.held_w):
        assert np.all(series >= 0)
    grid_j = float(r.grid_w.sum()) * dt_s
    demand_j = float(demand.sum()) * dt_s
    books_j = demand_j + r.burnt_j + r.conversion_loss_j + r.stored_change_j - r.held_back_j
    assert grid_j == pytest.approx(books_j, rel=1e-9, abs=1e-6 * max(demand_j, 1.0))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(-2e5, 2e5), min_size=2, max_size=200).map(np.array),
    steps,
    rates,
    rates,
)
def test_with_no_store_the_burn_is_the_causal_floor(moves_w, dt_s, up, down):
    """With nothing stored and a one-step horizon the grid draw is the demand, held up by a
    fall no faster than the limit: ``least_ramp_floor`` with no rise limit, a causal floor.
    Rises within the limit (the demand's) need nothing held back."""
    demand = 1e6 + np.cumsum(np.minimum(moves_w, up * dt_s))
    r = dispatch(demand, dt_s, NONE, up, down, horizon_s=dt_s)
    floor = grid.least_ramp_floor(demand, dt_s, dt_s, math.inf, down)
    assert r.grid_w == pytest.approx(floor, rel=1e-12, abs=1e-6)
    cost = grid.floor_cost(demand, floor, dt_s)
    assert r.burnt_j == pytest.approx(cost.energy_kwh * grid.J_PER_KWH, rel=1e-9, abs=1e-3)
    assert r.held_back_j == pytest.approx(0.0, abs=1e-3)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(4, 40),  # period, steps
    st.floats(0.05, 0.5),  # share of it in the dip
    st.floats(1e4, 1e6),  # the dip, W
    st.sampled_from([0.5, 1.0]),
    st.floats(0.7, 0.95),
)
def test_ample_storage_takes_up_a_periodic_demand_whole(period, dip_share, dip_w, dt_s, round_trip):
    """A square wave (a synchronous job's waits, the last steps of every period): with
    storage ample in energy and power, the grid draw settles near the mean and nothing is
    burnt or held back; the grid's limit is far slower than the dip."""
    t = np.arange(60 * period)
    dip_steps = max(1, round(dip_share * period))
    demand = np.where(t % period >= period - dip_steps, 2e6 - dip_w, 2e6)
    limit = dip_w / (20 * period * dt_s)
    store = Storage(
        capacity_j=100 * dip_w * period * dt_s, power_w=2 * dip_w, round_trip=round_trip
    )
    horizon_s = 4 * period * dt_s
    r = dispatch(demand, dt_s, store, limit, limit, horizon_s)
    demand_j = float(demand.sum()) * dt_s
    assert r.burnt_j <= 1e-9 * demand_j and r.held_back_j <= 1e-9 * demand_j
    assert r.conversion_loss_j > 0  # what it costs instead
    # the same wave with no storage burns or holds back much of what the dips leave out
    bare = dispatch(demand, dt_s, NONE, limit, limit, horizon_s)
    dips_j = float((2e6 - demand).sum()) * dt_s
    assert bare.burnt_j + bare.held_back_j > 0.5 * dips_j
