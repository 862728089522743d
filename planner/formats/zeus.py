"""What Zeus's power monitor writes (ml-energy/zeus, ``zeus/monitor/power.py``), as profile rows.

Two forms, told apart by their first line:

- the CSV of ``PowerMonitor(power_csv_path=...)`` (Zeus up to 0.12): no header, one line per
  poll, ``time.time()`` (Unix seconds) then each monitored GPU's power in W
  (``1715680800.1001,640.37,649.613``); the columns are the monitor's ``gpu_indices`` in
  order, 0, 1, ... unless given (``zeus:2,3``). A header ``time,power0,power1`` (the
  monitor's own column names) is read too, and names the GPUs.
- the output of ``python -m zeus.monitor power`` (``rich.print(datetime.now(), {"GPU0":
  W, ...})``): a local time without a zone (read as UTC), then a dict of GPU power in W,
  on one line or spread over several; the ``Total time``/``Total energy`` lines printed on
  Ctrl-C end it.
"""

from __future__ import annotations

import ast
import csv
import io
import re
from pathlib import Path

import numpy as np
import pandas as pd

from planner.errors import ProfileError
from planner.formats.common import Names, NotThisFormat, Parsed, naive_unix_s, with_names

NAME = "zeus"
#: a first field above this is Unix seconds (2001-09-09 on)
MIN_UNIX_S = 1e9
_STAMP = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?)\s*(.*)$")
_GPU_KEY = re.compile(r"^GPU(\d+)$")
_HEADER_POWER = re.compile(r"^power(\d+)$")
TIME_FORMATS = ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S")
END_OF_LOG = "Total time (s):"


def looks_like_log(lines: list[str]) -> bool:
    """A time, then a dict of GPUs' power (``python -m zeus.monitor power``); first lines."""
    if not lines or (stamp := _STAMP.match(lines[0])) is None:
        return False
    rest = " ".join([stamp.group(2), *lines[1:3]]).strip()
    return rest.startswith("{") and "'GPU" in rest


def looks_like_csv(line: str) -> bool:
    """A line of numbers whose first is Unix seconds: the CSV without its header."""
    fields = line.split(",")
    try:
        numbers = [float(f) for f in fields]
    except ValueError:
        return False
    return len(numbers) >= 2 and numbers[0] > MIN_UNIX_S


def read(path: Path, text: str, names: Names, gpus: tuple[int, ...] = ()) -> Parsed:
    """Either form; ``gpus`` are the indices of a headerless CSV's power columns."""
    lines = [line.strip() for line in text.splitlines()]
    first = next((line for line in lines if line), "")
    if looks_like_log([line for line in lines if line][:3]):
        if gpus:
            raise ProfileError(path, "the monitor's output names its GPUs: give no :GPUS")
        frame, numbers = _log(path, lines)
    elif looks_like_csv(first) or first.lower().startswith("time,"):
        frame, numbers = _csv(path, text, gpus)
    else:
        raise NotThisFormat(
            path,
            f"not Zeus's power CSV (time,W,W...) or `python -m zeus.monitor power` output:"
            f" {first[:80]!r}",
        )
    columns = {"time_s": "time_s", "gpu": "gpu", "power_w": "power_w"}
    columns.update(with_names(frame, names.node_of(path), names.workload_of(path)))
    return Parsed(frame, numbers, columns)


def _csv(path: Path, text: str, gpus: tuple[int, ...]) -> tuple[pd.DataFrame, np.ndarray]:
    rows: list[list[str]] = []
    lines: list[int] = []
    reader = csv.reader(io.StringIO(text, newline=""))
    header_gpus: tuple[int, ...] | None = None
    for fields in reader:
        if not fields or all(not f.strip() for f in fields):
            continue
        if header_gpus is None and not rows and fields[0].strip().lower() == "time":
            header_gpus = _header(path, fields, reader.line_num, gpus)
            continue
        rows.append([f.strip() for f in fields])
        lines.append(reader.line_num)
    if not rows:
        raise ProfileError(path, "no rows of samples", 1)
    width = len(rows[0]) - 1
    indices = header_gpus or gpus or tuple(range(width))
    if len(indices) != width:
        raise ProfileError(
            path, f"{width} power columns but {len(indices)} GPUs given ({indices})", lines[0]
        )
    for row, number in zip(rows, lines, strict=True):
        if len(row) != width + 1:
            raise ProfileError(
                path, f"{len(row)} fields where the first row has {width + 1}", number
            )
    values = pd.DataFrame(rows).apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
    bad = np.argwhere(np.isnan(values))
    if len(bad):
        at, col = (int(v) for v in bad[0])
        what = "time (Unix seconds)" if col == 0 else f"power of GPU {indices[col - 1]} (W)"
        raise ProfileError(path, f"{rows[at][col]!r}: not a number, need the {what}", lines[at])
    count = len(rows)
    frame = pd.DataFrame(
        {
            "time_s": np.repeat(values[:, 0], width),
            "gpu": np.tile(np.asarray(indices, dtype=np.int64), count),
            "power_w": values[:, 1:].reshape(-1),
        }
    )
    return frame, np.repeat(np.asarray(lines), width)


def _header(path: Path, fields: list[str], line: int, gpus: tuple[int, ...]) -> tuple[int, ...]:
    matches = [_HEADER_POWER.match(f.strip()) for f in fields[1:]]
    if not matches or not all(matches):
        raise ProfileError(
            path, f"header {','.join(fields)!r}: Zeus writes time,power0,power1,...", line
        )
    named = tuple(int(m.group(1)) for m in matches if m)
    if gpus and gpus != named:
        raise ProfileError(path, f"the header names GPUs {named}, not {gpus}", line)
    return named


def _log(path: Path, lines: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
    stamps: list[str] = []
    numbers: list[int] = []
    readings: list[dict[int, float]] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line:
            index += 1
            continue
        if line.startswith(END_OF_LOG):
            break
        stamp = _STAMP.match(line)
        if stamp is None:
            raise ProfileError(path, f"{line[:80]!r}: not a time then the GPUs' power", index + 1)
        start = index
        text = stamp.group(2)
        index += 1
        while text.count("{") == 0 or text.count("{") > text.count("}"):
            if index >= len(lines):
                raise ProfileError(path, "the GPUs' power is cut off at the end", start + 1)
            text += lines[index]
            index += 1
        stamps.append(stamp.group(1))
        numbers.append(start + 1)
        readings.append(_reading(path, text, start + 1))
    if not readings:
        raise ProfileError(path, "no samples before 'Total time'", 1)
    times = naive_unix_s(stamps, TIME_FORMATS)
    rows = [
        (time_s, gpu, power_w, number)
        for time_s, reading, number in zip(times, readings, numbers, strict=True)
        for gpu, power_w in sorted(reading.items())
    ]
    frame = pd.DataFrame(
        {
            "time_s": [r[0] for r in rows],
            "gpu": np.asarray([r[1] for r in rows], dtype=np.int64),
            "power_w": [r[2] for r in rows],
        }
    )
    return frame, np.asarray([r[3] for r in rows])


def _reading(path: Path, text: str, line: int) -> dict[int, float]:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ProfileError(path, f"{text[:80]!r}: not a dict of GPU power", line) from None
    if not isinstance(value, dict):
        raise ProfileError(path, f"{text[:80]!r}: not a dict of GPU power", line)
    reading: dict[int, float] = {}
    for key, power in value.items():
        match = _GPU_KEY.match(str(key))
        if match is None or not isinstance(power, int | float):
            raise ProfileError(path, f"{key!r}: {power!r}: need 'GPU<index>': watts", line)
        reading[int(match.group(1))] = float(power)
    return reading
