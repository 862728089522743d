"""Slurm-style host lists (``r01-n[03-05,07],gpu7``): ``$POWERD_NODES`` and
``$SLURM_JOB_NODELIST`` for the job hook, and a large job's nodes on the wire (a phase
event's ``hostlist``, docs/PROTOCOL.md), where the controller expands what anyone sent:
so expanding is bounded (``MAX_HOSTS`` names in all, checked before they are made)."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable

__all__ = ["MAX_HOSTS", "compress_hostlist", "expand_hostlist"]

MAX_HOSTS = 100_000  # a list expanding to more is refused (the 1 GW site has ~140,000 GPUs)
_NUMBERED = re.compile(r"\A(.*?)(\d+)\Z")  # a name's last run of digits, at its end


def expand_hostlist(spec: str) -> list[str]:
    """Expand a Slurm-style host list: ``"r01-n[03-05,07],gpu7"`` -> five names.

    Raises ValueError on a malformed list.
    """
    items: list[str] = []
    depth = 0
    current = ""
    for char in spec:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {_shown(spec)}")
        if depth == 0 and (char == "," or char.isspace()):
            if current:
                items.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {_shown(spec)}")
    if current:
        items.append(current)
    hosts: list[str] = []
    for item in items:
        parts = re.split(r"(\[[^\[\]]*\])", item)
        choices: list[list[str]] = []
        for part in parts:
            if part.startswith("[") and part.endswith("]"):
                choices.append(_expand_range(part[1:-1], spec))
            elif "[" in part or "]" in part:
                raise ValueError(f"nested brackets in host list {_shown(spec)}")
            else:
                choices.append([part])
        count = math.prod(len(c) for c in choices)
        if len(hosts) + count > MAX_HOSTS:
            raise ValueError(f"host list {_shown(spec)} expands to too many names")
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def _shown(spec: str) -> str:
    """``spec`` for an error message: a list off the wire may be 64 KiB."""
    return repr(spec) if len(spec) <= 80 else repr(spec[:77] + "...")


def _expand_range(body: str, spec: str) -> list[str]:
    """The names one bracket stands for: ``"03-05,07"`` -> ``["03", "04", "05", "07"]``
    (zero padding kept); ``spec`` is the whole list, for the error message. More than
    ``MAX_HOSTS`` in one bracket is refused before any is made."""
    ranges: list[tuple[int, int, int]] = []
    count = 0
    for piece in body.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", piece.strip())
        if not match:
            raise ValueError(f"bad range {_shown(piece)} in host list {_shown(spec)}")
        start, end = match.group(1), match.group(2) or match.group(1)
        if int(end) < int(start):
            raise ValueError(f"bad range {_shown(piece)} in host list {_shown(spec)}")
        count += int(end) - int(start) + 1
        if count > MAX_HOSTS:
            raise ValueError(f"host list {_shown(spec)} expands to too many names")
        ranges.append((int(start), int(end), len(start)))
    return [f"{n:0{width}d}" for start, end, width in ranges for n in range(start, end + 1)]


def compress_hostlist(names: Iterable[str]) -> str:
    """A host list ``expand_hostlist`` turns back into ``names``, in their order: runs of
    names that differ only in a last number of the same width, one after the other,
    become one bracket (``r01-n01 r01-n02 r01-n03 r01-n07`` -> ``r01-n[01-03,07]``).
    For a 150 MW job: 10,368 nodes in 576 racks, 25 KB instead of 176 KB as a list."""
    items: list[str] = []
    prefix: str | None = None
    width = 0
    runs: list[list[int]] = []  # [first, last] numbers of the current prefix, in order

    def close() -> None:
        if prefix is None:
            return
        if len(runs) == 1 and runs[0][0] == runs[0][1]:
            items.append(f"{prefix}{runs[0][0]:0{width}d}")
            return
        body = ",".join(
            f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}" for a, b in runs
        )
        items.append(f"{prefix}[{body}]")

    for name in names:
        if not name or any(c in ",[]" or c.isspace() for c in name):  # what expand splits on
            raise ValueError(f"{name!r} cannot be part of a host list")
        match = _NUMBERED.match(name)
        if match is None:  # no number at its end: a list item of its own
            close()
            prefix, runs = None, []
            items.append(name)
            continue
        head, digits = match.group(1), match.group(2)
        number = int(digits)
        same = prefix == head and len(digits) == width
        if same and number == runs[-1][1] + 1:
            runs[-1][1] = number
        elif same and number > runs[-1][1] + 1:
            runs.append([number, number])
        else:  # another prefix or width, or out of order: a new item keeps the order
            close()
            prefix, width, runs = head, len(digits), [[number, number]]
    close()
    return ",".join(items)
