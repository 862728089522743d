"""Slurm-style host lists (``r01-n[03-05,07],gpu7``), for ``$POWERD_NODES`` and
``$SLURM_JOB_NODELIST``."""

from __future__ import annotations

import itertools
import math
import re

__all__ = ["expand_hostlist"]

_MAX_HOSTS = 100_000  # a list, or one range, expanding to more is refused


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
                raise ValueError(f"unbalanced ']' in host list {spec!r}")
        if depth == 0 and (char == "," or char.isspace()):
            if current:
                items.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {spec!r}")
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
                raise ValueError(f"nested brackets in host list {spec!r}")
            else:
                choices.append([part])
        count = math.prod(len(c) for c in choices)
        if len(hosts) + count > _MAX_HOSTS:
            raise ValueError(f"host list {spec!r} expands to too many names")
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def _expand_range(body: str, spec: str) -> list[str]:
    """The names one bracket stands for: ``"03-05,07"`` -> ``["03", "04", "05", "07"]``
    (zero padding kept); ``spec`` is the whole list, for the error message."""
    out: list[str] = []
    for piece in body.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", piece.strip())
        if not match:
            raise ValueError(f"bad range {piece!r} in host list {spec!r}")
        start, end = match.group(1), match.group(2) or match.group(1)
        if int(end) < int(start) or int(end) - int(start) > _MAX_HOSTS:
            raise ValueError(f"bad range {piece!r} in host list {spec!r}")
        width = len(start)
        out.extend(f"{n:0{width}d}" for n in range(int(start), int(end) + 1))
    return out
