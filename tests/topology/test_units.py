"""powerd.units: the one copy of the unit factor tables, their reading and the watt formats."""

from __future__ import annotations

import pytest

from powerd.units import (
    KILOJOULES_PER,
    KILOWATTS_PER,
    POWER_SUFFIXES,
    POWER_SYMBOLS,
    RAMP_SUFFIXES,
    SECONDS_PER,
    UNITS,
    WATTS_PER,
    fmt_kw_or_mw,
    fmt_kw_per_s,
    fmt_w,
    plain_number,
    split_quantity,
)


@pytest.mark.parametrize(
    ("text", "factors", "expected"),
    [
        ("1.2kW", WATTS_PER, (1200.0, "kW")),
        (" 120 MW ", WATTS_PER, (120e6, "MW")),
        ("90", SECONDS_PER, (90.0, "")),
        ("15m", SECONDS_PER, (900.0, "m")),
        (".5h", SECONDS_PER, (1800.0, "h")),
        ("2kWh", KILOJOULES_PER, (7200.0, "kWh")),
    ],
)
def test_a_number_with_a_unit_reads_in_the_base_unit(text, factors, expected):
    assert split_quantity(text, factors) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "-5kW", "1.2 furlongs", "kW", "1e3W", "nan"])
def test_anything_else_is_none(text):
    assert split_quantity(text, WATTS_PER) is None


def test_the_tables_agree_with_each_other():
    assert {u: w / 1e3 for u, w in WATTS_PER.items()} == KILOWATTS_PER
    assert POWER_SUFFIXES == {"_w": 1.0, "_kw": 1e3, "_mw": 1e6}
    assert RAMP_SUFFIXES == {"_w_per_s": 1.0, "_kw_per_s": 1e3, "_mw_per_s": 1e6}
    assert {POWER_SYMBOLS[f].lower() for f in WATTS_PER.values()} == set(WATTS_PER)
    assert {unit: name for unit, (name, _) in UNITS.items()} == {
        "W": "watts",
        "s": "seconds",
        "kW": "kilowatts",
        "kJ": "kilojoules",
    }


def test_numbers_are_written_as_a_person_types_them():
    assert plain_number(1200.0) == "1200"
    assert plain_number(1.2e6) == "1200000"
    assert plain_number(0.999) == "0.999"


@pytest.mark.parametrize(
    ("watts", "text"),
    [(999.0, "999 W"), (1000.0, "1 kW"), (1.2e5, "120 kW"), (1.5e8, "150 MW"), (2e9, "2 GW")],
)
def test_fmt_w_takes_the_largest_prefix_the_watts_reach(watts, text):
    assert fmt_w(watts) == text


def test_a_report_figure_is_in_mw_from_a_megawatt_on():
    assert fmt_kw_or_mw(999_949.0) == "999.9 kW"
    assert fmt_kw_or_mw(1_234_567.0) == "1.235 MW"
    assert fmt_kw_or_mw(-2e6) == "-2.000 MW"


def test_a_ramp_is_in_kw_per_s():
    assert fmt_kw_per_s(1234.0) == "1.2 kW/s"
