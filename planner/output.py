"""One way every ``powerplan`` command prints its results: ``--format table|json|csv``."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import click
import pandas as pd

FORMATS = ("table", "json", "csv")


def write_whole(path: Path, write: Callable[[Path], object]) -> None:
    """The whole file or nothing: ``write`` fills a temporary file in the same
    directory, which is then renamed over ``path``; on any error it is removed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def column_mapping(pairs: tuple[str, ...]) -> dict[str, str]:
    """``--column NAME=COLUMN`` options (NAME one of the profile table's columns) as a dict."""
    from planner.profile_table import COLUMNS

    mapping: dict[str, str] = {}
    for pair in pairs:
        name, sep, column = pair.partition("=")
        name, column = name.strip(), column.strip()
        if not sep or not column or name not in COLUMNS:
            raise click.BadParameter(
                f"{pair!r}: give NAME=COLUMN with NAME one of {', '.join(COLUMNS)}",
                param_hint="--column",
            )
        mapping[name] = column
    return mapping


def format_option(default: str = "table"):
    """The ``--format`` option every command takes."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(FORMATS),
        default=default,
        show_default=True,
        help="table: for people; json: one document; csv: one table, for spreadsheets.",
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return _jsonable(value.item())
    if value is pd.NA or value is pd.NaT:
        return None
    return value


def emit(
    tables: dict[str, pd.DataFrame],
    fmt: str,
    *,
    extra: dict[str, Any] | None = None,
    out: IO[str] | None = None,
) -> None:
    """Print named tables (and, in JSON, ``extra`` scalars) in the chosen format.

    ``csv`` prints only the first table (a CSV file holds one table); ``json``
    prints ``{"<name>": [rows...], ...extra}``; ``table`` prints each table
    with its name as a title, then the extras as ``key: value`` lines.
    """
    out = out or sys.stdout
    if fmt == "json":
        doc: dict[str, Any] = {
            name: [_jsonable(row) for row in df.to_dict(orient="records")]
            for name, df in tables.items()
        }
        doc.update(_jsonable(extra or {}))
        out.write(json.dumps(doc, indent=2) + "\n")
        return
    if fmt == "csv":
        first = next(iter(tables.values()))
        first.to_csv(out, index=False)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out, width=200)
    for name, df in tables.items():
        table = Table(title=name)
        for column in df.columns:
            table.add_column(str(column), justify="right" if _numeric(df[column]) else "left")
        for row in df.itertuples(index=False):
            table.add_row(*[cell_text(v) for v in row])
        console.print(table)
    for key, value in (extra or {}).items():
        console.print(f"{key}: {cell_text(value)}")


def _numeric(series: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(series)


def cell_text(value: Any) -> str:
    if value is None or value is pd.NA:
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)
