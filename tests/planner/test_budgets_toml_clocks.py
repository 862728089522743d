"""`powerplan size` keeps how the input chose each model's communication clock.

A file that chose it with ``comm_max_slowdown`` from its own ``clock_table`` must be written
so that the controller locks the same clock and every simulator (demo, fleet, whatif,
evaluate) answers the lock from the same table, not the shipped one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from planner.budgets_toml import check_round_trip
from planner.sizing import SizingError
from powerd.gpu.clock_table import clock_table_csv, shipped_table
from powerd.topology import Topology, load_budgets
from tests.planner.test_budgets_toml_grid import SMALL_SITE, _sized_text


def _own_table(folder: Path) -> Path:
    """The H100's shipped table with communication 30 % cheaper in time below 1500 MHz."""
    shipped = shipped_table("h100-gpt3-175b")
    time_rel = np.where(
        shipped.clock_mhz < 1500, 1 + (shipped.time_rel - 1) * 0.7, shipped.time_rel
    )
    own = dataclasses.replace(shipped, time_rel=time_rel, source="measured here")
    folder.mkdir(exist_ok=True)
    path = folder / "own.csv"
    path.write_text(clock_table_csv(own))
    return path


def _load(tmp_path: Path, clock: str) -> Topology:
    folder = tmp_path / "in"
    folder.mkdir(exist_ok=True)
    path = folder / "budgets.toml"
    path.write_text(SMALL_SITE.format(extra=f"[models.H100]\n{clock}"))
    return load_budgets(path)


def test_a_files_own_clock_table_is_kept_wherever_the_output_is_written(tmp_path: Path):
    _own_table(tmp_path / "in")
    top = _load(tmp_path, 'comm_max_slowdown = 0.05\nclock_table = "own.csv"')
    own = top.clock_table("H100")
    assert own is not None and own.source == "measured here"
    text, _ = _sized_text(top, "share = 1.0")
    assert "comm_max_slowdown = 0.05" in text
    assert f'clock_table = "{(tmp_path / "in" / "own.csv").resolve()}"' in text
    out = tmp_path / "elsewhere" / "sized.toml"  # not beside own.csv
    out.parent.mkdir()
    out.write_text(text)
    back = load_budgets(out)
    assert back.comm_clock_mhz["H100"] == top.comm_clock_mhz["H100"]
    table = back.clock_table("H100")
    assert table is not None
    np.testing.assert_array_equal(table.time_rel, own.time_rel)
    shipped = shipped_table("h100-gpt3-175b")
    assert not np.array_equal(table.time_rel, shipped.time_rel)  # not the shipped fallback


@pytest.mark.parametrize(
    ("clock", "written"),
    [
        ('comm_max_slowdown = 0.1\nclock_table = "h100-bloom"', 'clock_table = "h100-bloom"'),
        ("comm_max_slowdown = 0.05", "comm_max_slowdown = 0.05"),
        ("comm_clock_mhz = 1500", "comm_clock_mhz = 1500"),
    ],
)
def test_the_clock_keys_are_written_as_given(tmp_path: Path, clock: str, written: str):
    top = _load(tmp_path, clock)
    text, _ = _sized_text(top, "share = 1.0")
    assert written in text
    assert ("comm_clock_mhz" in text) == ("comm_clock_mhz" in clock)


def test_no_clock_writes_none(tmp_path: Path):
    top = _load(tmp_path, "failsafe_cap_w = 500")
    text, _ = _sized_text(top, "share = 1.0")
    assert "comm_" not in text and "clock_table" not in text


def test_the_round_trip_check_catches_a_file_that_drops_the_clock_table(tmp_path: Path):
    _own_table(tmp_path / "in")
    top = _load(tmp_path, 'comm_max_slowdown = 0.05\nclock_table = "own.csv"')
    text, sized = _sized_text(top, "share = 1.0")
    check_round_trip(text, top, sized)  # as written: the same
    clock = top.comm_clock_mhz["H100"]
    lines = [
        line
        for line in text.splitlines()
        if not line.startswith(("comm_max_slowdown", "clock_table"))
    ]
    dropped = "\n".join(lines).replace(
        "[models.H100]", f"[models.H100]\ncomm_clock_mhz = {clock:g}"
    )
    with pytest.raises(SizingError, match="H100 communication clock and clock table"):
        check_round_trip(dropped, top, sized)  # the same clock, but the shipped table
