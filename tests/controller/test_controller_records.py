"""Records: the controller's line-protocol points, read back with telemetry_schema.parse_line."""

from __future__ import annotations

import dataclasses
import itertools

import msgspec
import pytest

from policies.tree import RACK, ROW, SITE
from powerd.controller.records import Records, by_level_name
from powerd.protocol import GpuSmoothingState, PhaseEvent, Telemetry, decode, encode
from powerd.telemetry_schema import DECISION, GPU, PHASE_EVENT, TREE, ParsedLine, parse_line, to_ns
from powerd.topology.grid import GridSpec
from tests.controller.test_controller_core import (
    BANDS,
    CAP_MAX_W,
    NODES,
    WALL0,
    Bench,
    make_bench,
    phase_payload,
    telemetry_payload,
)

TS = WALL0 + 123.25


@pytest.fixture
def bench() -> Bench:
    return make_bench()


@pytest.fixture
def records(bench: Bench) -> Records:
    return Records("prod", bench.topology, "ctl-a")


def parsed(lines: list[str]) -> list[ParsedLine]:
    out = [parse_line(line) for line in lines]
    for p in out:  # every field has the schema's type
        schema = {m.name: m for m in (GPU, TREE, DECISION, PHASE_EVENT)}[p.measurement]
        assert set(p.tags) <= set(schema.tag_names), p
        for name, value in p.fields.items():
            kind = schema.field_type(name)
            assert isinstance(value, float if kind == "float" else int), (name, value)
    return out


# --- one cycle ---------------------------------------------------------------------


def test_cycle_writes_a_tree_point_per_tree_node_and_one_decision(
    bench: Bench, records: Records
) -> None:
    bench.report_all(650.0)
    result = bench.cycle()
    points = parsed(records.cycle(bench.core, result, TS))
    trees = [p for p in points if p.measurement == "tree"]
    decisions = [p for p in points if p.measurement == "decision"]
    assert [p.tags["name"] for p in trees] == list(bench.topology.names)
    assert len(decisions) == 1 and len(points) == bench.topology.n_nodes + 1
    assert all(p.ts_ns == to_ns(TS) for p in points)
    assert all(p.tags["cluster"] == "prod" for p in points)


def test_tree_points_carry_their_placement(bench: Bench, records: Records) -> None:
    bench.report_all(650.0)
    points = parsed(records.cycle(bench.core, bench.cycle(), TS))
    tags = {p.tags["name"]: p.tags for p in points if p.measurement == "tree"}
    drop = lambda t: {k: v for k, v in t.items() if k != "cluster"}  # noqa: E731
    assert drop(tags["lab"]) == {"level": "site", "name": "lab", "site": "lab"}
    assert drop(tags["r2"]) == {"level": "row", "name": "r2", "site": "lab"}
    assert drop(tags["k1"]) == {"level": "rack", "name": "k1", "site": "lab", "row": "r1"}
    assert drop(tags["k3-n1"]) == {
        "level": "node",
        "name": "k3-n1",
        "site": "lab",
        "row": "r2",
        "rack": "k3",
    }


def test_tree_fields_are_the_cycles_numbers(records: Records) -> None:
    bench = make_bench(policy=BANDS)  # the bands: their thresholds, target and capping
    bench.report_all(650.0)
    result = bench.cycle()
    points = parsed(records.cycle(bench.core, result, TS))
    k1 = next(p.fields for p in points if p.tags.get("name") == "k1")
    assert k1["power_w"] == 4 * 650.0 + 100.0
    assert (k1["budget_w"], k1["limit_w"]) == (1500.0, 2600.0)
    assert k1["cap_threshold_w"] == pytest.approx(0.98 * 1500)
    assert k1["cap_target_w"] == pytest.approx(0.95 * 1500)
    assert k1["uncap_threshold_w"] == pytest.approx(0.90 * 1500)
    assert k1["capping"] == 1
    assert k1["capped_share"] == 1.0  # all four GPUs below their 700 W maximum
    assert k1["predicted_w"] == pytest.approx(0.95 * 1500)
    assert k1["cap_sum_w"] == pytest.approx(0.95 * 1500)  # caps sum + the 100 W overhead
    k2 = next(p.fields for p in points if p.tags.get("name") == "k2")
    assert (k2["capping"], k2["capped_share"]) == (0, 0.0)
    assert k2["cap_sum_w"] == 4 * CAP_MAX_W
    site = next(p.fields for p in points if p.tags.get("level") == "site")
    assert site["capped_share"] == pytest.approx(4 / 10)


def test_decision_point_counts_what_happened(bench: Bench, records: Records) -> None:
    bench.core.new_epoch(3)
    bench.report_all(650.0)
    bench.core.on_telemetry("k1-n1", b"garbage")
    result = bench.cycle()
    (decision,) = [
        p for p in parsed(records.cycle(bench.core, result, TS)) if p.measurement == "decision"
    ]
    assert decision.tags == {"cluster": "prod", "controller": "ctl-a"}
    f = decision.fields
    assert f["commands_sent"] == len(NODES)
    assert f["epoch"] == 3
    assert f["rejected_payloads"] == 1
    assert f["gpus_capped"] == 4
    assert (f["resends"], f["acks_missing"], f["stale_nodes"], f["offline_nodes"]) == (0, 0, 0, 0)
    assert isinstance(f["cycle_s"], float) and f["cycle_s"] >= 0.0
    assert "site_ramp_w_per_s" not in f  # no previous cycle to compare with
    assert f["clock_policy_gpus"] == result.counters.clock_policy_gpus == 0  # no job announced


def test_decision_point_counts_stale_offline_failsafe_and_resends(
    bench: Bench, records: Records
) -> None:
    bench.report_all(300.0)
    bench.apply(bench.cycle(), ack=False)
    bench.clock.advance(4.0)
    for node in ("k1-n2", "k2-n1"):
        bench.report(node, 300.0)
    bench.report("k2-n2", 300.0, mode="failsafe")
    bench.core.on_status(
        "k3-n1", b'{"v":1,"node":"k3-n1","state":"offline","ts":0,"gpus":2,"agent_version":"x"}'
    )
    bench.clock.advance(2.0)  # k1-n1 silent 6 s: stale; the others are 2 s old, resent
    bench.report("k1-n2", 300.0)
    bench.report("k2-n1", 300.0)
    result = bench.cycle()
    (decision,) = [
        p for p in parsed(records.cycle(bench.core, result, TS)) if p.measurement == "decision"
    ]
    f = decision.fields
    assert (f["stale_nodes"], f["offline_nodes"], f["failsafe_nodes"]) == (1, 1, 1)
    assert f["resends"] == f["acks_missing"] == 2  # k1-n2 and k2-n1, live and unacknowledged
    assert f["commands_sent"] == 3  # the two resends and the failsafe node


def test_site_ramp_is_the_change_of_the_site_cap_sum_per_second(records: Records) -> None:
    # the bands, which hand rack k1 watts back as the load goes (safety by caps leaves caps
    # nobody draws where they are)
    bench = make_bench(policy=BANDS)
    bench.report_all(650.0)
    first = bench.cycle()
    records.cycle(bench.core, first, TS)
    bench.apply(first)
    site_cap_before = float(first.decision.cap_w.sum()) + 100.0
    bench.report_all(100.0)  # the load goes: rack k1 is handed watts back
    second = bench.cycle(advance_s=2.0)
    points = parsed(records.cycle(bench.core, second, TS + 2))
    (decision,) = [p for p in points if p.measurement == "decision"]
    site_cap_after = float(second.decision.cap_w.sum()) + 100.0
    assert site_cap_after > site_cap_before
    assert decision.fields["site_ramp_w_per_s"] == pytest.approx(
        (site_cap_after - site_cap_before) / 2.0
    )


def decision_of(points: list[ParsedLine]) -> ParsedLine:
    (decision,) = [p for p in points if p.measurement == "decision"]
    return decision


def test_site_power_ramp_is_the_change_of_the_measured_site_power_per_second(
    bench: Bench, records: Records
) -> None:
    bench.report_all(650.0)  # 10 GPUs at 650 W, and rack k1's 100 W overhead
    first = decision_of(parsed(records.cycle(bench.core, bench.cycle(), TS)))
    assert "site_power_ramp_w_per_s" not in first.fields  # nothing to compare with yet
    bench.report_all(100.0)  # the load goes
    points = parsed(records.cycle(bench.core, bench.cycle(advance_s=2.0), TS + 2))
    site = next(p.fields for p in points if p.tags.get("level") == "site")
    assert site["power_w"] == 10 * 100.0 + 100.0
    # by hand: (1,100 W - 6,600 W) / 2 s; the caps' ramp is another number
    ramp = decision_of(points).fields
    assert ramp["site_power_ramp_w_per_s"] == (1_100.0 - 6_600.0) / 2.0 == -2_750.0
    assert ramp["site_ramp_w_per_s"] != ramp["site_power_ramp_w_per_s"]
    bench.report_all(400.0)
    third = decision_of(parsed(records.cycle(bench.core, bench.cycle(advance_s=0.5), TS + 2.5)))
    assert third.fields["site_power_ramp_w_per_s"] == (4_100.0 - 1_100.0) / 0.5


def test_grid_limits_are_on_the_decision_point_only_with_a_grid_spec(bench: Bench) -> None:
    bench.report_all(650.0)
    result = bench.cycle()
    assert bench.topology.grid is None
    plain = decision_of(
        parsed(Records("prod", bench.topology, "ctl-a").cycle(bench.core, result, TS))
    )
    assert not {"grid_ramp_up_w_per_s", "grid_ramp_down_w_per_s"} & set(plain.fields)

    def with_grid(grid: GridSpec) -> dict:
        topology = dataclasses.replace(bench.topology, grid=grid)
        lines = Records("prod", topology, "ctl-a").cycle(bench.core, result, TS)
        return decision_of(parsed(lines)).fields

    both = with_grid(GridSpec(ramp_up_w_per_s=20_000.0, ramp_down_w_per_s=35_000.0, window_s=5.0))
    assert (both["grid_ramp_up_w_per_s"], both["grid_ramp_down_w_per_s"]) == (20_000.0, 35_000.0)
    up_only = with_grid(GridSpec(ramp_up_w_per_s=20_000.0))  # ramp down: inf, no limit
    assert up_only["grid_ramp_up_w_per_s"] == 20_000.0
    assert "grid_ramp_down_w_per_s" not in up_only
    neither = with_grid(GridSpec(floor_fraction=0.5))  # a grid spec without ramp limits
    assert not {"grid_ramp_up_w_per_s", "grid_ramp_down_w_per_s"} & set(neither)


# --- telemetry and phases --------------------------------------------------------------


def test_telemetry_points_carry_placement_job_and_phase(bench: Bench, records: Records) -> None:
    bench.phase("llm-70b", "startup", ["k3-n1"], priority="high")
    bench.phase("llm-70b", "checkpoint", priority="high")
    sample = bench.report("k3-n1", [610.0, 0.0], cap_w=[650.0, 700.0], clock_mhz=1100, seq=41)
    assert sample is not None
    points = parsed(records.telemetry(bench.core, sample))
    assert len(points) == 2
    for i, p in enumerate(points):
        assert p.measurement == "gpu"
        assert p.tags == {
            "cluster": "prod",
            "site": "lab",
            "row": "r2",
            "rack": "k3",
            "node": "k3-n1",
            "gpu": str(i),
            "job": "llm-70b",
            "phase": "checkpoint",
            "mode": "controlled",
        }
        assert p.ts_ns == to_ns(sample.ts)
        assert p.fields["seq"] == 41
        assert p.fields["max_sm_clock_mhz"] == 1100.0
    assert points[0].fields["power_w"] == 610.0
    assert (points[0].fields["capped"], points[1].fields["capped"]) == (1, 0)
    assert points[1].fields["power_w"] == 0.0  # a zero is a value, not a missing one


def test_telemetry_of_a_node_without_a_job_has_no_job_tags(bench: Bench, records: Records) -> None:
    sample = bench.report("k1-n2", 300.0, mode="failsafe")
    assert sample is not None
    for p in parsed(records.telemetry(bench.core, sample)):
        assert "job" not in p.tags and "phase" not in p.tags
        assert (p.tags["rack"], p.tags["row"], p.tags["mode"]) == ("k1", "r1", "failsafe")
        assert "max_sm_clock_mhz" not in p.fields  # not locked: left out, not 0


def test_telemetry_points_carry_the_gpus_smoothing_state(bench: Bench, records: Records) -> None:
    sample = bench.report("k3-n1", [610.0, 590.0])
    assert sample is not None
    states = [
        GpuSmoothingState(enabled=True, preset=1, floor_percent=62.5),  # hardware
        GpuSmoothingState(enabled=True, preset=0, floor_percent=40.0, mechanism="software"),
    ]
    sample.gpus = [
        msgspec.structs.replace(g, smoothing=s) for g, s in zip(sample.gpus, states, strict=True)
    ]
    hardware, software = (p.fields for p in parsed(records.telemetry(bench.core, sample)))
    assert (hardware["smoothing_enabled"], hardware["smoothing_software"]) == (1, 0)
    assert hardware["smoothing_floor_pct"] == 62.5
    assert (software["smoothing_enabled"], software["smoothing_software"]) == (1, 1)
    assert software["smoothing_floor_pct"] == 40.0
    off = GpuSmoothingState(enabled=False, preset=0, floor_percent=0.0, mechanism="hardware")
    sample.gpus = [msgspec.structs.replace(g, smoothing=off) for g in sample.gpus]
    for p in parsed(records.telemetry(bench.core, sample)):
        assert (p.fields["smoothing_enabled"], p.fields["smoothing_software"]) == (0, 0)
        assert p.fields["smoothing_floor_pct"] == 0.0  # a zero floor is a value


def test_a_sample_without_the_state_is_recorded_with_the_last_its_gpu_sent(
    bench: Bench, records: Records
) -> None:
    """Agents send a smoothing state when it changes and every tenth sample (docs/PROTOCOL.md):
    a point records the last state its GPU sent, so a dashboard sees it at every point."""
    on = GpuSmoothingState(enabled=True, preset=1, floor_percent=62.5)
    with_state = decode(Telemetry, telemetry_payload("k3-n1", [610.0, 590.0], seq=1))
    with_state.gpus = [
        msgspec.structs.replace(with_state.gpus[0], smoothing=on),
        with_state.gpus[1],
    ]
    assert bench.core.on_telemetry("k3-n1", encode(with_state)) is not None
    bench.clock.advance(1.0)
    later = bench.core.on_telemetry("k3-n1", telemetry_payload("k3-n1", [600.0, 580.0], seq=2))
    assert later is not None and all(g.smoothing is None for g in later.gpus)
    first, second = (p.fields for p in parsed(records.telemetry(bench.core, later)))
    assert (first["smoothing_enabled"], first["smoothing_floor_pct"]) == (1, 62.5)
    assert not [name for name in second if name.startswith("smoothing")]  # never sent one


def test_telemetry_without_a_smoothing_state_has_no_smoothing_fields(
    bench: Bench, records: Records
) -> None:
    sample = bench.report("k1-n1", 300.0)
    assert sample is not None and all(g.smoothing is None for g in sample.gpus)
    for p in parsed(records.telemetry(bench.core, sample)):
        assert not [name for name in p.fields if name.startswith("smoothing")], p.fields


def test_phase_event_point(records: Records) -> None:
    event = decode(
        PhaseEvent, phase_payload("llm-70b", "checkpoint", ["k1-n1", "k1-n2"], "high", 45.0)
    )
    (p,) = parsed(records.phase(event))
    assert p.measurement == "phase_event"
    assert p.tags == {
        "cluster": "prod",
        "job": "llm-70b",
        "phase": "checkpoint",
        "priority": "high",
    }
    assert p.fields == {"events": 1, "nodes": 2, "expected_s": 45.0}
    assert p.ts_ns == to_ns(WALL0)
    (p,) = parsed(records.phase(decode(PhaseEvent, phase_payload("llm-70b", "compute"))))
    assert p.fields == {"events": 1}  # no node list, no expectation


def test_by_level_name(bench: Bench) -> None:
    top = bench.topology
    node = top.node_index("k3-n1")
    assert by_level_name(top, node, RACK) == "k3"
    assert by_level_name(top, node, ROW) == "r2"
    assert by_level_name(top, node, SITE) == "lab"
    assert by_level_name(top, top.node_index("k1"), RACK) == "k1"  # itself
    assert by_level_name(top, top.node_index("r1"), RACK) is None  # above the level


# --- fine_every_s: per-node points once per window, windows staggered ----------------


def test_fine_recording_writes_each_node_once_per_window_spread_over_the_window() -> None:
    """400 nodes at 1 Hz for 60 s, fine_every_s = 10: each node's gpu points once per
    10 s window (after its first), and no second carries much more than a tenth of them."""
    from powerd.protocol import GpuTelemetry, Telemetry
    from powerd.topology import parse_budgets

    topology = parse_budgets(
        """
version = 1
[site]
name = "s"
limit_w = 3e6
budget_w = 2e6
[models.H100]
failsafe_cap_w = 500
[rows]
count = 1
name = "r"
limit_w = 3e6
budget_w = 2e6
[rows.racks]
count = 20
name = "k{i}"
limit_w = 100000
budget_w = 90000
[rows.racks.nodes]
count = 20
name = "{rack}-n{i}"
gpus = 1
model = "H100"
"""
    )
    nodes = list(topology.servers)
    assert len(nodes) == 400
    records = Records("c", topology, "ctl", fine_every_s=10.0)
    bench = make_bench()
    per_second: list[int] = []
    seen: dict[str, list[float]] = {n: [] for n in nodes}
    for second in range(60):
        count = 0
        for k, node in enumerate(nodes):
            ts = WALL0 + second + k / len(nodes)
            gpu = GpuTelemetry(
                index=0, uuid="u", power_w=100.0, energy_j=None, cap_w=700.0, cap_min_w=200.0,
                cap_max_w=700.0, sm_clock_mhz=1000, max_sm_clock_mhz=None, util_pct=1.0,
                temp_c=40.0,
            )  # fmt: skip
            sample = Telemetry(v=1, node=node, ts=ts, seq=second, mode="controlled", gpus=[gpu])
            if records.telemetry(bench.core, sample):
                seen[node].append(ts)
                count += 1
        per_second.append(count)
    assert per_second[:1] == [0]  # no burst when the controller starts
    for node, times in seen.items():
        assert len(times) in (5, 6), node  # windows 1..5 (or 6) of 60 s after the first
        assert all(9.0 < b - a < 11.0 for a, b in itertools.pairwise(times)), node
    assert max(per_second[10:]) < 2.5 * len(nodes) / 10  # a tenth a second, give or take


def test_fine_recording_staggers_the_node_level_tree_points(bench: Bench) -> None:
    records = Records("prod", bench.topology, "ctl-a", fine_every_s=10.0)
    bench.report_all(650.0)
    servers = set(bench.topology.servers)
    written: dict[str, list[float]] = {n: [] for n in servers}
    for second in range(41):
        result = bench.cycle(advance_s=1.0)
        for p in parsed(records.cycle(bench.core, result, TS + second)):
            if p.measurement == "tree" and p.tags["name"] in servers:
                written[p.tags["name"]].append(second)
            elif p.measurement == "tree":
                assert p.tags["level"] in ("site", "row", "rack")
        bench.report_all(650.0)
    for node, seconds in written.items():
        assert len(seconds) == 4, (node, seconds)  # every 10 s, none in the first cycle
        assert all(b - a == 10 for a, b in itertools.pairwise(seconds)), node
