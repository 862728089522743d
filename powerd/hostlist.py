"""Slurm-style host lists (``r01-n[03-05,07],gpu7``): ``$POWERD_NODES`` and
``$SLURM_JOB_NODELIST`` for the job hook, and a large job's nodes on the wire (a phase
event's ``hostlist``, docs/PROTOCOL.md), where the controller expands what anyone sent.
So a list is parsed and counted before any name is made (``MAX_HOSTS`` names in all),
and the controller expands it only against the site's names (``expand_within``): a
list longer than the site is refused unexpanded, and a name no node of the site starts
like is dropped at its first literal, not built with every number in its brackets."""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections.abc import Iterable, Sequence

__all__ = [
    "MAX_HOSTS",
    "SiteNames",
    "compress_hostlist",
    "count_hosts",
    "expand_hostlist",
    "expand_within",
    "parse_hostlist",
]

MAX_HOSTS = 100_000  # a list expanding to more is refused (the 1 GW site has ~140,000 GPUs)
_NUMBERED = re.compile(r"\A(.*?)(\d+)\Z")  # a name's last run of digits, at its end

Range = tuple[int, int, int]  # first, last, zero-padded width
Part = str | tuple[Range, ...]  # a literal, or a bracket's ranges
Item = tuple[Part, ...]  # one comma-separated item: its parts in order


def parse_hostlist(spec: str, limit: int = MAX_HOSTS) -> list[Item]:
    """The items of a host list, with no name made; ValueError on a malformed list or
    one that names more than ``limit`` hosts (counted before anything is built)."""
    items: list[Item] = []
    total = 0
    for text in _split_items(spec):
        item = _parse_item(text, spec, limit)
        total += _item_count(item)
        if total > limit:
            raise ValueError(f"host list {_shown(spec)} expands to too many names")
        items.append(item)
    return items


def count_hosts(spec: str) -> int:
    """How many names ``spec`` expands to, without making them."""
    return sum(_item_count(item) for item in parse_hostlist(spec))


def expand_hostlist(spec: str) -> list[str]:
    """Expand a Slurm-style host list: ``"r01-n[03-05,07],gpu7"`` -> five names.

    Raises ValueError on a malformed list.
    """
    hosts: list[str] = []
    for item in parse_hostlist(spec):
        choices = [[p] if isinstance(p, str) else _range_names(p) for p in item]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def first_name(item: Item) -> str:
    """The first name an item expands to, and the longest one's length: a check of its
    names' form without making them all."""
    return "".join(p if isinstance(p, str) else f"{p[0][0]:0{p[0][2]}d}" for p in item)


def longest_name(item: Item) -> int:
    return sum(
        len(p) if isinstance(p, str) else max(max(w, len(str(b))) for _, b, w in p) for p in item
    )


class SiteNames:
    """A site's node names, for ``expand_within``: a set, and the names sorted for a
    prefix test (does any name start with this?) in O(log n)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        self._sorted = sorted(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def starts_one(self, prefix: str) -> bool:
        at = bisect.bisect_left(self._sorted, prefix)
        return at < len(self._sorted) and self._sorted[at].startswith(prefix)

    def starting(self, prefix: str) -> list[str]:
        """The names that start with ``prefix``, in order."""
        first = bisect.bisect_left(self._sorted, prefix)
        last = bisect.bisect_left(self._sorted, prefix + "\U0010ffff")
        return self._sorted[first:last]


def expand_within(spec: str, site: SiteNames, limit: int) -> tuple[list[str], int]:
    """The names of ``site`` that ``spec`` gives, in its order, and how many of the names
    it gives are not the site's. ValueError (nothing made) on a malformed list or one
    giving more than ``limit`` names (a site's node count: no job has more nodes). A name
    is built a part at a time and dropped as soon as no site name starts with it."""
    found: list[str] = []
    total = 0
    for item in parse_hostlist(spec, limit):
        total += _item_count(item)
        partial = [""]
        for k, part in enumerate(item):
            if k == len(item) - 1 and not isinstance(part, str):
                partial = _last_bracket(partial, part, site)
                break
            pieces = [part] if isinstance(part, str) else _range_names(part)
            partial = [p + piece for p in partial for piece in pieces]
            partial = [p for p in partial if site.starts_one(p)]
            if not partial:
                break
        found.extend(name for name in partial if name in site.names)
    return found, total - len(found)


def _last_bracket(partial: list[str], ranges: tuple[Range, ...], site: SiteNames) -> list[str]:
    """The names an item's last bracket makes after each of ``partial``: from the site's
    names that start with the prefix when they are fewer than the bracket's numbers (a
    node's 18 names, not a stranger's 20,000 numbers), else from the numbers."""
    count = sum(b - a + 1 for a, b, _ in ranges)
    out: list[str] = []
    for prefix in partial:
        names = site.starting(prefix)
        if len(names) * len(ranges) < count:
            out += [n for n in names if _in_ranges(n[len(prefix) :], ranges)]
        else:
            out += [prefix + number for number in _range_names(ranges)]
    return out


def _in_ranges(digits: str, ranges: tuple[Range, ...]) -> bool:
    """Whether a bracket of ``ranges`` writes ``digits`` (its zero padding included)."""
    if not digits.isdigit():
        return False
    n = int(digits)
    return any(a <= n <= b and f"{n:0{w}d}" == digits for a, b, w in ranges)


def _split_items(spec: str) -> list[str]:
    """The comma- or space-separated items of a list, brackets kept whole."""
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for char in spec:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {_shown(spec)}")
        if depth == 0 and (char == "," or char.isspace()):
            if current:
                items.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {_shown(spec)}")
    if current:
        items.append("".join(current))
    return items


def _parse_item(text: str, spec: str, limit: int) -> Item:
    parts: list[Part] = []
    for part in re.split(r"(\[[^\[\]]*\])", text):
        if part.startswith("[") and part.endswith("]"):
            parts.append(_parse_ranges(part[1:-1], spec, limit))
        elif "[" in part or "]" in part:
            raise ValueError(f"nested brackets in host list {_shown(spec)}")
        elif part:
            parts.append(part)
    return tuple(parts)


def _item_count(item: Item) -> int:
    return math.prod(sum(b - a + 1 for a, b, _ in p) for p in item if not isinstance(p, str))


def _shown(spec: str) -> str:
    """``spec`` for an error message: a list off the wire may be 64 KiB."""
    return repr(spec) if len(spec) <= 80 else repr(spec[:77] + "...")


def _parse_ranges(body: str, spec: str, limit: int) -> tuple[Range, ...]:
    """A bracket's ranges: ``"03-05,07"`` -> ``((3, 5, 2), (7, 7, 2))`` (zero padding
    kept); ``spec`` is the whole list, for the error message. More than ``limit`` names
    in one bracket is refused at the first range past it."""
    ranges: list[Range] = []
    count = 0
    for piece in body.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", piece.strip())
        if not match:
            raise ValueError(f"bad range {_shown(piece)} in host list {_shown(spec)}")
        start, end = match.group(1), match.group(2) or match.group(1)
        if int(end) < int(start):
            raise ValueError(f"bad range {_shown(piece)} in host list {_shown(spec)}")
        count += int(end) - int(start) + 1
        if count > limit:
            raise ValueError(f"host list {_shown(spec)} expands to too many names")
        ranges.append((int(start), int(end), len(start)))
    return tuple(ranges)


def _range_names(ranges: Sequence[Range]) -> list[str]:
    """The numbers a bracket stands for, as written: ``["03", "04", "05", "07"]``."""
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
