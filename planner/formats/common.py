"""What every preset shares: its result, the node and workload names it defaults to, time text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from planner.errors import ProfileError


@dataclass(frozen=True)
class Parsed:
    """A tool's file as rows the profile reader normalises.

    ``frame`` keeps the tool's own names (nvidia-smi fields, DCGM metrics and labels, Zeus
    columns) with numbers already parsed and times in Unix seconds; ``columns`` maps each
    normalised name to the frame's column that holds it (``--column`` overrides it);
    ``lines`` is each row's 1-based line in the file.
    """

    frame: pd.DataFrame
    lines: np.ndarray
    columns: dict[str, str]
    header_line: int | None = None


@dataclass(frozen=True)
class Names:
    """The node and workload of a file's samples: given, else the file's stem."""

    node: str | None
    workload: str | None

    def node_of(self, path: Path) -> str:
        return self.node or path.stem

    def workload_of(self, path: Path) -> str:
        return self.workload or path.stem


class NotThisFormat(ProfileError):
    """The file is not what the preset reads at all (the dispatcher adds which one it is)."""


def with_names(frame: pd.DataFrame, node: str | None, workload: str) -> dict[str, str]:
    """Add ``node`` (when given) and ``workload`` columns under free names; their mapping."""
    columns: dict[str, str] = {}
    for name, value in (("node", node), ("workload", workload)):
        if value is None:
            continue
        column = name
        while column in frame.columns:
            column = f"_{column}"
        frame[column] = value
        columns[name] = column
    return columns


def naive_unix_s(text: Sequence[str], formats: Sequence[str]) -> np.ndarray:
    """Unix seconds of local times without a zone, read as UTC; NaN where no format fits."""
    values = pd.Series(list(text), dtype="string").str.strip()
    stamps = pd.Series(pd.NaT, index=values.index, dtype="datetime64[ns]")
    for fmt in formats:
        missing = stamps.isna()
        if not missing.any():
            break
        stamps[missing] = pd.to_datetime(values[missing], format=fmt, errors="coerce")
    epoch = pd.Timestamp("1970-01-01")
    seconds: np.ndarray = ((stamps - epoch) / pd.Timedelta(seconds=1)).to_numpy(
        dtype="float64", na_value=np.nan
    )
    return seconds


def unix_s_of(text: str) -> float | None:
    """Unix seconds, or ISO-8601 (UTC without an offset); None if it is neither."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def first_lines(text: str, count: int) -> list[tuple[int, str]]:
    """The first ``count`` non-blank lines, stripped, with their 1-based numbers."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            found.append((number, line.strip()))
            if len(found) == count:
                break
    return found
