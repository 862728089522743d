"""Grafana's InfluxQL interpolation, for running dashboard queries against a real InfluxDB.

What Grafana's InfluxDB data source does to a raw query before sending it:
``$timeFilter`` becomes ``time >= <from>ms and time <= <to>ms``,
``$__interval`` / ``$interval`` the group-by interval and ``$__interval_ms``
its milliseconds; a template variable (``$name``, ``${name}``, ``[[name]]``)
becomes its value, and for a multi-value or All variable each value is
regex-escaped and several are joined as ``(a|b|c)`` (the data source's
``interpolateQueryExpr``). The dashboards use variables only inside
``/^...$/`` regexes, where that is what makes them work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_REGEX_SPECIAL = re.compile(r"[\\^$*+?.()|\[\]{}/]")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
MACROS = ("timeFilter", "__interval", "__interval_ms", "interval")


def regex_escape(value: str) -> str:
    return _REGEX_SPECIAL.sub(lambda m: "\\" + m.group(0), value)


@dataclass
class Selection:
    """The values chosen for each variable and how Grafana formats them."""

    values: dict[str, list[str]]
    multi: dict[str, bool]  # multi or includeAll: regex-escaped, (a|b) for several

    def format(self, name: str) -> str:
        chosen = self.values[name]
        if not self.multi[name]:
            return chosen[0]
        escaped = [regex_escape(v) for v in chosen]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def variables_in(query: str) -> set[str]:
    names = {a or b or c for a, b, c in _VARIABLE.findall(query)}
    return names - set(MACROS)


def interpolate(
    query: str, selection: Selection, start_ms: int, end_ms: int, interval_s: int = 2
) -> str:
    """``query`` as Grafana would send it; KeyError for a variable with no value."""
    text = query.replace("$timeFilter", f"time >= {start_ms}ms and time <= {end_ms}ms")
    text = text.replace("$__interval_ms", str(interval_s * 1000))
    text = text.replace("$__interval", f"{interval_s}s").replace("$interval", f"{interval_s}s")

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        return selection.format(name)

    return _VARIABLE.sub(value, text)
