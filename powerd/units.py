"""Quantities and their units: the factor tables, reading ``1.2kW`` or ``15m``, and writing
watts for people. Standard library only, so every layer may import it: the budgets file's
loader (``powerd.topology``), ``powerd``'s and ``powerplan``'s commands, the demo.

A factor table maps a unit, lower case as typed, to how many of the quantity's base unit
one of it is: ``WATTS_PER["kw"] == 1e3``. ``split_quantity`` reads a number with one of a
table's units; the formatters write watts in kW or MW.
"""

from __future__ import annotations

import re

# What a quantity may be written in, as factors to its base unit (W, s, kW, kJ).
WATTS_PER: dict[str, float] = {"w": 1.0, "kw": 1e3, "mw": 1e6, "gw": 1e9}
SECONDS_PER: dict[str, float] = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
KILOWATTS_PER: dict[str, float] = {unit: w / 1e3 for unit, w in WATTS_PER.items()}
KILOJOULES_PER: dict[str, float] = {"j": 1e-3, "kj": 1.0, "mj": 1e3, "kwh": 3600.0}
# A unit as a name ends in it ("_kw") -> factor to watts: the budgets file's spellings.
POWER_SUFFIXES: dict[str, float] = {f"_{unit}": WATTS_PER[unit] for unit in ("w", "kw", "mw")}
RAMP_SUFFIXES: dict[str, float] = {f"{suffix}_per_s": f for suffix, f in POWER_SUFFIXES.items()}
# Factor to watts -> the unit's symbol.
POWER_SYMBOLS: dict[float, str] = {
    1e-6: "µW",
    1e-3: "mW",
    1.0: "W",
    1e3: "kW",
    1e6: "MW",
    1e9: "GW",
}
# The base unit of a quantity (as an option's name ends in it) -> (its name, its factors).
UNITS: dict[str, tuple[str, dict[str, float]]] = {
    "W": ("watts", WATTS_PER),
    "s": ("seconds", SECONDS_PER),
    "kW": ("kilowatts", KILOWATTS_PER),
    "kJ": ("kilojoules", KILOJOULES_PER),
}
_NUMBER_AND_UNIT = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*")


def split_quantity(text: str, factors: dict[str, float]) -> tuple[float, str] | None:
    """``1.2kW`` with ``WATTS_PER`` -> (1200.0, "kW"); ``90`` -> (90.0, ""); None when ``text``
    is no non-negative number or its unit is not one of ``factors`` (case-insensitive)."""
    found = _NUMBER_AND_UNIT.fullmatch(text)
    if found is None:
        return None
    number, unit = float(found[1]), found[2]
    if not unit:
        return number, ""
    factor = factors.get(unit.lower())
    return None if factor is None else (number * factor, unit)


def plain_number(value: float) -> str:
    """1200.0 -> "1200", 1.2e6 -> "1200000", 0.999 -> "0.999": what a person would type."""
    return format(value, ".12g")


def power_unit(watts: float) -> tuple[float, str]:
    """The unit :func:`fmt_w` writes ``watts`` in, the largest of GW, MW, kW that is at most
    them, else W: (factor to watts, symbol), 1.2e5 -> (1e3, "kW"). A site's scale: its
    tables in the unit of its limit."""
    for factor in (1e9, 1e6, 1e3):
        if watts >= factor:
            return factor, POWER_SYMBOLS[factor]
    return 1.0, "W"


def fmt_w(watts: float) -> str:
    """Watts in the largest of GW, MW, kW that is at most them: 1.2e5 -> "120 kW"."""
    factor, symbol = power_unit(watts)
    return f"{watts / factor:g} {symbol}"


def fmt_kw_or_mw(watts: float) -> str:
    """A report's figure: MW to the kilowatt from 1 MW on, else kW to a tenth."""
    return f"{watts / 1e6:,.3f} MW" if abs(watts) >= 1e6 else f"{watts / 1e3:,.1f} kW"


def fmt_kw_per_s(w_per_s: float) -> str:
    """A ramp in kW/s to a tenth: 1234.0 -> "1.2 kW/s"."""
    return f"{w_per_s / 1e3:.1f} kW/s"
