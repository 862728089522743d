"""Read a GPU power-cap sweep: one row per (workload, cap) with speed and average power.

A sweep is what ``powerplan caps`` works from: the same workloads run at
several power caps, each row giving the time per unit of work (or the
throughput) and the average GPU power at that cap. Column names are mapped
by arguments, so the measured Zeus sweeps (``tests/data/zeus-power-limit/``:
``dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power``)
load as they are.

:func:`load_sweep` returns one ``DataFrame`` sorted by (gpu, workload, cap_w):

============  ========  ===================================================
column        dtype     meaning
============  ========  ===================================================
gpu           string    GPU label (one file = one GPU model)
workload      string    the mapped workload columns joined by ``/``
cap_w         float64   power cap, W
throughput    float64   work per second (``1 / time`` when time is given)
avg_power_w   float64   average GPU power at that cap, W; NaN without a column
============  ========  ===================================================

Bad input raises :class:`planner.errors.ProfileError` naming the file and the
1-based line (the header is line 1); nothing is returned.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

import pandas as pd

from planner.errors import ProfileError, read_input_text
from powerd.gpu.models import GPU_MODELS, GpuModel, gpu_model

#: A GPU's power (cap or draw under work) in W lies in this range; outside it
#: the column is almost surely in another unit (NVML reports mW; site sheets
#: use kW, where every GPU is below 5). The largest GPU limits in
#: docs/DOMAIN.md are ~1400 W (GB300); idle datacenter GPUs draw > 5 W.
MIN_PLAUSIBLE_W = 5.0
MAX_PLAUSIBLE_W = 5000.0

SWEEP_COLUMNS: tuple[str, ...] = ("gpu", "workload", "cap_w", "throughput", "avg_power_w")


def default_label(path: str | Path) -> str:
    """GPU label from a file name: the stem's last ``_`` part (``summary_power_a40`` -> ``a40``)."""
    return Path(path).stem.rsplit("_", 1)[-1]


def sweep_model(label: str) -> GpuModel | None:
    """The GPU model a sweep's label names (``a40`` -> the A40), case-insensitively;
    None for a label that names no known model (powerd.gpu.models)."""
    try:
        return gpu_model(label)
    except KeyError:
        return None


def foreign_sweeps(labels: Iterable[str], site_models: Collection[str]) -> dict[str, str]:
    """Per sweep label whose GPU is not one of ``site_models`` (model keys), why its cap
    is not the site's, as a sentence; labels of the site's GPUs are left out.

    A cap curve is the chip's own: where throughput per watt peaks depends on its clocks,
    memory and voltage curve, so another model's best cap, scaled or not, is no
    recommendation for this site."""
    site = ", ".join(sorted(site_models))
    why: dict[str, str] = {}
    for label in labels:
        model = sweep_model(label)
        if model is None:
            why[label] = (
                f"the sweep {label!r} names no known GPU model ({', '.join(GPU_MODELS)}), so"
                f" it cannot be told to be of this site's GPUs ({site}); name its GPU (the"
                " file name's last '_' part, e.g. summary_power_h100.csv); no cap is"
                " recommended from it"
            )
        elif model.key not in site_models:
            why[label] = (
                f"the sweep {label!r} was measured on {model.key} GPUs; this site's GPUs are"
                f" {site}: its cap is not this site's, and none is recommended from it"
                f" (measure a sweep on {site})"
            )
    return why


def sweep_label_warnings(sweep: pd.DataFrame) -> list[str]:
    """Per GPU of a sweep (:func:`load_sweep`'s form) whose label names a known model,
    a warning when its measured caps fall outside that model's cap range: the label is
    probably not the GPU the sweep was measured on."""
    warnings = []
    for label, caps in sweep.groupby("gpu", sort=True)["cap_w"]:
        model = sweep_model(str(label))
        if model is None:
            continue
        lo, hi = float(caps.min()), float(caps.max())
        if lo < model.cap_min_w or hi > model.cap_max_w:
            warnings.append(
                f"the sweep {label!r} has caps {lo:g}-{hi:g} W, outside the {model.key}'s cap"
                f" range {model.cap_min_w:g}-{model.cap_max_w:g} W: is it of another GPU?"
            )
    return warnings


def _watts(source: Path, line: int, column: str, raw: str, what: str) -> float:
    value = _number(source, line, column, raw)
    if value < 0:
        raise ProfileError(source, f"{column} is {raw!r}: {what} must not be negative", line)
    if value == 0:
        raise ProfileError(source, f"{column} is 0: {what} must be above 0 W", line)
    if value > MAX_PLAUSIBLE_W:
        raise ProfileError(
            source,
            f"{column} is {raw!r}: no GPU {what} is above {MAX_PLAUSIBLE_W:.0f} W;"
            " is the column in mW? give watts",
            line,
        )
    if value < MIN_PLAUSIBLE_W:
        raise ProfileError(
            source,
            f"{column} is {raw!r}: below {MIN_PLAUSIBLE_W:.0f} W; is the column in kW? give watts",
            line,
        )
    return value


def _number(source: Path, line: int, column: str, raw: str) -> float:
    if not raw:
        raise ProfileError(source, f"{column} is empty: need a number", line)
    try:
        value = float(raw)
    except ValueError:
        raise ProfileError(source, f"{column} is {raw!r}: not a number", line) from None
    if not math.isfinite(value):
        raise ProfileError(source, f"{column} is {raw!r}: need a finite number (no NaN)", line)
    return value


def _positive(source: Path, line: int, column: str, raw: str) -> float:
    value = _number(source, line, column, raw)
    if value <= 0:
        raise ProfileError(source, f"{column} is {raw!r}: must be above 0", line)
    return value


def load_sweep(
    path: str | Path,
    *,
    workload_cols: Sequence[str],
    cap_col: str,
    time_col: str | None = None,
    throughput_col: str | None = None,
    power_col: str | None = None,
    label: str | None = None,
) -> pd.DataFrame:
    """Read one CSV cap sweep (one GPU model) into the sweep form above.

    Give exactly one of ``time_col`` (time per unit of work; throughput is its
    inverse) and ``throughput_col``. ``label`` names the GPU (default:
    :func:`default_label`). Raises :class:`ProfileError` for a missing column,
    a non-number, NaN, a zero or negative value, power or cap outside
    5..5000 W (mW or kW), an empty file, a duplicate (workload, cap) row, or a
    workload measured at a single cap.
    """
    source = Path(path)
    if (time_col is None) == (throughput_col is None):
        raise ValueError("give exactly one of time_col and throughput_col")
    if not workload_cols:
        raise ValueError("workload_cols must name at least one column")
    gpu = label if label is not None else default_label(source)
    speed_col = time_col if time_col is not None else throughput_col
    assert speed_col is not None
    wanted = [*workload_cols, cap_col, speed_col] + ([power_col] if power_col else [])

    text = read_input_text(source, kind="text (CSV)")
    reader = csv.reader(io.StringIO(text, newline=""))
    header: list[str] | None = None
    index: dict[str, int] = {}
    rows: list[tuple[str, float, float, float]] = []
    first_line: dict[tuple[str, float], int] = {}
    caps_by_workload: dict[str, list[int]] = {}
    for fields in reader:
        line = reader.line_num
        if not fields or all(not f.strip() for f in fields):
            continue
        if header is None:
            header = [f.strip() for f in fields]
            index = _header_index(source, line, header, wanted)
            continue
        if len(fields) != len(header):
            raise ProfileError(
                source, f"{len(fields)} fields where the header has {len(header)}", line
            )
        row = _sweep_row(source, line, fields, index, workload_cols, cap_col, speed_col, power_col)
        if time_col is not None:  # time per unit of work: throughput is its inverse
            row = (row[0], row[1], 1.0 / row[2], row[3])
        workload, cap_w = row[0], row[1]
        key = (workload, cap_w)
        if key in first_line:
            raise ProfileError(
                source,
                f"duplicate row for workload {workload!r} at cap {cap_w:g} W"
                f" (first on line {first_line[key]})",
                line,
            )
        first_line[key] = line
        caps_by_workload.setdefault(workload, []).append(line)
        rows.append(row)
    if header is None:
        raise ProfileError(source, "empty file: need a header and rows", 1)
    if not rows:
        raise ProfileError(source, "no data rows after the header", reader.line_num + 1)
    for workload, lines in caps_by_workload.items():
        if len(lines) < 2:
            raise ProfileError(
                source,
                f"workload {workload!r} is measured at a single cap: a sweep needs two or more",
                lines[0],
            )
    return _sweep_frame(gpu, rows)


def _header_index(source: Path, line: int, header: list[str], wanted: list[str]) -> dict[str, int]:
    """Where each ``wanted`` column is in ``header``; a missing one is a ProfileError."""
    missing = [c for c in wanted if c not in header]
    if missing:
        raise ProfileError(
            source,
            f"missing column(s) {', '.join(missing)}; the header has"
            f" {', '.join(header)} (map names with --workload-cols, --cap-col,"
            " --time-col/--throughput-col, --power-col)",
            line,
        )
    return {c: header.index(c) for c in wanted}


def _sweep_row(
    source: Path,
    line: int,
    fields: list[str],
    index: dict[str, int],
    workload_cols: Sequence[str],
    cap_col: str,
    speed_col: str,
    power_col: str | None,
) -> tuple[str, float, float, float]:
    """One data row: its workload (its columns joined by "/"), cap (W), speed (a time or a
    throughput, as the column gives it) and average power (W; NaN without a column)."""
    parts = [fields[index[c]].strip() for c in workload_cols]
    if any(not p for p in parts):
        empty = workload_cols[[not p for p in parts].index(True)]
        raise ProfileError(source, f"{empty} is empty: every row needs its workload", line)
    cap_w = _watts(source, line, cap_col, fields[index[cap_col]].strip(), "power cap")
    speed = _positive(source, line, speed_col, fields[index[speed_col]].strip())
    power_w = (
        _watts(source, line, power_col, fields[index[power_col]].strip(), "average power")
        if power_col
        else math.nan
    )
    return "/".join(parts), cap_w, speed, power_w


def _sweep_frame(gpu: str, rows: list[tuple[str, float, float, float]]) -> pd.DataFrame:
    """The sweep form (module docstring), sorted by workload and cap."""
    df = pd.DataFrame(rows, columns=["workload", "cap_w", "throughput", "avg_power_w"])
    df.insert(0, "gpu", gpu)
    df = df.astype(
        {
            "gpu": "string",
            "workload": "string",
            "cap_w": "float64",
            "throughput": "float64",
            "avg_power_w": "float64",
        }
    )
    return df.sort_values(["gpu", "workload", "cap_w"], ignore_index=True)


def load_sweeps(
    paths: Sequence[str | Path],
    *,
    workload_cols: Sequence[str],
    cap_col: str = "power_limit",
    time_col: str | None = "time_per_epoch",
    throughput_col: str | None = None,
    power_col: str | None = "average_power",
    labels: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Several sweeps (one GPU model each) as one table; defaults read the Zeus CSVs.

    ``labels`` names each file's GPU (default: :func:`default_label`). Raises
    :class:`ProfileError` naming the first bad file.
    """
    names = list(labels) if labels is not None else [default_label(p) for p in paths]
    if len(names) != len(paths):
        raise ValueError(f"{len(names)} labels for {len(paths)} sweep files")
    return pd.concat(
        [
            load_sweep(
                path,
                workload_cols=workload_cols,
                cap_col=cap_col,
                time_col=time_col,
                throughput_col=throughput_col,
                power_col=power_col,
                label=name,
            )
            for path, name in zip(paths, names, strict=True)
        ],
        ignore_index=True,
    )
