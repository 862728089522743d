"""Caps are clamped into the device range and read back; per-GPU failures make a partial ack."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerd.agent.rules import MAX_ACK_ERRORS
from powerd.gpu import GpuNotSupportedError, GpuPermissionError
from powerd.gpu.simulated import SimulatedGpu
from powerd.protocol import MAX_PAYLOAD_BYTES, Ack, GpuCommand, decode, encode
from tests.support.agent_core_harness import (
    FAILSAFE_W,
    Node,
    cap,
    command,
    controlled_core,
    core_clock,
)


@pytest.fixture
def node() -> Node:
    """A started core on 4 simulated H100s, following a live leader of epoch 1."""
    return controlled_core(core_clock())


def settings_of_gpu(gpu: SimulatedGpu) -> tuple[float, int | None]:
    return gpu.power_limit_w(), gpu.locked_max_sm_clock_mhz()


def by_index(ack: Ack) -> dict[int, tuple[float | None, int | None, bool]]:
    return {g.index: (g.cap_w, g.max_sm_clock_mhz, g.clamped) for g in ack.gpus}


def round_trip(ack: Ack) -> Ack:
    """The ack as the controller will see it: encoded and decoded again."""
    data = encode(ack)
    assert len(data) <= MAX_PAYLOAD_BYTES
    return decode(Ack, data)


# --- clamping ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("asked_w", "enforced_w", "clamped"),
    [
        (900.0, 700.0, True),  # H100 SXM: 200..700 W
        (700.001, 700.0, True),
        (5000.0, 700.0, True),
        (150.0, 200.0, True),
        (0.5, 200.0, True),  # tiny but > 0: clamped, not rejected
        (1e-9, 200.0, True),
        (200.0, 200.0, False),
        (700.0, 700.0, False),
        (555.5, 555.5, False),
    ],
)
def test_cap_clamped_into_device_range(
    node: Node, asked_w: float, enforced_w: float, clamped: bool
) -> None:
    core, gpus = node
    ack = round_trip(core.on_command(command(1, 1, cap(1, asked_w))))
    assert ack.result == "applied"  # clamping is reported, not an error
    assert ack.errors == []
    assert gpus[1].power_limit_w() == enforced_w
    assert by_index(ack) == {1: (enforced_w, None, clamped)}
    assert ack.gpus[0].cap_w == gpus[1].enforced_cap_w()
    assert core.counters.commands_applied == 1


def test_clamp_follows_each_model() -> None:
    core, gpus = controlled_core(core_clock(), "2xA100")  # 100..400 W
    ack = core.on_command(command(1, 1, cap(0, 700.0), cap(1, 50.0)))
    assert by_index(ack) == {0: (400.0, None, True), 1: (100.0, None, True)}
    assert [g.power_limit_w() for g in gpus] == [400.0, 100.0]


def test_clamped_flag_is_per_gpu(node: Node) -> None:
    core, _ = node
    ack = core.on_command(
        command(
            1,
            1,
            cap(0, 800.0),
            cap(1, 300.0),
            GpuCommand(index=2, cap_w=300.0, max_sm_clock_mhz=9000),
            GpuCommand(index=3, cap_w=300.0, max_sm_clock_mhz=1500),
        )
    )
    assert by_index(ack) == {
        0: (700.0, None, True),
        1: (300.0, None, False),
        2: (300.0, 1980, True),  # clamped clock alone sets the flag
        3: (300.0, 1500, False),
    }


def test_the_ack_reads_back_the_limit_taken_and_telemetry_the_limit_enforced(node: Node) -> None:
    core, gpus = node
    gpus[0].set_external_limit_w(450.0)  # an out-of-band limiter (BMC, power brake)
    gpus[1].inject_error("set_power_limit_w", GpuPermissionError("no"))  # not taken
    ack = core.on_command(command(1, 1, cap(0, 600.0), cap(1, 600.0)))
    assert by_index(ack)[0] == (600.0, None, False)  # the limit the device took ...
    assert by_index(ack)[1] == (FAILSAFE_W, None, False)  # ... read back, not the request
    assert [g.cap_w for g in core.telemetry().gpus][:2] == [450.0, FAILSAFE_W]  # enforced


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False))
def test_no_cap_escapes_the_device_range(asked_w: float) -> None:
    core, gpus = controlled_core(core_clock(), "1xH100")
    ack = core.on_command(command(1, 1, cap(0, asked_w)))
    assert ack.result == "applied"
    limit_w = gpus[0].power_limit_w()
    assert 200.0 <= limit_w <= 700.0
    assert abs(limit_w - min(max(asked_w, 200.0), 700.0)) <= 0.0005  # NVML keeps mW
    assert ack.gpus[0].cap_w == limit_w
    assert ack.gpus[0].clamped == (not 200.0 <= asked_w <= 700.0)


# --- unknown GPUs and failing GPUs -----------------------------------------------


def test_unknown_index_is_an_error_and_the_rest_apply(node: Node) -> None:
    core, gpus = node
    ack = round_trip(core.on_command(command(1, 1, cap(0, 300.0), cap(7, 300.0), cap(2, 310.0))))
    assert ack.result == "partial"
    assert [e.index for e in ack.errors] == [7]
    assert "7" in ack.errors[0].message
    assert "unknown" in ack.errors[0].message
    assert sorted(by_index(ack)) == [0, 2]
    assert [g.power_limit_w() for g in gpus] == [300.0, FAILSAFE_W, 310.0, FAILSAFE_W]
    assert core.counters.commands_partial == 1
    assert core.counters.commands_applied == 0
    # a partial command still took its place in the order
    assert core.on_command(command(1, 1, cap(0, 320.0))).result == "stale"


def test_failing_setter_makes_a_partial_ack(node: Node) -> None:
    core, gpus = node
    gpus[1].inject_error("set_power_limit_w", GpuPermissionError("insufficient permissions"))
    ack = round_trip(core.on_command(command(1, 1, cap(0, 300.0), cap(1, 300.0), cap(2, 300.0))))
    assert ack.result == "partial"
    assert [e.index for e in ack.errors] == [1]
    assert "power cap" in ack.errors[0].message
    assert "insufficient permissions" in ack.errors[0].message
    # the failing GPU is unchanged, and its ack says so (read back); the others applied
    assert [g.power_limit_w() for g in gpus] == [300.0, FAILSAFE_W, 300.0, FAILSAFE_W]
    assert by_index(ack) == {
        0: (300.0, None, False),
        1: (FAILSAFE_W, None, False),
        2: (300.0, None, False),
    }
    assert core.counters.commands_partial == 1
    # the injected fault was a one-off: the next command reaches GPU 1
    assert core.on_command(command(1, 2, cap(1, 300.0))).result == "applied"
    assert gpus[1].power_limit_w() == 300.0


def test_failing_clock_lock_still_applies_the_cap(node: Node) -> None:
    core, gpus = node
    gpus[0].inject_error("lock_max_sm_clock_mhz", GpuNotSupportedError("clock locking"))
    ack = core.on_command(command(1, 1, GpuCommand(index=0, cap_w=350.0, max_sm_clock_mhz=1200)))
    assert ack.result == "partial"
    assert [(e.index, "clock lock" in e.message) for e in ack.errors] == [(0, True)]
    assert settings_of_gpu(gpus[0]) == (350.0, None)
    assert by_index(ack) == {0: (350.0, None, False)}


def test_failing_read_back_reports_null_and_an_error(node: Node) -> None:
    core, gpus = node
    gpus[3].inject_error("locked_max_sm_clock_mhz", GpuNotSupportedError("lock unknown"))
    ack = round_trip(core.on_command(command(1, 1, cap(3, 333.0))))
    assert ack.result == "partial"
    assert by_index(ack) == {3: (333.0, None, False)}  # what was read; the lock as null
    assert [e.index for e in ack.errors] == [3]
    assert "reading back" in ack.errors[0].message
    assert gpus[3].power_limit_w() == 333.0  # the write itself went through


def test_lost_gpu_makes_a_partial_ack(node: Node) -> None:
    core, gpus = node
    gpus[2].lose()
    ack = core.on_command(command(1, 1, cap(0, 300.0), cap(2, 300.0), cap(3, 300.0)))
    assert ack.result == "partial"
    assert {e.index for e in ack.errors} == {2}
    assert gpus[0].power_limit_w() == gpus[3].power_limit_w() == 300.0


def test_many_unknown_indices_are_truncated(node: Node) -> None:
    core, gpus = node
    unknown = list(range(4, 1024))  # every other index the protocol allows
    payload = command(1, 1, *[cap(i, 300.0) for i in range(4)], *[cap(i, 300.0) for i in unknown])
    assert len(payload) <= MAX_PAYLOAD_BYTES
    ack = core.on_command(payload)
    assert ack.result == "partial"
    assert len(ack.errors) == MAX_ACK_ERRORS
    listed = ack.errors[:-1]
    assert [e.index for e in listed] == unknown[: MAX_ACK_ERRORS - 1]
    summary = ack.errors[-1]
    assert summary.index is None
    assert f"{len(unknown) - (MAX_ACK_ERRORS - 1)} more errors" in summary.message
    # the known GPUs still applied
    assert sorted(by_index(ack)) == [0, 1, 2, 3]
    assert [g.power_limit_w() for g in gpus] == [300.0] * 4
    data = encode(ack)
    assert len(data) < 64 * 1024
    assert decode(Ack, data).errors[-1].message == summary.message


def test_exactly_max_errors_are_not_truncated(node: Node) -> None:
    core, _ = node
    unknown = list(range(100, 100 + MAX_ACK_ERRORS))
    ack = core.on_command(command(1, 1, *[cap(i, 300.0) for i in unknown]))
    assert [e.index for e in ack.errors] == unknown


def test_the_ack_of_a_cut_reports_the_cut_though_the_device_enforces_it_later() -> None:
    """Seen on an H200 (driver 580): NVML's enforced limit shows a new cap up to 92 ms after it
    is set. An ack read back from it at once reported the old cap (700 W for a 450 W cut),
    so the controller counted the GPU above what it had just cut it to."""
    from powerd.gpu.models import gpu_model
    from powerd.gpu.nvml import open_nvml
    from tests.support.agent_core_harness import core_following
    from tests.support.fakes.fake_pynvml import FakeNvml

    clock = core_clock()
    fake = FakeNvml([gpu_model("H100")] * 2, clock=clock.monotonic, enforce_delay_s=0.092)
    gpus = open_nvml(fake)
    core = core_following(clock, gpus)  # started: the failsafe caps (500 W) are on their way
    clock.advance(1.0)
    ack = core.on_command(command(1, 1, cap(0, 450.0), cap(1, 650.0)))
    assert ack.result == "applied"
    assert by_index(ack) == {0: (450.0, None, False), 1: (650.0, None, False)}
    # telemetry says what holds the GPUs as they draw: the old limit, for a moment
    assert [s.cap_w for s in core.telemetry().gpus] == [FAILSAFE_W, FAILSAFE_W]
    clock.advance(0.1)
    assert [s.cap_w for s in core.telemetry().gpus] == [450.0, 650.0]
