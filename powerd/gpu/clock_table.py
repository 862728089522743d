"""How a training step's time and power respond to an SM clock lock, as measured.

A ``ClockTable`` is one workload on one GPU model: at each SM clock, the time per
unit of work and the average power, both relative to the table's highest clock.
Energy per unit of work is their product. ``best_clock`` picks the clock with the
least energy among those at most a given share slower than the highest: what the
controller locks during communication (``[models.X] comm_max_slowdown`` in the
budgets file) and what ``powerplan clocks`` recommends.

The shipped tables (``powerd/data/clocks/*.csv``) come from the Perseus frequency
sweeps (SOSP '24) of GPT-3 175B and BLOOM training on A100 SXM, written by
``powerplan clocks`` (planner/clocks.py). H100 and GB200 have no such sweep: their
tables are the A100 curves at the same fraction of each model's maximum SM clock
(``ClockTable.scaled_to``), an assumption each such file states in its header.

The file format, one table per CSV file::

    # model: A100
    # source: where it was measured
    # (any other comment line)
    clock_mhz,time_rel,power_rel
    855,1.50,0.50
    ...
    1410,1,1

numpy and the csv module only: a GPU node's install has no pandas.
"""

from __future__ import annotations

import csv
import functools
import io
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from powerd.gpu.models import gpu_model

CLOCKS_RESOURCE = "data/clocks"
COLUMNS = ("clock_mhz", "time_rel", "power_rel")
# The table each model's controller and simulated GPU use unless told otherwise: GPT-3 175B,
# the larger of the two measured models (its curve saves a little less than BLOOM's).
DEFAULT_TABLES = {"A100": "a100-gpt3-175b", "H100": "h100-gpt3-175b", "GB200": "gb200-gpt3-175b"}
# The top row is the reference: 1 by definition, up to the rounding a CSV file keeps.
TOP_TOLERANCE = 1e-6


class ClockTableError(ValueError):
    """A clock table that cannot be used; the message names the file (and line)."""


@dataclass(frozen=True, eq=False)
class ClockTable:
    """One workload's response to an SM clock lock on one GPU model (see the module doc)."""

    model: str  # GPU model key (powerd.gpu.models), e.g. "A100"
    clock_mhz: np.ndarray  # ascending SM clocks
    time_rel: np.ndarray  # time per unit of work relative to the highest clock (>= ~1)
    power_rel: np.ndarray  # average power relative to the highest clock
    source: str  # where it was measured

    def __post_init__(self) -> None:
        arrays = {name: _column(getattr(self, name), name) for name in COLUMNS}
        for name, array in arrays.items():
            object.__setattr__(self, name, array)
        problem = _table_problem(arrays["clock_mhz"], arrays["time_rel"], arrays["power_rel"])
        if problem:
            raise ClockTableError(f"{self.source}: {problem}")
        try:
            object.__setattr__(self, "model", gpu_model(self.model).key)
        except KeyError as exc:
            raise ClockTableError(f"{self.source}: {exc.args[0]}") from None

    def energy_rel(self) -> np.ndarray:
        """Energy per unit of work relative to the highest clock."""
        energy: np.ndarray = self.time_rel * self.power_rel
        return energy

    def at(self, clock_mhz: float) -> tuple[float, float]:
        """(time_rel, power_rel) at ``clock_mhz``: linear between rows, clamped to the table."""
        time_rel = float(np.interp(clock_mhz, self.clock_mhz, self.time_rel))
        power_rel = float(np.interp(clock_mhz, self.clock_mhz, self.power_rel))
        return time_rel, power_rel

    def scaled_to(self, model: str) -> ClockTable:
        """The same curve on ``model``: each clock at the same fraction of the model's maximum
        SM clock, rounded to whole MHz (what a clock lock takes). An assumption, not a
        measurement: the source says so."""
        source, target = gpu_model(self.model), gpu_model(model)
        ratio = target.sm_clock_max_mhz / source.sm_clock_max_mhz
        clocks = np.round(self.clock_mhz * ratio)
        return ClockTable(
            target.key,
            clocks,
            self.time_rel,
            self.power_rel,
            f"scaled from {source.key} ({source.sm_clock_max_mhz} MHz max) to {target.key} "
            f"({target.sm_clock_max_mhz} MHz max) at the same fraction of the maximum SM "
            f"clock, assumed; {source.key}: {self.source}",
        )


def _column(values: object, name: str) -> np.ndarray:
    array = np.array(values, dtype=np.float64)
    if array.ndim != 1:
        raise ClockTableError(f"ClockTable.{name} must be one-dimensional")
    array.setflags(write=False)
    return array


def _table_problem(clock: np.ndarray, time_rel: np.ndarray, power_rel: np.ndarray) -> str:
    """What is wrong with the columns of a table, or ''."""
    if not len(clock) == len(time_rel) == len(power_rel):
        return "clock_mhz, time_rel and power_rel differ in length"
    if len(clock) < 2:
        return "a clock table needs 2 rows or more"
    for name, array in zip(COLUMNS, (clock, time_rel, power_rel), strict=True):
        if not np.all(np.isfinite(array) & (array > 0)):
            return f"every {name} must be a finite number > 0"
    if np.any(np.diff(clock) <= 0):
        return "clock_mhz must increase from row to row (each clock once)"
    if abs(time_rel[-1] - 1) > TOP_TOLERANCE or abs(power_rel[-1] - 1) > TOP_TOLERANCE:
        return (
            f"the highest clock's row must be time_rel = 1, power_rel = 1 (values are relative "
            f"to it), got {time_rel[-1]:g}, {power_rel[-1]:g}"
        )
    return ""


def best_clock(table: ClockTable, max_slowdown: float) -> tuple[float, float]:
    """(clock_mhz, energy_saved_share): the table's clock with the least energy per unit of
    work among those at most ``max_slowdown`` slower than the highest clock (0.05: 5 %).

    A brute-force search of the table's rows; a tie goes to the faster clock. The highest
    clock always qualifies, so there is always an answer; a lower clock that measured no
    slower than the highest (BLOOM's 1380 MHz) qualifies even at a ``max_slowdown`` of 0.
    """
    if not (math.isfinite(max_slowdown) and max_slowdown >= 0):
        raise ValueError(
            f"max_slowdown must be a finite share >= 0 (0.05: 5 %), not {max_slowdown}"
        )
    allowed = table.time_rel <= 1.0 + max_slowdown + 1e-12
    allowed[-1] = True
    energy = np.where(allowed, table.energy_rel(), np.inf)
    best = int(np.flatnonzero(energy == energy.min())[-1])
    return float(table.clock_mhz[best]), float(1.0 - energy[best])


# --- files ---------------------------------------------------------------------------------


def clock_table_csv(table: ClockTable, notes: tuple[str, ...] = ()) -> str:
    """The table in the CSV format ``load_clock_table`` reads; ``notes`` become comment lines."""
    lines = [f"# model: {table.model}", f"# source: {table.source}"]
    lines += [f"# {note}" for note in notes]
    lines.append(",".join(COLUMNS))
    for clock, time_rel, power_rel in zip(
        table.clock_mhz, table.time_rel, table.power_rel, strict=True
    ):
        lines.append(f"{clock:g},{time_rel:.6g},{power_rel:.6g}")
    return "\n".join(lines) + "\n"


def load_clock_table(path: str | Path) -> ClockTable:
    """Read a clock table file; ``ClockTableError`` naming the file (and line) on any fault."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise ClockTableError(
            f"{path}: cannot read the clock table: {exc.strerror or exc}"
        ) from None
    except UnicodeDecodeError:
        raise ClockTableError(f"{path}: not a UTF-8 CSV file") from None
    return parse_clock_table(text, str(path))


def parse_clock_table(text: str, source: str = "<string>") -> ClockTable:
    """A clock table from CSV text (see the module doc); ``source`` names it in errors."""
    header: dict[str, str] = {}
    rows: list[tuple[int, list[str]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("#"):
            key, sep, value = stripped.lstrip("#").partition(":")
            if sep and key.strip() in ("model", "source") and key.strip() not in header:
                header[key.strip()] = value.strip()
        elif stripped:
            rows.append((number, next(csv.reader(io.StringIO(stripped)))))
    if "model" not in header:
        raise ClockTableError(f"{source}: no '# model: <GPU model>' line before the table")
    if not rows or [c.strip() for c in rows[0][1]] != list(COLUMNS):
        raise ClockTableError(f"{source}: the table's header must be {','.join(COLUMNS)}")
    values = [_row(source, number, cells) for number, cells in rows[1:]]
    columns = np.array(values, dtype=np.float64).reshape(-1, len(COLUMNS)).T
    where = header.get("source", source)
    try:
        return ClockTable(header["model"], columns[0], columns[1], columns[2], where)
    except ClockTableError as exc:
        raise ClockTableError(f"{source}: {str(exc).removeprefix(where + ': ')}") from None


def _row(source: str, number: int, cells: list[str]) -> tuple[float, float, float]:
    if len(cells) != len(COLUMNS):
        raise ClockTableError(
            f"{source}:{number}: expected {len(COLUMNS)} values, got {len(cells)}"
        )
    try:
        clock, time_rel, power_rel = (float(c) for c in cells)
    except ValueError:
        raise ClockTableError(f"{source}:{number}: {','.join(cells)!r} is not 3 numbers") from None
    if not all(math.isfinite(v) and v > 0 for v in (clock, time_rel, power_rel)):
        raise ClockTableError(f"{source}:{number}: every value must be a finite number > 0")
    return clock, time_rel, power_rel


# --- the shipped tables --------------------------------------------------------------------


def shipped_table_names() -> tuple[str, ...]:
    """The names of the tables in ``powerd/data/clocks/`` (``a100-gpt3-175b``, ...)."""
    folder = resources.files("powerd").joinpath(CLOCKS_RESOURCE)
    return tuple(
        sorted(p.name.removesuffix(".csv") for p in folder.iterdir() if p.name.endswith(".csv"))
    )


@functools.cache
def shipped_table(name: str) -> ClockTable:
    """A shipped table by name; ``KeyError`` listing the names for an unknown one."""
    if name not in shipped_table_names():
        raise KeyError(
            f"no shipped clock table {name!r}; shipped: {', '.join(shipped_table_names())}"
        )
    resource = resources.files("powerd").joinpath(f"{CLOCKS_RESOURCE}/{name}.csv")
    return parse_clock_table(
        resource.read_text(encoding="utf-8"), f"powerd/{CLOCKS_RESOURCE}/{name}.csv"
    )


def shipped_clock_table(model: str) -> ClockTable | None:
    """The table a GPU model uses by default (``DEFAULT_TABLES``); None for a model without."""
    name = DEFAULT_TABLES.get(gpu_model(model).key)
    return None if name is None else shipped_table(name)
