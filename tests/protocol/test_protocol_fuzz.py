"""Property tests of powerd.protocol: decoding never fails in any way but ProtocolError.

For arbitrary bytes, arbitrary JSON-ish values and mutations of valid payloads,
``decode(cls, ...)`` for every message class either returns a ``cls`` or raises
``ProtocolError``, and whatever it accepts re-encodes and decodes to an equal value.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from powerd.protocol import (
    INT64_MAX,
    MAX_TTL_S,
    PHASES,
    Ack,
    Command,
    Heartbeat,
    PhaseEvent,
    ProtocolError,
    Status,
    Telemetry,
    Topics,
    check_name,
    decode,
    encode,
    peek_order,
)
from tests.support.protocol_examples import CLASSES, NAME_FIELD

NAME_RE = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"

FUZZ = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LIGHT = settings(FUZZ, max_examples=300)


def check(cls: type, payload: Any, name: str | None = None) -> Any:
    """Decode; on success the message must survive encode -> decode unchanged.

    Returns the message, or None when decode raised ProtocolError. Any other
    exception propagates and fails the test.
    """
    try:
        msg = decode(cls, payload, name)
    except ProtocolError:
        return None
    assert type(msg) is cls
    data = encode(msg)
    again = decode(cls, data, name)
    assert again == msg
    assert encode(again) == data
    return msg


def check_all(payload: Any) -> None:
    for cls in CLASSES:
        check(cls, payload)


# --- strategies ------------------------------------------------------------------

names = st.from_regex(NAME_RE, fullmatch=True)
finite = st.floats(allow_nan=False, allow_infinity=False)
non_neg = st.floats(min_value=0, allow_infinity=False)
positive = st.floats(min_value=0, exclude_min=True, allow_infinity=False)
ttl = st.floats(min_value=0, exclude_min=True, max_value=MAX_TTL_S)
counters = st.integers(min_value=0, max_value=INT64_MAX)
gpu_index = st.integers(min_value=0, max_value=1023)
clock = st.integers(min_value=0, max_value=100_000)
short_text = st.text(max_size=20)


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


gpu_telemetry = st.fixed_dictionaries(
    {
        "index": gpu_index,
        "uuid": short_text,
        "power_w": non_neg,
        "energy_j": _maybe(non_neg),
        "cap_w": non_neg,
        "cap_min_w": non_neg,
        "cap_max_w": non_neg,
        "sm_clock_mhz": clock,
        "max_sm_clock_mhz": _maybe(clock),
        "util_pct": st.floats(min_value=0, max_value=100),
        "temp_c": finite,
    },
    optional={"power_reading": _maybe(st.sampled_from(["instant", "average_1s", "simulated"]))},
)
gpu_command = st.fixed_dictionaries(
    {"index": gpu_index},
    optional={"cap_w": positive, "max_sm_clock_mhz": _maybe(positive | st.integers(1, 100_000))},
)
gpu_ack = st.fixed_dictionaries(
    {
        "index": gpu_index,
        "cap_w": _maybe(non_neg),
        "max_sm_clock_mhz": _maybe(clock),
        "clamped": st.booleans(),
    }
)
ack_error = st.fixed_dictionaries({"index": _maybe(gpu_index), "message": short_text})

VALID: dict[type, st.SearchStrategy[dict[str, Any]]] = {
    Telemetry: st.fixed_dictionaries(
        {
            "v": st.just(1),
            "node": names,
            "ts": finite,
            "seq": counters,
            "mode": st.sampled_from(["controlled", "failsafe", "local"]),
            "gpus": st.lists(gpu_telemetry, max_size=4),
        }
    ),
    Command: st.fixed_dictionaries(
        {
            "v": st.just(1),
            "epoch": counters,
            "seq": counters,
            "ts": finite,
            "ttl_s": ttl,
            "gpus": st.lists(gpu_command, max_size=4, unique_by=lambda g: g["index"]),
        }
    ),
    Ack: st.fixed_dictionaries(
        {
            "v": st.just(1),
            "node": names,
            "epoch": counters,
            "seq": counters,
            "ts": finite,
            "result": st.sampled_from(["applied", "partial", "stale", "rejected"]),
            "gpus": st.lists(gpu_ack, max_size=4),
            "errors": st.lists(ack_error, max_size=3),
        }
    ),
    Status: st.fixed_dictionaries(
        {
            "v": st.just(1),
            "node": names,
            "state": st.sampled_from(["online", "failsafe", "offline"]),
            "ts": finite,
            "gpus": counters,
            "agent_version": short_text,
        },
        optional={"failsafe_cap_w": non_neg},
    ),
    PhaseEvent: st.fixed_dictionaries(
        {"v": st.just(1), "job": names, "ts": finite, "phase": st.sampled_from(PHASES)},
        optional={
            "nodes": _maybe(st.lists(names, max_size=4)),
            "priority": st.sampled_from(["high", "normal", "low"]),
            "expected_s": _maybe(non_neg),
        },
    ),
    Heartbeat: st.fixed_dictionaries(
        {
            "v": st.just(1),
            "epoch": counters,
            "ts": finite,
            "controller": names,
            "state": st.sampled_from(["leader", "standby"]),
        }
    ),
}
valid_payloads = st.sampled_from(CLASSES).flatmap(lambda c: st.tuples(st.just(c), VALID[c]))

FIELD_NAMES = sorted(
    {f.name for cls in CLASSES for f in msgspec.structs.fields(cls)}
    | {"index", "uuid", "power_w", "cap_w", "clamped", "message", "max_sm_clock_mhz", "util_pct"}
)
INTERESTING_STRINGS = [
    "",
    "r01-n03",
    "controlled",
    "leader",
    "online",
    "applied",
    "checkpoint",
    "high",
    "instant",
    "1",
    "1e999",
    "NaN",
    "\x00",
    "\ud800",
    "a" * 65,
]
leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.sampled_from([0, 1, -1, 1023, 1024, 2**63, 2**64, -(2**63) - 1])
    | st.floats()  # includes nan, inf, -inf, huge and subnormal values
    | st.text(st.characters(exclude_categories=()), max_size=12)
    | st.sampled_from(INTERESTING_STRINGS)
)
json_values = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=8), children, max_size=8)
    ),
    max_leaves=30,
)

# Valid JSON that an unknown field may hold: finite numbers, no lone surrogates (a
# "\ud800" escape is not Unicode, and the decoder rejects it even where it skips).
plain_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=20,
)


def dumps(value: Any, overflow: bool) -> bytes:
    """JSON text, with non-finite floats as NaN/Infinity tokens or (overflow) as 1e999."""
    text = json.dumps(value, allow_nan=True, ensure_ascii=False)
    if overflow:
        text = (
            text.replace("-Infinity", "-1e999").replace("Infinity", "1e999").replace("NaN", "1e999")
        )
    return text.encode("utf-8", "surrogatepass")


# --- arbitrary input ---------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=2048))
@example(b"")
@example(b"\xff")
@example(b"{" * 5000)
@example(b"[" * 40000)
@example(b'{"v":1,"x":' + b"[" * 30000 + b"]" * 30000 + b"}")
def test_arbitrary_bytes(payload: bytes) -> None:
    check_all(payload)
    check_all(bytearray(payload))
    check_all(memoryview(payload))


@LIGHT
@given(st.text(st.characters(exclude_categories=()), max_size=512))
@example("\ud800")
@example('{"v":1,"node":"\udfff"}')
def test_arbitrary_text(payload: str) -> None:
    check_all(payload)


@FUZZ
@given(json_values, st.booleans())
@example(float("nan"), False)
@example({"v": 1, "epoch": float("inf")}, True)
def test_arbitrary_json_values(value: Any, overflow: bool) -> None:
    check_all(dumps(value, overflow))


@LIGHT
@given(st.data())
def test_objects_with_real_field_names(data: st.DataObject) -> None:
    """Objects whose keys are the protocol's own, with arbitrary values: validation runs deep."""
    cls = data.draw(st.sampled_from(CLASSES))
    fields = [f.name for f in msgspec.structs.fields(cls)]
    obj = data.draw(st.fixed_dictionaries({}, optional={f: json_values for f in fields}))
    obj.setdefault("v", 1)
    payload = dumps(obj, data.draw(st.booleans()))
    check(cls, payload)
    check_all(payload)


# --- valid payloads and their mutations ----------------------------------------------


@FUZZ
@given(valid_payloads)
def test_valid_payloads_accepted(case: tuple[type, dict[str, Any]]) -> None:
    cls, obj = case
    payload = json.dumps(obj).encode()
    msg = check(cls, payload)
    assert msg is not None, payload
    field = NAME_FIELD.get(cls)
    if field is not None:
        assert check(cls, payload, obj[field]) == msg
        try:
            decode(cls, payload, obj[field] + "x")
        except ProtocolError as exc:
            assert "does not match topic name" in str(exc)
        else:
            raise AssertionError("a name differing from the topic's was accepted")
    # the same JSON value goes out again, less the optional fields left at their default
    assert json.loads(encode(msg)) == _without_defaults(obj)


OMITTED_DEFAULTS = {"nodes": None, "expected_s": None, "priority": "normal", "power_reading": None}


def _without_defaults(value: Any) -> Any:
    if isinstance(value, list):
        return [_without_defaults(v) for v in value]
    if isinstance(value, dict):
        return {
            k: _without_defaults(v)
            for k, v in value.items()
            if not (k in OMITTED_DEFAULTS and v == OMITTED_DEFAULTS[k])
        }
    return value


def _defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in msgspec.structs.fields(cls) if not f.required}


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _objects(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of every JSON object inside ``obj``, the root included."""
    out = [prefix] if isinstance(obj, dict) else []
    if isinstance(obj, dict | list):
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        for k, v in items:
            out += _objects(v, (*prefix, k))
    return out


def _at(obj: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        obj = obj[key]
    return obj


RETYPE = st.sampled_from(
    [None, True, False, 0, -1, 1, 1.5, -0.0, 2**64, 10**30, "", "x", "1", [], [1], {}, {"index": 0}]
) | st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e308])


@FUZZ
@given(valid_payloads, st.data())
def test_mutated_payloads(case: tuple[type, dict[str, Any]], data: st.DataObject) -> None:
    cls, obj = case
    paths = _paths(obj)
    path = data.draw(st.sampled_from(paths))
    op = data.draw(st.sampled_from(["drop", "replace", "retype"]))
    parent = _at(obj, path[:-1])
    if op == "drop":
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(json_values if op == "replace" else RETYPE)
    payload = dumps(obj, data.draw(st.booleans()))
    msg = check(cls, payload)
    check_all(payload)
    if op == "drop" and len(path) == 1 and path[0] not in _defaults(cls):
        assert msg is None, f"accepted {cls.__name__} without required {path[0]!r}"


@FUZZ
@given(valid_payloads, st.data())
def test_unknown_fields_ignored_anywhere(
    case: tuple[type, dict[str, Any]], data: st.DataObject
) -> None:
    cls, obj = case
    original = decode(cls, json.dumps(obj).encode())
    where = data.draw(st.sampled_from(_objects(obj)))
    target = _at(obj, where)
    key = data.draw(st.text(max_size=10).filter(lambda k: k not in target and k not in FIELD_NAMES))
    target[key] = data.draw(plain_json_values)
    assert check(cls, json.dumps(obj).encode()) == original


@FUZZ
@given(valid_payloads, st.data())
def test_byte_mutations_of_valid_payloads(
    case: tuple[type, dict[str, Any]], data: st.DataObject
) -> None:
    cls, obj = case
    raw = bytearray(json.dumps(obj).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw)))
        op = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if op == "insert" or pos == len(raw):
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del raw[pos : pos + data.draw(st.integers(1, 4))]
        else:
            raw[pos] ^= 1 << data.draw(st.integers(0, 7))
    check(cls, bytes(raw))
    check_all(bytes(raw))


# --- topics, names, peek_order ------------------------------------------------------

topic_parts = (
    st.sampled_from(["powerd", "v1", "default", "nodes", "jobs", "controller", "heartbeat"])
    | st.sampled_from(["telemetry", "command", "ack", "status", "phase", "+", "#", "", "n1"])
    | names
    | st.text(max_size=8)
)


@LIGHT
@given(st.text(max_size=100) | st.lists(topic_parts, max_size=7).map("/".join))
@example("powerd/v1/default/nodes/n1/telemetry")
@example("powerd/v1/default/controller/heartbeat")
def test_topic_parse_total(topic: str) -> None:
    topics = Topics()
    try:
        kind, name = topics.parse(topic)
    except ProtocolError:
        return
    if kind == "heartbeat":
        assert name is None
        assert topic == topics.heartbeat
    else:
        assert name is not None
        assert getattr(topics, kind)(name) == topic


@LIGHT
@given(names, names, st.sampled_from(["telemetry", "command", "ack", "status", "phase"]))
def test_topic_round_trip(cluster: str, name: str, kind: str) -> None:
    topics = Topics(cluster)
    assert topics.parse(getattr(topics, kind)(name)) == (kind, name)
    assert topics.parse(topics.heartbeat) == ("heartbeat", None)


@LIGHT
@given(names | st.text(max_size=70) | names.map(lambda n: n + "/") | names.map(lambda n: "." + n))
def test_check_name_matches_the_pattern(name: str) -> None:
    valid = re.fullmatch(NAME_RE, name) is not None
    try:
        assert check_name(name, "node") == name
        accepted = True
    except ProtocolError:
        accepted = False
    assert accepted == valid, name


@FUZZ
@given(st.binary(max_size=512) | st.builds(dumps, json_values, st.booleans()))
@example(b'{"epoch":7,"seq":1203}')
@example(b'{"epoch":true,"seq":1}')
def test_peek_order_total(payload: bytes) -> None:
    epoch, seq = peek_order(payload)
    assert type(epoch) is int and type(seq) is int
    assert epoch >= 0 and seq >= 0
    if (epoch, seq) != (0, 0):
        raw = json.loads(payload)
        assert (raw["epoch"], raw["seq"]) == (epoch, seq)
