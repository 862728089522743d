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
Json = dict[str, Any]  # a JSON object of a dashboard, as Grafana reads it


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


def target(query: str | Query, ref: str, *, alias: str = "", fmt: str = "time_series") -> Json:
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


# Colours: what each means on these dashboards is in grafana/README.md
GOOD, WARNING, BAD = "green", "orange", "red"
NEUTRAL = "text"  # the theme's text colour: a number stated, not judged


@dataclass(frozen=True)
class Colours:
    """How a panel colours its values: Grafana thresholds, each ``(from, colour)``.

    The first step is the base, from minus infinity (``None``); a value takes
    the colour of the last step it reaches. ``mode`` is the field colour mode:
    ``thresholds`` colours a value by its step, ``fixed`` paints every value the
    base step's colour (a budget, a count: stated, not judged), and
    ``palette-classic`` gives each series of a graph its own colour while the
    steps are drawn as lines across it.
    """

    steps: tuple[tuple[float | None, str], ...]
    mode: str = "thresholds"

    def field_config(self) -> dict[str, Any]:
        color: dict[str, Any] = {"mode": self.mode}
        if self.mode == "fixed":
            color["fixedColor"] = self.steps[0][1]
        steps = [{"color": colour, "value": at} for at, colour in self.steps]
        return {"color": color, "thresholds": {"mode": "absolute", "steps": steps}}


STATED = Colours(((None, NEUTRAL),), mode="fixed")


@dataclass
class Panel:
    """A panel before layout: ``w`` x ``h`` grid cells; ``id`` and ``gridPos`` come from Layout.

    ``colours`` are its thresholds and colour mode (see Colours), ``custom``
    the panel plugin's field config (``custom.thresholdsStyle``: draw the
    steps as lines), ``overrides`` and ``mappings`` Grafana's field overrides
    and value mappings.
    """

    type: str
    title: str
    description: str
    targets: list[Json]
    w: int = 12
    h: int = 8
    unit: str = ""
    extra: dict[str, Any] = field(default_factory=Json)
    min: float | None = None
    max: float | None = None
    colours: Colours | None = None
    custom: dict[str, Any] = field(default_factory=Json)
    overrides: list[Json] = field(default_factory=list)
    mappings: list[Json] = field(default_factory=list)

    def field_defaults(self) -> dict[str, Any]:
        defaults: dict[str, Any] = {}
        if self.unit:
            defaults["unit"] = self.unit
        if self.min is not None:
            defaults["min"] = self.min
        if self.max is not None:
            defaults["max"] = self.max
        if self.colours is not None:
            defaults.update(self.colours.field_config())
        if self.custom:
            defaults["custom"] = self.custom
        if self.mappings:
            defaults["mappings"] = self.mappings
        return defaults

    def to_json(self, panel_id: int, x: int, y: int) -> Json:
        refs = [chr(ord("A") + i) for i in range(len(self.targets))]
        panel = {
            "id": panel_id,
            "type": self.type,
            "title": self.title,
            "description": self.description,
            "datasource": dict(DATASOURCE),
            "gridPos": {"h": self.h, "w": self.w, "x": x, "y": y},
            "targets": [dict(t, refId=r) for t, r in zip(self.targets, refs, strict=True)],
            "fieldConfig": {"defaults": self.field_defaults(), "overrides": self.overrides},
        }
        for key, value in self.extra.items():
            panel[key] = value
        return panel


def stat(
    title: str,
    description: str,
    targets: list[Json],
    *,
    unit: str,
    colours: Colours,
    w: int,
    h: int = 4,
    trend: bool = True,
    mappings: tuple[Json, ...] = (),
) -> Panel:
    """A stat panel: each series' last value, coloured as ``colours`` says.

    A judged value colours its background (a state, seen across the room);
    a stated one (``STATED``) stays in the text colour. ``trend`` draws the
    series behind the number.
    """
    judged = colours.mode == "thresholds"
    options = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "background" if judged else "none",
        "graphMode": "area" if trend else "none",
        "textMode": "auto",
        "justifyMode": "auto",
        "orientation": "auto",
        "wideLayout": True,
        "showPercentChange": False,
        "percentChangeColorMode": "standard",
    }
    return Panel(
        "stat",
        title,
        description,
        targets,
        w=w,
        h=h,
        unit=unit,
        colours=colours,
        mappings=list(mappings),
        extra={"options": options},
    )


def bands(*named: tuple[float | None, str, str]) -> tuple[Colours, tuple[Json, ...]]:
    """Colours and a word for each band of a value: ``(from, colour, word)``, lowest first,
    the first from minus infinity (``None``); a band ends where the next begins.

    The words are range value mappings (ends inclusive), highest band first so that a
    value on a boundary is named by the band above it, as its colour is.
    """
    colours = Colours(tuple((low, colour) for low, colour, _ in named))
    highs = [low for low, _, _ in named[1:]] + [None]
    ranges = [(low, high, word) for (low, _, word), high in zip(named, highs, strict=True)]
    mappings = tuple(
        {
            "type": "range",
            "options": {"from": low, "to": high, "result": {"text": word, "index": i}},
        }
        for i, (low, high, word) in enumerate(reversed(ranges))
    )
    return colours, mappings


def ratio_panel(
    title: str, description: str, targets: list[Json], *, over: str, w: int = 12, h: int = 8
) -> Panel:
    """A graph of power as a share of its ``over`` ("budget" or "limit") with a dashed line at
    100 %: amber for the budget (the controller caps above it), red for the limit (the
    breaker)."""
    colour = {"budget": WARNING, "limit": BAD}[over]
    return Panel(
        "timeseries",
        title,
        description,
        targets,
        w=w,
        h=h,
        unit="percentunit",
        colours=Colours(((None, GOOD), (1.0, colour)), mode="palette-classic"),
        custom={"thresholdsStyle": {"mode": "dashed"}},
    )


def drawn_as_limit(matcher: Json, colour: str) -> Json:
    """A field override: the series ``matcher`` picks are a line not to cross (a limit, a
    budget), drawn dashed in ``colour`` rather than in a series colour."""
    return {
        "matcher": matcher,
        "properties": [
            {"id": "color", "value": {"mode": "fixed", "fixedColor": colour}},
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
        ],
    }


def by_name(name: str) -> Json:
    return {"id": "byName", "options": name}


def by_regexp(pattern: str) -> Json:
    return {"id": "byRegexp", "options": pattern}


def row_panel(title: str) -> Panel:
    return Panel("row", title, "", [], w=GRID_WIDTH, h=1, extra={"collapsed": False, "panels": []})


def layout(panels: list[Panel]) -> list[Json]:
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


def datasource_variable() -> Json:
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
) -> Json:
    """A variable filled by ``SHOW TAG VALUES``; All expands to every value (a regex).

    It opens on All where it has All; otherwise on no value, which Grafana
    replaces by the first value the query returns when the dashboard loads.
    """
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": dict(DATASOURCE),
        "query": query,
        "refresh": 2,  # on time range change: new racks and jobs appear
        "sort": 7,  # natural order: rack2 before rack10 (3 is numerical: the first number only)
        "multi": multi,
        "includeAll": include_all,
        "current": opening_value(multi=multi, include_all=include_all),
        "options": [],
        "hide": 0,
        "regex": "",
    }


def opening_value(*, multi: bool, include_all: bool) -> Json:
    """A variable's ``current``: All (a list where several may be chosen), or no value."""
    if not include_all:
        return {"selected": False, "text": "", "value": ""}
    if multi:
        return {"selected": True, "text": ["All"], "value": ["$__all"]}
    return {"selected": True, "text": "All", "value": "$__all"}


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
    variables: list[Json],
    annotations: list[Json] | None = None,
) -> Json:
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
                "title": "powerd",
                "tooltip": "The other powerd dashboards, with this one's time range and choices",
                "icon": "external link",
                "url": "",
                "tags": ["powerd"],
                "asDropdown": True,
                "targetBlank": False,
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "templating": {"list": variables},
        "annotations": {"list": [builtin, *(annotations or [])]},
        "panels": layout(panels),
    }


def annotation(name: str, query: str, color: str, *, text: str, tags: str = "") -> Json:
    """An InfluxQL annotation query: each row of ``query`` marks its time with the value of
    column ``text``, tagged with column ``tags`` (comma-separated).

    Grafana's current form: the query is the annotation's ``target`` (an
    InfluxDB query; ``textColumn`` and ``tagsColumn`` are read where Grafana
    runs InfluxQL in the browser) and ``mappings`` name the columns where it
    runs them on the server and reads data frames. The legacy form, the query
    spread into the annotation itself, is what Grafana migrates on load.
    ``limit``, ``matchAny``, ``tags`` and ``type`` are there because the
    dashboard schema requires them of every annotation target; only Grafana's
    own annotation data source reads them.
    """
    mappings = {"text": {"source": "field", "value": text}}
    if tags:
        mappings["tags"] = {"source": "field", "value": tags}
    return {
        "name": name,
        "datasource": dict(DATASOURCE),
        "enable": True,
        "hide": False,
        "iconColor": color,
        "target": {
            "refId": "Anno",
            "query": query,
            "rawQuery": True,
            "resultFormat": "table",
            "fromAnnotations": True,
            "textEditor": True,
            "textColumn": text,
            "tagsColumn": tags,
            "limit": 100,
            "matchAny": False,
            "tags": [],
            "type": "dashboard",
        },
        "mappings": mappings,
    }
