"""Malformed commands and heartbeats change nothing and are counted; stop() on exit.

The malformed payloads are signed by the controller key where they can be (a JSON
object): what is tested is validation behind the signature check, as if a real
controller had a bug. Unsigned, every one of them is refused before that (the last
tests here; tests/agent/test_agent_core_signed.py has the rest of the signature rules)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from powerd.agent.core import AgentCore
from powerd.gpu import GpuPermissionError
from powerd.gpu.simulated import SimulatedGpu
from powerd.protocol import MAX_PAYLOAD_BYTES, Ack, GpuCommand, decode, encode, peek_order
from tests.support.agent_core_harness import (
    COMMAND_TOPIC,
    FAILSAFE_W,
    TOPICS,
    WALL0,
    Node,
    command,
    controlled_core,
    core_clock,
    heartbeat_each_second,
    settings_of,
    started_core,
)
from tests.support.clock import ManualClock
from tests.support.keys import sign


def signed(topic: str, payload: bytes) -> bytes:
    """``payload`` signed for ``topic`` if it is a JSON object (else it cannot be)."""
    return sign(topic, payload) if payload.startswith(b"{") and payload.endswith(b"}") else payload


def rejections(core: AgentCore) -> int:
    """Payloads refused as malformed or as unsigned."""
    return core.counters.payloads_rejected + core.counters.unverified


@pytest.fixture
def clock() -> ManualClock:
    return core_clock()


@pytest.fixture
def node(clock: ManualClock) -> Node:
    """Controlled by a live leader, with (2, 5) applied: GPU i at 600 + 10 i W (above the
    failsafe cap), locked 1200."""
    core, gpus = controlled_core(clock, epoch=2)
    ack = core.on_command(
        command(
            2,
            5,
            *[GpuCommand(index=i, cap_w=600.0 + 10 * i, max_sm_clock_mhz=1200) for i in range(4)],
        )
    )
    assert ack.result == "applied"
    return core, gpus


def with_overrides(body: dict[str, object], overrides: dict[str, object]) -> bytes:
    """``body`` as JSON text, with fields replaced (or removed with a value of ...)."""
    for key, value in overrides.items():
        if value is ...:
            del body[key]
        else:
            body[key] = value
    return json.dumps(body).encode()


def raw_command(**overrides: object) -> bytes:
    """A command as JSON text, with fields replaced (or removed with a value of ...)."""
    body: dict[str, object] = {
        "v": 1,
        "epoch": 2,
        "seq": 9,
        "ts": WALL0,
        "ttl_s": 30,
        "gpus": [{"index": 0, "cap_w": 650.0}],
    }
    return with_overrides(body, overrides)


# (payload, epoch and seq the rejected ack carries)
MALFORMED: list = [
    pytest.param(b"not json at all", (0, 0), id="not-json"),
    pytest.param(b"", (0, 0), id="empty"),
    pytest.param(b"\xff\xfe\x00garbage", (0, 0), id="not-utf8"),
    pytest.param(b'{"v":1,"epoch":2,"seq":9', (0, 0), id="truncated"),
    pytest.param(b"[1, 2, 3]", (0, 0), id="array"),
    pytest.param(b"null", (0, 0), id="null"),
    pytest.param(raw_command(v=2), (2, 9), id="version-2"),
    pytest.param(raw_command(gpus=...), (2, 9), id="no-gpus"),
    pytest.param(raw_command(ttl_s=...), (2, 9), id="no-ttl"),
    pytest.param(raw_command(ttl_s=0), (2, 9), id="ttl-zero"),
    pytest.param(raw_command(ttl_s="30"), (2, 9), id="ttl-string"),
    pytest.param(raw_command(gpus={"index": 0}), (2, 9), id="gpus-object"),
    pytest.param(raw_command(gpus=[{"index": "0", "cap_w": 650.0}]), (2, 9), id="index-string"),
    pytest.param(raw_command(gpus=[{"index": 0.5, "cap_w": 650.0}]), (2, 9), id="index-float"),
    pytest.param(raw_command(gpus=[{"index": -1, "cap_w": 650.0}]), (2, 9), id="index-negative"),
    pytest.param(raw_command(gpus=[{"index": 1024, "cap_w": 650.0}]), (2, 9), id="index-1024"),
    pytest.param(raw_command(gpus=[{"cap_w": 650.0}]), (2, 9), id="index-missing"),
    pytest.param(raw_command(gpus=[{"index": 0, "cap_w": "650"}]), (2, 9), id="cap-string"),
    pytest.param(raw_command(gpus=[{"index": 0, "cap_w": True}]), (2, 9), id="cap-bool"),
    pytest.param(raw_command(gpus=[{"index": 0, "cap_w": 0}]), (2, 9), id="cap-zero"),
    pytest.param(raw_command(gpus=[{"index": 0, "cap_w": -300.0}]), (2, 9), id="cap-negative"),
    pytest.param(raw_command(gpus=[{"index": 0, "cap_w": None}]), (2, 9), id="cap-null"),
    pytest.param(raw_command(gpus=[{"index": 0, "max_sm_clock_mhz": 0}]), (2, 9), id="clock-zero"),
    pytest.param(
        raw_command(gpus=[{"index": 0, "max_sm_clock_mhz": "1410"}]), (2, 9), id="clock-string"
    ),
    pytest.param(
        raw_command(gpus=[{"index": 0, "cap_w": 650.0}, {"index": 0, "cap_w": 300.0}]),
        (2, 9),
        id="duplicate-index",
    ),
    pytest.param(
        raw_command(gpus=[{"index": 1, "cap_w": 650.0}, {"index": 3}, {"index": 1}]),
        (2, 9),
        id="duplicate-index-later",
    ),
    pytest.param(
        b'{"v":1,"epoch":2,"seq":9,"ts":1.0,"ttl_s":30,"gpus":[{"index":0,"cap_w":NaN}]}',
        (0, 0),
        id="NaN-literal",
    ),
    pytest.param(
        b'{"v":1,"epoch":2,"seq":9,"ts":1.0,"ttl_s":30,"gpus":[{"index":0,"cap_w":Infinity}]}',
        (0, 0),
        id="Infinity-literal",
    ),
    pytest.param(raw_command(epoch=-1), (0, 0), id="epoch-negative"),
    pytest.param(raw_command(epoch=2.0), (0, 0), id="epoch-float"),
    pytest.param(raw_command(seq="9"), (0, 0), id="seq-string"),
    pytest.param(raw_command(seq=True), (0, 0), id="seq-bool"),
    pytest.param(raw_command(epoch=...), (0, 0), id="epoch-missing"),
    pytest.param(
        raw_command(gpus=[{"index": 0, "cap_w": 650.0, "pad": "x" * MAX_PAYLOAD_BYTES}]),
        (2, 9),
        id="over-64KiB",
    ),
]

# 1e999 is valid JSON text that overflows to infinity: the contract's "non-finite number".
OVERFLOWING = [
    pytest.param(
        b'{"v":1,"epoch":2,"seq":9,"ts":1.0,"ttl_s":30,"gpus":[{"index":0,"cap_w":1e999}]}',
        id="cap-1e999",
    ),
    pytest.param(
        b'{"v":1,"epoch":2,"seq":9,"ts":1e999,"ttl_s":30,"gpus":[{"index":0,"cap_w":650}]}',
        id="ts-1e999",
    ),
    pytest.param(
        b'{"v":1,"epoch":2,"seq":9,"ts":1.0,"ttl_s":-1e999,"gpus":[]}',
        id="ttl-minus-1e999",
    ),
    pytest.param(
        b'{"v":1,"epoch":2,"seq":9,"ts":1.0,"ttl_s":30,'
        b'"gpus":[{"index":0,"max_sm_clock_mhz":1e999}]}',
        id="clock-1e999",
    ),
]


def assert_rejected_and_nothing_changed(
    core: AgentCore, gpus: list[SimulatedGpu], payload: bytes, rejected_before: int
) -> Ack:
    before = settings_of(gpus)
    payload = signed(COMMAND_TOPIC, payload)
    ack = core.on_command(payload)
    assert ack.result == "rejected"
    assert ack.gpus == []
    assert len(ack.errors) == 1 and ack.errors[0].index is None
    assert ack.errors[0].message
    assert (ack.epoch, ack.seq) == peek_order(payload)
    assert settings_of(gpus) == before
    assert rejections(core) == rejected_before + 1
    assert core.counters.commands_applied == 1  # the fixture's only
    assert core.counters.commands_refused == 0
    decode(Ack, encode(ack))  # the ack itself is valid
    return ack


@pytest.mark.parametrize(("payload", "order"), MALFORMED)
def test_malformed_command_is_rejected_and_changes_nothing(
    node: Node, payload: bytes, order: tuple[int, int]
) -> None:
    core, gpus = node
    ack = assert_rejected_and_nothing_changed(core, gpus, payload, 0)
    assert (ack.epoch, ack.seq) == order
    assert core.mode == "controlled"


@pytest.mark.parametrize("payload", OVERFLOWING)
def test_overflowing_number_is_rejected_and_changes_nothing(node: Node, payload: bytes) -> None:
    core, gpus = node
    assert_rejected_and_nothing_changed(core, gpus, payload, 0)


@pytest.mark.parametrize("payload", OVERFLOWING)
def test_overflowing_number_ack_carries_epoch_and_seq(node: Node, payload: bytes) -> None:
    core, _ = node
    ack = core.on_command(signed(COMMAND_TOPIC, payload))
    assert ack.result == "rejected"
    assert (ack.epoch, ack.seq) == (2, 9)


def test_rejected_command_takes_no_place_in_the_order(node: Node) -> None:
    core, gpus = node
    bad = signed(COMMAND_TOPIC, raw_command(gpus=[{"index": 0, "cap_w": 0}]))
    assert core.on_command(bad).result == "rejected"
    # the same (2, 9), well-formed this time, is applied, not stale
    ack = core.on_command(command(2, 9, GpuCommand(index=0, cap_w=650.0)))
    assert ack.result == "applied"
    assert gpus[0].power_limit_w() == 650.0


def test_a_flood_of_garbage_is_counted_and_survived(node: Node) -> None:
    core, gpus = node
    before = settings_of(gpus)
    payloads = [p.values[0] for p in MALFORMED + OVERFLOWING]
    payloads += [signed(COMMAND_TOPIC, p) for p in payloads]
    for _ in range(25):
        for payload in payloads:
            assert core.on_command(payload).result == "rejected"
    assert rejections(core) == 25 * len(payloads)
    assert settings_of(gpus) == before
    assert core.on_command(command(2, 6, GpuCommand(index=1, cap_w=600.0))).result == "applied"


def test_malformed_command_in_failsafe_is_still_rejected_as_malformed(clock: ManualClock) -> None:
    core, gpus = started_core(clock, "2xH100")
    ack = core.on_command(signed(COMMAND_TOPIC, raw_command(gpus=[{"index": 0, "cap_w": -1}])))
    assert (ack.result, ack.epoch, ack.seq) == ("rejected", 2, 9)
    assert core.counters.payloads_rejected == 1
    assert core.counters.commands_refused == 0
    assert [g.power_limit_w() for g in gpus] == [FAILSAFE_W, FAILSAFE_W]


# --- malformed heartbeats ----------------------------------------------------------


def raw_heartbeat(clock: ManualClock, **overrides: object) -> bytes:
    body: dict[str, object] = {
        "v": 1,
        "epoch": 2,
        "ts": clock.wall,
        "controller": "ctl-a",
        "state": "leader",
    }
    return with_overrides(body, overrides)


MakeHeartbeat = Callable[[ManualClock], bytes]

BAD_HEARTBEATS: dict[str, MakeHeartbeat] = {
    "not-json": lambda c: b"leader!",
    "array": lambda c: b"[]",
    "no-v": lambda c: raw_heartbeat(c, v=...),
    "v2": lambda c: raw_heartbeat(c, v=2),
    "bad-state": lambda c: raw_heartbeat(c, state="boss"),
    "epoch-negative": lambda c: raw_heartbeat(c, epoch=-1),
    "epoch-string": lambda c: raw_heartbeat(c, epoch="3"),
    "ts-missing": lambda c: raw_heartbeat(c, ts=...),
    "ts-string": lambda c: raw_heartbeat(c, ts="now"),
    "ts-1e999": lambda c: raw_heartbeat(c, ts=...)[:-1] + b',"ts":1e999}',
    "bad-controller-name": lambda c: raw_heartbeat(c, controller="ctl a/b"),
}


@pytest.mark.parametrize("make", BAD_HEARTBEATS.values(), ids=BAD_HEARTBEATS.keys())
def test_malformed_heartbeat_does_not_make_it_controlled(
    clock: ManualClock, make: MakeHeartbeat
) -> None:
    core, _ = started_core(clock, "2xH100")
    core.on_heartbeat(signed(TOPICS.heartbeat, make(clock)))
    assert core.mode == "failsafe"
    assert rejections(core) == 1
    assert core.counters.heartbeats_ignored == 0


@pytest.mark.parametrize("make", BAD_HEARTBEATS.values(), ids=BAD_HEARTBEATS.keys())
def test_malformed_heartbeat_does_not_keep_it_alive(
    clock: ManualClock, node: Node, make: MakeHeartbeat
) -> None:
    core, gpus = node
    heartbeat_each_second(clock, core, 11, lambda c: signed(TOPICS.heartbeat, make(c)))
    assert core.mode == "failsafe"
    assert rejections(core) == 11
    assert [g.power_limit_w() for g in gpus] == [FAILSAFE_W] * 4


def test_malformed_heartbeat_with_a_higher_epoch_does_not_raise_the_epoch(
    clock: ManualClock, node: Node
) -> None:
    core, _ = node
    core.on_heartbeat(signed(TOPICS.heartbeat, raw_heartbeat(clock, epoch=9, state="boss")))
    assert core.on_command(command(2, 6, GpuCommand(index=0, cap_w=610.0))).result == "applied"


# --- stop ----------------------------------------------------------------------------


def test_stop_restore_puts_back_defaults_and_unlocks(node: Node) -> None:
    core, gpus = node
    assert settings_of(gpus) == [(600.0 + 10 * i, 1200) for i in range(4)]
    core.stop("restore")
    assert settings_of(gpus) == [(700.0, None)] * 4  # H100 default limit


def test_stop_restore_survives_a_failing_gpu(node: Node) -> None:
    core, gpus = node
    gpus[2].inject_error("set_power_limit_w", GpuPermissionError("not root"))
    core.stop("restore")  # logs, does not raise
    assert [g.power_limit_w() for g in gpus] == [700.0, 700.0, 620.0, 700.0]


def test_stop_keep_changes_nothing(node: Node) -> None:
    core, gpus = node
    before = settings_of(gpus)
    core.stop("keep")
    assert settings_of(gpus) == before
