"""Presets that read what common GPU tools write (``--input-format``) into profile rows.

One module per tool turns its file into :class:`planner.formats.common.Parsed` rows that
:mod:`planner.profiles` normalises and checks like any other input:

- ``nvidia-smi`` (:mod:`.nvidia_smi`): ``nvidia-smi --query-gpu=... --format=csv``;
  ``nvidia-smi:FIELDS`` for a file written with ``noheader``;
- ``dcgm`` (:mod:`.dcgm`): dcgm-exporter scrapes (Prometheus text);
- ``zeus`` (:mod:`.zeus`): Zeus's power monitor CSV or ``python -m zeus.monitor power``
  output; ``zeus:GPUS`` names a headerless CSV's GPUs.

:func:`detect` picks one without the flag where a file's first lines can be nothing else.
A command's choice reaches every read of its profiles through :func:`reading`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from planner.errors import ProfileError, read_input_text
from planner.formats import dcgm, nvidia_smi, zeus
from planner.formats.common import Names, NotThisFormat, Parsed, first_lines

__all__ = [
    "InputFormat",
    "Names",
    "Parsed",
    "chosen",
    "detect",
    "parse_format",
    "preset_for",
    "read",
    "reading",
]

PRESETS = (nvidia_smi.NAME, dcgm.NAME, zeus.NAME)
METAVAR = "nvidia-smi[:FIELDS]|dcgm|zeus[:GPUS]"
#: file types that are never a tool's text (read by their own readers)
NOT_TEXT = (".parquet", ".pq", ".lp", ".line")
_SNIFF_CHARS = 65536
PLAIN_NAMES = frozenset({"time_s", "time", "node", "gpu", "workload", "job", "power_w"})


@dataclass(frozen=True)
class InputFormat:
    """A preset and its argument: nvidia-smi's fields, or the GPUs of Zeus's CSV columns."""

    name: str
    fields: tuple[str, ...] = ()
    gpus: tuple[int, ...] = ()

    def __str__(self) -> str:
        extra = self.fields or tuple(str(g) for g in self.gpus)
        return f"{self.name}:{','.join(extra)}" if extra else self.name


def parse_format(text: str) -> InputFormat:
    """``nvidia-smi``, ``nvidia-smi:timestamp,index,power.draw``, ``dcgm``, ``zeus``,
    ``zeus:0,1``; ValueError saying what is accepted."""
    name, _, arg = text.strip().partition(":")
    items = tuple(item.strip() for item in arg.split(",") if item.strip())
    if name not in PRESETS:
        raise ValueError(f"{text!r}: give one of {METAVAR}")
    if name == nvidia_smi.NAME:
        bad = [f for f in items if not nvidia_smi.header_fields(f)]
        if bad:
            raise ValueError(f"{', '.join(bad)}: not nvidia-smi --query-gpu field names")
        if len(set(items)) != len(items):
            raise ValueError(f"{arg}: a field named twice")
        return InputFormat(name, fields=items)
    if name == zeus.NAME:
        if not all(item.isdigit() for item in items):
            raise ValueError(f"{text!r}: zeus:GPUS takes GPU indices, e.g. zeus:0,1")
        return InputFormat(name, gpus=tuple(int(item) for item in items))
    if items:
        raise ValueError(f"{text!r}: dcgm takes nothing after it (its samples name their GPUs)")
    return InputFormat(name)


def read(path: Path, chosen: InputFormat, names: Names) -> Parsed:
    """The file read by the preset; a file of another kind says which flag reads it."""
    text = read_input_text(path)
    try:
        if chosen.name == nvidia_smi.NAME:
            return nvidia_smi.read(path, text, names, chosen.fields)
        if chosen.name == dcgm.NAME:
            return dcgm.read(path, text, names)
        return zeus.read(path, text, names, chosen.gpus)
    except NotThisFormat as exc:
        other = _kind(first_lines(text[:_SNIFF_CHARS], 3))
        hint = f"; it looks like {other}: give --input-format {other}" if other else ""
        raise ProfileError(path, f"--input-format {chosen.name}: {exc.problem}{hint}") from None


def preset_for(path: Path, given: InputFormat | None) -> InputFormat | None:
    """The preset that reads ``path``: the one given, else the one :func:`detect` finds.

    A profile table is never a tool's output: Parquet, line protocol and a CSV with a
    ``power_w`` column are read by their own readers whatever is given, so they can be
    given beside a tool's files.
    """
    if given is None:
        return detect(path)
    if path.suffix.lower() in NOT_TEXT or "power_w" in _header_names(path):
        return None
    return given


def _header_names(path: Path) -> set[str]:
    try:
        with path.open(encoding="utf-8-sig", errors="replace") as handle:
            line = handle.readline()
    except OSError:
        return set()
    return {name.strip() for name in line.split(",")}


def detect(path: Path) -> InputFormat | None:
    """The preset a file's first lines can only be, else None (read it by its type).

    nvidia-smi's header, a DCGM scrape and Zeus's monitor output are read without the
    flag; the lines of a headerless nvidia-smi or Zeus CSV raise ProfileError naming the
    flag (which fields, which GPUs: the file does not say).
    """
    if path.suffix.lower() in NOT_TEXT:
        return None
    try:
        with path.open(encoding="utf-8-sig", errors="replace") as handle:
            head = handle.read(_SNIFF_CHARS)
    except OSError:
        return None  # the reader says why
    lines = first_lines(head, 3)
    kind = _kind(lines)
    if kind is not None:
        return InputFormat(kind)
    if lines and nvidia_smi.looks_like_row(lines[0][1]):
        count = len(lines[0][1].split(","))
        raise ProfileError(
            path,
            f"nvidia-smi rows without a header (--format=csv,noheader), {count} fields: give"
            f" them as queried, e.g. --input-format {nvidia_smi.NAME}:{nvidia_smi.EXAMPLE_QUERY}",
            lines[0][0],
        )
    if lines and zeus.looks_like_csv(lines[0][1]):
        raise ProfileError(
            path,
            "numbers without a header: Zeus's power CSV (time,W,W...)? give --input-format"
            " zeus (GPUs 0, 1, ...) or zeus:GPUS (the monitor's gpu_indices)",
            lines[0][0],
        )
    return None


def _kind(lines: list[tuple[int, str]]) -> str | None:
    texts = [text for _, text in lines]
    if dcgm.looks_like(texts):
        return dcgm.NAME
    if zeus.looks_like_log(texts):
        return zeus.NAME
    if nvidia_smi.looks_like(texts) and not _plain(texts[0]):
        return nvidia_smi.NAME
    return None


def _plain(header: str) -> bool:
    """A header with a profile table's own names (a file edited by hand) is not a tool's."""
    return bool({f.strip() for f in header.split(",")} & PLAIN_NAMES)


# --- a command's choice, for every profile it reads ------------------------------------

_CHOSEN: ContextVar[tuple[InputFormat | None, str | None]] = ContextVar(
    "planner_input_format", default=(None, None)
)


@contextlib.contextmanager
def reading(chosen: InputFormat | None, node: str | None) -> Iterator[None]:
    """While a command runs: the preset and node name its profile files are read with."""
    token = _CHOSEN.set((chosen, node))
    try:
        yield
    finally:
        _CHOSEN.reset(token)


def chosen() -> tuple[InputFormat | None, str | None]:
    """The command's ``--input-format`` and ``--node`` (None, None outside :func:`reading`)."""
    return _CHOSEN.get()
