"""The ``[site.grid]`` table of a budgets file: the utility's limits on the measured site
power, read into a ``GridSpec``."""

from __future__ import annotations

import math
from typing import Any

from powerd.topology.grid import (
    BAND_PLAUSIBLE_HZ,
    DEFAULT_FLOOR_WINDOW_S,
    DEFAULT_OSCILLATION_BAND_HZ,
    DEFAULT_OSCILLATION_WINDOW_S,
    DEFAULT_WINDOW_S,
    WINDOW_PLAUSIBLE_S,
    GridSpec,
)
from powerd.topology.reader import Reader
from powerd.topology.units import GRID_QUANTITIES, RAMP_PLAUSIBLE_PER_S, implausible

_GRID_WINDOWS = ("window_s", "floor_window_s", "oscillation_window_s")
_GRID_KEYS = {
    *(k for q in GRID_QUANTITIES.values() for k in q),
    *_GRID_WINDOWS,
    "floor_fraction",
    "oscillation_band_hz",
    "oscillation_max_share",
}


def read_grid(reader: Reader, raw: Any, budget_w: float) -> GridSpec | None:
    """``[site.grid]``: the utility's limits on the measured site power (module grid)."""
    if raw is None:
        return None
    where = "[site.grid]"
    if not isinstance(raw, dict):
        raise reader.fail(where, 'must be a table (docs/BUDGETS.md, "The grid spec")')
    reader.check_keys(raw, _GRID_KEYS, where)
    ramps: dict[str, float] = {}
    lo, hi = budget_w * RAMP_PLAUSIBLE_PER_S[0], budget_w * RAMP_PLAUSIBLE_PER_S[1]
    for quantity in ("ramp_up", "ramp_down"):
        written = reader.watts(raw, quantity, where)
        if written is None:
            continue
        if not lo <= written.watts <= hi:
            what = f"the site's budget_w = {budget_w:g} W"
            raise reader.fail(where, implausible(written, quantity, what, lo, hi, budget_w / 30))
        ramps[quantity] = written.watts
    least = reader.watts(raw, "oscillation_min_rms", where)
    if least is not None and not least.watts <= budget_w:
        what = f"the site's budget_w = {budget_w:g} W"
        raise reader.fail(
            where, implausible(least, "oscillation_min_rms", what, 0.0, budget_w, budget_w / 100)
        )
    seconds = {k: _grid_seconds(reader, raw, k, where) for k in _GRID_WINDOWS if k in raw}
    floor = _grid_share(reader, raw, "floor_fraction", where, "of the recent running power", 1)
    share = _grid_share(reader, raw, "oscillation_max_share", where, "of the variance", 0)
    band = _grid_band(reader, raw, where)
    if floor is None and "floor_window_s" in seconds:
        raise reader.fail(
            where,
            f"floor_window_s = {seconds['floor_window_s']:g} s is given but floor_fraction "
            "is not: there is no floor to hold",
        )
    window = seconds.get("oscillation_window_s", DEFAULT_OSCILLATION_WINDOW_S)
    if window * band[0] < 1:
        raise reader.fail(
            where,
            f"oscillation_window_s = {window:g} s is shorter than one period of the band's "
            f"lower edge ({band[0]:g} Hz: {1 / band[0]:g} s), so a window cannot resolve the "
            f"band; give oscillation_window_s ≥ {1 / band[0]:g}",
        )
    return GridSpec(
        ramp_up_w_per_s=ramps.get("ramp_up", math.inf),
        ramp_down_w_per_s=ramps.get("ramp_down", math.inf),
        window_s=seconds.get("window_s", DEFAULT_WINDOW_S),
        floor_fraction=floor,
        floor_window_s=seconds.get("floor_window_s", DEFAULT_FLOOR_WINDOW_S),
        oscillation_band_hz=band,
        oscillation_max_share=share,
        oscillation_window_s=window,
        oscillation_min_rms_w=0.0 if least is None else least.watts,
    )


def _grid_seconds(reader: Reader, table: dict[str, Any], key: str, where: str) -> float:
    value = reader.number(table, key, where)
    lo, hi = WINDOW_PLAUSIBLE_S
    if not lo <= value <= hi:
        hint = ""
        if lo <= value / 1e3 <= hi:
            hint = f"; in milliseconds? {value:g} ms is {value / 1e3:g} s"
        raise reader.fail(
            where, f"{key} = {value:g} s is implausible (expected {lo:g} s .. {hi:g} s){hint}"
        )
    return value


def _grid_share(
    reader: Reader, table: dict[str, Any], key: str, where: str, of: str, open_top: int
) -> float | None:
    """A share in (0, 1) (``open_top``) or (0, 1], with a hint when it looks like a percent."""
    if key not in table:
        return None
    value = reader.number(table, key, where)
    if value > 1 or (open_top and value == 1):
        interval = "(0, 1)" if open_top else "(0, 1]"
        hint = f"; a percentage? write {value / 100:g}" if 1 < value <= 100 else ""
        raise reader.fail(where, f"{key} = {value:g} must be a share {of} in {interval}{hint}")
    return value


def _grid_band(reader: Reader, table: dict[str, Any], where: str) -> tuple[float, float]:
    key = "oscillation_band_hz"
    if key not in table:
        return DEFAULT_OSCILLATION_BAND_HZ
    value = table[key]
    if not isinstance(value, list) or len(value) != 2:
        raise reader.fail(where, f"{key} must be [low, high] in Hz (e.g. [0.1, 20]), got {value!r}")
    edges = tuple(
        reader.number({f"{key}[{i}]": v}, f"{key}[{i}]", where) for i, v in enumerate(value)
    )
    lo, hi = edges
    if not lo < hi:
        raise reader.fail(
            where, f"{key} = [{lo:g}, {hi:g}]: the low edge must come first, below the high one"
        )
    plo, phi = BAND_PLAUSIBLE_HZ
    if lo < plo or hi > phi:
        hint = ""
        if plo <= lo / 1e3 and hi / 1e3 <= phi:
            hint = f"; in mHz? [{lo:g}, {hi:g}] mHz is [{lo / 1e3:g}, {hi / 1e3:g}] Hz"
        raise reader.fail(
            where,
            f"{key} = [{lo:g}, {hi:g}] Hz is implausible (expected edges in "
            f"{plo:g} Hz .. {phi:g} Hz){hint}",
        )
    return lo, hi
