"""What the agent reads from each GPU, read once: ``powerd gpus``'s rows, table and JSON.

Plain text only: a GPU node has the agent's dependencies, no terminal-table library.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from powerd.gpu.errors import GpuError
from powerd.gpu.open import close_gpus, open_gpus

# table heading -> row key
COLUMNS = {
    "GPU": "index",
    "W": "power_w",
    "reading": "power_reading",
    "kJ": "energy_j",
    "cap W": "cap_w",
    "min W": "cap_min_w",
    "max W": "cap_max_w",
    "SM MHz": "sm_clock_mhz",
    "lock": "max_sm_clock_mhz",
    "util %": "util_pct",
    "°C": "temp_c",
}


def read_gpus(simulate: str | None) -> list[dict[str, Any]]:
    """One row per GPU: its sample, name and cap range, or ``{"index", "error"}`` when
    reading it failed. Opening the GPUs raises GpuError (ValueError: a bad ``simulate``)."""
    opened = open_gpus(simulate)
    try:
        rows: list[dict[str, Any]] = []
        for gpu in opened:
            try:
                sample, limits = gpu.sample(), gpu.power_limit_range()
            except GpuError as exc:
                rows.append({"index": gpu.index, "error": str(exc)})
                continue
            rows.append(
                {
                    **dataclasses.asdict(sample),
                    "name": gpu.name,
                    "cap_min_w": limits.min_w,
                    "cap_max_w": limits.max_w,
                    "cap_default_w": limits.default_w,
                }
            )
    finally:
        close_gpus(opened)
    return rows


def json_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One JSON object per GPU."""
    return [json.dumps(row, default=str) for row in rows]


def table_lines(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The table (the GPUs' names, then a heading and one line per GPU) and one line per
    GPU that could not be read."""
    lines = [list(COLUMNS)]
    errors = []
    for row in rows:
        if "error" in row:
            errors.append(f"GPU {row['index']}: {row['error']}")
            continue
        row = {**row, "energy_j": None if row["energy_j"] is None else row["energy_j"] / 1000}
        lines.append([_cell(row[key]) for key in COLUMNS.values()])
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    table = [", ".join(sorted({str(r.get("name", "?")) for r in rows}))]
    for line in lines:
        table.append("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
    return table, errors


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.0f}"
    return "-" if value is None else str(value)
