"""One way every ``powerplan`` command prints its results: ``--format table|json|csv``."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

import click
import numpy as np
import pandas as pd

FC = TypeVar("FC", bound=Callable[..., Any])

FORMATS = ("table", "json", "csv")
PIPE_WIDTH = 100  # table width when the output is piped and $COLUMNS is not set
MIN_WIDTH = 40  # narrower than this, tables are laid out as if it were this wide
FOOTER_INDENT = "    "  # a footer value's continuation lines


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


def format_option(default: str = "table") -> Callable[[FC], FC]:
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

    width = terminal_width()
    console = Console(file=out, width=width)
    for name, df in tables.items():
        for table in rich_tables(name, df, width):
            console.print(table)
    for line in footer_lines(extra or {}, width):
        out.write(line + "\n")


def terminal_width() -> int:
    """Columns for ``--format table``: $COLUMNS, else the terminal's width, else
    :data:`PIPE_WIDTH` (piped, where no terminal says how wide a line may be)."""
    return max(MIN_WIDTH, shutil.get_terminal_size((PIPE_WIDTH, 24)).columns)


def column_blocks(df: pd.DataFrame, least: dict[str, int], width: int) -> list[list[str]]:
    """The table's columns in blocks that each fit ``width`` as a rich table (each column
    at its ``least`` width, at narrowest), each block led by the columns that name the
    row (:func:`_key_columns`).

    A table wider than the terminal is cut into blocks of whole columns, printed one
    under the other (as pandas wraps a wide frame), rather than shrunk or cut: every
    value stays on screen, a header is never cut (``share_c…``) and a number never
    wraps. Only text with spaces in it may wrap, and only between words.
    """
    columns = [str(c) for c in df.columns]
    if not columns:
        return []
    key = _key_columns(df)
    blocks: list[list[str]] = []
    block = list(key)
    for column in columns[len(key) :]:
        if len(block) > len(key) and _table_width([*block, column], least) > width:
            blocks.append(block)
            block = list(key)
        block.append(column)
    blocks.append(block)
    return blocks


def _key_columns(df: pd.DataFrame) -> list[str]:
    """The leading text columns that name a row (``name``; ``gpu`` and ``workload``),
    repeated in every block so each row can be told apart there: the fewest that are
    unique together, or every leading text column if none are."""
    key: list[str] = []
    for column in df.columns:
        if _numeric(df[column]):
            break
        key.append(str(column))
        if not df.duplicated(subset=key).any():
            break
    return key


def _natural_widths(df: pd.DataFrame) -> dict[str, int]:
    """Each column's width with nothing wrapped: its widest cell or header."""
    from rich.cells import cell_len

    return {
        str(c): max([cell_len(str(c)), *(cell_len(cell_text(v)) for v in df[c])])
        for c in df.columns
    }


def _least_widths(df: pd.DataFrame) -> dict[str, int]:
    """The narrowest each column can be: its widest cell for numbers (never wrapped),
    its longest word for text (wrapped between words); the header likewise."""
    from rich.cells import cell_len

    natural = _natural_widths(df)
    least: dict[str, int] = {}
    for c in df.columns:
        if _numeric(df[c]):
            least[str(c)] = natural[str(c)]
            continue
        words = [w for text in [str(c), *(cell_text(v) for v in df[c])] for w in text.split()]
        least[str(c)] = max([1, *(cell_len(w) for w in words)])
    return least


def _table_width(columns: list[str], widths: dict[str, int]) -> int:
    """Width of rich's default table: a border before every column and after the last,
    one space of padding either side of every cell."""
    return sum(widths[c] + 3 for c in columns) + 1


def _fitted_widths(
    block: list[str], natural: dict[str, int], least: dict[str, int], width: int
) -> dict[str, int]:
    """Column widths for one block: natural where the block fits, else the text columns
    narrowed in proportion to how far each can narrow (rich alone would narrow only the
    widest, wrapping it into many short lines while its neighbour keeps its width)."""
    excess = _table_width(block, natural) - width
    slack = {c: natural[c] - least[c] for c in block}
    total = sum(slack.values())
    if excess <= 0 or total <= 0:
        return {c: natural[c] for c in block}
    cut = {c: math.ceil(excess * slack[c] / total) for c in block}
    return {c: max(least[c], natural[c] - cut[c]) for c in block}


def rich_tables(name: str, df: pd.DataFrame, width: int) -> list[Any]:
    """``df`` as rich tables titled ``name``, in as many blocks as ``width`` needs."""
    from rich.table import Table
    from rich.text import Text

    natural, least = _natural_widths(df), _least_widths(df)
    blocks = column_blocks(df, least, width)
    tables = []
    for k, block in enumerate(blocks):
        title = name if len(blocks) == 1 else f"{name}: part {k + 1} of {len(blocks)}"
        table = Table(title=_title(title, width))
        widths = _fitted_widths(block, natural, least, width)
        for column in block:
            numeric = _numeric(df[column])
            table.add_column(
                Text(column),
                justify="right" if numeric else "left",
                no_wrap=numeric,
                width=widths[column],
            )
        for row in df[block].itertuples(index=False):
            table.add_row(*[Text(cell_text(v)) for v in row])
        tables.append(table)
    return tables


def _title(title: str, width: int) -> Any:
    """A table's title on one line where the terminal is wide enough for it, even over a
    narrower table (rich wraps a title to its table's width, mid-phrase)."""
    from rich.cells import cell_len
    from rich.text import Text

    if cell_len(title) <= width:
        return Text(title, no_wrap=True, overflow="ignore")
    return Text(title)


def footer_lines(extra: dict[str, Any], width: int) -> list[str]:
    """The ``key: value`` lines under the tables: values as text (:func:`cell_text`),
    a long one wrapped at spaces onto indented lines."""
    lines: list[str] = []
    for key, value in extra.items():
        text = f"{key}: {cell_text(value)}"
        lines += textwrap.wrap(
            text,
            width,
            subsequent_indent=FOOTER_INDENT,
            break_long_words=False,
            break_on_hyphens=False,
        ) or [text]
    return lines


def _numeric(series: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)


def cell_text(value: Any) -> str:
    """A value as a table cell or a footer shows it: numbers rounded, yes/no, and a
    dict or list as words (``GB200 1,046``), never a Python repr."""
    if value is None or value is pd.NA:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_nested_text(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple):
        return ", ".join(_nested_text(v) for v in value) or "-"
    if isinstance(value, np.generic) and not isinstance(value, float):  # numpy scalars
        return cell_text(value.item())
    if isinstance(value, float):
        return _float_text(value)
    return str(value)


SMALLEST_SHOWN = 1e-6  # closer to 0 than this (not 0), a cell says "<0.000001"


def _float_text(value: float) -> str:
    """Three significant digits, never in scientific notation (``6.94e-05`` is 0.0000694
    in a table people read): whole numbers with thousands separators from 1,000 up (999.7
    too, which ``.3g`` would write ``1e+03``), and a bound below a millionth."""
    if not math.isfinite(value):
        return "-"
    if abs(value) >= 999.5:
        return f"{value:,.0f}"
    if value == 0:
        return "0"
    if abs(value) < SMALLEST_SHOWN:
        return f">-{SMALLEST_SHOWN:.6f}" if value < 0 else f"<{SMALLEST_SHOWN:.6f}"
    text: str = np.format_float_positional(value, precision=3, unique=False, fractional=False)
    return text.rstrip("0").rstrip(".") if "." in text else text


def _nested_text(value: Any) -> str:
    """A dict or list inside a dict or list: in parentheses, so its commas stay its own."""
    text = cell_text(value)
    return f"({text})" if isinstance(value, dict | list | tuple) and len(value) > 1 else text
