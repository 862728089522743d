"""The clock policy (``comm_clock``, an optional field of v1): on a command's GPU entry and in
the ack; round trip, constraints, and readers that do not know it."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from msgspec import UNSET

from powerd.protocol import (
    CLOCK_MAX_MHZ,
    Ack,
    Command,
    CommClock,
    GpuAck,
    GpuCommand,
    ProtocolError,
    decode,
    encode,
)


def command_with(policy: Any) -> bytes:
    entry = {"index": 0, "cap_w": 500.0, "comm_clock": policy}
    message = {"v": 1, "epoch": 1, "seq": 1, "ts": 1.0, "ttl_s": 30, "gpus": [entry]}
    return json.dumps(message).encode()


def test_round_trip_and_absent_stays_absent() -> None:
    owned = CommClock(job="llama-70b", owner="alice", max_sm_clock_mhz=1100.0)
    command = Command(
        v=1,
        epoch=7,
        seq=3,
        ts=1.0,
        ttl_s=30.0,
        gpus=[GpuCommand(index=0, comm_clock=owned), GpuCommand(index=1, cap_w=400.0)],
    )
    data = encode(command)
    assert b'"comm_clock":{"job":"llama-70b","max_sm_clock_mhz":1100.0,"owner":"alice"}' in data
    back = decode(Command, data)
    assert back == command
    assert back.gpus[1].comm_clock is UNSET  # absent: no policy, and not on the wire
    assert data.count(b"comm_clock") == 1
    unowned = decode(Command, command_with({"job": "j", "max_sm_clock_mhz": 1100}))
    assert unowned.gpus[0].comm_clock == CommClock(job="j", max_sm_clock_mhz=1100.0)


@pytest.mark.parametrize(
    ("policy", "match"),
    [
        (None, "comm_clock"),  # null is not "none": absent is
        ({"job": "j"}, "max_sm_clock_mhz"),
        ({"max_sm_clock_mhz": 1100}, "job"),
        ({"job": "j", "max_sm_clock_mhz": 0}, "max_sm_clock_mhz"),
        ({"job": "j", "max_sm_clock_mhz": -5}, "max_sm_clock_mhz"),
        ({"job": "j", "max_sm_clock_mhz": CLOCK_MAX_MHZ + 1}, "max_sm_clock_mhz"),
        ({"job": "j", "max_sm_clock_mhz": "1100"}, "max_sm_clock_mhz"),
        ({"job": "bad name", "max_sm_clock_mhz": 1100}, "job"),
        ({"job": "j\n", "max_sm_clock_mhz": 1100}, "job"),
        ({"job": "j", "owner": "a/b", "max_sm_clock_mhz": 1100}, "owner"),
        ({"job": "j", "max_sm_clock_mhz": 1100, "owner": 3}, "owner"),
        ("llm", "comm_clock"),
    ],
)
def test_a_bad_policy_makes_the_command_malformed(policy: Any, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode(Command, command_with(policy))


def test_a_non_finite_clock_is_refused_when_built_and_when_sent() -> None:
    with pytest.raises(ValueError, match="non-finite"):
        CommClock(job="j", max_sm_clock_mhz=float("nan"))
    policy = CommClock(job="j", max_sm_clock_mhz=1100.0)
    policy.max_sm_clock_mhz = float("inf")
    command = Command(v=1, epoch=1, seq=1, ts=1.0, ttl_s=5.0, gpus=[GpuCommand(index=0)])
    command.gpus[0].comm_clock = policy
    with pytest.raises(ProtocolError, match="non-finite"):
        encode(command)


class _OldGpuCommand(msgspec.Struct, forbid_unknown_fields=False):
    """A GPU entry as an agent from before clock policies reads it."""

    index: int
    cap_w: float | None = None


class _OldCommand(msgspec.Struct, forbid_unknown_fields=False):
    v: int
    epoch: int
    seq: int
    ts: float
    ttl_s: float
    gpus: list[_OldGpuCommand]


def test_an_older_reader_ignores_the_policy_and_an_older_ack_reads_as_none() -> None:
    data = command_with({"job": "j", "max_sm_clock_mhz": 1100})
    old = msgspec.json.decode(data, type=_OldCommand)
    assert old.gpus[0].cap_w == 500.0
    # an older agent's ack has no comm_clock: the controller reads "holds none"
    ack = {
        "v": 1,
        "node": "n1",
        "epoch": 1,
        "seq": 1,
        "ts": 1.0,
        "result": "applied",
        "gpus": [{"index": 0, "cap_w": 500.0, "max_sm_clock_mhz": None, "clamped": False}],
        "errors": [],
    }
    assert decode(Ack, json.dumps(ack).encode()).gpus[0].comm_clock is None
    held = GpuAck(
        index=0,
        cap_w=500.0,
        max_sm_clock_mhz=None,
        clamped=True,
        comm_clock=CommClock(job="j", max_sm_clock_mhz=1980.0),
    )
    full = Ack(v=1, node="n1", epoch=1, seq=1, ts=1.0, result="applied", gpus=[held], errors=[])
    assert decode(Ack, encode(full)) == full
