"""Units in a budgets file: how a quantity may be spelled, what is plausible, what was meant.

A power may be written in W, kW or MW (``limit_w``, ``limit_kw``, ``limit_mw``), a
ramp in W/s, kW/s or MW/s. A number far outside what a level of a power tree
can draw is almost always a unit mistake, so the loader refuses it and says
which spelling would have made it plausible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.tree import RACK, ROW, SERVER, SITE
from powerd.units import POWER_SUFFIXES, POWER_SYMBOLS, RAMP_SUFFIXES, fmt_w

# quantity -> {key as written: factor to watts}
QUANTITIES: dict[str, dict[str, float]] = {
    "limit": {f"limit{s}": f for s, f in POWER_SUFFIXES.items()},
    "budget": {f"budget{s}": f for s, f in POWER_SUFFIXES.items()},
    "overhead": {f"overhead{s}": f for s, f in POWER_SUFFIXES.items()},
    "ramp": {f"ramp{s}": f for s, f in RAMP_SUFFIXES.items()},
    # An oversubscribed level (docs/BUDGETS.md, "Oversubscription"): what the caps under it
    # may sum to beyond its limit, and the rise its band keeps below the limit.
    "oversubscription": {f"oversubscription{s}": f for s, f in POWER_SUFFIXES.items()},
    "rise_margin": {f"rise_margin{s}": f for s, f in POWER_SUFFIXES.items()},
}
OVERSUBSCRIPTION = ("oversubscription", "rise_margin")
# Quantities a file may give as 0 (the others must be > 0).
ZERO_OK = frozenset({"overhead", "oversubscription", "rise_margin"})
# The site's [site.grid] table: limits on the measured ramp, in the same three units.
GRID_QUANTITIES: dict[str, dict[str, float]] = {
    "ramp_up": {f"ramp_up{s}": f for s, f in RAMP_SUFFIXES.items()},
    "ramp_down": {f"ramp_down{s}": f for s, f in RAMP_SUFFIXES.items()},
    "oscillation_min_rms": {f"oscillation_min_rms{s}": f for s, f in POWER_SUFFIXES.items()},
}
SPELLINGS = {**QUANTITIES, **GRID_QUANTITIES}

# Plausible watts per level (limit, budget; overhead up to the upper bound).
# Wide on purpose: they only catch a number in the wrong unit. A 12.6 kW
# Dynamo rack and a ~120 kW GB200 NVL72 rack are both well inside the rack
# range; a 150 MW site inside the site range; a 4-GPU GB200 tray (~6 kW) and
# an 8-GPU H100 server (~10 kW) inside the node range.
PLAUSIBLE_W: dict[int, tuple[float, float]] = {
    SITE: (1e3, 2e9),
    ROW: (1e3, 5e8),
    RACK: (5e2, 5e6),
    SERVER: (5e1, 2e5),
}
# A ramp limit goes from 0 to the budget in 10 ms at the fastest, ~3 h at the slowest.
RAMP_PLAUSIBLE_PER_S = (1e-4, 100.0)


@dataclass(frozen=True)
class Written:
    """A number as the file wrote it: its key (which carries the unit) and its value."""

    key: str
    value: float
    factor: float  # to watts (or watts per second)

    @property
    def watts(self) -> float:
        return self.value * self.factor


def implausible(
    written: Written, quantity: str, what: str, lo: float, hi: float, expect: float | None
) -> str:
    """'limit_kw = 120000 (1.2e+08 W) is implausible for a rack (expected ...); did you
    mean ...?': the value as written, the range, and a unit that would make it plausible."""
    per = "/s" if written.key.endswith("_per_s") else ""
    as_written = f"{written.key} = {written.value:g}"
    if written.factor != 1.0:
        as_written += f" ({written.watts:g} W{per})"
    else:
        as_written += f" W{per}"
    hint = unit_hint(written, SPELLINGS[quantity], lo, hi, expect)
    expected = f"{fmt_w(lo)}{per} .. {fmt_w(hi)}{per}"
    return f"{as_written} is implausible for {what} (expected {expected}){hint}"


def unit_hint(
    written: Written, spellings: dict[str, float], lo: float, hi: float, expect: float | None
) -> str:
    """'; did you mean limit_kw = 120 (120000 W)?' when another unit makes the value plausible."""
    watts = written.watts
    per = "/s" if written.key.endswith("_per_s") else ""
    candidates = [f for f in (1e3, 1e6, 1e-3) if lo <= watts * f <= hi]
    if not candidates:
        return ""
    if expect and expect > 0:
        candidates.sort(key=lambda f: abs(math.log(watts * f / expect)))
    factor = candidates[0]
    meant = written.factor * factor
    then = f"{watts * factor:g} W{per}"
    for spelling, unit in spellings.items():
        if math.isclose(unit, meant):
            return f"; did you mean {spelling} = {written.value:g} ({then})?"
    unit_name = next((u for f, u in POWER_SYMBOLS.items() if math.isclose(f, meant)), "")
    return f"; a value in {unit_name}{per}? {written.value:g} {unit_name}{per} would be {then}"
