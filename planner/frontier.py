"""What a grid spec costs a site, in three currencies: energy burnt, work lost, storage.

A site meets a ramp limit by holding its power above its demand (a floor: energy
burnt), by holding rises back below it (work lost: demand not served), or by
rack storage that takes up the swings. ``policies.grid_frontier`` gives, for one
demand series, every cheapest pair of the first two (the frontier: less floor
costs more lost work); this module adds storage and the site's units.

Storage. Rack storage of a size (``planner.whatif_storage.StorageSizing``, one pool
dispatched by ``policies.storage.dispatch``) moves energy in time: the grid then
sees the demand plus what the storage takes from the bus less what it gives,
``grid - burnt + held`` of the dispatch (``shifted_by_storage``). What that series
still breaks of the ramp limits is left to a floor and held rises: its frontier.
The storage's conversion losses are burnt too, at every point of its frontier.

Units. Joules over the replay become a day's: × ``86,400 / duration_s``. Energy
burnt is kWh a day. Work lost is demand energy not served, counted in GPU-hours:
``lost_j / w_per_gpu / 3600`` with ``w_per_gpu`` the jobs' mean draw per GPU over
the replay (their energy / (their GPUs × duration)): a GPU-hour is the energy a
job's GPU draws in an hour, and energy not served is taken as work not done
pro rata (the replay's speed model, ``r ** 0.28``, would say a GPU held at a
share ``r`` of its draw loses less: this counts the energy, not the speed).

The knee: the point whose burn weight is 1 (``least_cost_schedule`` with equal
weights), the least floor + lost energy: beyond it, each further kWh burnt saves
less than a kWh of work, and short of it, each kWh not burnt loses more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from planner.whatif import WhatifResult
from planner.whatif_storage import StorageSizing, ramp_spec, storage_dispatch
from policies.grid import J_PER_KWH, as_series
from policies.grid_frontier import (
    FrontierPoint,
    frontier,
    least_cost_schedule,
    least_lost_j,
    lost_work_bound_j,
)
from policies.storage import Dispatch
from powerd.topology import Topology
from powerd.topology.grid import GridSpec

S_PER_DAY = 86_400.0
S_PER_HOUR = 3_600.0
KNEE_BURN_WEIGHT = 1.0  # a joule burnt weighs as much as a joule of demand not served
NO_STORAGE = StorageSizing(0.0, 0.0)


@dataclass(frozen=True)
class Units:
    """A replay's joules as a day's: kWh a day, GPU-hours a day (module docstring)."""

    duration_s: float
    w_per_gpu: float  # the jobs' mean draw per GPU over the replay

    def __post_init__(self) -> None:
        for name in ("duration_s", "w_per_gpu"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be positive, not {value}")

    def kwh_per_day(self, joules: float) -> float:
        return joules / J_PER_KWH * S_PER_DAY / self.duration_s

    def gpu_hours_per_day(self, joules: float) -> float:
        return joules / self.w_per_gpu / S_PER_HOUR * S_PER_DAY / self.duration_s


def units_of(result: WhatifResult) -> Units:
    """The replay's duration and its jobs' mean draw per GPU."""
    duration_s = float(result.info["duration_s"])  # type: ignore[arg-type]
    gpus = float(result.jobs["gpus"].sum())
    if gpus <= 0 or result.jobs_energy_j <= 0:
        raise ValueError("the replay has no jobs drawing power: nothing to count work in")
    return Units(duration_s, result.jobs_energy_j / (gpus * duration_s))


@dataclass(frozen=True)
class Shifted:
    """The demand the grid sees with a storage size, and the storage's own costs (J)."""

    demand_w: np.ndarray
    conversion_loss_j: float


def shifted_by_storage(
    top: Topology, site_w: np.ndarray, step_s: float, sizing: StorageSizing
) -> Shifted:
    """``site_w`` as the grid sees it with ``sizing`` per rack (``NO_STORAGE``: itself)."""
    d = as_series(site_w, "site_w")
    if sizing == NO_STORAGE:
        return Shifted(d, 0.0)
    return _shifted(storage_dispatch(top, d, step_s, sizing))


def _shifted(run: Dispatch) -> Shifted:
    """The dispatch's grid draw less what it burnt plus what it held back: the demand plus
    the storage's net take from the bus."""
    shifted: np.ndarray = run.grid_w - run.burnt_w + run.held_w
    return Shifted(shifted, run.conversion_loss_j)


@dataclass(frozen=True)
class SiteFrontier:
    """One storage size's frontier (``policies.grid_frontier.frontier``, floor descending)
    and its knee, in joules over the replay."""

    sizing: StorageSizing
    points: list[FrontierPoint]
    knee: FrontierPoint
    conversion_loss_j: float

    def lost_bound_j(self, floor_j: float) -> float:
        """The least work any schedule meeting the spec loses burning at most ``floor_j``."""
        return lost_work_bound_j(self.points, floor_j)


def _costs_j(demand_w: np.ndarray, power_w: np.ndarray, step_s: float) -> tuple[float, float]:
    """(burnt above the demand, demand not served), J."""
    gap = power_w - demand_w
    return float(np.maximum(gap, 0.0).sum()) * step_s, float(np.maximum(-gap, 0.0).sum()) * step_s


def demand_frontier(
    demand_w: np.ndarray, step_s: float, spec: GridSpec, points: int
) -> tuple[list[FrontierPoint], FrontierPoint]:
    """The frontier of ``demand_w`` under the spec's ramp limits, and its knee."""
    args = (demand_w, step_s, spec.window_s, spec.ramp_up_w_per_s, spec.ramp_down_w_per_s)
    return frontier(*args, points=points), _knee(*args)


def _knee(
    demand_w: np.ndarray, step_s: float, window_s: float, up_w_per_s: float, down_w_per_s: float
) -> FrontierPoint:
    """The least-cost schedule with burn and loss weighed alike (``KNEE_BURN_WEIGHT``)."""
    knee_w = least_cost_schedule(
        demand_w, step_s, window_s, up_w_per_s, down_w_per_s,
        burn_weight=KNEE_BURN_WEIGHT, loss_weight=1.0,
    )  # fmt: skip
    floor_j, lost_j = _costs_j(np.asarray(demand_w, dtype=float), knee_w, step_s)
    return FrontierPoint(floor_j, lost_j, KNEE_BURN_WEIGHT)


def site_frontiers(
    top: Topology,
    site_w: np.ndarray,
    step_s: float,
    sizings: Sequence[StorageSizing],
    points: int = 9,
) -> list[SiteFrontier]:
    """One frontier per storage size, over the replayed site series ``site_w``."""
    spec = ramp_spec(top, "the frontier")
    out = []
    for sizing in sizings:
        shifted = shifted_by_storage(top, site_w, step_s, sizing)
        curve, knee = demand_frontier(shifted.demand_w, step_s, spec, points)
        out.append(SiteFrontier(sizing, curve, knee, shifted.conversion_loss_j))
    return out


def _row(f: SiteFrontier, point: FrontierPoint, what: str, units: Units) -> dict[str, object]:
    burnt_j = point.floor_j + f.conversion_loss_j
    return {
        "storage_kj_per_rack": f.sizing.kj_per_rack,
        "storage_kw_per_rack": f.sizing.kw_per_rack,
        "point": what,
        "burn_weight": point.burn_weight,
        "burnt_kwh_per_day": units.kwh_per_day(burnt_j),
        "floor_kwh_per_day": units.kwh_per_day(point.floor_j),
        "conversion_loss_kwh_per_day": units.kwh_per_day(f.conversion_loss_j),
        "lost_gpu_hours_per_day": units.gpu_hours_per_day(point.lost_j),
        "lost_kwh_per_day": units.kwh_per_day(point.lost_j),
    }


def answer_table(frontiers: Sequence[SiteFrontier], units: Units) -> pd.DataFrame:
    """Per storage size: the least loss (the least floor losing nothing), the knee, and the
    least burn (no floor: the most lost)."""
    rows = []
    for f in frontiers:
        rows.append(_row(f, f.points[0], "least loss", units))
        rows.append(_row(f, f.knee, "knee", units))
        rows.append(_row(f, f.points[-1], "least burn", units))
    return pd.DataFrame(rows)


def frontier_table(frontiers: Sequence[SiteFrontier], units: Units) -> pd.DataFrame:
    """Every point of every storage size's frontier, floor descending."""
    rows = [_row(f, p, "", units) for f in frontiers for p in f.points]
    return pd.DataFrame(rows).drop(columns=["point"])


@dataclass(frozen=True)
class Marks:
    """What a replay is placed against on its storage size's frontier: the least-loss end's
    burn, the knee, and the least work lost at the replay's burn (``bound_j``)."""

    sizing: StorageSizing
    least_floor_j: float
    knee: FrontierPoint
    bound_j: float


def marks(demand_w: np.ndarray, step_s: float, spec: GridSpec, sizing: StorageSizing,
          floor_j: float) -> Marks:  # fmt: skip
    """``Marks`` from three schedules and one bound search, not the whole frontier
    (``least_lost_j``: seconds at 150 MW where the frontier takes minutes)."""
    args = (demand_w, step_s, spec.window_s, spec.ramp_up_w_per_s, spec.ramp_down_w_per_s)
    least = least_cost_schedule(*args, burn_weight=1.0, loss_weight=math.inf)
    least_floor_j = _costs_j(np.asarray(demand_w, dtype=float), least, step_s)[0]
    knee = _knee(*args)
    return Marks(sizing, least_floor_j, knee, least_lost_j(*args, floor_j))


def position(
    m: Marks, floor_j: float, lost_j: float, units: Units, meets_spec: bool
) -> dict[str, object]:
    """Where a replayed site (burning ``floor_j`` above its demand and losing ``lost_j`` of
    it, J over the replay) sits against its storage size's frontier (``m``): the least work
    any schedule meeting the spec loses at that burn, and the ratio (1: on the frontier)."""
    bound_j, least_floor_j = m.bound_j, m.least_floor_j
    return {
        "storage_kj_per_rack": m.sizing.kj_per_rack,
        "storage_kw_per_rack": m.sizing.kw_per_rack,
        "meets_spec": meets_spec,
        "floor_kwh_per_day": units.kwh_per_day(floor_j),
        "lost_gpu_hours_per_day": units.gpu_hours_per_day(lost_j),
        "lost_bound_gpu_hours_per_day": units.gpu_hours_per_day(bound_j),
        "lost_over_bound": lost_j / bound_j if bound_j > 0 else None,
        "least_loss_floor_kwh_per_day": units.kwh_per_day(least_floor_j),
        "floor_over_least_loss_floor": floor_j / least_floor_j if least_floor_j > 0 else None,
        "knee_floor_kwh_per_day": units.kwh_per_day(m.knee.floor_j),
        "knee_lost_gpu_hours_per_day": units.gpu_hours_per_day(m.knee.lost_j),
        "w_per_gpu": units.w_per_gpu,
    }


def position_line(where: dict[str, object]) -> str:
    """``position`` in one line, as whatif and report print it."""
    head = (
        f"burns {where['floor_kwh_per_day']:,.1f} kWh/day above demand, loses "
        f"{where['lost_gpu_hours_per_day']:,.1f} GPU-h/day"
    )
    ends = (
        f"nothing lost from {where['least_loss_floor_kwh_per_day']:,.1f} kWh/day; knee "
        f"{where['knee_floor_kwh_per_day']:,.1f} kWh/day, "
        f"{where['knee_lost_gpu_hours_per_day']:,.1f} GPU-h/day"
    )
    if not where["meets_spec"]:
        return f"{head}: outside the grid spec, not on its frontier ({ends})"
    ratio = where["lost_over_bound"]
    told = f", {ratio:.2f}x" if isinstance(ratio, float) else ""
    return (
        f"{head}; the least any schedule within the spec loses at that burn: "
        f"{where['lost_bound_gpu_hours_per_day']:,.1f} GPU-h/day{told} ({ends})"
    )


def replay_position(
    top: Topology, result: WhatifResult, sizing: StorageSizing | None = None, points: int = 9
) -> dict[str, object] | None:
    """Where a whatif replay sits against the frontier at its storage (``position``); None
    without a ramp limit or jobs. The demand is what the site would draw with no grid spec
    (``WhatifResult.site_demand_w``, the one ``grid_report``'s bounds are computed on): its
    draw burns what it holds above that and loses what it holds below (site-wide, per
    step); it meets the spec only if its ramps do. With ``sizing`` the storage's dispatch is the
    schedule: it burns what the storage cannot take and loses what it cannot give, against
    the frontier of the demand the storage leaves (``shifted_by_storage``)."""
    from policies.grid import ramp_stats

    spec = top.grid
    if spec is None or not spec.limits_ramp or result.jobs_energy_j <= 0:
        return None
    units = units_of(result)
    step_s = float(result.info["step_s"])  # type: ignore[arg-type]
    demand = result.site_demand_w if len(result.site_demand_w) else result.site_power_w
    if sizing is None:
        shifted = shifted_by_storage(top, demand, step_s, NO_STORAGE)
        floor_j, lost_j = _costs_j(demand, result.site_power_w, step_s)
        up, down = spec.ramp_up_w_per_s, spec.ramp_down_w_per_s
        ramps = ramp_stats(result.site_power_w, step_s, spec.window_s, up, down)
        meets = ramps.s_up_over == 0 and ramps.s_down_over == 0
    else:
        run = storage_dispatch(top, demand, step_s, sizing)
        shifted = _shifted(run)
        floor_j, lost_j, meets = run.burnt_j, run.held_back_j, True  # within 0.9 x the limits
    m = marks(shifted.demand_w, step_s, spec, sizing or NO_STORAGE, floor_j)
    return position(m, floor_j, lost_j, units, meets)
