"""The ``[models]`` table of a budgets file: each GPU model's failsafe cap and
communication clock (given, or chosen from a clock table within a slowdown)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powerd.gpu.clock_table import (
    ClockTable,
    ClockTableError,
    best_clock,
    load_clock_table,
    shipped_clock_table,
    shipped_table,
)
from powerd.gpu.models import GPU_MODELS, GpuModel
from powerd.topology import checks
from powerd.topology.reader import Reader

MODEL_KEYS = {"failsafe_cap_w", "comm_clock_mhz", "comm_max_slowdown", "clock_table"}


def find_model(key: str) -> GpuModel | None:
    """A GPU model by its key, case-insensitively."""
    for known, model in GPU_MODELS.items():
        if known.lower() == key.lower():
            return model
    return None


@dataclass(frozen=True)
class Models:
    """What ``[models.<key>]`` tables set: failsafe caps and communication clocks."""

    failsafe_cap_w: dict[str, float]
    comm_clock_mhz: dict[str, float]  # NaN: configured, no clock
    clock_tables: dict[str, ClockTable]  # the table a comm_max_slowdown chose from
    comm_clock_keys: dict[str, dict[str, float | str]]  # the keys that chose the clock


def read_models(reader: Reader, models: Any) -> Models:
    if not isinstance(models, dict):
        raise reader.fail("[models]", "must be a table of [models.<GPU model>] tables")
    failsafe: dict[str, float] = {}
    clocks: dict[str, float] = {}
    tables: dict[str, ClockTable] = {}
    keys: dict[str, dict[str, float | str]] = {}
    for key, table in models.items():
        where = f"[models.{key}]"
        model = find_model(key)
        if model is None:
            raise reader.fail(where, f"unknown GPU model {key!r}; known: {', '.join(GPU_MODELS)}")
        if model.key in failsafe or model.key in clocks:
            raise reader.fail(where, f"GPU model {model.key} is configured twice")
        if not isinstance(table, dict):
            raise reader.fail(where, "must be a table")
        reader.check_keys(table, MODEL_KEYS, where)
        if "failsafe_cap_w" in table:
            cap = reader.number(table, "failsafe_cap_w", where)
            problem = checks.failsafe_out_of_range(cap, model)
            if problem:
                raise reader.fail(where, problem)
            failsafe[model.key] = cap
        clocks[model.key], chosen_from = _comm_clock(reader, table, model, where)
        if chosen_from is not None:
            tables[model.key] = chosen_from
        keys[model.key] = _comm_clock_keys(reader, table, clocks[model.key])
    return Models(failsafe, clocks, tables, keys)


def _comm_clock_keys(
    reader: Reader, table: dict[str, Any], clock_mhz: float
) -> dict[str, float | str]:
    """The keys that chose a model's communication clock, as a writer must repeat them for
    the file it writes to choose the same clock from the same table (a ``clock_table``
    path made absolute: the written file may live elsewhere). Empty: no clock."""
    if "comm_max_slowdown" not in table:
        return {"comm_clock_mhz": clock_mhz} if math.isfinite(clock_mhz) else {}
    keys: dict[str, float | str] = {"comm_max_slowdown": float(table["comm_max_slowdown"])}
    name = table.get("clock_table")
    if isinstance(name, str):
        is_path = name.lower().endswith(".csv")
        keys["clock_table"] = str(_clock_table_path(reader, name).resolve()) if is_path else name
    return keys


def _clock_table_path(reader: Reader, name: str) -> Path:
    """A ``clock_table`` path as written: relative to the budgets file."""
    return Path(reader.source).parent / name


def _comm_clock(
    reader: Reader, table: dict[str, Any], model: GpuModel, where: str
) -> tuple[float, ClockTable | None]:
    """``comm_clock_mhz`` as given, or the clock table's best within ``comm_max_slowdown``
    (and that table); NaN for neither (no clock lock)."""
    if "comm_clock_mhz" in table and "comm_max_slowdown" in table:
        raise reader.fail(
            where,
            "give comm_clock_mhz (a clock) or comm_max_slowdown (the clock table's best within "
            "that slowdown), not both",
        )
    if "clock_table" in table and "comm_max_slowdown" not in table:
        raise reader.fail(
            where, "clock_table is read only with comm_max_slowdown (e.g. comm_max_slowdown = 0.05)"
        )
    if "comm_clock_mhz" in table:
        clock = reader.number(table, "comm_clock_mhz", where)
        _check_clock(reader, clock, "comm_clock_mhz", model, where)
        return clock, None
    if "comm_max_slowdown" not in table:
        return math.nan, None
    slowdown = reader.number(table, "comm_max_slowdown", where, zero_ok=True)
    if slowdown >= 1:
        hint = f"; a percentage? write {slowdown / 100:g}" if slowdown < 100 else ""
        raise reader.fail(
            where,
            f"comm_max_slowdown = {slowdown:g} must be a fraction in [0, 1) (0.05: 5 %){hint}",
        )
    clock_table = _clock_table(reader, table, model, where)
    clock, _ = best_clock(clock_table, slowdown)
    _check_clock(reader, clock, f"the clock table's best ({clock_table.source})", model, where)
    return clock, clock_table


def _check_clock(reader: Reader, clock: float, what: str, model: GpuModel, where: str) -> None:
    lo, hi = model.sm_clock_min_mhz, model.sm_clock_max_mhz
    if not lo <= clock <= hi:
        hint = ""
        if lo <= clock * 1e3 <= hi:
            hint = f"; in GHz? {clock:g} GHz is {clock * 1e3:g} MHz"
        raise reader.fail(
            where,
            f"{what} = {clock:g} MHz is outside the {model.key}'s SM clock range "
            f"[{lo}, {hi}] MHz{hint}",
        )


def _clock_table(reader: Reader, table: dict[str, Any], model: GpuModel, where: str) -> ClockTable:
    """The ``clock_table`` named (a shipped name, or a .csv path relative to the budgets
    file), else the model's shipped default; it must be the model's own."""
    name = table.get("clock_table")
    if name is None:
        found = shipped_clock_table(model.key)
        if found is None:
            raise reader.fail(
                where,
                f"no shipped clock table for the {model.key}: give clock_table = "
                '"<file>.csv" (written by powerplan clocks) or comm_clock_mhz',
            )
        return found
    if not isinstance(name, str) or not name:
        raise reader.fail(where, f"clock_table must be a name or a .csv path, got {name!r}")
    try:
        if name.lower().endswith(".csv"):
            found = load_clock_table(_clock_table_path(reader, name))
        else:
            found = shipped_table(name)
    except ClockTableError as exc:
        raise reader.fail(where, f"clock_table: {exc}") from None
    except KeyError as exc:
        raise reader.fail(where, f"clock_table: {exc.args[0]} (or a path ending in .csv)") from None
    if found.model != model.key:
        raise reader.fail(
            where,
            f"clock_table {name!r} is for the {found.model}, not the {model.key} "
            f"(powerplan clocks --scale-to {model.key} writes one)",
        )
    return found
