"""Read GPU power profiles into the planner's one table, check them, and summarise per workload.

Readers (each returns the table of :mod:`planner.profile_table`, sorted by
(workload, node, gpu, time_s)):

- :func:`read_profiles`: files, by extension: ``.csv``; ``.parquet``/``.pq``;
  ``.lp``/``.line`` (InfluxDB line protocol: what ``powerd`` records when it
  has no InfluxDB; only the ``gpu`` measurement is read).
- :func:`read_influx`: an InfluxDB query, InfluxQL over the ``/query`` HTTP
  endpoint (InfluxDB 1.x, and 2.x/3.x through their 1.x compatibility API), or
  Flux through ``influxdb-client`` when the query starts with ``from(`` or
  ``import``.

Column names: a normalised name (``time_s``, ``node``, ``gpu``, ``workload``,
``power_w``, ``cap_w``, ``cap_max_w``, ``clock_mhz``, ``phase``, ``throughput``) is taken
from the column of the same name, else from the ``columns`` mapping
(``{"power_w": "gpu_power"}``), else from powerd's own names (:data:`ALIASES`:
``time``, ``job``, ``sm_clock_mhz``). Time is Unix seconds (or seconds from
any origin) or ISO-8601 text (UTC when it has no offset).

Checks (each raises :class:`planner.errors.ProfileError` naming the source and
the 1-based line, the header of a CSV being line 1, the row of a Parquet file,
the row of a query result; nothing is returned): unreadable or empty input,
missing required columns, a number that does not parse, time in ms or finer,
a GPU's timestamps not increasing in file order, power that is empty, NaN,
infinite or negative, a GPU whose median power is above
:data:`MW_MEDIAN_W` (the column is in mW) or non-zero and below
:data:`KW_MEDIAN_W` (kW), the same sample in two files.

:func:`summarise` gives one row per workload; its method is in its docstring
and in docs/PLANNER.md.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import difflib
import io
import json
import math
import shlex
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from planner import formats
from planner.errors import ProfileError, read_input_text
from planner.profile_table import COLUMNS, FLOAT_COLUMNS, REQUIRED
from powerd.protocol import PHASES

#: A GPU whose median power is above this is in mW (no GPU draws 5 kW).
MW_MEDIAN_W = 5000.0
#: A GPU whose median power is non-zero and below this is in kW (an idle GPU draws 20-100 W).
KW_MEDIAN_W = 5.0
#: Times whose median is above this (about year 5138 in Unix seconds) are ms, µs or ns.
MAX_TIME_S = 1e11
#: A synchronised swing: the workload's total power changes by more than this share of its
#: mean within one sample step.
SWING_SHARE = 0.30

#: powerd's names for normalised columns (line protocol, InfluxDB), tried after the exact name.
ALIASES: dict[str, tuple[str, ...]] = {
    "time_s": ("time", "_time"),
    "workload": ("job",),
    "clock_mhz": ("sm_clock_mhz",),
}
_HINTS: dict[str, tuple[str, ...]] = {  # words that suggest a column for a --column hint
    "time_s": ("time", "stamp", "ts", "date"),
    "node": ("node", "host", "server"),
    "gpu": ("gpu", "index", "device"),
    "workload": ("workload", "job", "model"),
    "power_w": ("power", "watt"),
}
CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")
LP_SUFFIXES = (".lp", ".line")
LP_MEASUREMENT = "gpu"


@dataclass(frozen=True)
class _Origin:
    """Where each row came from, to name it in an error."""

    source: str
    lines: np.ndarray  # 1-based line (file) or row (query result) of each row
    rows_are_lines: bool = True  # False: a query result; say "result row N" in the text

    def error(self, problem: str, row: int | None = None) -> ProfileError:
        if row is None:
            return ProfileError(self.source, problem)
        where = int(self.lines[row])
        if self.rows_are_lines:
            return ProfileError(self.source, problem, where)
        return ProfileError(self.source, f"result row {where}: {problem}")


# --- public API ----------------------------------------------------------------


def read_profiles(
    sources: Sequence[str | Path],
    *,
    columns: Mapping[str, str] | None = None,
    workload: str | None = None,
    input_format: formats.InputFormat | str | None = None,
    node: str | None = None,
) -> pd.DataFrame:
    """Read and check profile files, one table for all of them.

    ``columns`` maps normalised names to the files' names (``{"power_w":
    "gpu_power", "time_s": "timestamp"}``); ``workload`` names the workload of
    rows that have none (a file without the column, line-protocol points
    without a ``job`` tag). ``input_format`` reads every file with a tool's preset
    (:mod:`planner.formats`: ``nvidia-smi``, ``dcgm``, ``zeus``), ``node`` names the node
    of its samples; both default to the command's ``--input-format`` and ``--node``
    (:func:`planner.formats.reading`), else a file a preset detects is read with it.
    Raises ProfileError (see the module) on bad input.
    """
    mapping = _check_mapping(columns)
    if not sources:
        raise ValueError("no profile files given")
    chosen, chosen_node = formats.chosen()
    if isinstance(input_format, str):
        input_format = formats.parse_format(input_format)
    input_format, node = input_format or chosen, node or chosen_node
    frames = []
    for item in sources:
        path = Path(item)
        if (preset := formats.preset_for(path, input_format)) is not None:
            frames.append(_read_preset(path, preset, mapping, workload, node))
            continue
        raw, origin, header_line = _read_file(path)
        frames.append(_normalise(raw, origin, mapping, workload, header_line, ordered=True))
    return _combine(frames)


def read_influx(
    url: str,
    query: str,
    *,
    token: str | None = None,
    org: str | None = None,
    database: str | None = None,
    columns: Mapping[str, str] | None = None,
    workload: str | None = None,
    timeout_s: float = 60.0,
) -> pd.DataFrame:
    """Run one query against InfluxDB and normalise its result like :func:`read_profiles`.

    InfluxQL (``SELECT * FROM gpu WHERE time > now() - 1h``) goes to
    ``{url}/query`` with ``db=database`` and ``epoch=ns``; ``token`` is sent
    as ``Authorization: Token ...``, or as basic auth when it is
    ``user:password`` (InfluxDB 1.x). Flux (a query starting with ``from(`` or
    ``import``) goes through ``influxdb-client`` with ``org``; results not
    pivoted are pivoted on ``_field``. Tags and fields both become columns.
    The server's row order is not checked (results come per series); a GPU
    with two samples at one time is an error.
    """
    mapping = _check_mapping(columns)
    if query.lstrip().startswith(("from(", "import ")):
        raw = _flux_frame(url, query, token=token, org=org, timeout_s=timeout_s)
    else:
        if not database:
            raise ProfileError(url, "an InfluxQL query needs a database (--database)")
        raw = influxql_frame(
            url, _influxql_get(url, query, token=token, database=database, timeout_s=timeout_s)
        )
    if raw.empty:
        raise ProfileError(url, f"the query returned no rows: {query}")
    origin = _Origin(url, np.arange(1, len(raw) + 1), rows_are_lines=False)
    return _combine([_normalise(raw, origin, mapping, workload, None, ordered=False)])


def influxql_frame(source: str, doc: Mapping[str, Any]) -> pd.DataFrame:
    """The rows of an InfluxQL ``/query`` JSON answer: one column per tag and field.

    ``time`` is converted from ns (``epoch=ns``) to seconds; RFC 3339 text is
    kept for the normaliser. A statement error raises ProfileError.
    """
    if "error" in doc:
        raise ProfileError(source, f"query failed: {doc['error']}")
    frames = []
    for result in doc.get("results", []):
        if "error" in result:
            raise ProfileError(source, f"query failed: {result['error']}")
        for series in result.get("series", []):
            frame = pd.DataFrame(series.get("values", []), columns=series["columns"])
            for tag, value in (series.get("tags") or {}).items():
                if tag not in frame.columns:
                    frame[tag] = value if value != "" else None
            frames.append(frame)
    if not frames:
        return pd.DataFrame()
    raw = pd.concat(frames, ignore_index=True)
    if "time" in raw.columns and pd.api.types.is_numeric_dtype(raw["time"]):
        raw["time"] = raw["time"].astype("float64") / 1e9
    return raw


def summarise(table: pd.DataFrame) -> pd.DataFrame:
    """One row per workload, from the normalised table.

    Per GPU sample: ``mean_w``, ``p50_w``, ``p90_w``, ``p99_w``, ``max_w``.
    The workload's aggregate (the sum of its GPUs, see :func:`aggregate_power`):
    ``agg_mean_w``, ``agg_p99_w``, ``agg_max_w`` and ``peak_to_mean`` =
    agg p99 / agg mean. Synchronised swings: ``swings`` counts the steps where
    the aggregate moves by more than :data:`SWING_SHARE` of its mean from one
    sample step (``step_s``) to the next; ``max_swing_w_per_s`` is the largest
    such move per second. ``share_<phase>``: share of the samples with a known
    phase spent in each phase (NaN where the workload has no phase).
    """
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing:
        raise ValueError(f"not a normalised profile table: no {', '.join(missing)}")
    seen = set(table["phase"].dropna()) if "phase" in table.columns else set()
    phases = [p for p in PHASES if p in seen] + sorted(seen - set(PHASES))
    rows = []
    for workload, group in table.groupby("workload", sort=True):
        power = group["power_w"].to_numpy(dtype=float)
        agg = aggregate_power(group)
        step_s = float(agg.attrs["step_s"])
        row: dict[str, Any] = {
            "workload": str(workload),
            "gpus": int(group[["node", "gpu"]].drop_duplicates().shape[0]),
            "nodes": int(group["node"].nunique()),
            "samples": len(group),
            "duration_s": float(group["time_s"].max() - group["time_s"].min()),
            "step_s": step_s,
            "mean_w": float(power.mean()),
            "p50_w": float(np.percentile(power, 50)),
            "p90_w": float(np.percentile(power, 90)),
            "p99_w": float(np.percentile(power, 99)),
            "max_w": float(power.max()),
        }
        row.update(_aggregate_stats(agg, step_s))
        known = group["phase"].dropna() if "phase" in group.columns else pd.Series([])
        shares = known.value_counts(normalize=True)
        for phase in phases:
            row[f"share_{phase}"] = float(shares.get(phase, 0.0)) if len(known) else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def sample_step_s(table: pd.DataFrame) -> float:
    """The sampling period: the median time between a GPU's consecutive samples (NaN if none)."""
    ordered = table.sort_values(["node", "gpu", "time_s"], kind="stable")
    gaps = ordered.groupby(["node", "gpu"], sort=False)["time_s"].diff()
    gaps = gaps[gaps > 0]
    return float(gaps.median()) if len(gaps) else math.nan


def aggregate_power(table: pd.DataFrame, step_s: float | None = None) -> pd.Series:
    """Total power of the GPUs in ``table`` (one workload) on a common time grid.

    Samples are put in bins of ``step_s`` (default :func:`sample_step_s`) from
    the first time, rounding to the nearest bin, so GPUs sampled a little apart
    (each node has its own clock) share a bin. A GPU's samples in one bin are
    averaged; a GPU missing from one bin keeps its last value (sampling
    jitter); bins where some GPU has no value are left out, so the aggregate
    covers the time all the GPUs report. Index: bin time (s); ``attrs["step_s"]``.
    """
    step = sample_step_s(table) if step_s is None else float(step_s)
    if not math.isfinite(step) or step <= 0:
        series = pd.Series([], dtype="float64", name="power_w")
        series.attrs["step_s"] = math.nan
        return series
    t0 = float(table["time_s"].min())
    bins = np.rint((table["time_s"].to_numpy(dtype=float) - t0) / step).astype(np.int64)
    per_gpu = (
        table.assign(bin=bins).groupby(["bin", "node", "gpu"], observed=True)["power_w"].mean()
    )
    wide = per_gpu.unstack(["node", "gpu"])
    present = wide.index.to_numpy()
    # a bin's previous bin is the row before it (empty if no GPU reported): fill from it only
    wide = wide.reindex(np.union1d(present - 1, present)).ffill(limit=1).loc[present]
    complete = wide.notna().all(axis=1)
    total = wide[complete].sum(axis=1)
    series = pd.Series(
        total.to_numpy(dtype=float), index=t0 + total.index.to_numpy() * step, name="power_w"
    )
    series.index.name = "time_s"
    series.attrs["step_s"] = step
    return series


# --- summary helpers -------------------------------------------------------------


def _aggregate_stats(agg: pd.Series, step_s: float) -> dict[str, float | int]:
    if agg.empty:
        nan = math.nan
        return {
            "agg_mean_w": nan,
            "agg_p99_w": nan,
            "agg_max_w": nan,
            "peak_to_mean": nan,
            "swings": 0,
            "max_swing_w_per_s": nan,
        }
    values = agg.to_numpy(dtype=float)
    mean_w = float(values.mean())
    p99_w = float(np.percentile(values, 99))
    consecutive = np.isclose(np.diff(agg.index.to_numpy(dtype=float)), step_s)
    moves = np.abs(np.diff(values))[consecutive]
    return {
        "agg_mean_w": mean_w,
        "agg_p99_w": p99_w,
        "agg_max_w": float(values.max()),
        "peak_to_mean": p99_w / mean_w if mean_w > 0 else math.nan,
        "swings": int((moves > SWING_SHARE * mean_w).sum()),
        "max_swing_w_per_s": float(moves.max() / step_s) if len(moves) else math.nan,
    }


# --- reading files ---------------------------------------------------------------


def _check_mapping(columns: Mapping[str, str] | None) -> dict[str, str]:
    mapping = dict(columns or {})
    unknown = [name for name in mapping if name not in COLUMNS]
    if unknown:
        raise ValueError(
            f"unknown column name(s) {', '.join(unknown)}: map one of {', '.join(COLUMNS)}"
        )
    return mapping


def _read_preset(
    path: Path,
    preset: formats.InputFormat,
    mapping: Mapping[str, str],
    workload: str | None,
    node: str | None,
) -> pd.DataFrame:
    """A tool's file through its preset: the preset's column for each name, unless mapped."""
    parsed = formats.read(path, preset, formats.Names(node, workload))
    origin = _Origin(str(path), parsed.lines)
    columns = {**parsed.columns, **mapping}
    return _normalise(parsed.frame, origin, columns, None, parsed.header_line, ordered=True)


def _read_file(path: Path) -> tuple[pd.DataFrame, _Origin, int | None]:
    """The file's rows as they are, where each came from, and the header's line (CSV)."""
    suffix = path.suffix.lower()
    if suffix not in CSV_SUFFIXES + PARQUET_SUFFIXES + LP_SUFFIXES:
        raise ProfileError(
            path,
            f"unknown file type {suffix or '(none)'!r}: give .csv, .parquet/.pq or .lp/.line,"
            f" or a tool's output with --input-format {formats.METAVAR}",
        )
    if suffix in PARQUET_SUFFIXES:
        try:
            raw = pd.read_parquet(path)
        except (OSError, ValueError) as exc:  # pyarrow's errors are ValueErrors or OSErrors
            raise ProfileError(path, f"cannot read as Parquet: {exc}") from None
        if raw.empty:
            raise ProfileError(path, "empty file: no rows")
        return raw.reset_index(drop=True), _Origin(str(path), np.arange(1, len(raw) + 1)), None
    text = read_input_text(path)
    if suffix in CSV_SUFFIXES:
        return _read_csv(path, text)
    return _read_lp(path, text)


def _read_csv(path: Path, text: str) -> tuple[pd.DataFrame, _Origin, int | None]:
    reader = csv.reader(io.StringIO(text, newline=""))
    header: list[str] | None = None
    header_line = 1
    rows: list[list[str]] = []
    lines: list[int] = []
    for fields in reader:
        if not fields or all(not f.strip() for f in fields):
            continue
        if header is None:
            header = [f.strip() for f in fields]
            header_line = reader.line_num
            dupes = sorted({h for h in header if header.count(h) > 1})
            if dupes:
                raise ProfileError(path, f"column(s) {', '.join(dupes)} twice in the header", 1)
            continue
        if len(fields) != len(header):
            raise ProfileError(
                path, f"{len(fields)} fields where the header has {len(header)}", reader.line_num
            )
        rows.append(fields)
        lines.append(reader.line_num)
    if header is None:
        raise ProfileError(path, "empty file: need a header line and rows", 1)
    if not rows:
        raise ProfileError(path, "no data rows after the header", header_line + 1)
    raw = pd.DataFrame(rows, columns=header, dtype=object)
    return raw, _Origin(str(path), np.asarray(lines)), header_line


def _read_lp(path: Path, text: str) -> tuple[pd.DataFrame, _Origin, int | None]:
    from powerd.telemetry_schema import parse_line

    records: list[dict[str, Any]] = []
    lines: list[int] = []
    others: set[str] = set()
    for number, raw_line in enumerate(text.splitlines(), start=1):
        if not raw_line.strip() or raw_line.lstrip().startswith("#"):
            continue
        try:
            point = parse_line(raw_line)
        except ValueError as exc:
            raise ProfileError(path, f"not line protocol: {exc}", number) from None
        if point.measurement != LP_MEASUREMENT:
            others.add(point.measurement)
            continue
        if point.ts_ns is None:
            raise ProfileError(path, "point without a timestamp", number)
        record: dict[str, Any] = {**point.tags, **point.fields}
        record["time"] = point.ts_ns / 1e9
        records.append(record)
        lines.append(number)
    if not records:
        found = f" (only {', '.join(sorted(others))})" if others else ""
        raise ProfileError(path, f"empty file: no {LP_MEASUREMENT!r} points{found}", 1)
    raw = pd.DataFrame.from_records(records)
    return raw, _Origin(str(path), np.asarray(lines)), lines[0]


# --- InfluxDB --------------------------------------------------------------------


def _influxql_get(
    url: str, query: str, *, token: str | None, database: str, timeout_s: float
) -> dict[str, Any]:
    params = urllib.parse.urlencode({"db": database, "q": query, "epoch": "ns"})
    request = urllib.request.Request(f"{url.rstrip('/')}/query?{params}")
    if token:
        if ":" in token:  # InfluxDB 1.x user:password
            basic = base64.b64encode(token.encode()).decode()
            request.add_header("Authorization", f"Basic {basic}")
        else:
            request.add_header("Authorization", f"Token {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace").strip()
        with contextlib.suppress(ValueError, AttributeError):  # InfluxDB's {"error": ...}
            detail = json.loads(detail).get("error", detail)
        raise ProfileError(url, f"HTTP {exc.code}: {detail or exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ProfileError(url, f"cannot reach InfluxDB: {reason}") from None
    try:
        answer: dict[str, Any] = json.loads(body)
        return answer
    except ValueError:
        raise ProfileError(url, "the answer is not JSON: is this InfluxDB's /query?") from None


def _flux_frame(
    url: str, query: str, *, token: str | None, org: str | None, timeout_s: float
) -> pd.DataFrame:
    from influxdb_client.client.influxdb_client import InfluxDBClient

    try:
        with InfluxDBClient(
            url=url, token=token or "", org=org or "", timeout=int(timeout_s * 1000)
        ) as client:
            tables = client.query_api().query(query)
    except Exception as exc:  # the client raises its own, urllib3's and socket errors
        raise ProfileError(url, f"Flux query failed: {exc}") from None
    return flux_records_frame([record.values for table in tables for record in table.records])


def flux_records_frame(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows of a Flux answer (``FluxRecord.values``) as a frame; unpivoted fields are pivoted."""
    raw = pd.DataFrame.from_records(list(records))
    raw = raw.drop(columns=[c for c in ("result", "table") if c in raw.columns])
    if "_field" in raw.columns and "_value" in raw.columns:
        keys = [c for c in raw.columns if c not in ("_field", "_value", "_start", "_stop")]
        raw = raw.pivot_table(
            index=keys, columns="_field", values="_value", aggfunc="first", dropna=False
        )
        raw = raw.dropna(how="all").reset_index()
        raw.columns.name = None
    return raw


# --- normalising -----------------------------------------------------------------


def _resolve(
    found: Sequence[str],
    origin: _Origin,
    mapping: Mapping[str, str],
    workload: str | None,
    header_line: int | None,
) -> dict[str, str]:
    """Normalised name -> the source's column, or ProfileError naming what is missing."""
    resolved: dict[str, str] = {}
    wrong_maps: list[str] = []
    for name in COLUMNS:
        if name in mapping:
            if mapping[name] in found:
                resolved[name] = mapping[name]
            else:
                wrong_maps.append(f"{name}={mapping[name]}")
            continue
        for candidate in (name, *ALIASES.get(name, ())):
            if candidate in found:
                resolved[name] = candidate
                break
    missing = [n for n in REQUIRED if n not in resolved and not (n == "workload" and workload)]
    if not missing and not wrong_maps:
        return resolved
    problems = []
    if wrong_maps:
        problems.append(f"mapped column(s) not there: {', '.join(wrong_maps)}")
    if missing:
        problems.append(f"missing column(s) {', '.join(missing)}")
    hints = [shlex.quote(f"{n}={h}") for n, h in _hints(missing, found, resolved.values())]
    suggestion = " --column ".join(["", *hints]).strip() if hints else "--column NAME=COLUMN"
    if "workload" in missing:
        suggestion += " (or --workload NAME for a file of one workload)"
    message = (
        f"{'; '.join(problems)}; found: {', '.join(map(str, found)) or 'nothing'};"
        f" map names with {suggestion}"
    )
    line = header_line if header_line is not None else None
    raise ProfileError(origin.source, message, line)


def _hints(missing: Sequence[str], found: Sequence[str], used: Any) -> list[tuple[str, str]]:
    """A column for each missing name, each column once: by its words for every name
    first (gpu=index), then by spelling (difflib) for the names left."""
    free = [str(c) for c in found if c not in set(used)]
    hinted: dict[str, str] = {}
    for name in missing:
        words = _HINTS.get(name, ())
        column = next((c for w in words for c in free if w in c.lower()), None)
        if column is not None:
            hinted[name] = column
            free.remove(column)
    for name in missing:
        if name not in hinted and (close := difflib.get_close_matches(name, free, 1, 0.6)):
            hinted[name] = close[0]
            free.remove(close[0])
    return [(name, hinted[name]) for name in missing if name in hinted]


def _label(name: str, column: str) -> str:
    return name if name == column else f"{name} (column {column!r})"


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None


def _blank(values: pd.Series) -> np.ndarray:
    text = values.astype("string").str.strip()
    blank: np.ndarray = (values.isna() | (text == "").fillna(True)).to_numpy(dtype=bool)
    return blank


def _floats(
    values: pd.Series, origin: _Origin, label: str, need: str = "not a number"
) -> np.ndarray:
    """Numbers; NaN where blank or 'nan'. Raises for text that is no number, and for inf."""
    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        result = values.to_numpy(dtype="float64", na_value=np.nan)
    else:
        text = values.astype("string").str.strip()
        result = pd.to_numeric(text, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
        said_nan = (text.str.lower() == "nan").fillna(False).to_numpy(dtype=bool)
        bad = np.isnan(result) & ~_blank(values) & ~said_nan
        if (row := _first(bad)) is not None:
            raise origin.error(f"{label} is {values.iloc[row]!r}: {need}", row)
    if (row := _first(np.isinf(result))) is not None:
        raise origin.error(f"{label} is {values.iloc[row]!r}: need a finite number", row)
    finite: np.ndarray = result
    return finite


def _times(values: pd.Series, origin: _Origin, label: str) -> np.ndarray:
    if pd.api.types.is_datetime64_any_dtype(values):
        stamps = pd.to_datetime(values, utc=True)
    else:
        blank = _blank(values)
        if (row := _first(blank)) is not None:
            raise origin.error(f"{label} is empty: every sample needs its time", row)
        numbers = pd.to_numeric(values.astype("string").str.strip(), errors="coerce")
        if not pd.isna(numbers.iloc[0]):
            seconds = _floats(values, origin, label)
            if (row := _first(np.isnan(seconds))) is not None:
                raise origin.error(f"{label} is {values.iloc[row]!r}: not a number", row)
            if np.median(np.abs(seconds)) > MAX_TIME_S:
                raise origin.error(
                    f"{label} is {values.iloc[0]!r}: looks like ms, µs or ns since the epoch"
                    f" (above {MAX_TIME_S:.0e}); give seconds",
                    0,
                )
            return seconds
        stamps = pd.to_datetime(
            values.astype("string").str.strip(), utc=True, format="ISO8601", errors="coerce"
        )
    if (row := _first(stamps.isna().to_numpy(dtype=bool))) is not None:
        raise origin.error(
            f"{label} is {values.iloc[row]!r}: not Unix seconds or an ISO-8601 time", row
        )
    epoch = pd.Timestamp("1970-01-01", tz="UTC")
    unix_s: np.ndarray = ((stamps - epoch) / pd.Timedelta(seconds=1)).to_numpy(dtype="float64")
    return unix_s


def _strings(values: pd.Series) -> pd.Series:
    text = values.astype("string").str.strip()
    return text.mask(text == "")


def _normalise(
    raw: pd.DataFrame,
    origin: _Origin,
    mapping: Mapping[str, str],
    workload: str | None,
    header_line: int | None,
    *,
    ordered: bool,
) -> pd.DataFrame:
    """The source's rows in the normalised form, checked; with ``_source`` and ``_line``."""
    cols = _resolve([str(c) for c in raw.columns], origin, mapping, workload, header_line)
    raw = raw.reset_index(drop=True)
    raw.columns = [str(c) for c in raw.columns]
    out: dict[str, Any] = {}
    label = {name: _label(name, cols[name]) for name in cols}

    out["time_s"] = _times(raw[cols["time_s"]], origin, label["time_s"])

    node = _strings(raw[cols["node"]])
    if (row := _first(node.isna().to_numpy(dtype=bool))) is not None:
        raise origin.error(f"{label['node']} is empty: every sample needs its node", row)
    out["node"] = node

    need_index = "need a GPU index (0, 1, ...)"
    gpu = _floats(raw[cols["gpu"]], origin, label["gpu"], need_index)
    bad = np.isnan(gpu) | (gpu < 0) | (np.mod(np.nan_to_num(gpu), 1) != 0)
    if (row := _first(bad)) is not None:
        value = raw[cols["gpu"]].iloc[row]
        raise origin.error(f"{label['gpu']} is {value!r}: need a GPU index (0, 1, ...)", row)
    out["gpu"] = gpu.astype(np.int64)

    names = _strings(raw[cols["workload"]]) if "workload" in cols else None
    if names is None:
        names = pd.Series([workload] * len(raw), dtype="string")
    elif workload:
        names = names.fillna(workload)
    if (row := _first(names.isna().to_numpy(dtype=bool))) is not None:
        raise origin.error(
            f"{label['workload']} is empty: give --workload NAME for samples without one", row
        )
    out["workload"] = names

    power = _floats(raw[cols["power_w"]], origin, label["power_w"])
    if (row := _first(np.isnan(power))) is not None:
        raise origin.error(
            f"{label['power_w']} is {raw[cols['power_w']].iloc[row]!r}: need the power in W"
            " (empty or NaN)",
            row,
        )
    if (row := _first(power < 0)) is not None:
        raise origin.error(f"{label['power_w']} is {power[row]:g}: power cannot be negative", row)
    out["power_w"] = power

    for name in ("cap_w", "cap_max_w", "clock_mhz", "throughput"):
        if name not in cols:
            out[name] = np.full(len(raw), np.nan)
            continue
        values = _floats(raw[cols[name]], origin, label[name])
        if (row := _first(values < 0)) is not None:
            raise origin.error(f"{label[name]} is {values[row]:g}: cannot be negative", row)
        out[name] = values
    out["phase"] = (
        _strings(raw[cols["phase"]]) if "phase" in cols else pd.Series([pd.NA] * len(raw))
    )

    frame = pd.DataFrame({name: _values(out[name]) for name in COLUMNS})
    frame["_line"] = origin.lines
    frame["_source"] = origin.source
    frame["_row"] = np.arange(len(frame))
    _check_order(frame, origin, ordered)
    _check_units(frame, origin)
    return frame


def _values(values: Any) -> Any:
    return values.to_numpy() if isinstance(values, pd.Series) else values


def _check_order(frame: pd.DataFrame, origin: _Origin, ordered: bool) -> None:
    """Each GPU's times must increase (in file order when ``ordered``, else once sorted)."""
    view = frame if ordered else frame.sort_values(["node", "gpu", "time_s"], kind="stable")
    series = view.groupby(["node", "gpu"], sort=False)
    prev_time = series["time_s"].shift()
    prev_row = series["_row"].shift()
    bad = (view["time_s"] <= prev_time).to_numpy(dtype=bool)
    if (pos := _first(bad)) is None:
        return
    row = int(view["_row"].iloc[pos])
    before = int(prev_row.iloc[pos])
    where = f"line {int(origin.lines[before])}" if origin.rows_are_lines else "another row"
    what = "out of order" if view["time_s"].iloc[pos] < prev_time.iloc[pos] else "a duplicate"
    raise origin.error(
        f"time {view['time_s'].iloc[pos]:.6f} of node {view['node'].iloc[pos]} GPU"
        f" {view['gpu'].iloc[pos]} is {what}: not after {prev_time.iloc[pos]:.6f} on {where};"
        " each GPU's samples must be in time order",
        row,
    )


def _check_units(frame: pd.DataFrame, origin: _Origin) -> None:
    """A GPU's median power tells a column in mW or kW."""
    grouped = frame.groupby(["node", "gpu"], sort=False)
    medians = grouped["power_w"].median()
    first_rows = grouped["_row"].min()
    for (node, gpu), median_w in medians.items():
        if median_w > MW_MEDIAN_W:
            unit = f"above {MW_MEDIAN_W:.0f} W, which no GPU draws: is the column in mW?"
        elif 0 < median_w < KW_MEDIAN_W:
            unit = f"non-zero and below {KW_MEDIAN_W:.0f} W, under any GPU's idle: in kW?"
        else:
            continue
        raise origin.error(
            f"median power of node {node} GPU {gpu} is {median_w:g} W, {unit} give watts",
            int(first_rows[(node, gpu)]),
        )


def _combine(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One table; the same sample from two sources is an error."""
    table = pd.concat(frames, ignore_index=True)
    key = ["workload", "node", "gpu", "time_s"]
    dupes = table.duplicated(key, keep="first").to_numpy(dtype=bool)
    if (pos := _first(dupes)) is not None:
        row = table.iloc[pos]
        first = table[(table[key] == row[key]).all(axis=1)].iloc[0]
        raise ProfileError(
            row["_source"],
            f"sample of node {row['node']} GPU {row['gpu']} at {row['time_s']:.6f} is also"
            f" in {first['_source']}:{first['_line']}: the same profile given twice?",
            int(row["_line"]),
        )
    table = table.sort_values(key, kind="stable", ignore_index=True)[list(COLUMNS)]
    dtypes = {name: "float64" for name in FLOAT_COLUMNS}
    dtypes.update({"node": "string", "workload": "string", "phase": "string", "gpu": "int64"})
    return table.astype(dtypes)
