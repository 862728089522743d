"""policies.grid_frontier: the least-cost schedule, the frontier and the lost-work bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from policies.grid import least_ramp_floor, ramp_rates
from policies.grid_frontier import (
    FrontierPoint,
    frontier,
    least_cost_schedule,
    least_lost_j,
    least_ramp_ceiling,
    lost_work_bound_j,
    schedule_energies_j,
)

# the hand case: 1 s steps, 1 s window, rises ≤ 4 W/s, falls free
HAND_DEMAND_W = np.array([0.0, 10.0, 10.0])


def test_hand_case() -> None:
    """Demand 0, 10, 10 W at 1 s steps; rises ≤ 4 W/s over 1 s, no fall limit.

    Hold ``h`` W at step 0 (burn ``h`` J): steps 1 and 2 reach at most ``h + 4`` and
    ``h + 8``, so ``lost = (6 - h)^+ + (2 - h)^+``: ``8 - 2h`` for ``h`` in [0, 2],
    ``6 - h`` for ``h`` in [2, 6], 0 from 6 (the least ramp floor: 6, 10, 10). No other
    choice helps (steps 1 and 2 above the demand only burn more). So the frontier's
    vertices are (floor, lost) = (6, 0), (2, 4), (0, 8), with slopes 1 and 2 between
    them: at burn weight 1.5 (loss 1) the cheapest is ``h = 2``, i.e. 2, 6, 10 (cost
    1.5 × 2 + 4 = 7, against 9 at ``h = 6`` and 8 at ``h = 0``); with 4 J to burn the
    least loss is 6 - 4 = 2 J, with 1 J, 8 - 2 = 6 J."""
    args = (HAND_DEMAND_W, 1.0, 1.0, 4.0, math.inf)
    np.testing.assert_allclose(least_cost_schedule(*args, 1.5, 1.0), [2.0, 6.0, 10.0])
    np.testing.assert_allclose(least_cost_schedule(*args, 0.5, 1.0), [6.0, 10.0, 10.0])
    np.testing.assert_allclose(least_cost_schedule(*args, 3.0, 1.0), [0.0, 4.0, 8.0])
    np.testing.assert_allclose(least_ramp_ceiling(*args), [0.0, 4.0, 8.0])
    points = frontier(*args, points=3)
    pairs = [x for p in points for x in (p.floor_j, p.lost_j)]
    assert pairs == pytest.approx([6, 0, 2, 4, 0, 8])
    assert [p.burn_weight for p in points[:2]] == pytest.approx([1.0, 2.0])
    assert math.isinf(points[-1].burn_weight)
    assert lost_work_bound_j(points, 4.0) == pytest.approx(2.0)
    assert lost_work_bound_j(points, 1.0) == pytest.approx(6.0)
    assert lost_work_bound_j(points, 0.0) == pytest.approx(8.0)
    assert lost_work_bound_j(points, 7.0) == 0.0


def test_more_points_asked_split_the_longest_segments() -> None:
    """The hand case's frontier has 3 vertices; asked for 5, its longest segments are split
    at their middle, on the frontier: (4, 2) between (6, 0) and (2, 4), then (5, 1)."""
    points = frontier(HAND_DEMAND_W, 1.0, 1.0, 4.0, math.inf, points=5)
    pairs = [x for p in points for x in (p.floor_j, p.lost_j)]
    assert pairs == pytest.approx([6, 0, 5, 1, 4, 2, 2, 4, 0, 8])


def _random_case(rng: np.random.Generator) -> tuple[np.ndarray, float, float, float, float]:
    n = int(rng.integers(2, 25))
    demand = rng.choice([0.0, 10.0, 100.0], size=n) + rng.random(n) * 5
    return (
        demand,
        float(rng.choice([0.5, 1.0])),
        float(rng.choice([0.5, 1.0, 2.0, 3.0])),
        float(rng.choice([3.0, 10.0, 40.0])),
        float(rng.choice([3.0, 10.0, 40.0, math.inf])),
    )


def test_a_loss_that_weighs_everything_is_the_least_ramp_floor() -> None:
    """Lost work weighted 1e9 times a joule burnt: nothing is held back, and of the
    schedules that hold nothing back the least floor burns least."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        case = _random_case(rng)
        np.testing.assert_allclose(
            least_cost_schedule(*case, 1.0, 1e9), least_ramp_floor(*case), rtol=0, atol=1e-6
        )
        np.testing.assert_array_equal(
            least_cost_schedule(*case, 1.0, math.inf), least_ramp_floor(*case)
        )


def _lp_rows(
    n: int, w: int, dt_s: float, up: float, down: float
) -> tuple[list[np.ndarray], list[float]]:
    """Variables p, above, below (3n): the ramp rows of the linear program."""
    rows, rhs = [], []
    for t in range(w, n):
        row = np.zeros(3 * n)
        row[t], row[t - w] = 1.0, -1.0
        rows.append(row)
        rhs.append(up * w * dt_s)
        if math.isfinite(down):
            rows.append(-row)
            rhs.append(down * w * dt_s)
    return rows, rhs


def test_least_cost_matches_a_linear_program() -> None:
    """Against scipy's HiGHS on 200 small random cases: the same least cost, and the series
    within the limits (exactly up to float rounding)."""
    linprog = pytest.importorskip("scipy.optimize").linprog
    rng = np.random.default_rng(1)
    for _ in range(200):
        demand, dt_s, window_s, up, down = case = _random_case(rng)
        burn, loss = (
            float(rng.choice([0.1, 0.5, 1.0, 3.0, 10.0])),
            float(rng.choice([0.3, 1.0, 2.0])),
        )
        p = least_cost_schedule(*case, burn, loss)
        rate = ramp_rates(p, dt_s, window_s)
        assert np.all(rate <= up + 1e-9) and np.all(-rate <= down + 1e-9)
        floor_j, lost_j = schedule_energies_j(demand, p, dt_s)
        n, w = len(demand), max(1, round(window_s / dt_s))
        rows, rhs = _lp_rows(n, w, dt_s, up, down)
        lp = linprog(
            np.concatenate([np.zeros(n), np.full(n, burn * dt_s), np.full(n, loss * dt_s)]),
            A_ub=np.array(rows) if rows else None,
            b_ub=np.array(rhs) if rows else None,
            A_eq=np.hstack([np.eye(n), -np.eye(n), np.eye(n)]),
            b_eq=demand,
            bounds=[(None, None)] * n + [(0, None)] * (2 * n),
            method="highs",
        )
        assert burn * floor_j + loss * lost_j == pytest.approx(lp.fun, rel=1e-7, abs=1e-7)


def test_the_bound_matches_a_linear_program() -> None:
    """The least lost work at a given floor energy, from the frontier, against HiGHS
    minimising lost work with the floor energy constrained, at 7 floors each of 30 cases."""
    linprog = pytest.importorskip("scipy.optimize").linprog
    rng = np.random.default_rng(2)
    for _ in range(30):
        demand, dt_s, window_s, up, down = case = _random_case(rng)
        points = frontier(*case, points=3)
        floors = [p.floor_j for p in points]
        assert floors == sorted(floors, reverse=True) and points[0].lost_j == 0.0
        n, w = len(demand), max(1, round(window_s / dt_s))
        for budget_j in np.linspace(0.0, floors[0] * 1.1, 7):
            rows, rhs = _lp_rows(n, w, dt_s, up, down)
            burn_row = np.zeros(3 * n)
            burn_row[n : 2 * n] = dt_s
            lp = linprog(
                np.concatenate([np.zeros(2 * n), np.full(n, dt_s)]),
                A_ub=np.array([*rows, burn_row]),
                b_ub=np.array([*rhs, budget_j]),
                A_eq=np.hstack([np.eye(n), -np.eye(n), np.eye(n)]),
                b_eq=demand,
                bounds=[(None, None)] * n + [(0, None)] * (2 * n),
                method="highs",
            )
            bound = lost_work_bound_j(points, float(budget_j))
            assert bound == pytest.approx(lp.fun, rel=1e-6, abs=1e-6)


def test_a_demand_within_the_limits_costs_nothing() -> None:
    points = frontier(np.array([5.0, 6.0, 7.0]), 1.0, 1.0, 2.0, 2.0)
    assert [(p.floor_j, p.lost_j) for p in points] == [(0.0, 0.0)]
    assert lost_work_bound_j(points, 0.0) == 0.0


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="burn_weight"):
        least_cost_schedule(HAND_DEMAND_W, 1.0, 1.0, 4.0, 4.0, -1.0, 1.0)
    with pytest.raises(ValueError, match="nothing to weigh"):
        least_cost_schedule(HAND_DEMAND_W, 1.0, 1.0, 4.0, 4.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="floor_j"):
        lost_work_bound_j([FrontierPoint(1.0, 0.0, 1.0)], -1.0)
    with pytest.raises(ValueError, match="empty"):
        lost_work_bound_j([], 1.0)


def test_least_lost_at_one_floor_is_the_frontier_s_bound() -> None:
    """The one-floor search agrees with the whole frontier: on the hand case (2 J at 4 J,
    6 J at 1 J, 8 J at 0, 0 beyond 6 J) and on 20 random cases at 5 floors each."""
    args = (HAND_DEMAND_W, 1.0, 1.0, 4.0, math.inf)
    assert [least_lost_j(*args, f) for f in (4.0, 1.0, 0.0, 6.0, 9.0)] == pytest.approx(
        [2.0, 6.0, 8.0, 0.0, 0.0]
    )
    rng = np.random.default_rng(4)
    for _ in range(20):
        case = _random_case(rng)
        points = frontier(*case)
        for floor_j in np.linspace(0.0, points[0].floor_j, 5):
            expected = lost_work_bound_j(points, float(floor_j))
            assert least_lost_j(*case, float(floor_j)) == pytest.approx(
                expected, rel=1e-9, abs=1e-9
            )
