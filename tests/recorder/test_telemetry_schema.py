"""The telemetry schema: every builder, escaping, field types, and the line-protocol parser."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from influxdb_client import Point, WritePrecision

from powerd.protocol import GpuSmoothingState, PhaseEvent, Telemetry, decode
from powerd.telemetry_schema import (
    FLOAT,
    GPU,
    INT,
    MEASUREMENTS,
    STRING,
    Field,
    Measurement,
    Tag,
    decision_line,
    escape_key,
    gpu_line,
    iter_lines,
    parse_line,
    phase_event_from_message,
    phase_event_line,
    telemetry_lines,
    to_ns,
    tree_line,
)
from tests.support.paths import REPO
from tests.support.protocol_examples import EXAMPLES


def must(line: str | None) -> str:
    """A line the builder had to write (None: every field was empty)."""
    assert line is not None
    return line


TS = 1795320426.28
TS_NS = 1795320426280000000


def test_gpu_line() -> None:
    line = gpu_line(
        TS,
        cluster="c1",
        site="s1",
        row="row-a",
        rack="rack-3",
        node="r01-n03",
        gpu=2,
        job="llama-70b",
        phase="compute",
        mode="controlled",
        power_w=612.4,
        energy_j=918273.5,
        cap_w=650,  # an int in: a float out
        cap_min_w=200.0,
        cap_max_w=700.0,
        sm_clock_mhz=1755,
        max_sm_clock_mhz=None,  # not locked: left out
        util_pct=97.0,
        temp_c=61.0,
        capped=True,
        seq=812,
    )
    assert line == (
        "gpu,cluster=c1,gpu=2,job=llama-70b,mode=controlled,node=r01-n03,phase=compute,"
        "rack=rack-3,row=row-a,site=s1 "
        "power_w=612.4,energy_j=918273.5,cap_w=650.0,cap_min_w=200.0,cap_max_w=700.0,"
        "sm_clock_mhz=1755.0,util_pct=97.0,temp_c=61.0,capped=1i,seq=812i "
        f"{TS_NS}"
    )


def test_telemetry_lines_from_the_protocol_example() -> None:
    message = decode(Telemetry, EXAMPLES[Telemetry])
    (line,) = telemetry_lines("c1", message, row="r01", rack="r01-k1", job="j", phase="eval")
    point = parse_line(must(line))
    assert point.measurement == "gpu"
    assert point.tags == {
        "cluster": "c1",
        "row": "r01",
        "rack": "r01-k1",
        "node": "r01-n03",
        "gpu": "0",
        "job": "j",
        "phase": "eval",
        "mode": "controlled",
    }
    assert point.fields == {
        "power_w": 612.4,
        "energy_j": 918273.5,
        "cap_w": 650.0,
        "cap_min_w": 200.0,
        "cap_max_w": 700.0,
        "sm_clock_mhz": 1755.0,
        "util_pct": 97.0,
        "temp_c": 61.0,
        "capped": 1,
        "seq": 812,
    }
    assert point.ts_ns == TS_NS


def test_telemetry_lines_carry_the_smoothing_state_where_a_gpu_reports_one() -> None:
    message = decode(Telemetry, EXAMPLES[Telemetry])
    (gpu,) = message.gpus
    states = {
        "hardware": GpuSmoothingState(enabled=True, preset=2, floor_percent=55.0),
        "software": GpuSmoothingState(
            enabled=True, preset=0, floor_percent=30.5, mechanism="software"
        ),
        "off": GpuSmoothingState(enabled=False, preset=0, floor_percent=0.0, mechanism="hardware"),
    }
    expected = {"hardware": (1, 0, 55.0), "software": (1, 1, 30.5), "off": (0, 0, 0.0)}
    for name, state in states.items():
        gpu.smoothing = state
        (line,) = telemetry_lines("c1", message)
        assert line.endswith(
            f",seq=812i,smoothing_enabled={expected[name][0]}i,"
            f"smoothing_software={expected[name][1]}i,"
            f"smoothing_floor_pct={expected[name][2]!r} {TS_NS}"
        ), line
        fields = parse_line(line).fields
        got = tuple(fields[f] for f in ("smoothing_enabled", "smoothing_software"))
        assert (*got, fields["smoothing_floor_pct"]) == expected[name]
    gpu.smoothing = None  # none reported: none written, not zeros
    (line,) = telemetry_lines("c1", message)
    assert "smoothing" not in line


@pytest.mark.parametrize(
    ("enabled", "floor", "mechanism"),
    [
        (True, 60.0, None),
        (True, 60.0, "hardware"),
        (True, 45.5, "software"),
        (False, 0.0, "software"),
        (1, 60, None),  # ints where a bool and a float go (a struct built in code)
        (True, math.nan, None),  # the floor left out, the rest written
    ],
)
def test_telemetry_lines_write_the_smoothing_state_as_gpu_line_does(
    enabled, floor: float, mechanism
) -> None:
    message = decode(Telemetry, EXAMPLES[Telemetry])
    (gpu,) = message.gpus
    gpu.smoothing = GpuSmoothingState(enabled=True, preset=0, floor_percent=0.0)
    gpu.smoothing.enabled, gpu.smoothing.floor_percent = enabled, floor
    gpu.smoothing.mechanism = mechanism
    expected = gpu_line(
        message.ts, cluster="c1", node=message.node, gpu=gpu.index, mode=message.mode,
        power_w=gpu.power_w, energy_j=gpu.energy_j, cap_w=gpu.cap_w, cap_min_w=gpu.cap_min_w,
        cap_max_w=gpu.cap_max_w, sm_clock_mhz=gpu.sm_clock_mhz,
        max_sm_clock_mhz=gpu.max_sm_clock_mhz, util_pct=gpu.util_pct, temp_c=gpu.temp_c,
        capped=gpu.cap_w < gpu.cap_max_w, seq=message.seq, smoothing_enabled=enabled,
        smoothing_software=mechanism == "software", smoothing_floor_pct=floor,
    )  # fmt: skip
    assert telemetry_lines("c1", message) == [expected]
    fields = parse_line(must(expected)).fields
    assert (fields["smoothing_enabled"], fields["smoothing_software"]) == (
        int(enabled),
        int(mechanism == "software"),
    )


def test_tree_line() -> None:
    line = tree_line(
        TS,
        cluster="c1",
        level="rack",
        name="rack-3",
        site="s1",
        row="row-a",
        power_w=118_000.5,
        budget_w=120_000,
        limit_w=130_000,
        cap_threshold_w=117_600,
        cap_target_w=114_000,
        predicted_w=114_100.0,
        capped_share=0.25,
        capping=True,
    )
    point = parse_line(must(line))
    assert point.tags == {
        "cluster": "c1",
        "level": "rack",
        "name": "rack-3",
        "row": "row-a",
        "site": "s1",
    }
    assert point.fields == {
        "power_w": 118000.5,
        "budget_w": 120000.0,
        "limit_w": 130000.0,
        "cap_threshold_w": 117600.0,
        "cap_target_w": 114000.0,
        "predicted_w": 114100.0,
        "capped_share": 0.25,
        "capping": 1,
    }
    assert must(line).startswith("tree,cluster=c1,level=rack,name=rack-3,row=row-a,site=s1 ")


def test_decision_line() -> None:
    line = decision_line(
        TS,
        cluster="c1",
        controller="ctl-a",
        cycle_s=0.0123,
        commands_sent=np.int64(40),  # type: ignore[arg-type]  # numpy counts are fine
        acks_received=38,
        acks_missing=2,
        stale_nodes=0,
        failsafe_nodes=1,
        epoch=7,
        gpus_capped=np.float64(120.0),  # a numpy sum: a whole float, an int out
        site_ramp_w_per_s=-2500,
    )
    assert line == (
        "decision,cluster=c1,controller=ctl-a cycle_s=0.0123,commands_sent=40i,"
        "acks_received=38i,acks_missing=2i,stale_nodes=0i,failsafe_nodes=1i,epoch=7i,"
        f"gpus_capped=120i,site_ramp_w_per_s=-2500.0 {TS_NS}"
    )


def test_decision_line_ramps_and_grid_limits() -> None:
    line = decision_line(
        TS,
        cluster="c1",
        site_ramp_w_per_s=1200.0,
        site_power_ramp_w_per_s=-31_500.25,
        grid_ramp_up_w_per_s=20_000,  # an int in: a float out
        grid_ramp_down_w_per_s=math.inf,  # no limit: left out
    )
    assert line == (
        "decision,cluster=c1 site_ramp_w_per_s=1200.0,site_power_ramp_w_per_s=-31500.25,"
        f"grid_ramp_up_w_per_s=20000.0 {TS_NS}"
    )


def test_phase_event_lines() -> None:
    message = decode(PhaseEvent, EXAMPLES[PhaseEvent])
    point = parse_line(phase_event_from_message("c1", message))
    assert point == (
        "phase_event",
        {"cluster": "c1", "job": "llama-70b-pretrain", "phase": "checkpoint", "priority": "high"},
        {"events": 1, "nodes": 2, "expected_s": 45.0},
        1795320426000000000,
    )
    # no node list (all the job's nodes), no expected duration: still a point
    bare = phase_event_line(TS, cluster="c1", job="j", phase="compute")
    assert bare == f"phase_event,cluster=c1,job=j,phase=compute events=1i {TS_NS}"


def test_missing_and_non_finite_fields_are_left_out() -> None:
    line = gpu_line(1.0, cluster="c", node="n", gpu=0, power_w=math.nan, cap_w=math.inf, temp_c=40)
    assert parse_line(must(line)).fields == {"temp_c": 40.0}
    assert gpu_line(1.0, cluster="c", node="n", gpu=0, power_w=math.nan) is None
    assert decision_line(1.0, cluster="c", epoch=None) is None
    assert decision_line(1.0, cluster="c", commands_sent=float("nan")) is None


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: gpu_line(1.0, cluster="c", node="n", gpu=0, watts=1.0), "no field 'watts'"),
        (lambda: GPU.line(1.0, {"cluster": "c", "node": "n", "gpu": 0, "x": "y"}, {}), "no tag"),
        (lambda: gpu_line(1.0, cluster="c", node="", gpu=0, power_w=1.0), "tag node is required"),
        (lambda: gpu_line(1.0, cluster="c", node="n", gpu=0, mode="auto", power_w=1), "mode"),
        (lambda: gpu_line(1.0, cluster="c", node="n", gpu=0, phase="lunch", power_w=1), "phase"),
        (lambda: gpu_line(1.0, cluster="c", node="n", gpu=True, power_w=1), "must be a string"),
        (lambda: gpu_line(1.0, cluster="c", node="n", gpu=0, power_w="1.0"), "must be a number"),  # type: ignore[arg-type]
        (lambda: gpu_line(math.nan, cluster="c", node="n", gpu=0, power_w=1), "timestamp"),
        (lambda: gpu_line("now", cluster="c", node="n", gpu=0, power_w=1), "timestamp"),  # type: ignore[arg-type]
        (lambda: tree_line(1.0, cluster="c", level="pdu", name="p", power_w=1), "level"),
        (lambda: phase_event_line(1.0, cluster="c", job="j", phase="x"), "phase"),
        (lambda: phase_event_line(1.0, cluster="c", job="j", phase="eval", priority="x"), "prio"),
    ],
)
def test_programming_errors_are_value_errors(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_every_field_has_one_type_whatever_it_is_given() -> None:
    """InfluxDB fixes a field's type at its first point: the builders must never vary it."""
    for given_value in (1, 1.0, np.int32(1), np.float32(1.0), True, np.float64(1.0)):
        for m in MEASUREMENTS:
            tags = {t.name: "x" for t in m.tags if t.required and not t.allowed}
            tags.update({t.name: t.allowed[0] for t in m.tags if t.required and t.allowed})
            fields = {f.name: given_value for f in m.fields if f.type != STRING}
            point = parse_line(must(m.line(TS, tags, fields)))
            for f in m.fields:
                expected = float if f.type == FLOAT else int
                assert type(point.fields[f.name]) is expected, (m.name, f.name, given_value)


def test_units_decide_the_types() -> None:
    for m in MEASUREMENTS:
        for f in m.fields:
            if re.search(r"_(w|j|s|pct|mhz|c|w_per_s|share)$", f.name):
                assert f.type == FLOAT, f"{m.name}.{f.name}"
            else:
                assert f.type == INT, f"{m.name}.{f.name}: counts and flags are integers"
        assert len({f.name for f in m.fields}) == len(m.fields)
        assert not {t.name for t in m.tags} & {f.name for f in m.fields}


def test_timestamps_are_nanoseconds_rounded_to_the_microsecond() -> None:
    assert to_ns(1795325176.01) == 1795325176010000000  # the float is ...175.009999990...
    assert to_ns(1) == 1_000_000_000
    assert to_ns(np.float64(0.5)) == 500_000_000
    for bad in (math.inf, math.nan, None, "1", True):
        with pytest.raises(ValueError):
            to_ns(bad)  # type: ignore[arg-type]


# --- escaping --------------------------------------------------------------------------

# a measurement with a string field, to test what powerd's own schema does not use (yet)
NOTE = Measurement(
    name="note m,x",
    description="test",
    writer="test",
    rate="test",
    tags=(Tag("k", "test", required=True),),
    fields=(Field("text", STRING, "", "test"), Field("n x=1", INT, "", "test")),
)


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        ("a b", r"a\ b"),
        ("a,b", r"a\,b"),
        ("a=b", r"a\=b"),
        ("ends\\", "ends\\\\"),  # a trailing backslash cannot eat the separator
        ("back\\slash", "back\\\\slash"),
        ('quo"te', 'quo"te'),
        ("é ☃", r"é\ ☃"),
    ],
)
def test_tag_values_are_escaped_and_read_back(value: str, escaped: str) -> None:
    line = NOTE.line(1.0, {"k": value}, {"text": "t"})
    assert line == f'note\\ m\\,x,k={escaped} text="t" 1000000000'
    assert parse_line(line).tags == {"k": value}


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        ('say "hi"', r'"say \"hi\""'),
        ("c:\\dir\\", r'"c:\\dir\\"'),
        ("a, b=c d", '"a, b=c d"'),
        ("", '""'),
    ],
)
def test_string_fields_are_quoted_and_escaped(value: str, escaped: str) -> None:
    line = NOTE.line(1.0, {"k": "v"}, {"text": value, "n x=1": 3})
    assert line == f"note\\ m\\,x,k=v text={escaped},n\\ x\\=1=3i 1000000000"
    assert parse_line(line).fields == {"text": value, "n x=1": 3}


def test_newlines_never_split_a_point() -> None:
    line = must(NOTE.line(1.0, {"k": "two\nlines\ttab\r"}, {"text": "multi\nline"}))
    assert "\n" not in line and "\r" not in line
    point = parse_line(must(line))
    # line protocol cannot carry them: they become visible escapes, as influxdb-client does
    assert point.tags == {"k": "two\\nlines\\ttab\\r"}
    assert point.fields == {"text": "multi\\nline"}


TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\n\r\t"))


@settings(max_examples=300, deadline=None)
@given(tag=TEXT.filter(bool), text=TEXT, number=st.floats(allow_nan=False, allow_infinity=False))
def test_any_text_round_trips(tag: str, text: str, number: float) -> None:
    line = NOTE.line(1.5, {"k": tag}, {"text": text, "n x=1": round(number) % 1000})
    assert parse_line(must(line)) == (
        "note m,x",
        {"k": tag},
        {"text": text, "n x=1": round(number) % 1000},
        1_500_000_000,
    )


@settings(max_examples=300, deadline=None)
@given(
    node=TEXT.filter(lambda s: s and "\\" not in s),
    job=TEXT.filter(lambda s: s and "\\" not in s),
    power=st.floats(allow_nan=False, allow_infinity=False),
    seq=st.integers(min_value=0, max_value=2**62),
)
def test_same_points_as_influxdb_client(node: str, job: str, power: float, seq: int) -> None:
    """What the official client's Point writes, read back, equals what we write, read back.

    (Backslashes excluded: Point does not double them, it pads a trailing one with a space.)
    """
    ours = gpu_line(TS, cluster="c1", node=node, gpu=3, job=job, power_w=power, seq=seq)
    theirs = (
        Point("gpu")
        .tag("cluster", "c1")
        .tag("node", node)
        .tag("gpu", "3")
        .tag("job", job)
        .field("power_w", power)
        .field("seq", seq)
        .time(TS_NS, WritePrecision.NS)
        .to_line_protocol()
    )
    a, b = parse_line(must(ours)), parse_line(theirs)
    assert (a.measurement, a.tags, a.ts_ns) == (b.measurement, b.tags, b.ts_ns)
    assert a.fields == b.fields and type(a.fields["power_w"]) is float


# --- the parser ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "",
        "m",
        "m ",
        ",t=1 v=1",
        "m,t v=1",
        "m,t= v=1",
        "m v",
        "m v=",
        "m v=abc",
        "m v=nan",
        'm v="open',
        "m v=1 12x",
        "m v=1 1 2",
        "m v=-1u",
    ],
)
def test_invalid_lines_are_refused(line: str) -> None:
    with pytest.raises(ValueError):
        parse_line(line)


def test_the_parser_reads_other_writers_lines() -> None:
    point = parse_line("m,t=a b=true,c=F,u=7u,f=1e-3,i=-2i")
    assert point == ("m", {"t": "a"}, {"b": True, "c": False, "u": 7, "f": 0.001, "i": -2}, None)
    text = "# a comment\n\nm v=1 1\n  \nm v=2 2\n"
    assert [p.fields["v"] for p in iter_lines(text)] == [1.0, 2.0]


def test_escape_key_is_what_the_lines_use() -> None:
    assert escape_key("a b,c=d\\") == "a\\ b\\,c\\=d\\\\"


# --- the documentation ---------------------------------------------------------------


def test_docs_list_every_measurement_tag_and_field_with_its_type() -> None:
    doc = (REPO / "docs" / "TELEMETRY.md").read_text()
    for m in MEASUREMENTS:
        assert f"## `{m.name}`" in doc
        section = doc.split(f"## `{m.name}`", 1)[1].split("\n## ", 1)[0]
        for t in m.tags:
            assert re.search(rf"^\| `{t.name}` \| tag \|", section, re.M), f"{m.name} tag {t.name}"
        for f in m.fields:
            kind = {FLOAT: "float", INT: "integer", STRING: "string"}[f.type]
            row = rf"^\| `{f.name}` \| {kind} \| {re.escape(f.unit)} \|"
            assert re.search(row, section, re.M), f"{m.name} field {f.name} ({kind}, {f.unit})"


# --- telemetry_lines' fast path writes what gpu_line writes ----------------------------

_NUMBER = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.integers(-(10**6), 10**6),
)


@settings(max_examples=300, deadline=None)
@given(
    power=_NUMBER,
    energy=st.one_of(st.none(), _NUMBER),
    cap=_NUMBER,
    clock=st.one_of(st.integers(0, 5000), st.floats(0, 5000)),
    lock=st.one_of(st.none(), st.integers(0, 5000)),
    seq=st.integers(0, 10**20),
    mode=st.sampled_from(["controlled", "failsafe", "local"]),
    job=st.one_of(st.none(), st.text("ab ,=\\", min_size=1, max_size=5)),
    phase=st.one_of(st.none(), st.sampled_from(["compute", "checkpoint"])),
    node=st.text('nx ,=\\"', min_size=1, max_size=6),
    smoothing=st.one_of(
        st.none(),
        st.tuples(
            st.one_of(st.booleans(), st.integers(0, 1)),
            st.one_of(st.floats(0, 100), _NUMBER),
            st.sampled_from([None, "hardware", "software"]),
        ),
    ),
)
def test_telemetry_lines_fast_path_matches_gpu_line(
    power, energy, cap, clock, lock, seq, mode, job, phase, node, smoothing
) -> None:
    """Whatever the numbers (NaN, infinities, ints where floats go), tag characters and
    smoothing state, ``telemetry_lines`` (fast path) gives exactly the line ``gpu_line``
    gives."""
    from powerd.protocol import GpuTelemetry
    from powerd.telemetry_schema import gpu_line

    gpu = GpuTelemetry(
        index=0, uuid="", power_w=0.0, energy_j=None, cap_w=1.0, cap_min_w=1.0,
        cap_max_w=1.0, sm_clock_mhz=0, max_sm_clock_mhz=None, util_pct=0.0, temp_c=0.0,
    )  # fmt: skip
    for name, value in dict(  # set as code might after construction: unchecked
        index=3, uuid="u", power_w=power, energy_j=energy, cap_w=cap, cap_min_w=200.0,
        cap_max_w=700.0, sm_clock_mhz=clock, max_sm_clock_mhz=lock, util_pct=50.0,
        temp_c=60.0, power_reading=None,
    ).items():  # fmt: skip
        setattr(gpu, name, value)
    state = None
    if smoothing is not None:
        state = GpuSmoothingState(enabled=False, preset=0, floor_percent=0.0)
        for name, value in zip(("enabled", "floor_percent", "mechanism"), smoothing, strict=True):
            setattr(state, name, value)
        gpu.smoothing = state
    message = Telemetry(v=1, node="x", ts=0.0, seq=0, mode="local", gpus=[])
    for name, value in dict(
        v=1, node=node, ts=1.8e9 + 0.123, seq=seq, mode=mode, gpus=[gpu], epoch=None
    ).items():
        setattr(message, name, value)
    expected = gpu_line(
        message.ts, cluster="c", node=node, gpu=3, site="s", row=None, rack="k",
        job=job, phase=phase, mode=mode, power_w=power, energy_j=energy, cap_w=cap,
        cap_min_w=200.0, cap_max_w=700.0, sm_clock_mhz=clock, max_sm_clock_mhz=lock,
        util_pct=50.0, temp_c=60.0, capped=cap < 700.0, seq=seq,
        smoothing_enabled=None if state is None else state.enabled,
        smoothing_software=None if state is None else state.mechanism == "software",
        smoothing_floor_pct=None if state is None else state.floor_percent,
    )  # fmt: skip
    got = telemetry_lines("c", message, site="s", rack="k", job=job, phase=phase)
    assert got == ([] if expected is None else [expected])
