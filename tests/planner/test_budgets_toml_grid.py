"""`powerplan size` keeps the input's `[site.grid]`: the written file loads the same GridSpec."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from planner.budgets_toml import budgets_toml, check_round_trip
from planner.mix import parse_mix, place
from planner.sizing import Sizing, SizingError, SizingSettings, WorkloadTrace, size
from policies.tree import PHASE_CODES
from powerd.topology import Topology, load_budgets, parse_budgets
from powerd.topology.grid import GridSpec
from tests.support.paths import REPO

DATA = REPO / "powerd" / "data" / "budgets"


# One row, one rack of two 4-GPU H100 nodes; ``extra``: tables to add (a [site.grid], a
# [models.H100]), at the end, where TOML lets them be.
SMALL_SITE = """
[site]
name = "s"
limit_kw = 20
budget_kw = 18
[[rows]]
name = "r"
limit_kw = 20
budget_kw = 18
[[rows.racks]]
name = "k"
limit_kw = 10
budget_kw = 9
[rows.racks.nodes]
count = 2
name = "{{rack}}-n{{i}}"
gpus = 4
model = "H100"
{extra}
"""


def _trace() -> WorkloadTrace:
    t = np.arange(2_000)
    power = np.where((t % 10) < 5, 500.0, 250.0)
    return WorkloadTrace("w", power, np.full(len(t), PHASE_CODES["compute"], np.int8), 1.0, 8)


def _sized_text(top: Topology, mix: str = "share = 0.75\ncount = 3") -> tuple[str, Sizing]:
    placement = place(top, parse_mix(f'[[jobs]]\nworkload = "w"\n{mix}'))
    sized = size(top, placement, {"w": _trace()}, settings=SizingSettings(samples=2_000))
    return budgets_toml(top, sized, ["a header"]), sized


@pytest.mark.parametrize("name", ["demo", "site-150mw"])
def test_the_written_file_keeps_the_inputs_grid_spec(tmp_path: Path, name: str):
    top = load_budgets(DATA / f"{name}.toml")
    assert top.grid is not None  # both shipped files have a [site.grid]
    text, _ = _sized_text(top)
    assert text.count("[site.grid]") == 1
    out = tmp_path / f"{name}.toml"
    out.write_text(text)
    back = load_budgets(out)
    assert back.grid == top.grid
    assert isinstance(back.grid, GridSpec)


def test_every_grid_key_round_trips_including_fractions_and_no_floor():
    for grid in (
        "",  # an empty table: measured with the defaults, no limits; still a GridSpec
        "ramp_up_kw_per_s = 1.5\nwindow_s = 0.25",  # no ramp down: stays unlimited
        "ramp_down_w_per_s = 333.3\nfloor_fraction = 0.73\nfloor_window_s = 42.5\n"
        "oscillation_band_hz = [0.2, 3]\noscillation_max_share = 0.15\n"
        "oscillation_window_s = 30",
    ):
        top = parse_budgets(SMALL_SITE.format(extra=f"[site.grid]\n{grid}"), source="in.toml")
        assert top.grid is not None
        text, _ = _sized_text(top, "share = 1.0")
        back = parse_budgets(text, source="out.toml")
        assert back.grid == top.grid
        if "ramp_up" in grid:
            assert back.grid is not None
            assert math.isinf(back.grid.ramp_down_w_per_s)
            assert "ramp_up_w_per_s = 1500" in text


def test_no_grid_spec_writes_none():
    top = load_budgets(DATA / "tiny.toml")
    assert top.grid is None
    text, _ = _sized_text(top)
    assert "grid" not in text
    assert parse_budgets(text, source="out.toml").grid is None


def test_the_round_trip_check_compares_the_grid_spec():
    top = load_budgets(DATA / "demo.toml")
    text, sized = _sized_text(top)
    check_round_trip(text, top, sized)  # as written: the same
    assert top.grid is not None
    other = dataclasses.replace(top, grid=dataclasses.replace(top.grid, window_s=2.0))
    with pytest.raises(SizingError, match=r"\[site.grid\]"):
        check_round_trip(text, other, sized)
    with pytest.raises(SizingError, match=r"\[site.grid\]"):
        check_round_trip(text, dataclasses.replace(top, grid=None), sized)
