"""The files in grafana/: well-formed dashboards built from the schema, provisioning Grafana loads.

No server here (test_grafana_queries.py runs the queries against InfluxDB):
the committed JSON is exactly what powerd/grafana builds; each dashboard has
a uid, a title, unique panel ids, grid positions that fit and do not overlap,
a data source on every panel and target, and only variables it defines;
every measurement, field and tag a query names is in the telemetry schema;
every dashboard conforms to Grafana's dashboard schema (grafana_schema.py);
every stat panel colours its value on purpose, ratio graphs mark 100 % and
power graphs draw their limits.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from powerd.cli import main
from powerd.grafana.build import DATASOURCE_UID, GRID_WIDTH, Query
from powerd.grafana.dashboards import DASHBOARDS, stale
from powerd.telemetry_schema import MEASUREMENTS, TREE
from tests.grafana import grafana_schema
from tests.grafana.display import colour_of, text_of
from tests.support.grafana_queries import variables_in
from tests.support.paths import REPO

ROOT = REPO
GRAFANA = ROOT / "grafana"
FILES = sorted((GRAFANA / "dashboards").glob("*.json"))
SCHEMA = {m.name: set(m.field_names) | set(m.tag_names) for m in MEASUREMENTS}


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def queries(dash: dict) -> list[str]:
    out = [t["query"] for p in dash["panels"] for t in p.get("targets", [])]
    out += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    out += [
        a["target"]["query"] for a in dash["annotations"]["list"] if "query" in a.get("target", {})
    ]
    return out


def test_the_committed_files_are_what_the_code_builds():
    assert [p.name for p in FILES] == sorted(DASHBOARDS)
    assert stale(GRAFANA / "dashboards") == []
    result = CliRunner().invoke(
        main, ["dashboards", "--check", "--out", str(GRAFANA / "dashboards")]
    )
    assert result.exit_code == 0, result.output


def test_check_notices_a_hand_edited_file(tmp_path: Path):
    runner = CliRunner()
    assert runner.invoke(main, ["dashboards", "--out", str(tmp_path)]).exit_code == 0
    edited = tmp_path / "gpus.json"
    edited.write_text(edited.read_text().replace('"GPU power"', '"GPU watts"', 1))
    result = runner.invoke(main, ["dashboards", "--check", "--out", str(tmp_path)])
    assert result.exit_code == 1 and "gpus.json" in result.output


def test_uids_and_titles_are_unique():
    dashes = [load(p) for p in FILES]
    assert len({d["uid"] for d in dashes}) == len(dashes)
    assert len({d["title"] for d in dashes}) == len(dashes)
    for d in dashes:
        assert re.fullmatch(r"[a-z0-9-]{1,40}", d["uid"]) and d["title"].startswith("powerd")
        assert isinstance(d["schemaVersion"], int) and d["tags"] == ["powerd"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_panels_have_unique_ids_and_a_grid_that_fits(path: Path):
    dash = load(path)
    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids) and all(isinstance(i, int) and i > 0 for i in ids)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert set(g) == {"h", "w", "x", "y"} and g["w"] > 0 and g["h"] > 0
        assert g["x"] >= 0 and g["x"] + g["w"] <= GRID_WIDTH, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_target_has_a_data_source_and_a_unique_ref(path: Path):
    dash = load(path)
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert "datasource" in variables
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        assert p["title"] and p["description"], p
        assert p["datasource"] == {"type": "influxdb", "uid": "${datasource}"}
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(set(refs)) == len(refs)
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and t["rawQuery"] is True and t["query"]
    for a in dash["annotations"]["list"]:
        assert a["datasource"]["uid"] in ("${datasource}", "-- Grafana --")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_variables_resolve_in_order(path: Path):
    """Each query uses only variables defined before it (a panel: any variable)."""
    dash = load(path)
    defined: list[str] = []
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            assert variables_in(var["query"]) <= set(defined), var["name"]
            assert var["datasource"]["uid"] == "${datasource}"
        defined.append(var["name"])
    for query in queries(dash):
        assert variables_in(query) <= set(defined), query
        assert "$timeFilter" in query or query.startswith("SHOW TAG VALUES"), query


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_queries_name_only_the_schemas_measurements_fields_and_tags(path: Path):
    aliases = re.compile(r'AS "([^"]+)"')
    for query in queries(load(path)):
        measurements = re.findall(r'FROM "(\w+)"', query)
        assert measurements and set(measurements) <= set(SCHEMA), query
        known = set().union(*(SCHEMA[m] for m in measurements)) | set(aliases.findall(query))
        names = set(re.findall(r'"([^"]+)"', query)) - set(measurements)
        assert names <= known, f"{names - known} not in the schema: {query}"


def test_the_builder_refuses_a_name_the_schema_does_not_have():
    with pytest.raises(KeyError, match="no field or tag 'power_watts'"):
        Query(TREE, (("mean({power_watts})", "p"),)).text()
    with pytest.raises(KeyError, match="no field or tag"):
        Query(TREE, (("mean({power_w})", "p"),), where=("{gpu} = '0'",)).text()


def test_datasource_provisioning_is_influxql_with_the_dashboards_uid():
    doc = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "powerd.yaml").read_text())
    assert doc["apiVersion"] == 1
    (source,) = doc["datasources"]
    assert source["uid"] == DATASOURCE_UID and source["type"] == "influxdb"
    assert source["jsonData"]["version"] == "InfluxQL"
    assert source["jsonData"]["dbName"] == source["database"] == "${POWERD_INFLUXDB_DB}"
    assert source["url"] == "${POWERD_INFLUXDB_URL}" and "password" in source["secureJsonData"]
    for dash in map(load, FILES):
        (ds,) = [v for v in dash["templating"]["list"] if v["name"] == "datasource"]
        assert ds["current"]["value"] == DATASOURCE_UID and ds["query"] == "influxdb"


def test_dashboard_provider_points_at_a_directory_of_these_files():
    doc = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "powerd.yaml").read_text())
    (provider,) = doc["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    readme = (GRAFANA / "README.md").read_text()
    assert provider["options"]["path"] in readme  # the README says where to copy them


# --- the grid: the site's ramp against its limits, GPUs under smoothing --------------------


def panel(dash: dict, title: str) -> dict:
    (found,) = [p for p in dash["panels"] if p["title"] == title]
    return found


def test_the_site_ramp_panel_draws_both_ramps_against_the_grids_limits():
    site = load(GRAFANA / "dashboards" / "site-overview.json")
    ramp = panel(site, "Site ramp against the grid")
    assert ramp["type"] == "timeseries"
    assert ramp["fieldConfig"]["defaults"]["unit"] == "si:W/s"  # W/s, no scaling in a query
    text = " ".join(t["query"] for t in ramp["targets"])
    assert all(t["alias"] == "$col" for t in ramp["targets"])  # each series named by its AS
    assert 'max("site_power_ramp_w_per_s") AS "measured, fastest rise"' in text
    assert 'min("site_power_ramp_w_per_s") AS "measured, fastest fall"' in text
    assert 'mean("site_ramp_w_per_s") AS "sum of caps"' in text
    assert 'mean("grid_ramp_up_w_per_s") AS "grid ramp-up limit"' in text
    # the ramp-down limit is a positive number: drawn below zero, where the falls are
    assert 'mean("grid_ramp_down_w_per_s") * -1 AS "grid ramp-down limit"' in text
    assert all('FROM "decision"' in t["query"] for t in ramp["targets"])
    description = ramp["description"]
    for said in (
        "per controller cycle",
        "cycle-long window",
        "window_s",
        "cannot be measured online",
        "`powerd demo --smoothing`",
        "`powerplan whatif --smoothing`",
    ):
        assert said in description, said


def test_the_smoothing_panel_counts_gpus_switched_on_split_by_mechanism():
    site = load(GRAFANA / "dashboards" / "site-overview.json")
    smoothing = panel(site, "GPUs under grid smoothing")
    by_alias = {t["alias"]: t["query"] for t in smoothing["targets"]}
    assert set(by_alias) == {"hardware", "software"}
    for alias, software in (("hardware", 0), ("software", 1)):
        query = by_alias[alias]
        assert query.startswith('SELECT sum("gpus") AS "gpus" FROM (SELECT last("smoothing_')
        assert 'last("smoothing_enabled") AS "gpus" FROM "gpu"' in query
        assert f'"smoothing_software" = {software} AND' in query
        assert 'GROUP BY time($__interval), "node", "gpu" fill(none)' in query


# --- Grafana's schema --------------------------------------------------------------------


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_dashboard_conforms_to_grafanas_schema(path: Path):
    assert grafana_schema.problems(load(path)) == []


def test_the_schema_check_refuses_legacy_annotations_empty_variables_and_short_links():
    """The forms Grafana migrates or fills in on load, as these dashboards once had them."""
    legacy = {
        "schemaVersion": 39,
        "links": [
            {
                "type": "dashboards",
                "title": "powerd",
                "tags": ["powerd"],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "templating": {
            "list": [
                {
                    "name": "row",
                    "type": "query",
                    "query": "SHOW TAG VALUES",
                    "definition": "SHOW TAG VALUES",
                    "current": {},
                }
            ]
        },
        "annotations": {
            "list": [
                {
                    "name": "Phase changes",
                    "datasource": {"uid": "x"},
                    "enable": True,
                    "iconColor": "red",
                    "query": "SELECT 1",
                    "textColumn": "phase",
                    "tagsColumn": "job",
                }
            ]
        },
    }
    assert sorted(grafana_schema.problems(legacy)) == [
        "$.annotations.list[0].query: not in the schema",
        "$.annotations.list[0].tagsColumn: not in the schema",
        "$.annotations.list[0].textColumn: not in the schema",
        "$.links[0].icon: required, missing",
        "$.links[0].targetBlank: required, missing",
        "$.links[0].tooltip: required, missing",
        "$.templating.list[0].current.text: required, missing",
        "$.templating.list[0].current.value: required, missing",
        "$.templating.list[0].definition: not in the schema",
    ]


def test_the_schema_check_refuses_a_misspelt_option_and_an_incomplete_threshold():
    site = load(GRAFANA / "dashboards" / "site-overview.json")
    (index,) = [i for i, p in enumerate(site["panels"]) if p["title"] == "Site power"]
    site["panels"][index]["options"]["colorMode"] = "backgroud"
    del site["panels"][index]["fieldConfig"]["defaults"]["thresholds"]["steps"][0]["color"]
    assert grafana_schema.problems(site) == [
        f"$.panels[{index}].fieldConfig.defaults.thresholds.steps[0].color: required, missing",
        f"$.panels[{index}].options.colorMode: 'backgroud' is not a <enum 'BigValueColorMode'>",
    ]


def test_annotations_are_influxql_targets_with_field_mappings():
    for dash in map(load, FILES):
        for a in dash["annotations"]["list"][1:]:
            t = a["target"]
            assert a["datasource"] == {"type": "influxdb", "uid": "${datasource}"}
            assert t["rawQuery"] is t["fromAnnotations"] is True and t["query"].startswith("SELECT")
            assert a["mappings"]["text"] == {"source": "field", "value": t["textColumn"]}
            if t["tagsColumn"]:
                assert a["mappings"]["tags"] == {"source": "field", "value": t["tagsColumn"]}


def test_variables_open_on_all_or_on_the_first_value():
    for dash in map(load, FILES):
        for var in dash["templating"]["list"]:
            current = var["current"]
            if var["type"] == "datasource":
                assert current["value"] == DATASOURCE_UID
            elif var["includeAll"]:
                assert current["value"] == ["$__all"] and var["multi"]
            else:  # the cluster: Grafana takes the first value the query returns
                assert current["value"] == "" and var["name"] == "cluster"


# --- colours: what a stat's colour says, the lines a graph draws ---------------------------


def panels_of(kinds: tuple[str, ...]) -> list[tuple[str, dict]]:
    return [(path.name, p) for path in FILES for p in load(path)["panels"] if p["type"] in kinds]


GRAFANA_DEFAULT_STEPS = [{"color": "green", "value": None}, {"color": "red", "value": 80}]


def test_every_stat_and_gauge_panel_has_explicit_thresholds_and_a_colour_mode():
    found = panels_of(("stat", "gauge"))
    assert len(found) >= 6  # the six these dashboards had before the site's state
    for name, p in found:
        where = f"{name}: {p['title']}"
        levels = p["fieldConfig"]["defaults"].get("thresholds", {}).get("steps")
        assert levels, f"{where}: no thresholds (Grafana's default: green, red from 80)"
        assert levels[0]["value"] is None, where  # a base, from -infinity
        values = [s["value"] for s in levels[1:]]
        assert values == sorted(values) and levels != GRAFANA_DEFAULT_STEPS, where
        colour, mode = p["fieldConfig"]["defaults"]["color"], p["options"]["colorMode"]
        if colour["mode"] == "fixed":  # stated, not judged: one neutral colour
            assert len(levels) == 1 and mode == "none", where
            assert colour["fixedColor"] == levels[0]["color"] == "text", where
        else:
            assert colour["mode"] == "thresholds" and len(levels) > 1, where
            assert mode == "background", where


def stat_panel(file: str, title: str) -> dict:
    (found,) = [p for p in load(GRAFANA / "dashboards" / file)["panels"] if p["title"] == title]
    return found


def test_the_site_is_green_under_budget_amber_over_it_and_red_over_the_limit():
    """The site's position: (power - budget) / (limit - budget); its colour and its word."""
    state = stat_panel("site-overview.json", "Site against budget and limit")
    assert (
        '(last("power_w") - last("budget_w")) / (last("limit_w") - last("budget_w"))'
        in (state["targets"][0]["query"])
    )
    seen = {v: (colour_of(state, v), text_of(state, v)) for v in (-0.4, -0.01, 0.0, 0.5, 1.0, 1.3)}
    assert seen == {
        -0.4: ("green", "under budget"),
        -0.01: ("green", "under budget"),
        0.0: ("orange", "over budget"),
        0.5: ("orange", "over budget"),
        1.0: ("red", "over the limit"),
        1.3: ("red", "over the limit"),
    }


def test_headroom_is_red_at_the_limit_amber_when_small_green_otherwise():
    headroom = stat_panel("site-overview.json", "Headroom to the limit")
    assert headroom["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert '1 - last("power_w") / last("limit_w") AS "headroom"' in headroom["targets"][0]["query"]
    seen = {v: colour_of(headroom, v) for v in (-0.1, 0.0, 0.001, 0.049, 0.05, 0.3)}
    assert seen == {
        -0.1: "red",
        0.0: "red",
        0.001: "orange",
        0.049: "orange",
        0.05: "green",
        0.3: "green",
    }


@pytest.mark.parametrize(
    ("file", "title"),
    [
        ("site-overview.json", "Site power"),
        ("site-overview.json", "Site budget"),
        ("site-overview.json", "Site limit"),
        ("controller-health.json", "Cycles led, by controller"),
    ],
)
def test_stated_numbers_are_one_neutral_colour(file: str, title: str):
    panel = stat_panel(file, title)
    assert {colour_of(panel, v) for v in (-1.0, 0.0, 80.0, 1e9)} == {"text"}


def test_a_failover_in_range_is_amber():
    epochs = stat_panel("controller-health.json", "Epoch changes in range")
    assert [colour_of(epochs, v) for v in (0, 1, 5)] == ["green", "orange", "orange"]


def test_ratio_graphs_draw_a_dashed_line_at_one():
    """power / budget: amber at 100 % (over budget); power / limit: red (a breaker at its rating)."""
    ratios = [
        (name, p)
        for name, p in panels_of(("timeseries",))
        if re.search(r"power / (budget|limit)", p["title"])
    ]
    assert len(ratios) == 4
    for name, p in ratios:
        over = p["title"].rsplit("/ ", 1)[1]
        line = {"budget": "orange", "limit": "red"}[over]
        levels = p["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])
        assert levels[1:] == [{"color": line, "value": 1.0}], f"{name}: {p['title']}: no line at 1"
        assert p["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"] == {"mode": "dashed"}
        assert p["fieldConfig"]["defaults"]["color"] == {
            "mode": "palette-classic"
        }  # series keep theirs


def limit_overrides(panel: dict) -> dict[str, str]:
    """Series matcher -> colour, for each series the panel draws dashed (a line not to cross)."""
    out = {}
    for o in panel["fieldConfig"]["overrides"]:
        props = {p["id"]: p["value"] for p in o["properties"]}
        if props.get("custom.lineStyle", {}).get("fill") == "dash":
            out[o["matcher"]["options"]] = props["color"]["fixedColor"]
    return out


def test_the_site_power_graph_draws_its_budget_and_limits_dashed():
    site = stat_panel("site-overview.json", "Site power against budget and limit")
    assert limit_overrides(site) == {
        "capping threshold": "yellow",
        "budget": "orange",
        "limit": "red",
        "site limit (demand response)": "purple",
    }
    aliases = set(re.findall(r'AS "([^"]+)"', " ".join(t["query"] for t in site["targets"])))
    assert set(limit_overrides(site)) <= aliases  # each override names a series the panel has


@pytest.mark.parametrize(
    "title", ["Rows: power", "Racks: power", "Servers in the selected racks: power"]
)
def test_tree_power_graphs_draw_each_nodes_limit(title: str):
    panel = stat_panel("rows-and-racks.json", title)
    power, limit = panel["targets"]
    assert 'mean("power_w") AS "power"' in power["query"] and power["alias"] == "$tag_name"
    assert 'mean("limit_w") AS "limit"' in limit["query"] and limit["alias"] == "$tag_name limit"
    assert power["query"].split(" FROM ")[1] == limit["query"].split(" FROM ")[1]  # same nodes
    ((pattern, colour),) = limit_overrides(panel).items()
    assert colour == "red" and re.search(pattern.strip("/"), "row1-k2 limit")
    assert not re.search(pattern.strip("/"), "row1-k2")  # the power series keep their colours
