"""dcgm-exporter scrapes (Prometheus text exposition), as the profile table's rows.

A scrape of dcgm-exporter's ``/metrics`` (its counters file, ``etc/default-counters.csv``,
names the fields and units) holds one sample per GPU per field:
``DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-...",device="nvidia0",modelName="...",
Hostname="node1",...} 312.45``, with ``# HELP``/``# TYPE`` lines, and no time. A file may
hold many scrapes; each sample's time is, in this order:

- its own timestamp (ms since the epoch, after the value: Prometheus's text format, as
  ``/federate`` writes it);
- else the last ``# scrape at TIME`` line above it (TIME in Unix seconds or ISO-8601, UTC
  without an offset), a line the collecting loop writes before each scrape:
  ``while sleep 1; do echo "# scrape at $(date +%s.%N)"; curl -s NODE:9400/metrics; done``;
- else the file is refused: scrapes without a time cannot be put in order.

Read: power from ``DCGM_FI_DEV_POWER_USAGE`` (W), else ``DCGM_FI_DEV_POWER_USAGE_INSTANT``,
else the change of ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ) over the time between a
GPU's samples (its first sample then has none); the cap from
``DCGM_FI_DEV_ENFORCED_POWER_LIMIT``, else ``DCGM_FI_DEV_POWER_MGMT_LIMIT``; the GPU's
maximum cap from ``DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX`` (not in the default counters: add it
to tell capped samples); the SM clock from ``DCGM_FI_DEV_SM_CLOCK``; the GPU from the
``gpu`` label, the node from ``Hostname``. A scrape in which a GPU has no power sample
gives no row for it; samples of a MIG instance (a ``GPU_I_ID``) are left out: power is
the whole GPU's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from planner.errors import ProfileError
from planner.formats.common import Names, NotThisFormat, Parsed, unix_s_of, with_names

NAME = "dcgm"
PREFIX = "DCGM_FI_"
POWER = ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_POWER_USAGE_INSTANT")
ENERGY_MJ = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
CAP = ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT")
CLOCK = "DCGM_FI_DEV_SM_CLOCK"
CAP_MAX = "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX"  # tells a capped sample (planner.censored)
SCRAPE_AT = re.compile(r"^#\s*scrape at\s+(\S+)\s*$")
COLLECT = (
    'while sleep 1; do echo "# scrape at $(date +%s.%N)"; curl -s NODE:9400/metrics; done'
    " >> NODE.prom"
)
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


@dataclass
class _Row:
    time_s: float
    line: int
    labels: dict[str, str]
    values: dict[str, float] = field(default_factory=dict)
    value_lines: dict[str, int] = field(default_factory=dict)


def looks_like(lines: list[str]) -> bool:
    """Prometheus text whose first sample, or # HELP/# TYPE line, is a DCGM field."""
    for line in lines:
        if line.startswith(("# HELP ", "# TYPE ")):
            return line[7:].startswith(PREFIX)
        if not line.startswith("#"):
            return line.startswith(PREFIX)
    return False


def read(path: Path, text: str, names: Names) -> Parsed:
    rows = _rows(path, text)
    metrics = {m for row in rows for m in row.values}
    power = next((m for m in POWER if m in metrics), None)
    if power is None and ENERGY_MJ not in metrics:
        raise ProfileError(
            path,
            f"no {' or '.join(POWER)} or {ENERGY_MJ} samples: add"
            " DCGM_FI_DEV_POWER_USAGE to the exporter's counters (its default-counters.csv"
            " has it)",
        )
    frame = _frame(rows, metrics)
    source = power or ENERGY_MJ
    lines = np.asarray([row.value_lines.get(source, row.line) for row in rows])
    if power is None:
        power = "power_w_from_energy"
        frame[power] = _power_from_energy(frame)
    keep = _with_power(path, frame, power, source, lines)
    frame = frame[keep].reset_index(drop=True)
    columns = {"time_s": "time_s", "gpu": "gpu", "power_w": power}
    cap = next((m for m in CAP if m in metrics), None)
    if cap is not None:
        columns["cap_w"] = cap
    if CLOCK in metrics:
        columns["clock_mhz"] = CLOCK
    if CAP_MAX in metrics:
        columns["cap_max_w"] = CAP_MAX
    hostname = "Hostname" in frame.columns and bool(frame["Hostname"].notna().all())
    if hostname and names.node is None:
        columns["node"] = "Hostname"
    node = None if "node" in columns else names.node_of(path)
    columns.update(with_names(frame, node, names.workload_of(path)))
    return Parsed(frame, lines[keep], columns)


def _rows(path: Path, text: str) -> list[_Row]:
    """One row per (time, Hostname, gpu), in the order the file gives them."""
    rows: dict[tuple[float, str, str], _Row] = {}
    scrape_s: float | None = None
    seen_dcgm = False
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if (marker := SCRAPE_AT.match(line)) is not None:
                scrape_s = unix_s_of(marker.group(1))
                if scrape_s is None:
                    raise ProfileError(
                        path, f"{marker.group(1)!r}: not Unix seconds or ISO-8601", number
                    )
            continue
        sample = _SAMPLE.match(line)
        if sample is None:
            raise _not_text(path, line, number, seen_dcgm)
        name, label_text, value_text, stamp_ms = sample.groups()
        if not name.startswith(PREFIX):
            continue
        seen_dcgm = True
        labels = _labels(path, label_text or "", number)
        if "gpu" not in labels or labels.get("GPU_I_ID"):
            continue
        time_s = int(stamp_ms) / 1000 if stamp_ms is not None else scrape_s
        if time_s is None:
            raise ProfileError(
                path,
                "a sample without a time: dcgm-exporter's scrapes have none; write"
                f" '# scrape at UNIX_S' before each one ({COLLECT}), or give samples with"
                " their timestamps (Prometheus's /federate)",
                number,
            )
        key = (time_s, labels.get("Hostname", ""), labels["gpu"])
        row = rows.setdefault(key, _Row(time_s, number, labels))
        if name in row.value_lines:
            raise ProfileError(
                path,
                f"{name} of GPU {labels['gpu']} again at the same time as line"
                f" {row.value_lines[name]}: scrapes without a '# scrape at' line between them?",
                number,
            )
        row.values[name] = _value(path, value_text, name, number)
        row.value_lines[name] = number
    if not rows:
        raise NotThisFormat(path, f"no {PREFIX}* samples with a gpu label")
    return list(rows.values())


def _not_text(path: Path, line: str, number: int, seen_dcgm: bool) -> ProfileError:
    problem = f"not Prometheus text: {line[:80]!r}"
    return ProfileError(path, problem, number) if seen_dcgm else NotThisFormat(path, problem)


def _labels(path: Path, text: str, number: int) -> dict[str, str]:
    labels: dict[str, str] = {}
    position = 0
    text = text.strip().rstrip(",")
    while position < len(text):
        match = _LABEL.match(text, position)
        if match is None:
            raise ProfileError(path, f'labels not name="value": {text[position:][:60]!r}', number)
        labels[match.group(1)] = match.group(2).replace('\\"', '"').replace("\\\\", "\\")
        position = match.end()
    return labels


def _value(path: Path, text: str, name: str, number: int) -> float:
    try:
        return float(text)
    except ValueError:
        raise ProfileError(path, f"{name} is {text!r}: not a number", number) from None


def _frame(rows: list[_Row], metrics: set[str]) -> pd.DataFrame:
    label_names = sorted({label for row in rows for label in row.labels})
    data: dict[str, object] = {
        "time_s": [row.time_s for row in rows],
        **{label: [row.labels.get(label) for row in rows] for label in label_names},
    }
    for metric in sorted(metrics):
        data[metric] = [row.values.get(metric, np.nan) for row in rows]
    return pd.DataFrame(data)


def _power_from_energy(frame: pd.DataFrame) -> np.ndarray:
    """W from the energy counter (mJ): its change over the time since the GPU's last sample."""
    keys = [c for c in ("Hostname", "gpu") if c in frame.columns]
    ordered = frame.sort_values("time_s", kind="stable")
    grouped = ordered.groupby(keys, sort=False, dropna=False)
    energy_j = grouped[ENERGY_MJ].diff() / 1000.0
    step_s = grouped["time_s"].diff()
    power: np.ndarray = (energy_j / step_s).reindex(frame.index).to_numpy(dtype=float)
    return power


def _with_power(
    path: Path, frame: pd.DataFrame, power: str, source: str, lines: np.ndarray
) -> np.ndarray:
    """Rows with a power value; a GPU with none at all is an error."""
    has: np.ndarray = frame[power].notna().to_numpy(dtype=bool)
    keys = [c for c in ("Hostname", "gpu") if c in frame.columns]
    for _, rows in frame.groupby(keys, sort=False, dropna=False).indices.items():
        if not has[rows].any():
            first = int(rows[0])
            gpu = frame["gpu"].iloc[first]
            need = " (the energy counter needs two samples)" if source == ENERGY_MJ else ""
            raise ProfileError(path, f"GPU {gpu} has no {source} sample{need}", int(lines[first]))
    return has
