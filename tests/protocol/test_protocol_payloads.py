"""Table-driven tests of every powerd v1 payload against docs/PROTOCOL.md.

Each message type gets: the page's example (decodes, re-encodes to the same JSON
value), good variants the contract allows, and bad payloads that ``decode`` must
reject with a ``ProtocolError`` whose message names the problem.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from powerd.protocol import (
    MAX_PAYLOAD_BYTES,
    NAME_PATTERN,
    Ack,
    AckError,
    Command,
    GpuAck,
    GpuCommand,
    GpuSmoothing,
    GpuSmoothingState,
    GpuTelemetry,
    Grant,
    Heartbeat,
    LeaderState,
    PhaseEvent,
    ProtocolError,
    Status,
    Summary,
    Telemetry,
    Topics,
    check_name,
    decode,
    detach_signature,
    encode,
    names,
    peek_order,
)
from tests.support.paths import REPO
from tests.support.protocol_examples import CLASSES, EXAMPLES, TOPIC_NAME

DOCS = REPO / "docs" / "PROTOCOL.md"

Path_ = tuple[str | int, ...]
DROP = object()  # edit value: remove the field


class Raw:
    """Edit value: emit this JSON as is (1e999 or bad UTF-8, which json.dumps cannot write)."""

    def __init__(self, text: str | bytes) -> None:
        self.data: bytes = text.encode() if isinstance(text, str) else text


def example(cls: type) -> dict[str, Any]:
    return json.loads(EXAMPLES[cls])


def build(cls: type, *edits: tuple[Path_, Any], base: dict[str, Any] | None = None) -> bytes:
    """The example of ``cls`` (or ``base``) with ``(path, value)`` edits applied, as JSON."""
    obj = example(cls) if base is None else json.loads(json.dumps(base))
    raws: dict[bytes, bytes] = {}
    for path, value in edits:
        parent: Any = obj
        for key in path[:-1]:
            parent = parent[key]
        if value is DROP:
            del parent[path[-1]]
        elif isinstance(value, Raw):
            token = f"@@raw{len(raws)}@@"
            raws[json.dumps(token).encode()] = value.data
            parent[path[-1]] = token
        else:
            parent[path[-1]] = value
    data = json.dumps(obj, ensure_ascii=False).encode()
    for quoted, raw in raws.items():
        data = data.replace(quoted, raw)
    return data


def pad_to(payload: str, size: int) -> bytes:
    """``payload`` with an unknown string field added so that it is exactly ``size`` bytes."""
    head = payload.encode()[:-1] + b',"pad":"'
    return head + b"x" * (size - len(head) - 2) + b'"}'


def at(path: Path_) -> str:
    """Regex for msgspec's location suffix of ``path``."""
    loc = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    return re.escape(f"- at `{loc}`")


def expected(typ: str, got: str) -> str:
    return rf"Expected `[^`]*\b{typ}\b[^`]*`, got `{got}`"


def pid(cls: type, path: Path_, what: str) -> str:
    return f"{cls.__name__}-{'.'.join(map(str, path)) or 'root'}-{what}"


def reject(
    cls: type, payload: bytes | str | memoryview, match: str, name: str | None = None
) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode(cls, payload, name)


# --- the page's examples -------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_example_decodes_and_round_trips(cls: type) -> None:
    msg = decode(cls, EXAMPLES[cls])
    assert isinstance(msg, cls)
    data = encode(msg)
    # the same JSON value as the page (ints in float fields come back as floats)
    assert json.loads(data) == json.loads(EXAMPLES[cls])
    assert decode(cls, data) == msg
    assert encode(decode(cls, data)) == data


@pytest.mark.parametrize("cls", list(TOPIC_NAME), ids=lambda c: c.__name__)
def test_example_decodes_with_matching_topic_name(cls: type) -> None:
    field, name = TOPIC_NAME[cls]
    assert getattr(decode(cls, EXAMPLES[cls], name), field) == name


def test_example_values() -> None:
    tel = decode(Telemetry, EXAMPLES[Telemetry])
    assert tel.gpus[0] == GpuTelemetry(
        index=0,
        uuid="GPU-8f1c...",
        power_w=612.4,
        energy_j=918273.5,
        cap_w=650.0,
        cap_min_w=200.0,
        cap_max_w=700.0,
        sm_clock_mhz=1755,
        max_sm_clock_mhz=None,
        util_pct=97.0,
        temp_c=61.0,
    )
    assert tel.gpus[0].power_reading is None
    cmd = decode(Command, EXAMPLES[Command])
    assert (cmd.epoch, cmd.seq, cmd.ttl_s) == (7, 1203, 30.0)
    assert cmd.gpus == [GpuCommand(index=0, cap_w=550.0, max_sm_clock_mhz=1410)]
    ack = decode(Ack, EXAMPLES[Ack])
    assert ack.gpus == [GpuAck(index=0, cap_w=550.0, max_sm_clock_mhz=1410, clamped=False)]
    assert ack.errors == []
    phase = decode(PhaseEvent, EXAMPLES[PhaseEvent])
    assert (phase.phase, phase.priority, phase.expected_s) == ("checkpoint", "high", 45.0)
    assert phase.nodes == ["r01-n03", "r01-n04"]
    hb = decode(Heartbeat, EXAMPLES[Heartbeat])
    assert (hb.epoch, hb.controller, hb.state) == (7, "ctl-a", "leader")


def test_docs_examples_match_the_tests() -> None:
    """docs/PROTOCOL.md shows exactly these examples, in this order, and they decode; then
    one signed heartbeat, in the form a verifier cuts its signature from."""
    blocks = re.findall(r"```json\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == len(CLASSES) + 4
    for cls, block in zip(CLASSES, blocks[: len(CLASSES)], strict=True):
        assert json.loads(block) == json.loads(EXAMPLES[cls]), cls.__name__
        decode(cls, block)
    # a tree of controllers: a summary and a grant, as sent (their signatures elided)
    summary = decode(Summary, blocks[len(CLASSES)], "row01")
    assert summary.demand_w == [3100000.0, 780000.0, 0.0] and summary.grant_seq == 57
    grant = decode(Grant, blocks[len(CLASSES) + 1], "row01")
    assert (grant.budget_w, grant.ttl_s, grant.seq) == (7350000.0, 15.0, 58)
    state = decode(LeaderState, blocks[len(CLASSES) + 2])  # for people: powerd status
    assert state.limit is not None and state.limit.in_force and state.nodes is not None
    signed = json.dumps(json.loads(blocks[-1]), separators=(",", ":")).encode()
    decode(Heartbeat, signed)
    assert detach_signature(signed) is not None


# --- good variants -------------------------------------------------------------

ACK_WITH_ERRORS = {
    **example(Ack),
    "result": "partial",
    "errors": [{"index": 1, "message": "unknown GPU"}, {"index": None, "message": "x"}],
}

Check = Callable[[Any], bool]
GOOD: list[Any] = [
    # unknown fields are ignored, at every level
    *[
        pytest.param(
            cls,
            build(cls, (("x_future",), {"a": [1, None, "s"]})),
            None,
            id=pid(cls, (), "unknown-field"),
        )
        for cls in CLASSES
    ],
    *[
        pytest.param(
            cls,
            build(cls, (("gpus", 0, "x_future"), [1.5])),
            None,
            id=pid(cls, ("gpus", 0), "unknown-field"),
        )
        for cls in (Telemetry, Command, Ack)
    ],
    pytest.param(
        Ack,
        build(Ack, (("errors", 0, "x_future"), True), base=ACK_WITH_ERRORS),
        lambda m: m.errors[0] == AckError(index=1, message="unknown GPU"),
        id="Ack-errors.0-unknown-field",
    ),
    # telemetry
    pytest.param(
        Telemetry,
        build(Telemetry, (("gpus", 0, "energy_j"), None)),
        lambda m: m.gpus[0].energy_j is None,
        id="Telemetry-energy-null",
    ),
    pytest.param(
        Telemetry,
        build(Telemetry, (("gpus", 0, "max_sm_clock_mhz"), 1410)),
        lambda m: m.gpus[0].max_sm_clock_mhz == 1410,
        id="Telemetry-clock-locked",
    ),
    *[
        pytest.param(
            Telemetry,
            build(Telemetry, (("gpus", 0, "power_reading"), reading)),
            lambda m, r=reading: m.gpus[0].power_reading == r,
            id=f"Telemetry-power_reading-{reading}",
        )
        for reading in ("instant", "average_1s", "simulated")
    ],
    *[
        pytest.param(
            Telemetry,
            build(Telemetry, (("mode",), mode)),
            lambda m, v=mode: m.mode == v,
            id=f"Telemetry-mode-{mode}",
        )
        for mode in ("controlled", "failsafe", "local")
    ],
    pytest.param(
        Telemetry, build(Telemetry, (("gpus",), [])), lambda m: m.gpus == [], id="Telemetry-no-gpus"
    ),
    pytest.param(
        Telemetry,
        build(
            Telemetry, (("gpus", 0, "util_pct"), 100), (("gpus", 0, "index"), 1023), (("seq",), 0)
        ),
        lambda m: (m.gpus[0].util_pct, m.gpus[0].index, m.seq) == (100.0, 1023, 0),
        id="Telemetry-bounds-inclusive",
    ),
    pytest.param(
        Telemetry,
        build(Telemetry, (("ts",), 1795320426), (("gpus", 0, "temp_c"), -5)),
        lambda m: m.ts == 1795320426.0 and isinstance(m.ts, float) and m.gpus[0].temp_c == -5.0,
        id="Telemetry-int-for-float",
    ),
    # command
    pytest.param(
        Command,
        build(Command, (("gpus", 0, "max_sm_clock_mhz"), DROP)),
        lambda m: m.gpus[0].max_sm_clock_mhz is msgspec.UNSET,
        id="Command-clock-absent-leaves-it",
    ),
    pytest.param(
        Command,
        build(Command, (("gpus", 0, "max_sm_clock_mhz"), None)),
        lambda m: m.gpus[0].max_sm_clock_mhz is None,
        id="Command-clock-null-unlocks",
    ),
    pytest.param(
        Command,
        build(Command, (("gpus", 0), {"index": 3})),
        lambda m: m.gpus[0].cap_w is msgspec.UNSET and m.gpus[0].max_sm_clock_mhz is msgspec.UNSET,
        id="Command-index-only",
    ),
    pytest.param(
        Command, build(Command, (("gpus",), [])), lambda m: m.gpus == [], id="Command-no-gpus"
    ),
    pytest.param(
        Command,
        build(Command, (("gpus",), [{"index": 0, "cap_w": 5000.0}, {"index": 1, "cap_w": 0.5}])),
        lambda m: [g.cap_w for g in m.gpus] == [5000.0, 0.5],
        id="Command-out-of-range-positive-cap-left-to-clamp",
    ),
    pytest.param(
        Command,
        build(Command, (("epoch",), 0), (("seq",), 0), (("ttl_s",), 0.001)),
        lambda m: (m.epoch, m.seq, m.ttl_s) == (0, 0, 0.001),
        id="Command-zero-order",
    ),
    # ack
    pytest.param(
        Ack,
        build(Ack, base=ACK_WITH_ERRORS),
        lambda m: (
            m.errors
            == [AckError(index=1, message="unknown GPU"), AckError(index=None, message="x")]
        ),
        id="Ack-errors-objects",
    ),
    *[
        pytest.param(
            Ack, build(Ack, (("result",), r)), lambda m, v=r: m.result == v, id=f"Ack-result-{r}"
        )
        for r in ("applied", "partial", "stale", "rejected")
    ],
    pytest.param(
        Ack,
        build(Ack, (("result",), "rejected"), (("epoch",), 0), (("seq",), 0), (("gpus",), [])),
        lambda m: (m.epoch, m.seq, m.gpus) == (0, 0, []),
        id="Ack-rejected-unreadable-order",
    ),
    pytest.param(
        Ack,
        build(
            Ack,
            (("gpus", 0, "cap_w"), None),
            (("gpus", 0, "max_sm_clock_mhz"), None),
            (("gpus", 0, "clamped"), True),
        ),
        lambda m: m.gpus[0] == GpuAck(index=0, cap_w=None, max_sm_clock_mhz=None, clamped=True),
        id="Ack-gpu-nulls-clamped",
    ),
    # status
    *[
        pytest.param(
            Status,
            build(Status, (("state",), s)),
            lambda m, v=s: m.state == v,
            id=f"Status-state-{s}",
        )
        for s in ("online", "failsafe", "offline")
    ],
    pytest.param(
        Status, build(Status, (("gpus",), 0)), lambda m: m.gpus == 0, id="Status-zero-gpus"
    ),
    # phase
    pytest.param(
        PhaseEvent,
        build(PhaseEvent, (("nodes",), DROP), (("priority",), DROP), (("expected_s",), DROP)),
        lambda m: (m.nodes, m.priority, m.expected_s) == (None, "normal", None),
        id="PhaseEvent-optionals-absent",
    ),
    pytest.param(
        PhaseEvent,
        build(PhaseEvent, (("nodes",), None), (("expected_s",), None)),
        lambda m: (m.nodes, m.expected_s) == (None, None),
        id="PhaseEvent-optionals-null",
    ),
    pytest.param(
        PhaseEvent,
        build(PhaseEvent, (("nodes",), [])),
        lambda m: m.nodes == [],
        id="PhaseEvent-nodes-empty",
    ),
    *[
        pytest.param(
            PhaseEvent,
            build(PhaseEvent, (("phase",), p)),
            lambda m, v=p: m.phase == v,
            id=f"PhaseEvent-phase-{p}",
        )
        for p in ("startup", "compute", "communication", "checkpoint", "eval", "idle", "shutdown")
    ],
    *[
        pytest.param(
            PhaseEvent,
            build(PhaseEvent, (("priority",), p)),
            lambda m, v=p: m.priority == v,
            id=f"PhaseEvent-priority-{p}",
        )
        for p in ("high", "normal", "low")
    ],
    # heartbeat
    *[
        pytest.param(
            Heartbeat,
            build(Heartbeat, (("state",), s)),
            lambda m, v=s: m.state == v,
            id=f"Heartbeat-{s}",
        )
        for s in ("leader", "standby")
    ],
    # names at the edges of the pattern
    *[
        pytest.param(
            Status,
            build(Status, (("node",), n)),
            lambda m, v=n: m.node == v,
            id=f"Status-node-{label}",
        )
        for label, n in {
            "1-char": "a",
            "64-chars": "a" * 64,
            "digits-first": "0",
            "all-punct": "A._-",
        }.items()
    ],
    # payload sizes and types
    pytest.param(
        Heartbeat,
        pad_to(EXAMPLES[Heartbeat], MAX_PAYLOAD_BYTES),
        None,
        id="Heartbeat-exactly-64KiB",
    ),
    pytest.param(
        Heartbeat, bytearray(EXAMPLES[Heartbeat].encode()), None, id="Heartbeat-bytearray"
    ),
    pytest.param(
        Heartbeat, memoryview(EXAMPLES[Heartbeat].encode()), None, id="Heartbeat-memoryview"
    ),
    pytest.param(Heartbeat, f"  {EXAMPLES[Heartbeat]}\n", None, id="Heartbeat-str-whitespace"),
]

# hardware power smoothing (optional fields; docs/PROTOCOL.md, "Power smoothing")
SMOOTHING: dict[str, Any] = {
    "preset": 1,
    "enabled": True,
    "floor_percent": 40.0,
    "ramp_up_w_per_s": 200.0,
    "ramp_down_w_per_s": 100.0,
    "ramp_down_hysteresis_ms": 3000.0,
}
SMOOTHING_STATE: dict[str, Any] = {"enabled": True, "preset": 1, "floor_percent": 40.0}
GOOD += [
    pytest.param(
        Command,
        build(Command, (("gpus", 0, "smoothing"), SMOOTHING)),
        lambda m: m.gpus[0].smoothing == GpuSmoothing(**SMOOTHING),
        id="Command-smoothing",
    ),
    pytest.param(
        Command,
        build(Command, (("gpus", 0), {"index": 0, "smoothing": SMOOTHING})),
        lambda m: m.gpus[0].cap_w is msgspec.UNSET and m.gpus[0].smoothing.preset == 1,
        id="Command-smoothing-only",
    ),
    pytest.param(
        Command,
        build(Command),
        lambda m: m.gpus[0].smoothing is msgspec.UNSET,
        id="Command-smoothing-absent-leaves-it",
    ),
    pytest.param(
        Command,
        build(
            Command,
            (
                ("gpus", 0, "smoothing"),
                {
                    **SMOOTHING,
                    "preset": 4,
                    "enabled": False,
                    "floor_percent": 100,
                    "ramp_up_w_per_s": 0,
                    "ramp_down_w_per_s": (2**32 - 1) / 1000,
                    "ramp_down_hysteresis_ms": 2**32 - 1,
                },
            ),
        ),
        lambda m: (m.gpus[0].smoothing.preset, m.gpus[0].smoothing.floor_percent) == (4, 100.0),
        id="Command-smoothing-bounds-inclusive",
    ),
    pytest.param(
        Command,
        build(Command, (("gpus", 0, "smoothing"), {**SMOOTHING, "x_future": 1})),
        lambda m: m.gpus[0].smoothing == GpuSmoothing(**SMOOTHING),
        id="Command-smoothing-unknown-field",
    ),
    pytest.param(
        Ack,
        build(Ack, (("gpus", 0, "smoothing"), SMOOTHING)),
        lambda m: m.gpus[0].smoothing == GpuSmoothing(**SMOOTHING),
        id="Ack-smoothing-read-back",
    ),
    pytest.param(
        Ack,
        build(Ack, (("gpus", 0, "smoothing"), None)),
        lambda m: m.gpus[0].smoothing is None,
        id="Ack-smoothing-null",
    ),
    pytest.param(
        Telemetry,
        build(Telemetry, (("gpus", 0, "smoothing"), SMOOTHING_STATE)),
        lambda m: m.gpus[0].smoothing == GpuSmoothingState(**SMOOTHING_STATE),
        id="Telemetry-smoothing",
    ),
    pytest.param(
        Telemetry,
        build(Telemetry, (("gpus", 0, "smoothing"), SMOOTHING)),  # more than it needs: ignored
        lambda m: m.gpus[0].smoothing == GpuSmoothingState(**SMOOTHING_STATE),
        id="Telemetry-smoothing-extra-fields",
    ),
    pytest.param(
        Telemetry,
        build(Telemetry, (("gpus", 0, "smoothing"), None)),
        lambda m: m.gpus[0].smoothing is None,
        id="Telemetry-smoothing-null",
    ),
]


@pytest.mark.parametrize(("cls", "payload", "check"), GOOD)
def test_good_variant(cls: type, payload: Any, check: Check | None) -> None:
    msg = decode(cls, payload)
    assert isinstance(msg, cls)
    if check is not None:
        assert check(msg)
    assert decode(cls, encode(msg)) == msg


def test_exactly_64kib_is_the_limit() -> None:
    padded = pad_to(EXAMPLES[Heartbeat], MAX_PAYLOAD_BYTES)
    assert len(padded) == MAX_PAYLOAD_BYTES
    decode(Heartbeat, padded)
    reject(Heartbeat, pad_to(EXAMPLES[Heartbeat], MAX_PAYLOAD_BYTES + 1), "over 65536")


def test_oversize_memoryview_of_wide_items_rejected() -> None:
    data = pad_to(EXAMPLES[Heartbeat], 4 * 20_000)
    wide = memoryview(data).cast("I")
    assert len(wide) == 20_000
    reject(Heartbeat, wide, "over 65536")


def test_clock_null_and_absent_stay_distinct_on_the_wire() -> None:
    unlock = decode(Command, build(Command, (("gpus", 0, "max_sm_clock_mhz"), None)))
    keep = decode(Command, build(Command, (("gpus", 0, "max_sm_clock_mhz"), DROP)))
    assert unlock != keep
    assert json.loads(encode(unlock))["gpus"][0] == {
        "index": 0,
        "cap_w": 550.0,
        "max_sm_clock_mhz": None,
    }
    assert json.loads(encode(keep))["gpus"][0] == {"index": 0, "cap_w": 550.0}
    bare = json.loads(
        encode(Command(v=1, epoch=1, seq=1, ts=1.0, ttl_s=5.0, gpus=[GpuCommand(index=2)]))
    )
    assert bare["gpus"] == [{"index": 2}]


def test_smoothing_absent_stays_absent_on_the_wire() -> None:
    """Old controllers and agents never see the smoothing fields unless they are used."""
    keep = decode(Command, EXAMPLES[Command])
    assert "smoothing" not in json.loads(encode(keep))["gpus"][0]
    assert "smoothing" not in json.loads(encode(decode(Ack, EXAMPLES[Ack])))["gpus"][0]
    assert "smoothing" not in json.loads(encode(decode(Telemetry, EXAMPLES[Telemetry])))["gpus"][0]
    smooth = GpuCommand(index=0, smoothing=GpuSmoothing(**SMOOTHING))
    assert json.loads(encode(Command(v=1, epoch=1, seq=1, ts=1.0, ttl_s=5.0, gpus=[smooth])))[
        "gpus"
    ] == [{"index": 0, "smoothing": SMOOTHING}]


def test_smoothing_bounds_are_the_gpu_layers() -> None:
    """The protocol's copy of the bounds is what a SmoothingProfile accepts."""
    from powerd.gpu import base
    from powerd.protocol import (
        SMOOTHING_MAX_HYSTERESIS_MS,
        SMOOTHING_MAX_RAMP_W_PER_S,
        SMOOTHING_PRESET_MAX,
    )

    assert SMOOTHING_PRESET_MAX == base.SMOOTHING_MAX_PRESETS - 1
    assert SMOOTHING_MAX_RAMP_W_PER_S == base.SMOOTHING_MAX_RAMP_W_PER_S
    assert SMOOTHING_MAX_HYSTERESIS_MS == base.SMOOTHING_MAX_HYSTERESIS_MS


def test_smoothing_built_in_code_refuses_non_finite() -> None:
    with pytest.raises(ValueError, match="non-finite"):
        GpuSmoothing(**{**SMOOTHING, "ramp_up_w_per_s": math.inf})
    with pytest.raises(ValueError, match="non-finite"):
        GpuSmoothingState(enabled=True, preset=0, floor_percent=math.nan)


def test_name_ignored_for_messages_without_one() -> None:
    # command and heartbeat topics carry no name to check against the payload
    decode(Command, EXAMPLES[Command], "any-node")
    decode(Heartbeat, EXAMPLES[Heartbeat], "whatever")


# --- bad payloads --------------------------------------------------------------


def not_json(cls: type) -> dict[str, bytes]:
    """Payloads that are not JSON at all, most of them close to the example of ``cls``."""
    ex = EXAMPLES[cls]
    ts = str(json.loads(ex)["ts"])
    assert ts in ex
    return {
        "empty": b"",
        "garbage": b"not json",
        "truncated": ex.encode()[:-1],
        "trailing": ex.encode() + b"}",
        "single-quotes": b"{'v':1}",
        "nan-token": ex.replace(ts, "NaN", 1).encode(),
        "infinity-token": ex.replace(ts, "Infinity", 1).encode(),
        "bom": b"\xef\xbb\xbf" + ex.encode(),
        "bad-utf8": b"\xff\xfe",
    }


NOT_OBJECT = {
    "null": b"null",
    "int": b"1",
    "float": b"1.5",
    "str": b'"x"',
    "bool": b"true",
    "array": b"[]",
}


def _required(cls: type) -> list[str]:
    return [f.name for f in msgspec.structs.fields(cls) if f.required]


NESTED: dict[type, list[tuple[Path_, type, dict[str, Any] | None]]] = {
    Telemetry: [(("gpus", 0), GpuTelemetry, None)],
    Command: [(("gpus", 0), GpuCommand, None)],
    Ack: [(("gpus", 0), GpuAck, None), (("errors", 0), AckError, ACK_WITH_ERRORS)],
}

BAD: list[Any] = [
    *[
        pytest.param(cls, raw, None, r"not a valid JSON|utf-8", id=f"{cls.__name__}-not-json-{k}")
        for cls in CLASSES
        for k, raw in not_json(cls).items()
    ],
    *[
        pytest.param(
            cls, raw, None, rf"Expected `object`, got `{k}`", id=f"{cls.__name__}-not-object-{k}"
        )
        for cls in CLASSES
        for k, raw in NOT_OBJECT.items()
    ],
    *[
        pytest.param(
            cls,
            b"[" + EXAMPLES[cls].encode() + b"]",
            None,
            "Expected `object`, got `array`",
            id=f"{cls.__name__}-array",
        )
        for cls in CLASSES
    ],
    # every required field, top level and nested
    *[
        pytest.param(
            cls,
            build(cls, ((f,), DROP)),
            None,
            f"missing required field `{f}`",
            id=pid(cls, (f,), "missing"),
        )
        for cls in CLASSES
        for f in _required(cls)
    ],
    *[
        pytest.param(
            cls,
            build(cls, ((*path, f), DROP), base=base),
            None,
            f"missing required field `{f}` {at(path)}",
            id=pid(cls, (*path, f), "missing"),
        )
        for cls, nested in NESTED.items()
        for path, sub, base in nested
        for f in _required(sub)
    ],
    # v must be exactly the integer 1
    *[
        pytest.param(cls, build(cls, (("v",), v)), None, match, id=f"{cls.__name__}-v-{label}")
        for cls in CLASSES
        for label, v, match in [
            ("2", 2, r"Invalid enum value 2"),
            ("0", 0, r"Invalid enum value 0"),
            ("str", "1", expected("int", "str")),
            ("float", 1.0, expected("int", "float")),
            ("bool", True, expected("int", "bool")),
            ("null", None, expected("int", "null")),
        ]
    ],
]

WRONG_TYPES: list[tuple[type, Path_, Any, str]] = [
    (Telemetry, ("node",), 5, expected("str", "int")),
    (Telemetry, ("ts",), "1795320426.28", expected("float", "str")),
    (Telemetry, ("ts",), None, expected("float", "null")),
    (Telemetry, ("seq",), True, expected("int", "bool")),
    (Telemetry, ("seq",), 812.5, expected("int", "float")),
    (Telemetry, ("mode",), 1, expected("str", "int")),
    (Telemetry, ("gpus",), {}, expected("array", "object")),
    (Telemetry, ("gpus", 0), [], expected("object", "array")),
    (Telemetry, ("gpus", 0, "index"), True, expected("int", "bool")),
    (Telemetry, ("gpus", 0, "uuid"), 5, expected("str", "int")),
    (Telemetry, ("gpus", 0, "power_w"), "612.4", expected("float", "str")),
    (Telemetry, ("gpus", 0, "power_w"), False, expected("float", "bool")),
    (Telemetry, ("gpus", 0, "energy_j"), "1", expected("float", "str")),
    (Telemetry, ("gpus", 0, "sm_clock_mhz"), 1755.5, expected("int", "float")),
    (Telemetry, ("gpus", 0, "max_sm_clock_mhz"), True, expected("int", "bool")),
    (Telemetry, ("gpus", 0, "util_pct"), "97", expected("float", "str")),
    (Telemetry, ("gpus", 0, "temp_c"), [61.0], expected("float", "array")),
    (Command, ("epoch",), True, expected("int", "bool")),
    (Command, ("seq",), "1203", expected("int", "str")),
    (Command, ("ts",), "now", expected("float", "str")),
    (Command, ("ttl_s",), "30", expected("float", "str")),
    (Command, ("ttl_s",), True, expected("float", "bool")),
    (Command, ("gpus",), None, expected("array", "null")),
    (Command, ("gpus", 0, "index"), False, expected("int", "bool")),
    (Command, ("gpus", 0, "index"), "0", expected("int", "str")),
    (Command, ("gpus", 0, "cap_w"), "550", expected("float", "str")),
    (Command, ("gpus", 0, "cap_w"), None, expected("float", "null")),
    (Command, ("gpus", 0, "max_sm_clock_mhz"), "1410", expected("float", "str")),
    (Ack, ("epoch",), False, expected("int", "bool")),
    (Ack, ("seq",), 1.5, expected("int", "float")),
    (Ack, ("result",), None, expected("str", "null")),
    (Ack, ("gpus", 0, "clamped"), 0, expected("bool", "int")),
    (Ack, ("gpus", 0, "clamped"), "false", expected("bool", "str")),
    (Ack, ("gpus", 0, "cap_w"), "550", expected("float", "str")),
    (Ack, ("errors",), {}, expected("array", "object")),
    (Ack, ("errors",), ["unknown GPU"], expected("object", "str")),
    (Ack, ("errors",), [{"index": True, "message": "x"}], expected("int", "bool")),
    (Ack, ("errors",), [{"index": 0, "message": None}], expected("str", "null")),
    (Status, ("gpus",), True, expected("int", "bool")),
    (Status, ("gpus",), 4.0, expected("int", "float")),
    (Status, ("agent_version",), 1, expected("str", "int")),
    (Status, ("ts",), "x", expected("float", "str")),
    (PhaseEvent, ("ts",), "x", expected("float", "str")),
    (PhaseEvent, ("nodes",), "r01-n03", expected("array", "str")),
    (PhaseEvent, ("nodes",), [1], expected("str", "int")),
    (PhaseEvent, ("expected_s",), "45", expected("float", "str")),
    (PhaseEvent, ("expected_s",), True, expected("float", "bool")),
    (Heartbeat, ("epoch",), True, expected("int", "bool")),
    (Heartbeat, ("ts",), "1795320426.0", expected("float", "str")),
    (Heartbeat, ("controller",), 1, expected("str", "int")),
    (Heartbeat, ("state",), True, expected("str", "bool")),
]
BAD += [
    pytest.param(
        cls,
        build(cls, (path, value)),
        None,
        match,
        id=pid(cls, path, f"type-{type(value).__name__}"),
    )
    for cls, path, value, match in WRONG_TYPES
]

# non-finite numbers: 1e999 overflows to infinity, so it is rejected wherever a number goes
NUMBER_PATHS: list[tuple[type, Path_]] = [
    (Telemetry, ("ts",)),
    (Telemetry, ("seq",)),
    *[
        (Telemetry, ("gpus", 0, f))
        for f in (
            "power_w",
            "energy_j",
            "cap_w",
            "cap_min_w",
            "cap_max_w",
            "util_pct",
            "temp_c",
            "sm_clock_mhz",
        )
    ],
    (Telemetry, ("gpus", 0, "max_sm_clock_mhz")),
    (Command, ("epoch",)),
    (Command, ("ts",)),
    (Command, ("ttl_s",)),
    (Command, ("gpus", 0, "index")),
    (Command, ("gpus", 0, "cap_w")),
    (Command, ("gpus", 0, "max_sm_clock_mhz")),
    (Ack, ("ts",)),
    (Ack, ("seq",)),
    (Ack, ("gpus", 0, "cap_w")),
    (Ack, ("gpus", 0, "max_sm_clock_mhz")),
    (Status, ("ts",)),
    (Status, ("gpus",)),
    (PhaseEvent, ("ts",)),
    (PhaseEvent, ("expected_s",)),
    (Heartbeat, ("ts",)),
    (Heartbeat, ("epoch",)),
]
BAD += [
    pytest.param(
        cls,
        build(cls, (path, Raw(raw))),
        None,
        f"Number out of range {at(path)}",
        id=pid(cls, path, raw),
    )
    for cls, path in NUMBER_PATHS
    for raw in ("1e999", "-1e999")
]

# names: cluster/node/job pattern [A-Za-z0-9][A-Za-z0-9._-]{0,63}
NAME_PATHS: list[tuple[type, Path_]] = [
    (Telemetry, ("node",)),
    (Ack, ("node",)),
    (Status, ("node",)),
    (PhaseEvent, ("job",)),
    (PhaseEvent, ("nodes", 1)),
    (Heartbeat, ("controller",)),
]
BAD_NAMES = {
    "empty": "",
    "65-chars": "a" * 65,
    "leading-dot": ".r01",
    "leading-dash": "-r01",
    "leading-underscore": "_r01",
    "slash": "r01/n03",
    "unicode": "nöde",
    "fullwidth-digit": "１",
    "space": "r01 n03",
    "plus": "+",
    "hash": "#",
    "nul": "r01\x00",
    "leading-newline": "\nr01",
}
BAD += [
    pytest.param(
        cls,
        build(cls, (path, bad)),
        None,
        f"matching regex .* {at(path)}",
        id=pid(cls, path, label),
    )
    for cls, path in NAME_PATHS
    for label, bad in BAD_NAMES.items()
]

# invalid UTF-8 inside a string the message uses (surrogates, overlong, stray bytes)
UTF8_PATHS: list[tuple[type, Path_]] = [
    (Telemetry, ("node",)),
    (Telemetry, ("gpus", 0, "uuid")),
    (Ack, ("node",)),
    (Ack, ("result",)),
    (Status, ("agent_version",)),
    (PhaseEvent, ("job",)),
    (PhaseEvent, ("phase",)),
    (Heartbeat, ("controller",)),
]
BAD += [
    pytest.param(
        cls,
        build(cls, (path, Raw(raw))),
        None,
        "(?i)utf-8",
        id=pid(cls, path, label),
    )
    for cls, path in UTF8_PATHS
    for label, raw in {
        "surrogate": b'"a\xed\xb3\xbf"',
        "stray-byte": b'"a\xff"',
        "truncated-sequence": b'"a\xe2\x82"',
    }.items()
]

# a name that does not match the topic's
BAD += [
    pytest.param(
        cls,
        EXAMPLES[cls],
        "r01-n99",
        rf"{cls.__name__}\.{field} '{re.escape(name)}' does not match topic name 'r01-n99'",
        id=f"{cls.__name__}-{field}-not-topic-name",
    )
    for cls, (field, name) in TOPIC_NAME.items()
]
BAD += [
    pytest.param(
        Telemetry,
        EXAMPLES[Telemetry],
        "R01-N03",
        "does not match topic name",
        id="Telemetry-node-case-differs",
    ),
]

# over 64 KiB
BAD += [
    pytest.param(
        cls,
        build(cls, (("pad",), "x" * MAX_PAYLOAD_BYTES)),
        None,
        rf"payload of \d+ bytes is over {MAX_PAYLOAD_BYTES}",
        id=f"{cls.__name__}-oversize",
    )
    for cls in CLASSES
]
BAD += [
    pytest.param(
        Heartbeat,
        build(Heartbeat, (("pad",), "é" * 40_000)).decode(),
        None,
        "over 65536",
        id="Heartbeat-oversize-str-counts-bytes",
    ),
]

CONSTRAINTS: list[tuple[type, Path_, Any, str]] = [
    # negative order and counters
    (Telemetry, ("seq",), -1, ">= 0"),
    (Command, ("epoch",), -1, ">= 0"),
    (Command, ("seq",), -1, ">= 0"),
    (Ack, ("epoch",), -1, ">= 0"),
    (Ack, ("seq",), -1, ">= 0"),
    (Heartbeat, ("epoch",), -1, ">= 0"),
    (Status, ("gpus",), -1, ">= 0"),
    # GPU index 0..1023
    *[(cls, ("gpus", 0, "index"), -1, ">= 0") for cls in (Telemetry, Command, Ack)],
    *[(cls, ("gpus", 0, "index"), 1024, "<= 1023") for cls in (Telemetry, Command, Ack)],
    # command caps, clocks and ttl must be positive
    (Command, ("gpus", 0, "cap_w"), 0, "> 0"),
    (Command, ("gpus", 0, "cap_w"), 0.0, "> 0"),
    (Command, ("gpus", 0, "cap_w"), -0.0, "> 0"),
    (Command, ("gpus", 0, "cap_w"), -550.0, "> 0"),
    (Command, ("gpus", 0, "max_sm_clock_mhz"), 0, "> 0"),
    (Command, ("ttl_s",), 0, "> 0"),
    (Command, ("ttl_s",), -30, "> 0"),
    # issue 12: a ttl of a billion seconds, epochs and seqs past a signed 64-bit integer
    (Command, ("ttl_s",), 1e9, "<= 86400"),
    (Command, ("ttl_s",), 86400.5, "<= 86400"),
    *[(cls, ("epoch",), 2**63, f"<= {2**63 - 1}") for cls in (Command, Ack, Heartbeat)],
    *[(cls, ("seq",), 2**63, f"<= {2**63 - 1}") for cls in (Command, Ack, Telemetry)],
    (Telemetry, ("epoch",), 2**64, f"<= {2**63 - 1}"),
    (Status, ("failsafe_cap_w",), -1.0, ">= 0"),
    # telemetry ranges
    (Telemetry, ("gpus", 0, "util_pct"), 100.5, "<= 100"),
    (Telemetry, ("gpus", 0, "util_pct"), 1000, "<= 100"),
    (Telemetry, ("gpus", 0, "util_pct"), -0.1, ">= 0"),
    (Telemetry, ("gpus", 0, "power_w"), -1.0, ">= 0"),
    (Telemetry, ("gpus", 0, "sm_clock_mhz"), -1, ">= 0"),
    (Ack, ("gpus", 0, "cap_w"), -1.0, ">= 0"),
    (PhaseEvent, ("expected_s",), -45, ">= 0"),
    # enumerations
    (Telemetry, ("mode",), "manual", "Invalid enum value 'manual'"),
    (Telemetry, ("mode",), "Controlled", "Invalid enum value 'Controlled'"),
    (Telemetry, ("gpus", 0, "power_reading"), "average", "Invalid enum value 'average'"),
    (Ack, ("result",), "ok", "Invalid enum value 'ok'"),
    (Status, ("state",), "busy", "Invalid enum value 'busy'"),
    (PhaseEvent, ("phase",), "training", "Invalid enum value 'training'"),
    (PhaseEvent, ("phase",), "", "Invalid enum value ''"),
    (PhaseEvent, ("priority",), "urgent", "Invalid enum value 'urgent'"),
    (Heartbeat, ("state",), "follower", "Invalid enum value 'follower'"),
    (Heartbeat, ("state",), "online", "Invalid enum value 'online'"),
]
BAD += [
    pytest.param(
        cls,
        build(cls, (path, value)),
        None,
        f"{match}.* {at(path)}",
        id=pid(cls, path, repr(value)),
    )
    for cls, path, value, match in CONSTRAINTS
]
BAD += [
    pytest.param(
        Command,
        build(Command, (("gpus",), [{"index": 0, "cap_w": 500.0}, {"index": 1}, {"index": 0}])),
        None,
        "GPU index 0 appears twice",
        id="Command-duplicate-gpu-index",
    ),
]

# hardware power smoothing: the protocol refuses what no device can hold (the device's own
# narrower range is the agent's to clamp: tests/agent/test_agent_smoothing.py)
SMOOTHING_PATHS: list[tuple[type, Path_, dict[str, Any]]] = [
    (Command, ("gpus", 0, "smoothing"), SMOOTHING),
    (Ack, ("gpus", 0, "smoothing"), SMOOTHING),
    (Telemetry, ("gpus", 0, "smoothing"), SMOOTHING_STATE),
]
SMOOTHING_BAD: list[tuple[str, Any, str]] = [
    ("preset", 5, "<= 4"),
    ("preset", -1, ">= 0"),
    ("preset", 1.0, expected("int", "float")),
    ("preset", True, expected("int", "bool")),
    ("enabled", 1, expected("bool", "int")),
    ("enabled", None, expected("bool", "null")),
    ("floor_percent", 100.5, "<= 100"),
    ("floor_percent", -0.1, ">= 0"),
    ("floor_percent", "40", expected("float", "str")),
    ("ramp_up_w_per_s", -1.0, ">= 0"),
    ("ramp_down_w_per_s", (2**32 - 1) / 1000 + 0.01, "<= "),
    ("ramp_down_hysteresis_ms", -1, ">= 0"),
    ("ramp_down_hysteresis_ms", 2**32, "<= "),
]
BAD += [
    pytest.param(
        cls,
        build(cls, (path, {**base, field: value})),
        None,
        f"{re.escape(match) if match.startswith(('<', '>')) else match}.* {at((*path, field))}",
        id=pid(cls, (*path, field), repr(value)),
    )
    for cls, path, base in SMOOTHING_PATHS
    for field, value, match in SMOOTHING_BAD
    if field in base
]
BAD += [
    pytest.param(
        cls,
        build(cls, (path, {k: v for k, v in base.items() if k != field})),
        None,
        f"missing required field `{field}` {at(path)}",
        id=pid(cls, (*path, field), "missing"),
    )
    for cls, path, base in SMOOTHING_PATHS
    for field in base
]
BAD += [
    pytest.param(
        cls,
        build(cls, (path, dict(base)), ((*path, field), Raw(raw))),
        None,
        f"Number out of range {at((*path, field))}",
        id=pid(cls, (*path, field), raw),
    )
    for cls, path, base in SMOOTHING_PATHS
    for field in ("floor_percent", "ramp_up_w_per_s", "ramp_down_hysteresis_ms")
    if field in base
    for raw in ("1e999", "-1e999")
]
BAD += [
    pytest.param(
        Command,
        build(Command, (("gpus", 0, "smoothing"), None)),
        None,
        rf"{expected('object', 'null')} {at(('gpus', 0, 'smoothing'))}",
        id="Command-gpus.0.smoothing-null",
    ),
    pytest.param(
        Telemetry,
        build(Telemetry, (("gpus", 0, "smoothing"), [True, 1, 40.0])),
        None,
        expected("object", "array"),
        id="Telemetry-gpus.0.smoothing-array",
    ),
]


@pytest.mark.parametrize(("cls", "payload", "name", "match"), BAD)
def test_bad_payload_rejected(cls: type, payload: Any, name: str | None, match: str) -> None:
    reject(cls, payload, match, name)


@pytest.mark.parametrize(
    ("cls", "path"), [pytest.param(c, p, id=pid(c, p, "trailing-newline")) for c, p in NAME_PATHS]
)
def test_name_with_trailing_newline_rejected(cls: type, path: Path_) -> None:
    reject(cls, build(cls, (path, "r01-n03\n")), "matching regex")


# --- encode --------------------------------------------------------------------

Setter = Callable[[Any, float], None]


def _set_smoothing_floor(msg: Any, value: float) -> None:
    msg.gpus[0].smoothing = GpuSmoothing(**SMOOTHING)
    msg.gpus[0].smoothing.floor_percent = value


NON_FINITE_SETTERS: list[Any] = [
    pytest.param(Heartbeat, lambda m, x: setattr(m, "ts", x), r"Heartbeat\.ts", id="Heartbeat.ts"),
    pytest.param(Status, lambda m, x: setattr(m, "ts", x), r"Status\.ts", id="Status.ts"),
    pytest.param(
        Command, lambda m, x: setattr(m, "ttl_s", x), r"Command\.ttl_s", id="Command.ttl_s"
    ),
    pytest.param(
        Command,
        lambda m, x: setattr(m.gpus[0], "cap_w", x),
        r"Command\.gpus\[0\]\.cap_w",
        id="Command.gpus.cap_w",
    ),
    pytest.param(
        Telemetry,
        lambda m, x: setattr(m.gpus[0], "power_w", x),
        r"Telemetry\.gpus\[0\]\.power_w",
        id="Telemetry.gpus.power_w",
    ),
    pytest.param(
        Ack,
        lambda m, x: setattr(m.gpus[0], "cap_w", x),
        r"Ack\.gpus\[0\]\.cap_w",
        id="Ack.gpus.cap_w",
    ),
    pytest.param(
        Command,
        _set_smoothing_floor,
        r"Command\.gpus\[0\]\.smoothing\.floor_percent",
        id="Command.gpus.smoothing.floor_percent",
    ),
    pytest.param(
        PhaseEvent,
        lambda m, x: setattr(m, "expected_s", x),
        r"PhaseEvent\.expected_s",
        id="PhaseEvent.expected_s",
    ),
]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(("cls", "setter", "where"), NON_FINITE_SETTERS)
def test_encode_refuses_non_finite(cls: type, setter: Setter, where: str, value: float) -> None:
    msg = decode(cls, EXAMPLES[cls])
    setter(msg, value)  # structs are mutable: a caller can slip one in after construction
    with pytest.raises(ValueError, match=f"non-finite number at {where}"):
        encode(msg)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_constructing_with_non_finite_fails(value: float) -> None:
    with pytest.raises(ValueError, match="non-finite"):
        Heartbeat(v=1, epoch=1, ts=value, controller="ctl-a", state="leader")
    with pytest.raises(ValueError, match="non-finite"):
        GpuCommand(index=0, cap_w=value)


def test_encode_non_finite_raises_protocol_error() -> None:
    msg = decode(Heartbeat, EXAMPLES[Heartbeat])
    msg.ts = math.inf
    with pytest.raises(ProtocolError):
        encode(msg)


def _status_of_size(size: int) -> Status:
    base = len(
        encode(Status(v=1, node="r01-n03", state="online", ts=1.0, gpus=4, agent_version=""))
    )
    return Status(
        v=1, node="r01-n03", state="online", ts=1.0, gpus=4, agent_version="x" * (size - base)
    )


def test_encode_refuses_oversize() -> None:
    at_limit = _status_of_size(MAX_PAYLOAD_BYTES)
    data = encode(at_limit)
    assert len(data) == MAX_PAYLOAD_BYTES
    assert decode(Status, data) == at_limit
    with pytest.raises(ProtocolError, match=f"payload of {MAX_PAYLOAD_BYTES + 1} bytes is over"):
        encode(_status_of_size(MAX_PAYLOAD_BYTES + 1))
    many = Telemetry(
        v=1,
        node="n",
        ts=1.0,
        seq=0,
        mode="local",
        gpus=[decode(Telemetry, EXAMPLES[Telemetry]).gpus[0]] * 400,
    )
    with pytest.raises(ProtocolError, match="over 65536"):
        encode(many)


@pytest.mark.parametrize(
    "msg",
    [
        pytest.param(
            Heartbeat(v=1, epoch=-1, ts=1.0, controller="ctl-a", state="leader"),
            id="negative-epoch",
        ),
        pytest.param(
            Heartbeat(v=1, epoch=1, ts=1.0, controller="a/b", state="leader"), id="bad-name"
        ),
        pytest.param(
            Heartbeat(v=1, epoch=1, ts=1.0, controller="ctl-a", state="boss"),  # type: ignore[arg-type]
            id="bad-state",
        ),
        pytest.param(
            Command(v=1, epoch=1, seq=1, ts=1.0, ttl_s=5.0, gpus=[GpuCommand(index=0, cap_w=-5.0)]),
            id="negative-cap",
        ),
    ],
)
def test_encode_refuses_what_decode_rejects(msg: Any) -> None:
    with pytest.raises(ProtocolError):
        encode(msg)


# --- topics --------------------------------------------------------------------

BUILDERS = {
    "telemetry": lambda t, n: t.telemetry(n),
    "command": lambda t, n: t.command(n),
    "ack": lambda t, n: t.ack(n),
    "status": lambda t, n: t.status(n),
    "phase": lambda t, n: t.phase(n),
}


@pytest.mark.parametrize("cluster", ["default", "c1", "eu-west.dc_2", "Z" * 64])
@pytest.mark.parametrize("kind", list(BUILDERS))
@pytest.mark.parametrize("name", ["r01-n03", "a", "0.b_c-d", "n" * 64])
def test_topic_build_parse_round_trip(cluster: str, kind: str, name: str) -> None:
    topics = Topics(cluster)
    topic = BUILDERS[kind](topics, name)
    group = "jobs" if kind == "phase" else "nodes"
    assert topic == f"powerd/v1/{cluster}/{group}/{name}/{kind}"
    assert topics.parse(topic) == (kind, name)


def test_topic_shapes() -> None:
    t = Topics()
    assert t.cluster == "default"
    assert t.prefix == "powerd/v1/default"
    assert t.heartbeat == "powerd/v1/default/controller/heartbeat"
    assert t.parse(t.heartbeat) == ("heartbeat", None)
    assert t.all_telemetry == "powerd/v1/default/nodes/+/telemetry"
    assert t.all_acks == "powerd/v1/default/nodes/+/ack"
    assert t.all_status == "powerd/v1/default/nodes/+/status"
    assert t.all_phases == "powerd/v1/default/jobs/+/phase"
    assert Topics("c1").heartbeat == "powerd/v1/c1/controller/heartbeat"


BAD_TOPICS = {
    "other-cluster": ("powerd/v1/other/nodes/n1/telemetry", "is not under"),
    "cluster-prefix-shared": ("powerd/v1/default2/nodes/n1/telemetry", "is not under"),
    "v2": ("powerd/v2/default/nodes/n1/telemetry", "is not under"),
    "no-root": ("default/nodes/n1/telemetry", "is not under"),
    "empty": ("", "is not under"),
    "prefix-only": ("powerd/v1/default", "is not under"),
    "prefix-slash": ("powerd/v1/default/", "not a powerd v1 topic"),
    "leading-slash": ("/powerd/v1/default/nodes/n1/telemetry", "is not under"),
    "unknown-kind": ("powerd/v1/default/nodes/n1/metrics", "not a powerd v1 topic"),
    "job-with-node-kind": ("powerd/v1/default/jobs/j1/telemetry", "not a powerd v1 topic"),
    "node-with-phase": ("powerd/v1/default/nodes/n1/phase", "not a powerd v1 topic"),
    "extra-level": ("powerd/v1/default/nodes/n1/telemetry/x", "not a powerd v1 topic"),
    "trailing-slash": ("powerd/v1/default/nodes/n1/telemetry/", "not a powerd v1 topic"),
    "missing-name": ("powerd/v1/default/nodes/telemetry", "not a powerd v1 topic"),
    "empty-name": ("powerd/v1/default/nodes//telemetry", "node name '' must match"),
    "bad-node-name": ("powerd/v1/default/nodes/.n1/telemetry", "node name '.n1' must match"),
    "bad-job-name": ("powerd/v1/default/jobs/j 1/phase", "job name 'j 1' must match"),
    "wildcard-plus": ("powerd/v1/default/nodes/+/telemetry", "node name '\\+' must match"),
    "wildcard-hash": ("powerd/v1/default/#", "not a powerd v1 topic"),
    "heartbeat-extra": ("powerd/v1/default/controller/heartbeat/x", "not a powerd v1 topic"),
    "controller-other": ("powerd/v1/default/controller/status", "not a powerd v1 topic"),
    "case": ("powerd/v1/default/Nodes/n1/telemetry", "not a powerd v1 topic"),
}


@pytest.mark.parametrize(("topic", "match"), list(BAD_TOPICS.values()), ids=list(BAD_TOPICS))
def test_topic_parse_rejects(topic: str, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        Topics().parse(topic)


@pytest.mark.parametrize("bad", [*BAD_NAMES.values(), None, 5], ids=[*BAD_NAMES, "none", "int"])
def test_topic_builders_reject_bad_names(bad: Any) -> None:
    with pytest.raises(ProtocolError, match="must match"):
        Topics(bad)
    with pytest.raises(ProtocolError, match="must match"):
        check_name(bad, "node")
    with pytest.raises(ProtocolError, match="must match"):
        names(["ok", bad], "node")
    for kind, builder in BUILDERS.items():
        what = "job" if kind == "phase" else "node"
        with pytest.raises(ProtocolError, match=f"{what} name .* must match"):
            builder(Topics(), bad)


def test_check_name_accepts_and_returns() -> None:
    assert check_name("r01-n03", "node") == "r01-n03"
    assert names(["a", "b.c"], "job") == ["a", "b.c"]
    with pytest.raises(ProtocolError) as info:
        check_name("", "node")
    assert NAME_PATTERN in str(info.value)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda: check_name("r01-n03\n", "node"), id="check_name"),
        pytest.param(lambda: Topics("default\n"), id="Topics-cluster"),
        pytest.param(lambda: Topics().telemetry("r01-n03\n"), id="build"),
        pytest.param(
            lambda: Topics().parse("powerd/v1/default/nodes/r01-n03\n/telemetry"), id="parse"
        ),
    ],
)
def test_trailing_newline_names_rejected(call: Callable[[], Any]) -> None:
    with pytest.raises(ProtocolError):
        call()


# --- peek_order ----------------------------------------------------------------

PEEK = {
    "valid-command": (EXAMPLES[Command], (7, 1203)),
    "invalid-command-still-ordered": (build(Command, (("gpus", 0, "cap_w"), -1)), (7, 1203)),
    "wrong-version-still-ordered": (build(Command, (("v",), 2)), (7, 1203)),
    "bytes": (b'{"epoch":3,"seq":4}', (3, 4)),
    "zeros": (b'{"epoch":0,"seq":0}', (0, 0)),
    "huge": (b'{"epoch":100000000000000000000,"seq":1}', (0, 0)),  # past int64: unsendable
    "not-json": (b"{nope", (0, 0)),
    "empty": (b"", (0, 0)),
    "bad-utf8": (b'{"epoch":1,"seq":2,"x":"\xff"}', (0, 0)),
    "array": (b"[7,1203]", (0, 0)),
    "null": (b"null", (0, 0)),
    "missing-seq": (b'{"epoch":7}', (0, 0)),
    "missing-epoch": (b'{"seq":7}', (0, 0)),
    "bool": (b'{"epoch":true,"seq":1}', (0, 0)),
    "float": (b'{"epoch":7.0,"seq":1}', (0, 0)),
    "string": (b'{"epoch":"7","seq":"1"}', (0, 0)),
    "negative": (b'{"epoch":-1,"seq":5}', (0, 0)),
    "null-values": (b'{"epoch":null,"seq":null}', (0, 0)),
    "inf": (b'{"epoch":1e999,"seq":1}', (0, 0)),
}


@pytest.mark.parametrize(("payload", "order"), list(PEEK.values()), ids=list(PEEK))
def test_peek_order(payload: bytes | str, order: tuple[int, int]) -> None:
    assert peek_order(payload) == order
    if isinstance(payload, bytes):
        try:
            text = payload.decode()
        except UnicodeDecodeError:
            return
        assert peek_order(text) == order
