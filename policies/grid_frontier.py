"""The least a ramp spec costs a site: floor energy against lost work, exactly.

A site drawing ``demand_w`` (one value every ``dt_s``) meets a ramp limit
(``policies.grid.ramp_rates``: ``-down <= (p[t] - p[t - w]) / (w dt_s) <= up``)
by drawing a series ``p`` other than its demand: above it (a floor: *floor
energy*, ``sum((p - d)^+) dt_s``, joules burnt) and below it (rises held back:
*lost work*, ``sum((d - p)^+) dt_s``, joules of demand not served). Storage
aside, every schedule that meets the limits is such a ``p``; what each costs is
this pair. ``policies.grid.least_ramp_floor`` is the end that loses nothing;
the highest series at or below the demand (``least_ramp_ceiling``) the end
that burns nothing.

Least cost (``least_cost_schedule``)
------------------------------------
The series meeting the limits that minimises ``burn_weight * floor +
loss_weight * lost``. The window links step ``t`` only to ``t - w``, so each
residue class of steps modulo ``w`` is an independent chain, and on a chain
``x_0, x_1, ...`` (with ``D = down w dt_s``, ``U = up w dt_s``) the problem is
``min sum f_k(x_k)`` subject to ``-D <= x_k - x_{k-1} <= U``, with ``f_k(x) =
a (x - d_k)^+ + b (d_k - x)^+`` convex and piecewise linear. Dynamic
programming solves it exactly ("slope trick"): ``F_k(x)``, the least cost of
the chain up to ``k`` ending at ``x``, is ``f_k(x) + min over y in [x - U, x
+ D] of F_{k-1}(y)``. A convex piecewise-linear ``F`` is kept as its minimum
and two heaps of weighted breakpoints, those left of the minimum (where the
slope rises by the weight) and those right of it. The window's minimum of a
convex function is the function with its left part moved left by ``D`` and
its right part right by ``U`` (flat in between): one offset per heap. Adding
``f_k`` adds breakpoint ``d_k`` with weight ``a`` on the right and ``b`` on
the left; where ``d_k`` falls on the wrong side of the minimum, weight ``a``
(``b``) moves from the top of the one heap to the other, splitting the last
breakpoint moved. Each step keeps one minimiser ``m_k`` of ``F_k``; going
back, ``x_k = clip(m_k, x_{k+1} - U, x_{k+1} + D)`` is the minimiser of the
convex ``F_k`` over the ``y`` that reach ``x_{k+1}``, so the series is optimal.
Nothing is discretised: the answer is exact up to float rounding (each
breakpoint is a demand value moved by whole multiples of ``D`` or ``U``). Per
chain of ``m`` steps, ``O(m log m)`` heap operations and a few more per
breakpoint moved between heaps.

The frontier (``frontier``)
---------------------------
For loss weight 1 and burn weight ``λ``, the least cost is the lower
envelope of lines ``λ floor + lost`` over every feasible pair: the pairs
reachable form a convex set (the constraints are linear, the two energies
convex), so the least lost work at each floor energy, ``L(B)``, is convex,
decreasing and, the problem being a linear program, piecewise linear with
finitely many vertices, each the least-cost schedule of some ``λ``. The
frontier is found exactly by refinement between neighbours (the bi-objective
"non-inferior set estimation" of Cohon): start from the two ends; for
neighbours ``P1`` (more floor) and ``P2``, solve at the weight that makes them
cost the same, ``λ = (lost2 - lost1) / (floor1 - floor2)``. A point cheaper
at ``λ`` than both is a vertex between them (refine both sides); none cheaper
means the segment ``P1 P2`` lies on the frontier (every schedule costs at
least their cost at ``λ``, so no pair lies below their line). Every vertex is
found, since a vertex missing between two neighbours would be cheaper at their
``λ``. A point's ``burn_weight`` is the largest ``λ`` at which it is a least-
cost schedule: the frontier's slope from it towards less floor, the lost
joules each floor joule saved costs (``inf`` at the least-burn end).

The bound (``lost_work_bound_j``)
---------------------------------
Every point gives a line no feasible pair lies below: ``lost >= lost_i -
burn_weight_i (floor - floor_i)``. Their maximum is the least lost work any
schedule meeting the limits can have while burning at most ``floor``: on a
complete frontier it is the linear interpolation between its points (exact).
It ignores the oscillation limit and anything storage would do; a schedule
that meets the oscillation limit too can only lose more.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from policies.grid import as_series, check_ramp_limit, least_ramp_floor, window_steps

# a point this much cheaper (of its cost at the weight tried, plus 1e-9 J) is a new vertex
_REL_TOLERANCE = 1e-9
MAX_SOLVES = 400  # refinement stops here (every point's bound line stays valid; see frontier)


def least_ramp_ceiling(
    demand_w: np.ndarray,
    dt_s: float,
    window_s: float,
    up_w_per_s: float = math.inf,
    down_w_per_s: float = math.inf,
) -> np.ndarray:
    """The highest series at or below ``demand_w`` meeting the ramp limits: what a site
    draws if it burns nothing and holds back as little as it can (``least_ramp_floor``
    of the negated demand, a rise there being a fall here)."""
    d = as_series(demand_w, "demand_w")
    out: np.ndarray = -least_ramp_floor(-d, dt_s, window_s, down_w_per_s, up_w_per_s)
    return out


def least_cost_schedule(
    demand_w: np.ndarray,
    dt_s: float,
    window_s: float,
    up_w_per_s: float,
    down_w_per_s: float,
    burn_weight: float,
    loss_weight: float,
) -> np.ndarray:
    """The series meeting the ramp limits that minimises ``burn_weight * floor +
    loss_weight * lost`` (module docstring), exactly. ``loss_weight`` inf (or
    ``burn_weight`` 0): ``least_ramp_floor``, the least-floor schedule of those that lose
    nothing; ``burn_weight`` inf (or ``loss_weight`` 0): ``least_ramp_ceiling``. Weights
    are ≥ 0, not both 0, not both inf."""
    d = as_series(demand_w, "demand_w")
    w = window_steps(dt_s, window_s)
    check_ramp_limit("up_w_per_s", up_w_per_s)
    check_ramp_limit("down_w_per_s", down_w_per_s)
    for name, value in (("burn_weight", burn_weight), ("loss_weight", loss_weight)):
        if math.isnan(value) or value < 0:
            raise ValueError(f"{name} must be ≥ 0 (inf allowed), not {value}")
    if (burn_weight == 0 and loss_weight == 0) or (
        math.isinf(burn_weight) and math.isinf(loss_weight)
    ):
        raise ValueError(f"weights {burn_weight}, {loss_weight}: nothing to weigh one against")
    if math.isinf(loss_weight) or burn_weight == 0:
        return least_ramp_floor(d, dt_s, window_s, up_w_per_s, down_w_per_s)
    if math.isinf(burn_weight) or loss_weight == 0:
        return least_ramp_ceiling(d, dt_s, window_s, up_w_per_s, down_w_per_s)
    out = d.copy()
    rise_w, fall_w = up_w_per_s * w * dt_s, down_w_per_s * w * dt_s
    for r in range(min(w, len(d))):
        out[r::w] = _chain(d[r::w], rise_w, fall_w, burn_weight, loss_weight)
    return out


def _chain(d: np.ndarray, rise_w: float, fall_w: float, a: float, b: float) -> np.ndarray:
    """One chain (module docstring): min sum a (x - d)^+ + b (d - x)^+ subject to
    -fall_w <= x_k - x_{k-1} <= rise_w. Heaps hold [key, weight]: the left one keys
    -(position - left_shift) (a max-heap), the right one position - right_shift."""
    left: list[list[float]] = []
    right: list[list[float]] = []
    left_shift = right_shift = 0.0
    minimiser = np.empty(len(d))
    for k, dk in enumerate(d.tolist()):
        if k:  # the window's minimum: the left part moves down the fall, the right up the rise
            if math.isinf(fall_w):
                left.clear()
            else:
                left_shift -= fall_w
            if math.isinf(rise_w):
                right.clear()
            else:
                right_shift += rise_w
        # a (x - d)^+: breakpoint d, weight a, on the right of the minimum
        if not left or dk >= -left[0][0] + left_shift:
            heapq.heappush(right, [dk - right_shift, a])
        else:
            heapq.heappush(left, [-(dk - left_shift), a])
            _move(left, right, a, left_shift - right_shift)
        # b (d - x)^+: breakpoint d, weight b, on the left
        if not right or dk <= right[0][0] + right_shift:
            heapq.heappush(left, [-(dk - left_shift), b])
        else:
            heapq.heappush(right, [dk - right_shift, b])
            _move(right, left, b, left_shift - right_shift)
        minimiser[k] = -left[0][0] + left_shift if left else right[0][0] + right_shift
    x = np.empty(len(d))
    after = math.nan
    for k in range(len(d) - 1, -1, -1):
        m = float(minimiser[k])
        if k < len(d) - 1:
            m = min(max(m, after - rise_w), after + fall_w)
        x[k] = after = m
    return x


def _move(src: list[list[float]], dst: list[list[float]], weight: float, offset: float) -> None:
    """Move ``weight`` of breakpoints from the top of ``src`` to ``dst``, splitting the last
    one moved. A breakpoint keyed ``key`` in one heap is keyed ``offset - key`` in the
    other (``offset``: the left shift less the right one), either way."""
    while weight > 0 and src:
        top = src[0]
        if top[1] <= weight:
            heapq.heappop(src)
            heapq.heappush(dst, [offset - top[0], top[1]])
            weight -= top[1]
        else:
            top[1] -= weight  # the key is unchanged: the heap stays a heap
            heapq.heappush(dst, [offset - top[0], weight])
            weight = 0.0


@dataclass(frozen=True)
class FrontierPoint:
    """One point of the frontier: floor energy (J burnt above the demand), lost work (J of
    demand not served), and the largest burn weight (loss weight 1) at which it is a
    least-cost schedule: the frontier's slope from it towards less floor."""

    floor_j: float
    lost_j: float
    burn_weight: float


def schedule_energies_j(
    demand_w: np.ndarray, power_w: np.ndarray, dt_s: float
) -> tuple[float, float]:
    """(floor, lost): joules ``power_w`` draws above ``demand_w`` and below it."""
    gap = as_series(power_w) - as_series(demand_w, "demand_w")
    return float(np.maximum(gap, 0.0).sum()) * dt_s, float(np.maximum(-gap, 0.0).sum()) * dt_s


def frontier(
    demand_w: np.ndarray,
    dt_s: float,
    window_s: float,
    up_w_per_s: float,
    down_w_per_s: float,
    points: int = 9,
) -> list[FrontierPoint]:
    """The frontier between floor energy and lost work (module docstring), floor
    descending: from the least loss (``least_ramp_floor``'s floor, lost 0) to the least
    burn (floor 0, ``least_ramp_ceiling``'s loss). Every vertex, found exactly; where it
    has fewer than ``points`` points, its longest segments are split at their middle
    (points on a segment are on the frontier too) until it has ``points``. Refinement
    stops after ``MAX_SOLVES`` schedules: a segment left unchecked then keeps its ends'
    own bound lines (below the true frontier, never above it)."""
    d = as_series(demand_w, "demand_w")
    args = (dt_s, window_s, up_w_per_s, down_w_per_s)

    def solve(burn_weight: float) -> tuple[float, float]:
        return schedule_energies_j(d, least_cost_schedule(d, *args, burn_weight, 1.0), dt_s)

    most_floor_j, _ = solve(0.0)
    _, most_lost_j = solve(math.inf)
    if most_floor_j <= 0 and most_lost_j <= 0:
        return [FrontierPoint(0.0, 0.0, math.inf)]
    # [floor, lost, largest weight known optimal]; confirmed: the segment to the next is exact
    found: list[list[float]] = [[most_floor_j, 0.0, 0.0], [0.0, most_lost_j, math.inf]]
    confirmed = [False]
    solves = 2
    k = 0
    while k < len(found) - 1:
        if confirmed[k]:
            k += 1
            continue
        (f1, l1, _), (f2, l2, _) = found[k], found[k + 1]
        weight = (l2 - l1) / (f1 - f2)
        if solves >= MAX_SOLVES:
            k += 1
            continue
        f, lost = solve(weight)
        solves += 1
        at_ends = weight * f1 + l1
        if weight * f + lost < at_ends - (_REL_TOLERANCE * at_ends + 1e-9) and f2 < f < f1:
            found.insert(k + 1, [f, lost, weight])
            confirmed.insert(k + 1, False)
        else:  # the segment is on the frontier: P1 is optimal up to its slope
            found[k][2] = weight
            confirmed[k] = True
    out = [FrontierPoint(f, lost, weight) for f, lost, weight in found]
    while len(out) < points and len(out) >= 2:
        gaps = [out[i].floor_j - out[i + 1].floor_j for i in range(len(out) - 1)]
        i = int(np.argmax(gaps))
        if not confirmed[i] or gaps[i] <= 0:
            break
        mid = FrontierPoint(
            (out[i].floor_j + out[i + 1].floor_j) / 2,
            (out[i].lost_j + out[i + 1].lost_j) / 2,
            out[i].burn_weight,
        )
        out.insert(i + 1, mid)
        confirmed.insert(i + 1, True)
    return out


def lost_work_bound_j(points: list[FrontierPoint], floor_j: float) -> float:
    """The least lost work (J) any schedule meeting the limits can have while burning at
    most ``floor_j`` (module docstring): the maximum of the points' bound lines, which on
    a complete frontier is the linear interpolation between its points; 0 at or beyond
    the least-loss end."""
    if not points:
        raise ValueError("an empty frontier bounds nothing")
    if math.isnan(floor_j) or floor_j < 0:
        raise ValueError(f"floor_j must be ≥ 0 J, not {floor_j}")
    best = 0.0
    for p in points:
        if math.isinf(p.burn_weight):  # the least-burn end: its line is the floor it burns
            if floor_j == p.floor_j:
                best = max(best, p.lost_j)
            continue
        best = max(best, p.lost_j - p.burn_weight * (floor_j - p.floor_j))
    return best


def least_lost_j(
    demand_w: np.ndarray,
    dt_s: float,
    window_s: float,
    up_w_per_s: float,
    down_w_per_s: float,
    floor_j: float,
) -> float:
    """``lost_work_bound_j`` at one floor energy without the whole frontier: the same
    refinement, down the one segment that holds ``floor_j`` (a few schedules, not one per
    vertex). Should it stop after ``MAX_SOLVES`` schedules, the last weight's bound line
    (a lower bound still) is returned."""
    if math.isnan(floor_j) or floor_j < 0:
        raise ValueError(f"floor_j must be ≥ 0 J, not {floor_j}")
    d = as_series(demand_w, "demand_w")
    args = (dt_s, window_s, up_w_per_s, down_w_per_s)

    def solve(burn_weight: float) -> tuple[float, float]:
        return schedule_energies_j(d, least_cost_schedule(d, *args, burn_weight, 1.0), dt_s)

    f1, l1 = solve(0.0)[0], 0.0
    f2, l2 = 0.0, solve(math.inf)[1]
    if floor_j >= f1:
        return 0.0
    f, lost, weight = f2, l2, math.inf
    for _ in range(MAX_SOLVES):
        weight = (l2 - l1) / (f1 - f2)
        f, lost = solve(weight)
        at_ends = weight * f1 + l1
        if not (weight * f + lost < at_ends - (_REL_TOLERANCE * at_ends + 1e-9) and f2 < f < f1):
            return l1 + (l2 - l1) * (f1 - floor_j) / (f1 - f2)  # the segment is the frontier
        if floor_j >= f:
            f2, l2 = f, lost
        else:
            f1, l1 = f, lost
    return max(0.0, lost - weight * (floor_j - f))
