"""``nvidia-smi --query-gpu=... --format=csv`` output, as the profile table's rows.

nvidia-smi(1), "SELECTIVE QUERY OPTIONS", and ``nvidia-smi --help-query-gpu`` document it:
a header of the queried fields, each with its unit in brackets (``power.draw [W]``), then
one row per GPU per query, values separated by ", " and carrying their unit (``312.45 W``;
none with ``nounits``), ``[N/A]`` or ``[Not Supported]`` where the GPU gives none,
``timestamp`` as ``YYYY/MM/DD HH:MM:SS.mmm`` in the machine's local time without a zone.
``-l``/``-lms`` repeat the rows; a header repeated by appended runs is skipped. A file
written with ``noheader`` is read with its fields given (``nvidia-smi:FIELDS``).

Read: time from ``timestamp`` (local time, read as UTC: a workload's nodes must share a
zone), GPU from ``index``, power from ``power.draw``, else ``power.draw.instant``, else
``power.draw.average``; the cap from ``enforced.power.limit``, else ``power.limit``; the SM
clock from ``clocks.sm`` (``clocks.current.sm``); the GPU's maximum cap from
``power.max_limit``, which tells a capped sample (``planner.censored``). A sample whose
power is ``[N/A]`` (or another bracketed word) is left out; a GPU with no power at all is an error.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import numpy as np
import pandas as pd

from planner.errors import ProfileError
from planner.formats.common import Names, NotThisFormat, Parsed, naive_unix_s, with_names

NAME = "nvidia-smi"
TIME_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S")
#: normalised name -> the fields that hold it, the first one present is read
FIELDS: dict[str, tuple[str, ...]] = {
    "time_s": ("timestamp",),
    "gpu": ("index",),
    "power_w": ("power.draw", "power.draw.instant", "power.draw.average"),
    "cap_w": ("enforced.power.limit", "power.limit"),
    "clock_mhz": ("clocks.sm", "clocks.current.sm"),
    "cap_max_w": ("power.max_limit",),  # tells a capped sample (planner.censored)
}
#: the unit a value of these fields carries without ``nounits``
UNITS = {"W": ("power.",), "MHz": ("clocks.",)}
EXAMPLE_QUERY = "timestamp,index,power.draw,power.limit,clocks.sm"
_FIELD = re.compile(r"^([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*)(?: \[([^\]]+)\])?$")
_STAMP = re.compile(r"^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}(\.\d+)?$")


def header_fields(line: str) -> list[tuple[str, str | None]] | None:
    """(field, unit) of an nvidia-smi header line, or None if the line is not one."""
    fields = [f.strip() for f in line.split(",")]
    parsed = [_FIELD.match(f) for f in fields]
    if not fields or not all(parsed):
        return None
    return [(m.group(1), m.group(2)) for m in parsed if m]


def looks_like_header(line: str) -> bool:
    """An nvidia-smi header: every field one of its names, one of them a power reading."""
    fields = header_fields(line)
    return fields is not None and any(name in FIELDS["power_w"] for name, _ in fields)


def looks_like(lines: list[str]) -> bool:
    """nvidia-smi's header, and a first row that fits it (its timestamp nvidia-smi's)."""
    if not lines or not looks_like_header(lines[0]):
        return False
    if len(lines) < 2:
        return True
    names = [name for name, _ in header_fields(lines[0]) or []]
    row = [f.strip() for f in lines[1].split(",")]
    if len(row) != len(names):
        return False
    return "timestamp" not in names or bool(_STAMP.match(row[names.index("timestamp")]))


def looks_like_row(line: str) -> bool:
    """A row written with ``noheader``: it starts with nvidia-smi's timestamp."""
    return bool(_STAMP.match(line.split(",", 1)[0].strip()))


def read(path: Path, text: str, names: Names, fields: tuple[str, ...] = ()) -> Parsed:
    """The file's rows; ``fields`` names the columns of a file written with ``noheader``."""
    rows, lines, header, header_line = _rows(path, text, fields)
    units = dict(header)
    columns: dict[str, str] = {}
    for name, candidates in FIELDS.items():
        found = next((f for f in candidates if f in units), None)
        if found is not None:
            columns[name] = found
    _require(path, columns, header_line)
    frame = pd.DataFrame(rows, columns=[f for f, _ in header], dtype=object)
    line_numbers = np.asarray(lines)
    numeric = {f for f, unit in header if unit} | {
        columns[n] for n in ("power_w", "cap_w", "clock_mhz", "cap_max_w") if n in columns
    }
    power_text = frame[columns["power_w"]].copy()
    for field in numeric:
        frame[field] = _numbers(path, frame[field], field, units[field], line_numbers)
    times = naive_unix_s(frame[columns["time_s"]].tolist(), TIME_FORMATS)
    if (bad := _first(np.isnan(times))) is not None:
        raise ProfileError(
            path,
            f"timestamp is {frame[columns['time_s']].iloc[bad]!r}: not nvidia-smi's"
            " YYYY/MM/DD HH:MM:SS.mmm",
            int(line_numbers[bad]),
        )
    frame[columns["time_s"]] = times
    keep = _with_power(path, frame, columns, power_text, line_numbers)
    frame = frame[keep].reset_index(drop=True)
    columns.update(with_names(frame, names.node_of(path), names.workload_of(path)))
    return Parsed(frame, line_numbers[keep], columns, header_line)


def _rows(
    path: Path, text: str, given: tuple[str, ...]
) -> tuple[list[list[str]], list[int], list[tuple[str, str | None]], int | None]:
    header: list[tuple[str, str | None]] | None = None
    header_text: list[str] | None = None
    header_line: int | None = None
    if given:
        header = [(f, None) for f in given]
    rows: list[list[str]] = []
    lines: list[int] = []
    reader = csv.reader(io.StringIO(text, newline=""), skipinitialspace=True)
    for fields in reader:
        if not fields or all(not f.strip() for f in fields):
            continue
        fields = [f.strip() for f in fields]
        if header is None:
            header = _header(path, fields, reader.line_num)
            header_text, header_line = fields, reader.line_num
            continue
        if fields == header_text:  # the header again: runs appended to one file
            continue
        if given and not rows and looks_like_header(", ".join(fields)):
            raise ProfileError(
                path,
                "this line is a header: the file has one, read it with --input-format"
                f" {NAME} (no fields)",
                reader.line_num,
            )
        if len(fields) != len(header):
            where = "--input-format gives" if given else "the header has"
            raise ProfileError(
                path,
                f"{len(fields)} fields where {where} {len(header)}:"
                f" {', '.join(f for f, _ in header)}",
                reader.line_num,
            )
        rows.append(fields)
        lines.append(reader.line_num)
    if header is None:
        raise ProfileError(path, "empty file: no nvidia-smi header or rows", 1)
    if not rows:
        raise ProfileError(path, "no rows of samples", (header_line or 0) + 1)
    return rows, lines, header, header_line


def _header(path: Path, fields: list[str], line: int) -> list[tuple[str, str | None]]:
    parsed = header_fields(", ".join(fields))
    if parsed is not None:
        names = [name for name, _ in parsed]
        if twice := sorted({name for name in names if names.count(name) > 1}):
            raise ProfileError(path, f"field(s) {', '.join(twice)} twice in the header", line)
        return parsed
    if looks_like_row(fields[0]):
        raise ProfileError(
            path,
            "no header: for a file written with --format=csv,noheader give its fields,"
            f" --input-format {NAME}:{EXAMPLE_QUERY} (as given to --query-gpu)",
            line,
        )
    raise NotThisFormat(
        path, f"not an nvidia-smi header: {', '.join(fields)[:120]} (--format=csv writes one)"
    )


def _require(path: Path, columns: dict[str, str], header_line: int | None) -> None:
    missing = [" or ".join(FIELDS[n]) for n in ("time_s", "gpu", "power_w") if n not in columns]
    if missing:
        raise ProfileError(
            path,
            f"no {', no '.join(missing)} field: query at least"
            f" nvidia-smi --query-gpu={EXAMPLE_QUERY} --format=csv",
            header_line,
        )


def _numbers(
    path: Path, values: pd.Series, field: str, unit: str | None, lines: np.ndarray
) -> np.ndarray:
    """Numbers with or without their unit; NaN for nvidia-smi's bracketed words."""
    expected = unit or next(
        (u for u, prefixes in UNITS.items() if field.startswith(prefixes)), None
    )
    text = values.astype("string").str.strip()
    bracketed = (text.str.startswith("[") & text.str.endswith("]")).to_numpy(dtype=bool)
    bare = text.str.replace(f" {re.escape(expected)}$", "", regex=True) if expected else text
    numbers: np.ndarray = pd.to_numeric(bare, errors="coerce").to_numpy(
        dtype=float, na_value=np.nan
    )
    if (row := _first(~bracketed & np.isnan(numbers))) is not None:
        what = f"a number in {expected}" if expected else "a number"
        raise ProfileError(path, f"{field} is {values.iloc[row]!r}: need {what}", int(lines[row]))
    return numbers


def _with_power(
    path: Path, frame: pd.DataFrame, columns: dict[str, str], text: pd.Series, lines: np.ndarray
) -> np.ndarray:
    """Rows that have a power reading; a GPU with none at all is an error."""
    power = frame[columns["power_w"]].to_numpy(dtype=float)
    has: np.ndarray = ~np.isnan(power)
    gpus = frame[columns["gpu"]]
    for gpu in pd.unique(gpus):
        mine = (gpus == gpu).to_numpy(dtype=bool)
        if not has[mine].any():
            row = int(np.flatnonzero(mine)[0])
            raise ProfileError(
                path,
                f"{columns['power_w']} of GPU {gpu} is {text.iloc[row]!r}"
                f" (no number) on every row: nvidia-smi read no power from it",
                int(lines[row]),
            )
    return has


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None
