"""The communication clock from a clock table: ``[models.X] comm_max_slowdown`` (and
``clock_table``) in the budgets file set ``comm_clock_mhz`` to the table's least-energy clock
within that slowdown; every misuse is a BudgetError that says what to write; a SIGHUP reload
may change the clock this way as it may change ``comm_clock_mhz``."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from powerd.controller.reload import changes, refusal
from powerd.gpu.clock_table import best_clock, clock_table_csv, shipped_table
from powerd.topology import BudgetError, load_budgets, parse_budgets

BASE = """\
[site]
name = "lab"
limit_kw = 12
budget_kw = 10

[models.{model}]
{keys}

[[rows]]
name = "r1"
limit_kw = 12
budget_kw = 10

[[rows.racks]]
name = "k1"
limit_kw = 12
budget_kw = 10

[[rows.racks.nodes]]
name = "n1"
gpus = 4
model = "{model}"
"""


def budgets(keys: str, model: str = "H100") -> str:
    return BASE.format(model=model, keys=keys)


def comm_clock(keys: str, model: str = "H100") -> float:
    top = parse_budgets(budgets(keys, model))
    clock = top.comm_clock_mhz[model]
    assert np.all((top.tree.comm_clock_mhz == clock) | np.isnan(clock))
    return clock


@pytest.mark.parametrize("slowdown", [0.0, 0.01, 0.02, 0.05, 0.1, 0.3])
@pytest.mark.parametrize("model", ["A100", "H100", "GB200"])
def test_the_clock_is_the_tables_best_within_the_slowdown(model: str, slowdown: float) -> None:
    table = shipped_table(f"{model.lower()}-gpt3-175b")
    clock = comm_clock(f"comm_max_slowdown = {slowdown}", model)
    assert clock == best_clock(table, slowdown)[0]
    allowed = table.time_rel <= 1 + slowdown + 1e-12  # brute force, row by row
    least = min(e for e, ok in zip(table.energy_rel(), allowed, strict=True) if ok)
    assert table.energy_rel()[table.clock_mhz == clock][0] == least


def test_the_shipped_files_lock_communication_from_the_table() -> None:
    assert comm_clock("comm_max_slowdown = 0.05", "A100") == 1290
    assert comm_clock("comm_max_slowdown = 0.05", "H100") == 1811
    assert comm_clock("comm_max_slowdown = 0.05", "GB200") == 1887


def test_a_shipped_table_can_be_named() -> None:
    keys = 'comm_max_slowdown = 0.05\nclock_table = "h100-bloom"'
    assert comm_clock(keys) == best_clock(shipped_table("h100-bloom"), 0.05)[0] == 1790


def test_a_table_file_is_found_beside_the_budgets_file(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "tables").mkdir(parents=True)
    table = shipped_table("a100-bloom").scaled_to("H100")
    (site / "tables" / "mine.csv").write_text(clock_table_csv(table))
    path = site / "budgets.toml"
    path.write_text(budgets('comm_max_slowdown = 0.01\nclock_table = "tables/mine.csv"'))
    assert load_budgets(path).comm_clock_mhz["H100"] == best_clock(table, 0.01)[0] == 1896


def bloom_site(tmp_path: Path) -> Path:
    """A site whose file chooses the H100's clock from its own table (BLOOM on the A100,
    scaled), not the shipped GPT-3 175B one."""
    table = shipped_table("a100-bloom").scaled_to("H100")
    (tmp_path / "mine.csv").write_text(clock_table_csv(table))
    path = tmp_path / "budgets.toml"
    path.write_text(budgets('comm_max_slowdown = 0.01\nclock_table = "mine.csv"'))
    return path


def test_every_simulator_answers_a_lock_from_the_table_the_file_chose_its_clock_from(
    tmp_path: Path,
) -> None:
    """One table for the controller's clock and for how the GPUs answer it: the demo's
    simulated GPUs, the fleet's and the planner's (d) take ``Topology.clock_table``."""
    from planner.commands.evaluate import _clock_tables
    from powerd.demo.runner import _all_gpus

    top = load_budgets(bloom_site(tmp_path))
    mine = top.clock_table("H100")
    assert mine is not None and mine is top.clock_tables["H100"]
    assert np.array_equal(mine.power_rel, shipped_table("a100-bloom").power_rel)
    assert all(g.clock_table is mine for gpus in _all_gpus(top, 0).values() for g in gpus)
    assert _clock_tables(top, None) == {"H100": mine}
    # a file that gives a clock (or none) leaves the GPUs with their model's shipped table
    for keys in ("comm_clock_mhz = 1100", "failsafe_cap_w = 500"):
        plain = parse_budgets(budgets(keys))
        shipped = plain.clock_table("H100")
        assert plain.clock_tables == {} and shipped is not None
        assert shipped.source == shipped_table("h100-gpt3-175b").source


def test_an_explicit_clock_still_works_and_neither_means_no_lock() -> None:
    assert comm_clock("comm_clock_mhz = 1100") == 1100
    assert math.isnan(comm_clock("failsafe_cap_w = 500"))


@pytest.mark.parametrize(
    ("keys", "model", "message"),
    [
        (
            "comm_clock_mhz = 1100\ncomm_max_slowdown = 0.05",
            "H100",
            "give comm_clock_mhz (a clock) or comm_max_slowdown (the clock table's best within "
            "that slowdown), not both",
        ),
        ('clock_table = "h100-bloom"', "H100", "clock_table is read only with comm_max_slowdown"),
        (
            "comm_max_slowdown = 5",
            "H100",
            "must be a fraction in [0, 1) (0.05: 5 %); a percentage? write 0.05",
        ),
        ("comm_max_slowdown = -0.05", "H100", "comm_max_slowdown = -0.05 is negative"),
        ('comm_max_slowdown = "5 %"', "H100", "comm_max_slowdown must be a number"),
        ("comm_max_slowdown = 0.05", "A40", "no shipped clock table for the A40: give clock_table"),
        (
            'comm_max_slowdown = 0.05\nclock_table = "h100-llama"',
            "H100",
            "clock_table: no shipped clock table 'h100-llama'; shipped: a100-bloom",
        ),
        (
            'comm_max_slowdown = 0.05\nclock_table = "a100-bloom"',
            "H100",
            "clock_table 'a100-bloom' is for the A100, not the H100 (powerplan clocks --scale-to H100",
        ),
        (
            "comm_max_slowdown = 0.05\nclock_table = 5",
            "H100",
            "clock_table must be a name or a .csv path",
        ),
        (
            'comm_max_slowdown = 0.05\nclock_table = "gone.csv"',
            "H100",
            "gone.csv: cannot read the clock table",
        ),
    ],
)
def test_misuse_is_an_error_that_says_what_to_write(keys: str, model: str, message: str) -> None:
    with pytest.raises(BudgetError) as caught:
        parse_budgets(budgets(keys, model), source="lab.toml")
    text = str(caught.value)
    assert text.startswith(f"lab.toml: [models.{model}]: "), text
    assert message in text, text


def test_a_broken_table_file_is_named_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text(
        "# model: H100\nclock_mhz,time_rel,power_rel\n1000,x,1\n1980,1,1\n"
    )
    path = tmp_path / "b.toml"
    path.write_text(budgets('comm_max_slowdown = 0.05\nclock_table = "bad.csv"'))
    with pytest.raises(BudgetError, match=re.escape("bad.csv:3: '1000,x,1' is not 3 numbers")):
        load_budgets(path)


def test_a_table_clock_outside_the_models_range_is_refused(tmp_path: Path) -> None:
    (tmp_path / "low.csv").write_text(
        "# model: H100\nclock_mhz,time_rel,power_rel\n100,1.5,0.4\n1980,1,1\n"
    )
    path = tmp_path / "b.toml"
    path.write_text(budgets('comm_max_slowdown = 0.9\nclock_table = "low.csv"'))
    with pytest.raises(
        BudgetError, match=r"= 100 MHz is outside the H100's SM clock range \[345, 1980\]"
    ):
        load_budgets(path)


def test_a_reload_may_move_the_clock_by_the_slowdown_or_the_table() -> None:
    running = parse_budgets(budgets("comm_clock_mhz = 1100"))
    for keys in (
        "comm_max_slowdown = 0.05",
        'comm_max_slowdown = 0.01\nclock_table = "h100-bloom"',
    ):
        new = parse_budgets(budgets(keys))
        assert refusal(running, new) is None
        clock = new.comm_clock_mhz["H100"]
        assert changes(running, new) == [
            f"comm_clock_mhz {{'H100': 1100.0}} -> {{'H100': {clock!r}}}"
        ]
    same = parse_budgets(budgets("comm_clock_mhz = 1811"))
    assert changes(same, parse_budgets(budgets("comm_max_slowdown = 0.05"))) == []
