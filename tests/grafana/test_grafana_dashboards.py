"""The files in grafana/: well-formed dashboards built from the schema, provisioning Grafana loads.

No server here (test_grafana_queries.py runs the queries against InfluxDB):
the committed JSON is exactly what powerd/grafana builds; each dashboard has
a uid, a title, unique panel ids, grid positions that fit and do not overlap,
a data source on every panel and target, and only variables it defines;
every measurement, field and tag a query names is in the telemetry schema.
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
    out += [a["query"] for a in dash["annotations"]["list"] if "query" in a]
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
