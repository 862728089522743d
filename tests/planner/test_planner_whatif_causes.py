"""`powerplan whatif`: throughput lost, split by cause (policies.causes), adds up and names
what actually held the GPUs (issue: "capping doesn't bite" while jobs lost 5-14 %)."""

from __future__ import annotations

import numpy as np
import pytest

from planner.mix import parse_mix, place
from planner.sizing import WorkloadTrace
from planner.whatif import WhatifSettings, replay
from policies import PolicySettings
from policies.causes import LOST_CAUSES, lost_column
from policies.tree import PHASE_CODES
from tests.planner.test_planner_whatif import high_checkpoint_scenario, rack, trace

COMPUTE = PHASE_CODES["compute"]


def lost(result, job: str | int = 0) -> dict[str, float]:
    row = result.jobs.set_index("job").loc[job] if isinstance(job, str) else result.jobs.iloc[job]
    return {c: float(row[lost_column(c)]) for c in LOST_CAUSES}


def assert_adds_up(result) -> None:
    for _, row in result.jobs.iterrows():
        parts = sum(float(row[lost_column(c)]) for c in LOST_CAUSES)
        assert parts == pytest.approx(float(row["throughput_lost"]), abs=1e-9)
    site = result.info["throughput_lost_site_by_cause"]
    assert sum(site.values()) == pytest.approx(result.info["throughput_lost_site"], abs=1e-9)


def test_a_site_with_room_loses_only_to_the_failsafe_start():
    """Budgets with room, demand above the failsafe cap: the only loss is the climb from
    the failsafe caps agents start at; no capping, and the split says so."""
    top = rack(budget_w=14_000, limit_w=15_000, failsafe_w=400)
    placement = place(top, parse_mix('[[jobs]]\nworkload = "w"\nshare = 1.0'))
    result = replay(top, placement, {"w": trace(np.full(60, 650.0))}, WhatifSettings(60))
    assert (result.nodes["capping_share"] == 0).all()
    split = lost(result)
    assert split["failsafe start"] > 0.0
    assert split["failsafe start"] == pytest.approx(result.jobs.loc[0, "throughput_lost"])
    assert result.jobs.loc[0, "held_share"] > 0.0
    assert_adds_up(result)


def test_a_tight_rack_charges_its_cuts_to_capping():
    top = rack(budget_w=8000, limit_w=11_200, failsafe_w=650)  # failsafe = demand: no start loss
    placement = place(top, parse_mix('[[jobs]]\nworkload = "w"\nshare = 1.0'))
    # the bands cut the rack over its budget (under safety by caps its limit holds every
    # GPU at its 650 W failsafe cap: nothing is lost)
    bands = WhatifSettings(200, policy=PolicySettings(safety_by_caps=False))
    result = replay(top, placement, {"w": trace(np.full(100, 650.0))}, bands)
    split = lost(result)
    assert split["capping"] > 0.0
    assert split["capping"] > 0.9 * result.jobs.loc[0, "throughput_lost"]
    assert split["failsafe start"] == 0.0
    assert 0.0 < result.jobs.loc[0, "gpus_held_share"] <= 1.0
    assert_adds_up(result)


def test_low_priority_loses_to_the_priority_shift_after_a_high_checkpoint():
    """The high job leaves each checkpoint at its staged caps; the shift takes the low
    job's watts for it: the low job's loss is the shift's, the high job's the staging's.
    (The bands' staged caps and rule 3b.)"""
    top = rack(budget_w=8000, limit_w=11_200, failsafe_w=650)
    mix, traces = high_checkpoint_scenario()
    policy = PolicySettings(safety_by_caps=False, priority_shift=True)
    settings = WhatifSettings(duration_s=360, policy=policy)
    result = replay(top, place(top, mix), traces, settings)
    assert lost(result, "steady")["priority shift"] > 0.0
    assert lost(result, "vip")["staged phase"] > 0.0
    assert lost(result, "vip")["priority shift"] == 0.0  # nothing is shifted away from HIGH
    assert_adds_up(result)


def test_smoothing_charges_the_ramp_up_to_the_grid_ramp():
    """A synchronous job rising from a wait under grid smoothing: its draw climbs at the
    ramp share, below what its caps allow: the grid ramp's loss, not capping's."""
    from powerd.topology import parse_budgets

    top = parse_budgets(
        """
[site]
name = "s"
limit_kw = 100
budget_kw = 90
[site.grid]
ramp_up_kw_per_s = 0.2
ramp_down_kw_per_s = 0.2
window_s = 1
[[rows]]
name = "r1"
limit_kw = 100
budget_kw = 90
[[rows.racks]]
name = "k1"
limit_kw = 30
budget_kw = 28
[rows.racks.nodes]
count = 4
name = "{rack}-n{i}"
gpus = 4
model = "H100"
[models.H100]
failsafe_cap_w = 700
""",
        source="grid.toml",
    )
    power = np.concatenate([np.full(20, 650.0), np.full(20, 200.0), np.full(40, 650.0)])
    phase = np.full(len(power), COMPUTE, np.int8)
    phase[20:40] = PHASE_CODES["communication"]
    traces = {"w": WorkloadTrace("w", power, phase, 1.0, 8)}
    placement = place(top, parse_mix('[[jobs]]\nworkload = "w"\nshare = 1.0'))
    settings = WhatifSettings(duration_s=80, synchronised=True, smoothing=True)
    result = replay(top, placement, traces, settings)
    split = lost(result)
    assert split["grid ramp"] > 0.0
    assert split["capping"] == 0.0
    assert_adds_up(result)
