"""InfluxDB line protocol: the schema's building blocks (``Tag``, ``Field``, ``Measurement``),
escaping, timestamps, and reading a line back. It knows no measurement of its own:
``powerd.telemetry_schema`` names them.

Escaping follows the InfluxDB 2.x line protocol rules (which VictoriaMetrics
applies too): commas, spaces and equals signs escaped in tag keys, tag values
and field keys, double quotes and backslashes in string field values, and
backslashes doubled everywhere, so a value that ends in a backslash cannot
swallow the separator after it. Newlines, carriage returns and tabs, which
line protocol cannot carry, become the two characters ``\\n``, ``\\r``,
``\\t`` (as influxdb-client's ``Point`` writes them).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

FieldType = Literal["float", "int", "string"]
FLOAT: FieldType = "float"
INT: FieldType = "int"
STRING: FieldType = "string"


# --- line protocol: escaping ---------------------------------------------------

_MEASUREMENT_ESCAPES = str.maketrans(
    {"\\": "\\\\", ",": "\\,", " ": "\\ ", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
)
_KEY_ESCAPES = str.maketrans(
    {"\\": "\\\\", ",": "\\,", "=": "\\=", " ": "\\ ", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
)
# In a string field only \" and \\ are escapes; a newline would end the line.
_STRING_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r"})


def escape_measurement(name: str) -> str:
    return name.translate(_MEASUREMENT_ESCAPES)


def escape_key(text: str) -> str:
    """Escape a tag key, a tag value or a field key."""
    return text.translate(_KEY_ESCAPES)


def escape_string(text: str) -> str:
    """Escape a string field value and put it in double quotes."""
    return '"' + text.translate(_STRING_ESCAPES) + '"'


def to_ns(ts: float) -> int:
    """Unix seconds (float) to the nanosecond timestamp of a point, rounded to the microsecond.

    A float holds today's Unix time to about 0.24 µs: the digits below the
    microsecond are noise (1795325176.01 would be ...176009999872 ns), so they
    are rounded away; the write precision stays ``ns``.
    """
    if type(ts) is not float or ts - ts != 0.0:  # not a finite float: check it properly
        if isinstance(ts, bool) or not isinstance(ts, numbers.Real) or not math.isfinite(ts):
            raise ValueError(f"timestamp must be finite Unix seconds, not {ts!r}")
        ts = float(ts)
    return round(ts * 1e6) * 1000


# --- the schema ----------------------------------------------------------------


@dataclass(frozen=True)
class Tag:
    name: str
    description: str
    required: bool = False
    allowed: tuple[str, ...] | None = None  # enumerated values; None: any string


@dataclass(frozen=True)
class Field:
    name: str
    type: FieldType
    unit: str
    description: str


PREFIX_CACHE_MAX = 200_000  # distinct tag sets kept escaped (one per GPU x job x phase x mode)


@dataclass(frozen=True)
class Measurement:
    """One measurement: its tags, its fields, who writes it and how often."""

    name: str
    description: str
    writer: str
    rate: str
    tags: tuple[Tag, ...]
    fields: tuple[Field, ...]
    _tags: dict[str, Tag] = field(init=False, repr=False, compare=False)
    _fields: dict[str, tuple[str, FieldType]] = field(init=False, repr=False, compare=False)
    _prefixes: dict[tuple[Any, ...], str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_tags", {t.name: t for t in self.tags})
        object.__setattr__(
            self, "_fields", {f.name: (escape_key(f.name), f.type) for f in self.fields}
        )
        object.__setattr__(self, "_prefixes", {})

    @property
    def tag_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tags)

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def field_type(self, name: str) -> FieldType:
        return self._fields[name][1]

    def line(self, ts: float, tags: Mapping[str, Any], fields: Mapping[str, Any]) -> str | None:
        """One point as a line of line protocol (no newline), or None when no field has a value.

        Raises ValueError for a tag or field this measurement does not have, a
        missing required tag, a value outside an enumerated tag's values, or a
        value of the wrong kind (a string for a number): programming errors,
        not data errors.
        """
        key = tuple(tags.items())
        prefix = self._prefixes.get(key)
        if prefix is None:
            prefix = self._prefix(tags)
            if len(self._prefixes) >= PREFIX_CACHE_MAX:
                self._prefixes.clear()
            self._prefixes[key] = prefix
        parts = []
        specs = self._fields
        for name, value in fields.items():
            spec = specs.get(name)
            if spec is None:
                raise ValueError(f"measurement {self.name!r} has no field {name!r}")
            if value is None:
                continue
            if spec[1] is FLOAT and type(value) is float:  # the hot path, inline
                if value - value == 0.0:  # finite; nan and inf are left out
                    parts.append(f"{spec[0]}={value!r}")
                continue
            text = _format_value(value, spec[1], self.name, name)
            if text is not None:
                parts.append(f"{spec[0]}={text}")
        if not parts:
            return None
        return f"{prefix} {','.join(parts)} {to_ns(ts)}"

    def _prefix(self, tags: Mapping[str, Any]) -> str:
        pairs = []
        for name, value in tags.items():
            spec = self._tags.get(name)
            if spec is None:
                raise ValueError(f"measurement {self.name!r} has no tag {name!r}")
            if value is None or value == "":
                continue
            if isinstance(value, bool) or not isinstance(value, str | int):
                raise ValueError(f"{self.name}: tag {name} must be a string, not {value!r}")
            text = str(value)
            if spec.allowed is not None and text not in spec.allowed:
                raise ValueError(f"{self.name}: tag {name} is {text!r}, not one of {spec.allowed}")
            pairs.append((name, text))
        present = {name for name, _ in pairs}
        for spec in self.tags:
            if spec.required and spec.name not in present:
                raise ValueError(f"{self.name}: tag {spec.name} is required")
        # sorted by key, as InfluxDB prefers
        return ",".join(
            [escape_measurement(self.name)]
            + [f"{escape_key(k)}={escape_key(v)}" for k, v in sorted(pairs)]
        )


def _format_value(value: Any, kind: FieldType, measurement: str, name: str) -> str | None:
    cls = type(value)
    if kind == FLOAT:
        if cls is float:  # the common case first: no ABC checks
            return repr(value) if value - value == 0.0 else None  # nan, inf: left out
        if cls is int:
            return repr(float(value))
    elif kind == INT:
        if cls is int or cls is bool:
            return f"{int(value)}i"
    else:
        return escape_string(str(value))
    if isinstance(value, str | bytes) or not isinstance(value, numbers.Real):
        raise ValueError(f"{measurement}: field {name} must be a number, not {value!r}")
    number = float(value)
    if not math.isfinite(number):
        return None
    if kind == FLOAT:
        return repr(number)
    # INT: numpy integers, whole floats (numpy sums) to their integer
    return f"{int(value) if isinstance(value, numbers.Integral) else round(number)}i"


# --- reading line protocol back -----------------------------------------------


class ParsedLine(NamedTuple):
    measurement: str
    tags: dict[str, str]
    fields: dict[str, float | int | bool | str]
    ts_ns: int | None


_UNESCAPE = {"\\": "\\", ",": ",", "=": "=", " ": " "}


def parse_line(line: str) -> ParsedLine:
    """Parse one line of line protocol (InfluxDB 2.x rules); ValueError if it is not valid.

    Accepts what any writer produces, not only powerd: unsigned (``u``) and
    boolean fields included. Comments and blank lines are not lines: skip them first.
    """
    n = len(line)
    i = 0

    def token(stops: str, what: str) -> str:
        nonlocal i
        out = []
        while i < n:
            c = line[i]
            if c == "\\" and i + 1 < n and line[i + 1] in _UNESCAPE and line[i + 1] in stops + "\\":
                out.append(line[i + 1])
                i += 2
                continue
            if c in stops:
                break
            if c in "\n\r":
                raise ValueError(f"newline inside {what}")
            out.append(c)
            i += 1
        text = "".join(out)
        if not text:
            raise ValueError(f"empty {what} at column {i} of {line!r}")
        return text

    measurement = token(", ", "measurement")
    tags: dict[str, str] = {}
    while i < n and line[i] == ",":
        i += 1
        key = token(",= ", "tag key")
        if i >= n or line[i] != "=":
            raise ValueError(f"tag {key!r} has no value in {line!r}")
        i += 1
        tags[key] = token(",= ", "tag value")
    if i >= n or line[i] != " ":
        raise ValueError(f"no fields in {line!r}")
    i += 1
    fields: dict[str, float | int | bool | str] = {}
    while True:
        key = token(",= ", "field key")
        if i >= n or line[i] != "=":
            raise ValueError(f"field {key!r} has no value in {line!r}")
        i += 1
        if i < n and line[i] == '"':
            i += 1
            out = []
            while True:
                if i >= n:
                    raise ValueError(f"unterminated string in field {key!r} of {line!r}")
                c = line[i]
                if c == "\\" and i + 1 < n and line[i + 1] in '"\\':
                    out.append(line[i + 1])
                    i += 2
                elif c == '"':
                    i += 1
                    break
                else:
                    out.append(c)
                    i += 1
            fields[key] = "".join(out)
        else:
            start = i
            while i < n and line[i] not in ", ":
                i += 1
            fields[key] = _parse_number(line[start:i], key)
        if i < n and line[i] == ",":
            i += 1
            continue
        break
    ts_ns = None
    if i < n:
        if line[i] != " ":
            raise ValueError(f"unexpected {line[i]!r} at column {i} of {line!r}")
        text = line[i + 1 :].strip()
        if not text or not text.lstrip("-").isdigit():
            raise ValueError(f"bad timestamp {text!r} in {line!r}")
        ts_ns = int(text)
    return ParsedLine(measurement, tags, fields, ts_ns)


_TRUE = {"t", "T", "true", "True", "TRUE"}
_FALSE = {"f", "F", "false", "False", "FALSE"}


def _parse_number(text: str, key: str) -> float | int | bool:
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    try:
        if text.endswith(("i", "u")):
            whole = int(text[:-1])
            if text.endswith("u") and whole < 0:
                raise ValueError
            return whole
        value = float(text)
    except ValueError:
        raise ValueError(f"field {key!r}: {text!r} is not a number") from None
    if not math.isfinite(value) or text.lower().lstrip("+-") in ("nan", "inf", "infinity"):
        raise ValueError(f"field {key!r}: {text!r} is not a finite number")
    return value


def iter_lines(text: str) -> Iterable[ParsedLine]:
    """Every point of a line-protocol document (a ``.lp`` file), skipping blanks and comments."""
    for raw in text.splitlines():
        if raw.strip() and not raw.lstrip().startswith("#"):
            yield parse_line(raw)
