"""Rack energy storage on a replayed site series (``powerplan whatif --storage-kj-per-rack``).

After the replay (``planner.whatif.replay``), storage of a given size per rack is
dispatched over the replayed site series (``policies.storage``: one site-level pool,
within ``margin`` × the spec's ramp limits), and the grid draw it leaves is measured as
the site is; the replay itself is the same (no smoothing: a floor and storage together
are not modelled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from planner.whatif import WhatifResult
from policies.grid import J_PER_KWH
from policies.smoothing import DEFAULT_MARGIN
from policies.storage import (
    DEFAULT_HORIZON_S,
    DEFAULT_ROUND_TRIP,
    Dispatch,
    Storage,
    dispatch,
)
from policies.tree import RACK
from powerd.topology import Topology
from powerd.topology.grid import GridSpec, grid_report


@dataclass(frozen=True)
class StorageSizing:
    """Rack energy storage to try (``storage_report``): per rack, as a vendor states it."""

    kj_per_rack: float
    kw_per_rack: float  # charge and discharge
    round_trip: float = DEFAULT_ROUND_TRIP
    horizon_s: float = DEFAULT_HORIZON_S
    margin: float = DEFAULT_MARGIN  # of the spec's ramp limits the grid draw may use

    def pool(self, racks: int) -> Storage:
        """Every rack's storage as one site-level pool (``policies.storage``)."""
        return Storage(
            self.kj_per_rack * 1e3 * racks, self.kw_per_rack * 1e3 * racks, self.round_trip
        )


def ramp_spec(top: Topology, needs: str = "rack storage") -> GridSpec:
    """The site's grid spec, which must limit the ramp: what rack storage is dispatched to
    meet, and what the frontier is about (``needs``: who needs it, for the message)."""
    if top.grid is None or not top.grid.limits_ramp:
        raise ValueError(
            f"{needs} needs a grid spec with a ramp limit: add [site.grid] with "
            "ramp_up_mw_per_s / ramp_down_mw_per_s to the budgets file "
            "(docs/BUDGETS.md, 'The grid spec')"
        )
    return top.grid


def rack_count(top: Topology) -> int:
    """The site's racks (what storage per rack is multiplied by)."""
    racks = int(np.count_nonzero(np.asarray(top.tree.level) == RACK))
    if racks == 0:
        raise ValueError("rack storage needs racks: the budgets file has none")
    return racks


def check_storage(top: Topology, sizing: StorageSizing) -> tuple[GridSpec, Storage]:
    """Everything ``storage_report`` needs, checked before a long replay (ValueError): the
    spec it dispatches to and the site's pool."""
    spec = ramp_spec(top)
    pool = sizing.pool(rack_count(top))
    if not (math.isfinite(sizing.horizon_s) and sizing.horizon_s > 0):
        raise ValueError(f"the storage horizon must be positive, not {sizing.horizon_s} s")
    if not 0 < sizing.margin <= 1:
        raise ValueError(f"the storage margin must be in (0, 1], not {sizing.margin}")
    return spec, pool


def _kwh_and_share(name: str, joules: float, jobs_j: float) -> dict[str, float | None]:
    share = joules / jobs_j if jobs_j > 0 else None
    return {f"{name}_kwh": joules / J_PER_KWH, f"{name}_share_of_jobs": share}


def storage_dispatch(
    top: Topology, site_w: np.ndarray, step_s: float, sizing: StorageSizing
) -> Dispatch:
    """The storage dispatched over a site series (``policies.storage.dispatch``), its grid
    draw within ``margin`` × the spec's ramp limits."""
    spec, pool = check_storage(top, sizing)
    up, down = (sizing.margin * spec.ramp_up_w_per_s, sizing.margin * spec.ramp_down_w_per_s)
    return dispatch(site_w, step_s, pool, up, down, sizing.horizon_s)


def storage_report(top: Topology, result: WhatifResult, sizing: StorageSizing) -> dict[str, object]:
    """``info["storage"]``: the storage dispatched over the replayed site series, the grid
    draw it leaves measured as the site is (``grid_report``, without its floor costs: the
    storage's own are here), and where the energy went, each in kWh and as a share of the
    jobs' energy, beside the least floor without storage (``info["grid"]``)."""
    spec, pool = check_storage(top, sizing)
    racks = rack_count(top)
    step_s = float(result.info["step_s"])  # type: ignore[arg-type]
    run = storage_dispatch(top, result.site_power_w, step_s, sizing)
    jobs_j = result.jobs_energy_j
    measured = grid_report(run.grid_w, step_s, spec, jobs_j, demand_w=run.grid_w)
    site_grid = result.info.get("grid", {})
    assert isinstance(site_grid, dict)
    capacity = pool.capacity_j or math.nan
    return {
        "kj_per_rack": sizing.kj_per_rack,
        "kw_per_rack": sizing.kw_per_rack,
        "racks": racks,
        "capacity_kwh": pool.capacity_j / J_PER_KWH,
        "power_w": pool.power_w,
        "round_trip_efficiency": pool.round_trip,
        "horizon_s": sizing.horizon_s,
        "margin": sizing.margin,
        "assumptions": [
            "one site-level pool: every rack's storage dispatched together (the grid sees "
            "only the site)",
            f"round trip {pool.round_trip:g} (assumed), {pool.one_way:.3f} each way; "
            "no ageing, self-discharge or cost",
            f"grid draw: the demand's mean over the last {sizing.horizon_s:g} s plus a pull "
            f"back to {pool.reference:g} charge, moved within {sizing.margin:g} x the spec's "
            "ramp limits",
            "what storage cannot take is burnt (a floor); what it cannot give is held back "
            "(GPUs capped): the grid spec is kept",
            "the replay is the same without storage: work held back is not replayed later",
        ],
        "grid": {k: v for k, v in measured.items() if not k.startswith("floor")},
        **_kwh_and_share("burnt", run.burnt_j, jobs_j),
        **_kwh_and_share("conversion_loss", run.conversion_loss_j, jobs_j),
        **_kwh_and_share("burnt_and_losses", run.burnt_j + run.conversion_loss_j, jobs_j),
        **_kwh_and_share("held_back", run.held_back_j, jobs_j),
        "least_floor_without_storage_kwh": site_grid.get("floor_least_kwh"),
        "least_floor_without_storage_share_of_jobs": site_grid.get("floor_least_share_of_jobs"),
        "charge_min_share": run.charge_min_j / capacity if pool.capacity_j else None,
        "charge_max_share": run.charge_max_j / capacity if pool.capacity_j else None,
    }


def storage_table(storage: dict[str, object]) -> pd.DataFrame:
    """``info["storage"]`` (``storage_report``) as rows: what, unit, value; its grid draw is
    ``grid_table(storage["grid"])``."""
    rows: list[tuple[str, str, object]] = [
        ("storage per rack", "kJ", storage["kj_per_rack"]),
        ("storage per rack, charge and discharge", "kW", storage["kw_per_rack"]),
        ("racks (one pool)", "", storage["racks"]),
        ("round trip efficiency (assumed)", "share", storage["round_trip_efficiency"]),
        ("grid draw target: mean over", "s", storage["horizon_s"]),
    ]
    for key, what in (
        ("burnt", "energy burnt (a floor: storage full or at its power)"),
        ("conversion_loss", "energy lost charging and discharging"),
        ("burnt_and_losses", "burnt and lost together"),
        ("held_back", "energy held back (GPUs capped: storage empty or at its power)"),
        ("least_floor_without_storage", "the least floor within the ramp limits, no storage"),
    ):
        rows.append((what, "kWh", storage[f"{key}_kwh"]))
        rows.append((what, "share of jobs' energy", storage[f"{key}_share_of_jobs"]))
    rows.append(("charge, lowest", "share of capacity", storage["charge_min_share"]))
    rows.append(("charge, highest", "share of capacity", storage["charge_max_share"]))
    return pd.DataFrame(rows, columns=["what", "unit", "value"])
