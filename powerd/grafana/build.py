"""Grafana dashboard JSON from Python: InfluxQL over the telemetry schema, panels, layout.

The dashboards in ``grafana/dashboards/`` are generated (``powerd dashboards``)
so that every measurement, field and tag a query names comes from
``powerd.telemetry_schema``: a name that is not in the schema fails here, at
build time, not as an empty panel in front of an operator. Queries are raw
InfluxQL (``rawQuery``), which InfluxDB 1.8, 2.x (DBRP mapping) and 3.x
answer; they use Grafana's ``$timeFilter`` and ``$__interval`` macros and the
dashboards' template variables in regex form (``"row" =~ /^$row$/``), which
is how Grafana's InfluxDB data source expands multi-value and All.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from powerd.telemetry_schema import Measurement

DATASOURCE_UID = "powerd-influxdb"  # grafana/provisioning/datasources/powerd.yaml
DATASOURCE = {"type": "influxdb", "uid": "${datasource}"}
SCHEMA_VERSION = 39  # Grafana 10.4 / 11: loads as is, newer versions migrate
GRID_WIDTH = 24


def ident(measurement: Measurement, name: str) -> str:
    """A quoted field or tag of ``measurement``; KeyError for a name the schema does not have."""
    if name not in measurement.field_names and name not in measurement.tag_names:
        raise KeyError(f"measurement {measurement.name!r} has no field or tag {name!r}")
    return f'"{name}"'


@dataclass(frozen=True)
class Query:
    """One InfluxQL SELECT over a schema measurement.

    ``select`` items are ``(expression, alias)``; in an expression ``{f}``
    placeholders name fields or tags (``mean({power_w})``), checked against
    the schema. ``where`` are extra conditions, ``{f}`` placeholders too;
    ``cluster`` and ``$timeFilter`` are always added. ``group`` are tags to
    group by; ``every`` adds ``time($__interval)``.
    """

    measurement: Measurement
    select: tuple[tuple[str, str], ...]
    where: tuple[str, ...] = ()
    group: tuple[str, ...] = ()
    every: bool = True
    fill: str = "none"
    tail: str = ""  # ORDER BY / LIMIT

    def _names(self, text: str) -> str:
        names = {
            n: ident(self.measurement, n)
            for n in (*self.measurement.field_names, *self.measurement.tag_names)
        }
        try:
            return text.format(**names)
        except KeyError as exc:
            raise KeyError(
                f"measurement {self.measurement.name!r} has no field or tag {exc}"
            ) from None

    def text(self) -> str:
        cols = ", ".join(
            self._names(expr) + (f' AS "{alias}"' if alias else "") for expr, alias in self.select
        )
        conds = [
            f"{ident(self.measurement, 'cluster')} =~ /^$cluster$/",
            *map(self._names, self.where),
        ]
        conds.append("$timeFilter")
        groups = (["time($__interval)"] if self.every else []) + [
            ident(self.measurement, g) for g in self.group
        ]
        query = f'SELECT {cols} FROM "{self.measurement.name}" WHERE {" AND ".join(conds)}'
        if groups:
            query += " GROUP BY " + ", ".join(groups)
            if self.every:
                query += f" fill({self.fill})"
        return query + (f" {self.tail}" if self.tail else "")


def subquery(outer: str, inner: Query, alias: str, group: tuple[str, ...] = ()) -> str:
    """``SELECT outer(alias) FROM (inner) WHERE $timeFilter GROUP BY time, group``."""
    groups = ", ".join(["time($__interval)", *(f'"{g}"' for g in group)])
    return (
        f'SELECT {outer}("{alias}") AS "{alias}" FROM ({inner.text()}) WHERE $timeFilter'
        f" GROUP BY {groups} fill(none)"
    )


def target(query: str | Query, ref: str, *, alias: str = "", fmt: str = "time_series") -> dict:
    text = query.text() if isinstance(query, Query) else query
    out: dict[str, Any] = {
        "refId": ref,
        "datasource": dict(DATASOURCE),
        "rawQuery": True,
        "query": text,
        "resultFormat": fmt,
    }
    if alias:
        out["alias"] = alias
    return out


@dataclass
class Panel:
    """A panel before layout: ``w`` x ``h`` grid cells; ``id`` and ``gridPos`` come from Layout."""

    type: str
    title: str
    description: str
    targets: list[dict]
    w: int = 12
    h: int = 8
    unit: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    min: float | None = None
    max: float | None = None

    def to_json(self, panel_id: int, x: int, y: int) -> dict:
        defaults: dict[str, Any] = {}
        if self.unit:
            defaults["unit"] = self.unit
        if self.min is not None:
            defaults["min"] = self.min
        if self.max is not None:
            defaults["max"] = self.max
        refs = [chr(ord("A") + i) for i in range(len(self.targets))]
        panel = {
            "id": panel_id,
            "type": self.type,
            "title": self.title,
            "description": self.description,
            "datasource": dict(DATASOURCE),
            "gridPos": {"h": self.h, "w": self.w, "x": x, "y": y},
            "targets": [dict(t, refId=r) for t, r in zip(self.targets, refs, strict=True)],
            "fieldConfig": {"defaults": defaults, "overrides": []},
        }
        for key, value in self.extra.items():
            panel[key] = value
        return panel


def row_panel(title: str) -> Panel:
    return Panel("row", title, "", [], w=GRID_WIDTH, h=1, extra={"collapsed": False, "panels": []})


def layout(panels: list[Panel]) -> list[dict]:
    """Left to right, wrapping at the grid width; a row panel starts a new line. Ids from 1."""
    out = []
    x = y = line_h = 0
    for number, panel in enumerate(panels, start=1):
        if panel.type == "row" or x + panel.w > GRID_WIDTH:
            x, y, line_h = 0, y + line_h, 0
        item = panel.to_json(number, x, y)
        if panel.type == "row":
            item.pop("datasource")
            item.pop("targets")
            item.pop("fieldConfig")
            item.pop("description")
        out.append(item)
        x += panel.w
        line_h = max(line_h, panel.h)
        if panel.type == "row":
            x, y, line_h = 0, y + panel.h, 0
    return out


# --- template variables ----------------------------------------------------------------


def datasource_variable() -> dict:
    return {
        "name": "datasource",
        "label": "InfluxDB",
        "type": "datasource",
        "query": "influxdb",
        "current": {"selected": False, "text": "powerd", "value": DATASOURCE_UID},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "options": [],
    }


def query_variable(
    name: str, label: str, query: str, *, multi: bool = True, include_all: bool = True
) -> dict:
    """A variable filled by ``SHOW TAG VALUES``; All expands to every value (a regex)."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": dict(DATASOURCE),
        "query": query,
        "definition": query,
        "refresh": 2,  # on time range change: new racks and jobs appear
        "sort": 3,  # natural order: rack2 before rack10
        "multi": multi,
        "includeAll": include_all,
        "current": {},
        "options": [],
        "hide": 0,
        "regex": "",
    }


def tag_values(measurement: Measurement, key: str, where: tuple[str, ...] = ()) -> str:
    conds = [f"{ident(measurement, 'cluster')} =~ /^$cluster$/", *where]
    return (
        f'SHOW TAG VALUES FROM "{measurement.name}" WITH KEY = {ident(measurement, key)}'
        f" WHERE {' AND '.join(conds)}"
    )


def dashboard(
    uid: str,
    title: str,
    description: str,
    panels: list[Panel],
    variables: list[dict],
    annotations: list[dict] | None = None,
) -> dict:
    builtin = {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["powerd"],
        "editable": True,
        "graphTooltip": 1,  # shared crosshair
        "timezone": "browser",
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "links": [
            {
                "type": "dashboards",
                "tags": ["powerd"],
                "asDropdown": True,
                "title": "powerd",
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "templating": {"list": variables},
        "annotations": {"list": [builtin, *(annotations or [])]},
        "panels": layout(panels),
    }


def annotation(name: str, query: str, text_column: str, tags_column: str, color: str) -> dict:
    """An InfluxQL annotation query (Grafana's InfluxDB data source: text and tags columns)."""
    return {
        "name": name,
        "datasource": dict(DATASOURCE),
        "enable": True,
        "iconColor": color,
        "query": query,
        "textColumn": text_column,
        "tagsColumn": tags_column,
    }
