"""Every dashboard query runs against a real InfluxDB holding what powerd itself recorded.

The data: what ``powerd demo --record FILE`` recorded (the real loop: agents on
simulated GPUs, the controller, two training jobs announcing their phases; the
suite's one shortest demo run, tests/conftest.py), written into Debian's
InfluxDB through the project's own recorder, as ``--record influx1+http://...``
writes the same lines (``powerd.recorder``); then a
second controller's decisions with the next epoch (a failover), with site
ramps chosen here, and telemetry of GPUs under grid smoothing (hardware and
software, which the demo's simulated H100s do not report) are written the
same way. Every variable query, panel query and annotation query of
every dashboard is then expanded as Grafana would expand it
(tests/support/grafana_queries.py) and run over InfluxQL.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from policies.tree import RACK, ROW
from powerd.controller.records import by_level_name
from powerd.grafana.dashboards import DASHBOARDS
from powerd.protocol import GpuSmoothingState, GpuTelemetry, Telemetry
from powerd.recorder import open_recorder
from powerd.telemetry_schema import decision_line, telemetry_lines
from powerd.topology import Topology, load_budgets
from tests.grafana.display import colour_of, text_of
from tests.support.demo_process import DemoRun
from tests.support.grafana_queries import Selection, interpolate
from tests.support.paths import REPO
from tests.support.servers import running
from tests.support.tsdb import InfluxDB1

# realtime: the site ramp panel's test compares the controller's per-cycle ramp (its
# monotonic cycle lengths) with the points' wall-clock times; under the parallel stage's
# load they drift apart (one run: 13.5 against 10.1 kW/s)
pytestmark = pytest.mark.realtime

ROOT = REPO
BUDGETS = ROOT / "powerd" / "data" / "budgets" / "demo.toml"
DB = "powerd"
# the second controller's cycles: the measured site ramp and the sum of caps' ramp, W/s
FAILOVER_RAMPS_W_PER_S = ((25_000.0, 1_000.0), (-4_000.0, 0.0), (-32_000.0, -2_000.0))
GRID_RAMP_W_PER_S = 20_000.0  # demo.toml's [site.grid]: 20 kW/s both ways


@dataclass
class Recorded:
    server: InfluxDB1
    start_ms: int
    end_ms: int
    topology: Topology
    demo: dict
    failover_ms: int  # the second controller's first cycle; the demo's points are before it
    smoothing: dict[str, int]  # GPUs written here with smoothing on: hardware, software


def smoothing_samples(topology: Topology, ts: float, seq: int) -> list[str]:
    """``gpu`` points of three servers at ``ts``: five GPUs smooth in hardware, three in
    software, four have smoothing off (two of each kind)."""
    hardware = GpuSmoothingState(enabled=True, preset=0, floor_percent=60.0)
    software = GpuSmoothingState(enabled=True, preset=0, floor_percent=45.0, mechanism="software")
    off_hw = GpuSmoothingState(enabled=False, preset=0, floor_percent=0.0)
    off_sw = GpuSmoothingState(enabled=False, preset=0, floor_percent=0.0, mechanism="software")
    states = (
        [hardware] * 4,
        [software, software, off_sw, off_sw],
        [hardware, off_hw, software, off_hw],
    )
    lines = []
    for node, gpus in zip(topology.servers, states, strict=False):
        sample = Telemetry(
            v=1,
            node=node,
            ts=ts,
            seq=seq,
            mode="controlled",
            gpus=[
                GpuTelemetry(
                    index=i,
                    uuid=f"GPU-{node}-{i}",
                    power_w=400.0,
                    energy_j=None,
                    cap_w=700.0,
                    cap_min_w=200.0,
                    cap_max_w=700.0,
                    sm_clock_mhz=1700,
                    max_sm_clock_mhz=None,
                    util_pct=90.0,
                    temp_c=60.0,
                    smoothing=state,
                )
                for i, state in enumerate(gpus)
            ],
        )
        k = topology.node_index(node)
        where = {"row": by_level_name(topology, k, ROW), "rack": by_level_name(topology, k, RACK)}
        lines += telemetry_lines("demo", sample, site=topology.site, **where)
    return lines


@pytest.fixture(scope="module")
def recorded(
    tmp_path_factory: pytest.TempPathFactory, shortest_demo: DemoRun
) -> Iterator[Recorded]:
    work = tmp_path_factory.mktemp("grafana")
    done = shortest_demo.result
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    demo = json.loads((shortest_demo.where / "summary.json").read_text())
    with running(InfluxDB1(work)) as server:
        server.create_database(DB)
        url = f"influx1+http://127.0.0.1:{server.port}?db={DB}"
        start_ms = int(shortest_demo.started_s * 1000) - 1000
        # what the demo's controller recorded (`--record FILE`: the same lines it writes to
        # a URL, recorder.FileRecorder and InfluxRecorder share them), written as it would
        with open_recorder(url) as recorder:
            recorder.write(shortest_demo.recorded.read_text().splitlines())
            assert recorder.flush(30.0)
        # a failover: another controller leads with a later epoch (epochs are at least the
        # wall clock in ms at takeover: this one took over now, after the demo's), under an
        # operator's temporary site limit (demand response; the demo sets none), while
        # GPUs of three servers report their smoothing state
        now = time.time()
        epoch = int(now * 1000)
        topology = load_budgets(BUDGETS)
        with open_recorder(url) as recorder:
            recorder.write(
                decision_line(
                    now + i,
                    cluster="demo",
                    controller="ctl-b",
                    epoch=epoch,
                    cycle_s=0.01,
                    site_limit_w=150_000.0,
                    site_power_ramp_w_per_s=power_ramp,
                    site_ramp_w_per_s=caps_ramp,
                    grid_ramp_up_w_per_s=GRID_RAMP_W_PER_S,
                    grid_ramp_down_w_per_s=GRID_RAMP_W_PER_S,
                )
                for i, (power_ramp, caps_ramp) in enumerate(FAILOVER_RAMPS_W_PER_S)
            )
            for i in range(3):
                recorder.write(smoothing_samples(topology, now + i, seq=10_000 + i))
            assert recorder.flush(10.0)
        yield Recorded(
            server,
            start_ms,
            int((now + 5) * 1000),
            topology,
            demo,
            failover_ms=int(now * 1000),
            smoothing={"hardware": 5, "software": 3},
        )


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
    budget_w, limit_w = top.budget_w[0], top.limit_w[0]
    assert stat_value(recorded, dash, "Site budget", selection) == budget_w
    assert stat_value(recorded, dash, "Site limit", selection) == limit_w
    power_w = stat_value(recorded, dash, "Site power", selection)
    headroom = stat_value(recorded, dash, "Headroom to the limit", selection)
    assert 0 < power_w < limit_w and headroom == pytest.approx(1 - power_w / limit_w)
    position = stat_value(recorded, dash, "Site against budget and limit", selection)
    assert position == pytest.approx((power_w - budget_w) / (limit_w - budget_w))


def test_the_site_state_is_coloured_by_the_recorded_power_against_budget_and_limit(
    recorded: Recorded,
):
    """The colour and word Grafana shows for what was recorded, against the budgets file."""
    dash = DASHBOARDS["site-overview.json"]()
    selection = resolve(recorded, dash)
    top = recorded.topology
    power_w = stat_value(recorded, dash, "Site power", selection)
    position = stat_value(recorded, dash, "Site against budget and limit", selection)
    state = panel_json(dash, "Site against budget and limit")
    if power_w < top.budget_w[0]:
        expected = ("green", "under budget")
    elif power_w < top.limit_w[0]:
        expected = ("orange", "over budget")
    else:
        expected = ("red", "over the limit")
    assert (colour_of(state, position), text_of(state, position)) == expected
    headroom = stat_value(recorded, dash, "Headroom to the limit", selection)
    left = 1 - power_w / top.limit_w[0]
    expected_headroom = "red" if left <= 0 else "orange" if left < 0.05 else "green"
    assert colour_of(panel_json(dash, "Headroom to the limit"), headroom) == expected_headroom


def panel_json(dash: dict, title: str) -> dict:
    (found,) = [p for p in dash["panels"] if p["title"] == title]
    return found


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
    query = annotation["target"]["query"]
    found = run(recorded, interpolate(query, selection, recorded.start_ms, recorded.end_ms))
    columns = found[0]["columns"]
    assert (
        annotation["target"]["textColumn"] == "phase"
        and annotation["target"]["tagsColumn"] == "job"
    )
    assert {m["value"] for m in annotation["mappings"].values()} == {"phase", "job"} <= set(columns)
    seen = {row[columns.index("phase")] for row in rows(found)}
    assert {"startup", "compute", "communication", "checkpoint", "shutdown"} <= seen

    health = DASHBOARDS["controller-health.json"]()
    selection = resolve(recorded, health)
    (epochs,) = health["annotations"]["list"][1:]
    query = epochs["target"]["query"]
    epoch_rows = rows(
        run(recorded, interpolate(query, selection, recorded.start_ms, recorded.end_ms))
    )
    assert epochs["mappings"]["text"]["value"] == "change"
    assert len(epoch_rows) == 1 and epoch_rows[0][1] > 0  # one interval where the epoch grew
    assert stat_value(recorded, health, "Epoch changes in range", selection) > 0


# --- the grid: the site's measured ramp against its limits, GPUs under smoothing -----------


def panel_series(
    recorded: Recorded, dash: dict, title: str, start_ms: int, end_ms: int
) -> dict[str, dict[int, float]]:
    """Each of a panel's columns (its series, by alias) as time -> value, all targets."""
    selection = resolve(recorded, dash)
    panel = panel_json(dash, title)
    out: dict[str, dict[int, float]] = {}
    for t in panel["targets"]:
        found = run(recorded, interpolate(t["query"], selection, start_ms, end_ms))
        for s in found:
            columns = s["columns"]
            for name in columns[1:]:
                key = t.get("alias", name) if t.get("alias") != "$col" else name
                values = {row[0]: row[columns.index(name)] for row in s["values"]}
                out.setdefault(key, {}).update({ts: v for ts, v in values.items() if v is not None})
    return out


def test_the_site_ramp_panel_is_the_demos_measured_power_change_per_cycle(
    recorded: Recorded,
):
    """Over the demo's cycles: each cycle's recorded ramp is the site's recorded power
    change over the cycle, by hand (p[k] - p[k-1]) / (t[k] - t[k-1]); the panel's fastest
    rise and fall of each 2 s interval are the largest and smallest of those ramps; the
    grid's limits are demo.toml's, the ramp down drawn below zero."""
    dash = DASHBOARDS["site-overview.json"]()
    end_ms = recorded.failover_ms - 1
    where = f"\"cluster\" = 'demo' AND time >= {recorded.start_ms}ms AND time <= {end_ms}ms"
    site = dict(
        rows(run(recorded, f'SELECT "power_w" FROM "tree" WHERE "level" = \'site\' AND {where}'))
    )
    ramps = dict(
        rows(run(recorded, f'SELECT "site_power_ramp_w_per_s" FROM "decision" WHERE {where}'))
    )
    assert len(site) >= 15 and len(ramps) == len(site) - 1  # a cycle a second; not the first
    changed = 0
    for (t0, p0), (t1, p1) in itertools.pairwise(sorted(site.items())):
        # the cycle's length is from the controller's monotonic clock at the cycle's start,
        # the points' times from its wall clock once the commands went out: tens of ms apart
        # (under 6 % on an idle machine); a sign, the caps for the power, a factor are not
        by_hand = (p1 - p0) / ((t1 - t0) / 1e9)
        assert ramps[t1] == pytest.approx(by_hand, rel=0.25, abs=100.0), (t1, p0, p1)
        changed += abs(by_hand) > 1_000.0
    assert min(site) not in ramps and changed >= 3  # the jobs moved the site's power
    series = panel_series(recorded, dash, "Site ramp against the grid", recorded.start_ms, end_ms)
    by_interval: dict[int, list[float]] = {}
    for t, ramp in ramps.items():
        by_interval.setdefault(t - t % 2_000_000_000, []).append(ramp)  # GROUP BY time(2s)
    rise, fall = series["measured, fastest rise"], series["measured, fastest fall"]
    assert rise == {t: max(r) for t, r in by_interval.items()}
    assert fall == {t: min(r) for t, r in by_interval.items()}
    assert series["sum of caps"]  # the caps' ramp beside it
    grid = recorded.topology.grid
    assert grid is not None
    assert grid.ramp_up_w_per_s == grid.ramp_down_w_per_s == GRID_RAMP_W_PER_S
    assert set(series["grid ramp-up limit"].values()) == {GRID_RAMP_W_PER_S}
    assert set(series["grid ramp-down limit"].values()) == {-GRID_RAMP_W_PER_S}
    assert set(series["grid ramp-up limit"]) >= set(rise)  # a line across the whole range


def test_the_site_ramp_panel_over_cycles_written_by_hand(recorded: Recorded):
    """The second controller's three cycles: whatever intervals they fall in, the panel's
    extremes are the ramps written, and the limits are +20 kW/s and -20 kW/s."""
    dash = DASHBOARDS["site-overview.json"]()
    series = panel_series(
        recorded, dash, "Site ramp against the grid", recorded.failover_ms, recorded.end_ms
    )
    powers = [p for p, _ in FAILOVER_RAMPS_W_PER_S]
    assert max(series["measured, fastest rise"].values()) == max(powers) == 25_000.0
    assert min(series["measured, fastest fall"].values()) == min(powers) == -32_000.0
    caps = set(series["sum of caps"].values())
    assert min(caps) >= -2_000.0 and max(caps) <= 1_000.0
    assert set(series["grid ramp-up limit"].values()) == {20_000.0}
    assert set(series["grid ramp-down limit"].values()) == {-20_000.0}


def test_gpus_under_grid_smoothing_are_counted_hardware_and_software(recorded: Recorded):
    dash = DASHBOARDS["site-overview.json"]()
    title = "GPUs under grid smoothing"
    series = panel_series(recorded, dash, title, recorded.failover_ms, recorded.end_ms)
    assert set(series) == {"hardware", "software"}
    for kind, count in recorded.smoothing.items():
        assert set(series[kind].values()) == {count}, kind  # the GPUs switched off: not counted
    # over the whole range (the demo's GPUs report no smoothing state): the same counts
    everything = panel_series(recorded, dash, title, recorded.start_ms, recorded.end_ms)
    assert max(everything["hardware"].values()) == recorded.smoothing["hardware"]
    assert max(everything["software"].values()) == recorded.smoothing["software"]


def test_the_held_panel_shows_each_jobs_gpus_by_cause_and_level(recorded: Recorded):
    """What held the demo's jobs, as the controller recorded it (``job_held``): one series
    per job, cause and level; a level for capping only, and always one (under load a cap
    read back before its cut landed lost its level: ``policies.causes.cap_levels``); never
    more GPUs than the job has."""
    from policies.causes import CAUSES, LEVEL_TAGS

    dash = DASHBOARDS["jobs-and-phases.json"]()
    selection = resolve(recorded, dash)
    (query,) = [q for t, _, q in panel_queries(dash) if t == "Why the job's GPUs were held"]
    series = run(recorded, interpolate(query, selection, recorded.start_ms, recorded.end_ms))
    seen = {(s["tags"]["job"], s["tags"]["cause"], s["tags"]["level"]) for s in series}
    assert {job for job, _, _ in seen} <= set(recorded.demo["jobs"]) and seen
    for _, cause, level in seen:
        assert cause in CAUSES and (level in LEVEL_TAGS if cause == "capping" else level == "")
    gpus = max(v for s in series for _, v in s["values"] if v is not None)
    assert 0 < gpus <= recorded.topology.tree.n_gpus
