"""Clock tables (powerd.gpu.clock_table): the best clock is the table's brute-force optimum,
values interpolate between rows and clamp outside, a table scales to another GPU model at the
same fraction of its maximum clock, files round-trip and bad ones say where they are wrong,
and the shipped tables are what each model uses."""

from __future__ import annotations

import numpy as np
import pytest

from powerd.gpu.clock_table import (
    DEFAULT_TABLES,
    ClockTable,
    ClockTableError,
    best_clock,
    clock_table_csv,
    load_clock_table,
    parse_clock_table,
    shipped_clock_table,
    shipped_table,
    shipped_table_names,
)
from powerd.gpu.models import GPU_MODELS

# clock, time_rel, power_rel: energy 0.9, 0.72, 0.66 (least), 0.66 (tie), 1.0
SMALL = ClockTable(
    "A100",
    np.array([800.0, 1000.0, 1200.0, 1300.0, 1410.0]),
    np.array([1.8, 1.2, 1.1, 1.1, 1.0]),
    np.array([0.5, 0.6, 0.6, 0.6, 1.0]),
    "made up",
)
SLOWDOWNS = (0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def brute_force(table: ClockTable, max_slowdown: float) -> tuple[float, float]:
    """Every row in turn: the least time x power among rows within the slowdown, ties to the
    faster clock (independent of best_clock's vectorised search)."""
    best: tuple[float, float] | None = None
    for clock, t, p in zip(table.clock_mhz, table.time_rel, table.power_rel, strict=True):
        if t > 1 + max_slowdown + 1e-12 and clock != table.clock_mhz[-1]:
            continue
        if best is None or t * p <= best[1]:
            best = (float(clock), float(t * p))
    assert best is not None
    return best[0], 1 - best[1]


def test_energy_is_time_times_power() -> None:
    np.testing.assert_allclose(SMALL.energy_rel(), [0.9, 0.72, 0.66, 0.66, 1.0])


@pytest.mark.parametrize("max_slowdown", SLOWDOWNS)
def test_best_clock_is_the_brute_force_optimum(max_slowdown: float) -> None:
    for table in (SMALL, *(shipped_table(n) for n in shipped_table_names())):
        clock, saved = best_clock(table, max_slowdown)
        expected_clock, expected_saved = brute_force(table, max_slowdown)
        assert clock == expected_clock, (table.source, max_slowdown)
        assert saved == pytest.approx(expected_saved, abs=1e-12)


def test_best_clock_by_hand_on_a_small_table() -> None:
    assert best_clock(SMALL, 0.0) == (1410.0, 0.0)  # nothing else is as fast
    assert best_clock(SMALL, 0.05) == (1410.0, 0.0)
    clock, saved = best_clock(SMALL, 0.1)  # 1200 and 1300 tie at 0.66: the faster one
    assert clock == 1300.0 and saved == pytest.approx(0.34)
    assert best_clock(SMALL, 0.2)[0] == 1300.0  # 1000 MHz is allowed but costs more energy


def test_a_lower_clock_measured_faster_counts_even_at_zero_slowdown() -> None:
    table = ClockTable(
        "A100", np.array([1380, 1410]), np.array([0.999, 1]), np.array([0.98, 1]), "x"
    )
    clock, saved = best_clock(table, 0.0)
    assert clock == 1380 and saved == pytest.approx(1 - 0.999 * 0.98)


@pytest.mark.parametrize("bad", [-0.01, float("nan"), float("inf")])
def test_best_clock_refuses_a_slowdown_that_is_no_share(bad: float) -> None:
    with pytest.raises(ValueError, match="max_slowdown must be a finite share"):
        best_clock(SMALL, bad)


def test_values_interpolate_between_rows_and_clamp_outside() -> None:
    assert SMALL.at(1000) == (1.2, 0.6)
    time_rel, power_rel = SMALL.at(1100)
    assert time_rel == pytest.approx(1.15) and power_rel == pytest.approx(0.6)
    assert SMALL.at(900) == pytest.approx((1.5, 0.55))
    assert SMALL.at(300) == SMALL.at(800) == (1.8, 0.5)  # below the table: its lowest row
    assert SMALL.at(2000) == (1.0, 1.0)


def test_a_scaled_table_is_the_same_curve_at_the_same_fraction_of_the_max_clock() -> None:
    a100 = shipped_table("a100-gpt3-175b")
    for key in ("H100", "GB200"):
        scaled = a100.scaled_to(key)
        top = GPU_MODELS[key].sm_clock_max_mhz
        assert scaled.model == key and scaled.clock_mhz[-1] == top
        fractions = a100.clock_mhz / GPU_MODELS["A100"].sm_clock_max_mhz
        np.testing.assert_allclose(scaled.clock_mhz, np.round(fractions * top))  # whole MHz
        np.testing.assert_array_equal(scaled.time_rel, a100.time_rel)
        np.testing.assert_array_equal(scaled.power_rel, a100.power_rel)
        assert "scaled from A100" in scaled.source and "assumed" in scaled.source
        # the same point of the curve: A100 at 1290 MHz is the scaled model at 1290/1410
        assert scaled.at(round(1290 / 1410 * top)) == pytest.approx(a100.at(1290), rel=2e-3)


def test_the_shipped_scaled_tables_are_the_measured_ones_scaled() -> None:
    for workload in ("gpt3-175b", "bloom"):
        a100 = shipped_table(f"a100-{workload}")
        for key in ("H100", "GB200"):
            shipped = shipped_table(f"{key.lower()}-{workload}")
            scaled = a100.scaled_to(key)
            np.testing.assert_array_equal(shipped.clock_mhz, scaled.clock_mhz)
            np.testing.assert_allclose(shipped.time_rel, scaled.time_rel, rtol=1e-5)
            np.testing.assert_allclose(shipped.power_rel, scaled.power_rel, rtol=1e-5)
            assert shipped.source.startswith(f"scaled from A100 (1410 MHz max) to {key}")


def test_each_model_with_a_table_uses_gpt3_and_the_others_have_none() -> None:
    assert set(shipped_table_names()) == {
        f"{m}-{w}" for m in ("a100", "h100", "gb200") for w in ("gpt3-175b", "bloom")
    }
    for key in GPU_MODELS:
        table = shipped_clock_table(key.lower())
        if key in DEFAULT_TABLES:
            assert table is shipped_table(DEFAULT_TABLES[key]) and table.model == key
        else:
            assert table is None, key
    with pytest.raises(KeyError, match="no shipped clock table 'a100-llama'"):
        shipped_table("a100-llama")


def test_a_table_file_round_trips(tmp_path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(clock_table_csv(SMALL, ("workload: made up",)))
    back = load_clock_table(path)
    assert (back.model, back.source) == ("A100", "made up")
    for name in ("clock_mhz", "time_rel", "power_rel"):
        np.testing.assert_allclose(getattr(back, name), getattr(SMALL, name), rtol=1e-6)
    assert not back.clock_mhz.flags.writeable


GOOD = "# model: H100\n# source: lab\nclock_mhz,time_rel,power_rel\n1000,1.5,0.5\n1980,1,1\n"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("# model: H100\n", "", "no '# model: <GPU model>' line"),
        ("H100", "H900", "unknown GPU model 'H900'"),
        ("clock_mhz,time_rel", "clock,time_rel", "header must be clock_mhz,time_rel,power_rel"),
        ("1000,1.5,0.5", "1000,1.5", "t.csv:4: expected 3 values, got 2"),
        ("1000,1.5,0.5", "1000,fast,0.5", "t.csv:4: '1000,fast,0.5' is not 3 numbers"),
        ("1000,1.5,0.5", "1000,1.5,-0.5", "t.csv:4: every value must be a finite number > 0"),
        ("1000,1.5,0.5\n1980", "1980,1.5,0.5\n1000", "clock_mhz must increase"),
        ("1980,1,1", "1980,1.02,1", "the highest clock's row must be time_rel = 1"),
        ("1000,1.5,0.5\n", "", "needs 2 rows or more"),
    ],
)
def test_a_bad_table_file_says_where(tmp_path, old: str, new: str, message: str) -> None:
    assert old in GOOD
    path = tmp_path / "t.csv"
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(ClockTableError, match=r"t\.csv") as caught:
        load_clock_table(path)
    assert message in str(caught.value)


def test_an_unreadable_table_file_says_so(tmp_path) -> None:
    with pytest.raises(ClockTableError, match=r"nothing\.csv: cannot read the clock table"):
        load_clock_table(tmp_path / "nothing.csv")
    assert parse_clock_table(GOOD, "x").model == "H100"
