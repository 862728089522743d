"""Every dashboard query runs against a real InfluxDB holding what powerd itself recorded.

The data: ``powerd demo --record influx1+http://...`` (the real loop: agents on
simulated GPUs, the controller, two training jobs announcing their phases)
writes into Debian's InfluxDB through the project's own recorder; then a
second controller's decisions with the next epoch (a failover) are written
the same way. Every variable query, panel query and annotation query of
every dashboard is then expanded as Grafana would expand it
(tests/support/grafana_queries.py) and run over InfluxQL.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from powerd.grafana.dashboards import DASHBOARDS
from powerd.recorder import open_recorder
from powerd.telemetry_schema import decision_line
from powerd.topology import Topology, load_budgets
from tests.support.grafana_queries import Selection, interpolate
from tests.support.paths import REPO
from tests.support.servers import running
from tests.support.tsdb import InfluxDB1

ROOT = REPO
BUDGETS = ROOT / "powerd" / "data" / "budgets" / "demo.toml"
DB = "powerd"


@dataclass
class Recorded:
    server: InfluxDB1
    start_ms: int
    end_ms: int
    topology: Topology
    demo: dict


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    work = tmp_path_factory.mktemp("grafana")
    with running(InfluxDB1(work)) as server:
        server.create_database(DB)
        url = f"influx1+http://127.0.0.1:{server.port}?db={DB}"
        start_ms = int(time.time() * 1000) - 1000
        done = subprocess.run(
            [
                *(sys.executable, "-m", "powerd", "demo", "--duration", "20", "--no-live"),
                *("--record", url, "--plot", str(work / "demo.png")),
                *("--summary-json", str(work / "demo.json")),
            ],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=work,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        demo = json.loads((work / "demo.json").read_text())
        # a failover: another controller leads with a later epoch (epochs are at least the
        # wall clock in ms at takeover: this one took over now, after the demo's), under an
        # operator's temporary site limit (demand response; the demo sets none)
        now = time.time()
        epoch = int(now * 1000)
        with open_recorder(url) as recorder:
            recorder.write(
                decision_line(
                    now + i,
                    cluster="demo",
                    controller="ctl-b",
                    epoch=epoch,
                    cycle_s=0.01,
                    site_limit_w=150_000.0,
                )
                for i in range(3)
            )
            assert recorder.flush(10.0)
        yield Recorded(server, start_ms, int((now + 5) * 1000), load_budgets(BUDGETS), demo)


def run(recorded: Recorded, query: str) -> list[dict]:
    """The series of one InfluxQL query; fails on an error."""
    doc = recorded.server.query(query, database=DB)
    result = doc["results"][0]
    assert "error" not in result, f"{query}\n-> {result['error']}"
    return result.get("series", [])


def rows(series: list[dict]) -> list[list]:
    return [row for s in series for row in s["values"]]


def resolve(recorded: Recorded, dash: dict, first_only: bool = False) -> Selection:
    """Run the dashboard's variable queries in order, each with the ones before it chosen."""
    selection = Selection({}, {})
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = interpolate(var["query"], selection, recorded.start_ms, recorded.end_ms)
        values = [row[1] for row in rows(run(recorded, query))]
        assert values, f"{dash['uid']}: variable {var['name']} has no values ({query})"
        selection.values[var["name"]] = values[:1] if first_only else values
        selection.multi[var["name"]] = var["multi"] or var["includeAll"]
    return selection


def panel_queries(dash: dict):
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            yield panel["title"], t["refId"], t["query"]


def has_values(found: list[dict]) -> bool:
    """Some row holds a value besides its time (and the tags Grafana shows)."""
    return any(any(v is not None for v in row[1:]) for row in rows(found))


@pytest.mark.parametrize("name", list(DASHBOARDS))
def test_variables_resolve_to_what_was_recorded(recorded: Recorded, name: str):
    selection = resolve(recorded, DASHBOARDS[name]())
    top = recorded.topology
    expected = {
        "cluster": ["demo"],
        "row": list(top.rows),
        "rack": list(top.racks),
        "node": list(top.servers),
        "gpu": ["0", "1", "2", "3"],
    }
    for var, values in selection.values.items():
        if var in expected:
            assert sorted(values) == sorted(expected[var]), var
        else:
            assert var == "job" and sorted(values) == sorted(recorded.demo["jobs"])


@pytest.mark.parametrize("name", list(DASHBOARDS))
def test_every_panel_query_returns_rows_with_all_selected(recorded: Recorded, name: str):
    dash = DASHBOARDS[name]()
    selection = resolve(recorded, dash)
    for title, ref, query in panel_queries(dash):
        text = interpolate(query, selection, recorded.start_ms, recorded.end_ms)
        assert has_values(run(recorded, text)), f"{name}: {title} {ref} returned no rows: {text}"


@pytest.mark.parametrize("name", ["rows-and-racks.json", "gpus.json", "jobs-and-phases.json"])
def test_drill_down_to_one_value_still_returns_rows(recorded: Recorded, name: str):
    """row1, its first rack, its first node, GPU 0, the first job: every panel has data."""
    dash = DASHBOARDS[name]()
    selection = resolve(recorded, dash, first_only=True)
    for title, ref, query in panel_queries(dash):
        text = interpolate(query, selection, recorded.start_ms, recorded.end_ms)
        assert has_values(run(recorded, text)), f"{name}: {title} {ref} returned no rows: {text}"


def stat_value(recorded: Recorded, dash: dict, title: str, selection: Selection) -> float:
    (query,) = [q for t, _, q in panel_queries(dash) if t == title]
    found = rows(run(recorded, interpolate(query, selection, recorded.start_ms, recorded.end_ms)))
    assert len(found) == 1, found
    return found[0][1]


def test_site_numbers_are_the_budgets_files(recorded: Recorded):
    dash = DASHBOARDS["site-overview.json"]()
    selection = resolve(recorded, dash)
    top = recorded.topology
    assert stat_value(recorded, dash, "Site budget", selection) == top.budget_w[0]
    assert stat_value(recorded, dash, "Site limit", selection) == top.limit_w[0]
    power = stat_value(recorded, dash, "Site power", selection)
    headroom = stat_value(recorded, dash, "Headroom to the limit", selection)
    assert 0 < power < top.limit_w[0] and headroom == pytest.approx(top.limit_w[0] - power)


def test_racks_now_table_holds_every_racks_budget(recorded: Recorded):
    dash = DASHBOARDS["rows-and-racks.json"]()
    selection = resolve(recorded, dash)
    (query,) = [q for t, _, q in panel_queries(dash) if t == "Racks now"]
    series = run(recorded, interpolate(query, selection, recorded.start_ms, recorded.end_ms))
    top = recorded.topology
    budgets = {}
    for s in series:
        row = dict(zip(s["columns"], s["values"][0], strict=True))
        budgets[s["tags"]["name"]] = row["budget_w"]
        assert 0 <= row["capped_share"] <= 1 and row["power_w"] > 0
    assert budgets == {r: top.budget_w[top.node_index(r)] for r in top.racks}


def test_a_cluster_filter_that_matches_nothing_returns_nothing(recorded: Recorded):
    dash = DASHBOARDS["site-overview.json"]()
    other = Selection({"cluster": ["elsewhere"]}, {"cluster": False})
    for title, ref, query in panel_queries(dash):
        text = interpolate(query, other, recorded.start_ms, recorded.end_ms)
        assert not has_values(run(recorded, text)), f"{title} {ref} ignores the cluster"


def test_annotations_mark_phase_changes_and_the_failover(recorded: Recorded):
    phases = DASHBOARDS["jobs-and-phases.json"]()
    selection = resolve(recorded, phases)
    (annotation,) = phases["annotations"]["list"][1:]
    found = run(
        recorded, interpolate(annotation["query"], selection, recorded.start_ms, recorded.end_ms)
    )
    columns = found[0]["columns"]
    assert annotation["textColumn"] in columns and annotation["tagsColumn"] in columns
    seen = {row[columns.index("phase")] for row in rows(found)}
    assert {"startup", "compute", "communication", "checkpoint", "shutdown"} <= seen

    health = DASHBOARDS["controller-health.json"]()
    selection = resolve(recorded, health)
    (epochs,) = health["annotations"]["list"][1:]
    epoch_rows = rows(
        run(recorded, interpolate(epochs["query"], selection, recorded.start_ms, recorded.end_ms))
    )
    assert len(epoch_rows) == 1 and epoch_rows[0][1] > 0  # one interval where the epoch grew
    assert stat_value(recorded, health, "Epoch changes in range", selection) > 0
