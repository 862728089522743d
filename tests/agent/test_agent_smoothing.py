"""Hardware power smoothing through the agent: commanded, clamped into the device's range,
applied only when it differs, read back into the ack, reported in telemetry, put back on
exit (docs/PROTOCOL.md, "Power smoothing (optional fields)")."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerd.agent.controls import profile_of, smoothing_wire
from powerd.gpu import GpuPermissionError
from powerd.gpu.base import SmoothingProfile, SmoothingRange
from powerd.gpu.models import gpu_model
from powerd.gpu.simulated import (
    SMOOTHING_DEFAULT_RAMP_W_PER_S,
    SMOOTHING_FLOOR_MAX_PERCENT,
    SimulatedGpu,
    default_smoothing_preset,
)
from powerd.protocol import (
    SMOOTHING_MAX_HYSTERESIS_MS,
    SMOOTHING_MAX_RAMP_W_PER_S,
    SMOOTHING_STATE_EVERY_SAMPLES,
    Ack,
    Command,
    GpuCommand,
    GpuSmoothing,
    GpuSmoothingState,
    Telemetry,
    decode,
    encode,
)
from tests.support.agent_core_harness import (
    COMMAND_TOPIC,
    FAILSAFE_W,
    NODE,
    Node,
    command,
    controlled_core,
    core_clock,
    core_following,
    heartbeat,
)
from tests.support.clock import WALL0
from tests.support.keys import sign

WANTED = GpuSmoothing(
    preset=1,
    enabled=True,
    floor_percent=40.0,
    ramp_up_w_per_s=200.0,
    ramp_down_w_per_s=100.0,
    ramp_down_hysteresis_ms=3000.0,
)
OFF = default_smoothing_preset(0)  # what a simulated GB200 holds before anyone writes
OFF_WIRE = smoothing_wire(OFF)


@pytest.fixture
def node() -> Node:
    """A started core on 2 simulated GB200s (they have smoothing), following a live leader."""
    return controlled_core(core_clock(), "2xGB200")


def smooth(index: int, profile: GpuSmoothing = WANTED, cap_w: float | None = None) -> GpuCommand:
    if cap_w is None:
        return GpuCommand(index=index, smoothing=profile)
    return GpuCommand(index=index, cap_w=cap_w, smoothing=profile)


def round_trip(ack: Ack) -> Ack:
    """The ack as the controller sees it: encoded and decoded again."""
    return decode(Ack, encode(ack))


def raw_command(seq: int, gpus: list[dict[str, Any]]) -> bytes:
    """A signed command written as JSON by hand: what ``encode`` would refuse to send."""
    body = {"v": 1, "epoch": 1, "seq": seq, "ts": WALL0, "ttl_s": 30.0, "gpus": gpus}
    return sign(COMMAND_TOPIC, json.dumps(body, separators=(",", ":")).encode())


def wire(profile: GpuSmoothing, **changes: Any) -> dict[str, Any]:
    return {**msgspec.structs.asdict(profile), **changes}


# --- apply and read back ---------------------------------------------------------


def test_command_applies_the_profile_and_the_ack_reads_it_back(node: Node) -> None:
    core, gpus = node
    ack = round_trip(core.on_command(command(1, 1, smooth(0))))
    assert ack.result == "applied"
    assert ack.errors == []
    (gpu_ack,) = ack.gpus
    assert gpu_ack.clamped is False
    assert gpu_ack.smoothing == WANTED
    active = gpus[0].smoothing()
    assert active is not None and active.close_to(profile_of(WANTED))
    # the GPU the command left out keeps its smoothing, and a GPU whose command says nothing
    # of smoothing gets none in its ack
    assert gpus[1].smoothing() == OFF
    ack = core.on_command(command(1, 2, GpuCommand(index=1, cap_w=600.0)))
    assert ack.gpus[0].smoothing is None
    assert "smoothing" not in json.loads(encode(ack))["gpus"][0]


def test_the_same_profile_again_writes_nothing(node: Node) -> None:
    core, gpus = node
    assert core.on_command(command(1, 1, smooth(0))).result == "applied"
    # any write now fails: a command that wrote would be acked partial
    gpus[0].inject_error("set_smoothing", GpuPermissionError("no writes here"), times=None)
    ack = core.on_command(command(1, 2, smooth(0)))
    assert ack.result == "applied", ack.errors
    assert ack.gpus[0].smoothing == WANTED
    # a different profile does write (and meets the injected fault)
    ack = core.on_command(command(1, 3, smooth(0, GpuSmoothing(**{**wire(WANTED), "preset": 2}))))
    assert ack.result == "partial"
    assert [e.index for e in ack.errors] == [0]
    assert ack.errors[0].message.startswith("power smoothing: ")
    assert "no writes here" in ack.errors[0].message
    assert ack.gpus[0].smoothing == WANTED  # read back: what the device still holds


def test_switching_smoothing_off_is_applied(node: Node) -> None:
    core, gpus = node
    core.on_command(command(1, 1, smooth(0)))
    off = GpuSmoothing(**{**wire(WANTED), "enabled": False})
    ack = core.on_command(command(1, 2, smooth(0, off)))
    assert ack.result == "applied"
    assert ack.gpus[0].smoothing == off
    active = gpus[0].smoothing()
    assert active is not None and active.enabled is False


def test_failing_smoothing_still_applies_the_cap(node: Node) -> None:
    core, gpus = node
    gpus[0].inject_error("set_smoothing", GpuPermissionError("insufficient permissions"))
    ack = round_trip(core.on_command(command(1, 1, smooth(0, cap_w=650.0), smooth(1))))
    assert ack.result == "partial"
    assert [(e.index, e.message.startswith("power smoothing: ")) for e in ack.errors] == [(0, True)]
    assert gpus[0].power_limit_w() == 650.0
    assert ack.gpus[0].cap_w == 650.0
    assert ack.gpus[0].smoothing is not None
    assert ack.gpus[0].smoothing.enabled is False  # unchanged, and the ack says so
    assert ack.gpus[1].smoothing == WANTED  # the other GPU applied
    assert core.counters.commands_partial == 1


# --- out of range: the protocol refuses, the device's range clamps ------------------


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"floor_percent": 100.5}, "<= 100"),
        ({"floor_percent": -1.0}, ">= 0"),
        ({"ramp_up_w_per_s": -5.0}, ">= 0"),
        ({"ramp_down_w_per_s": SMOOTHING_MAX_RAMP_W_PER_S * 2}, "<="),
        ({"ramp_down_hysteresis_ms": -1}, ">= 0"),
        ({"ramp_down_hysteresis_ms": SMOOTHING_MAX_HYSTERESIS_MS + 1}, "<="),
        ({"preset": 5}, "<= 4"),
        ({"preset": -1}, ">= 0"),
        ({"preset": 1.0}, "Expected `int`"),
        ({"enabled": 1}, "Expected `bool`"),
        ({"floor_percent": None}, "Expected `float`"),
    ],
    ids=lambda v: str(v),
)
def test_out_of_any_range_is_refused_by_the_protocol(
    node: Node, changes: dict[str, Any], match: str
) -> None:
    core, gpus = node
    payload = raw_command(1, [{"index": 0, "cap_w": 650.0, "smoothing": wire(WANTED, **changes)}])
    ack = core.on_command(payload)
    assert ack.result == "rejected"
    assert ack.gpus == []
    assert match in ack.errors[0].message
    assert "smoothing" in ack.errors[0].message
    assert gpus[0].smoothing() == OFF
    assert gpus[0].power_limit_w() == FAILSAFE_W  # nothing of a rejected command applies


def test_a_missing_smoothing_field_is_refused(node: Node) -> None:
    core, _ = node
    partial = {k: v for k, v in wire(WANTED).items() if k != "ramp_up_w_per_s"}
    ack = core.on_command(raw_command(1, [{"index": 0, "smoothing": partial}]))
    assert ack.result == "rejected"
    assert "missing required field `ramp_up_w_per_s`" in ack.errors[0].message


@pytest.mark.parametrize(("asked", "held"), [(95.0, 90.0), (100.0, 90.0), (90.0, 90.0)])
def test_a_floor_beyond_the_device_range_is_clamped(node: Node, asked: float, held: float) -> None:
    core, gpus = node
    profile = GpuSmoothing(**{**wire(WANTED), "floor_percent": asked})
    ack = round_trip(core.on_command(command(1, 1, smooth(0, profile))))
    assert ack.result == "applied"  # clamping is reported, not an error
    assert ack.errors == []
    assert ack.gpus[0].clamped is (asked != held)
    assert ack.gpus[0].smoothing is not None
    assert ack.gpus[0].smoothing.floor_percent == held
    active = gpus[0].smoothing()
    assert active is not None and active.floor_percent == held == SMOOTHING_FLOOR_MAX_PERCENT


def test_a_preset_beyond_the_device_count_is_an_error_not_clamped(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    core, gpus = node
    # a device with 3 presets (real devices report their own count)
    monkeypatch.setattr(gpus[0], "smoothing_range", lambda: SmoothingRange(0.0, 90.0, 3))
    profile = GpuSmoothing(**{**wire(WANTED), "preset": 3})
    ack = core.on_command(command(1, 1, smooth(0, profile, cap_w=800.0)))
    assert ack.result == "partial"
    assert [e.index for e in ack.errors] == [0]
    assert ack.errors[0].message.startswith("power smoothing: ")
    assert "preset 3 is outside the device's presets 0-2" in ack.errors[0].message
    assert ack.gpus[0].clamped is False
    assert ack.gpus[0].smoothing == OFF_WIRE  # read back: unchanged
    assert gpus[0].smoothing() == OFF  # nothing written
    assert gpus[0].power_limit_w() == 800.0


# --- GPUs without smoothing ------------------------------------------------------


def test_h100_acks_an_error_for_smoothing_and_applies_its_cap() -> None:
    core, gpus = controlled_core(core_clock(), "2xH100")
    ack = round_trip(core.on_command(command(1, 1, smooth(0, cap_w=450.0), smooth(1))))
    assert ack.result == "partial"
    assert [e.index for e in ack.errors] == [0, 1]
    for error in ack.errors:
        assert error.message.startswith("power smoothing not supported on this GPU: ")
        assert "Blackwell" in error.message
    assert gpus[0].power_limit_w() == 450.0
    assert ack.gpus[0].cap_w == 450.0
    assert [g.smoothing for g in ack.gpus] == [None, None]
    assert core.counters.commands_partial == 1


def test_mixed_node_applies_smoothing_where_the_gpu_has_it() -> None:
    clock = core_clock()
    gpus = [
        SimulatedGpu(gpu_model("GB200"), 0, clock=clock.monotonic),
        SimulatedGpu(gpu_model("H100"), 1, clock=clock.monotonic),
    ]
    core = core_following(clock, gpus)
    ack = core.on_command(command(1, 1, smooth(0, cap_w=900.0), smooth(1, cap_w=600.0)))
    assert ack.result == "partial"
    assert [e.index for e in ack.errors] == [1]
    assert [g.cap_w for g in ack.gpus] == [900.0, 600.0]
    assert [g.smoothing for g in ack.gpus] == [WANTED, None]
    telemetry = decode(Telemetry, encode(core.telemetry()), NODE)
    assert [g.smoothing for g in telemetry.gpus] == [
        GpuSmoothingState(enabled=True, preset=1, floor_percent=40.0),
        None,
    ]


# --- telemetry -------------------------------------------------------------------


def test_telemetry_carries_the_profile_in_force(node: Node) -> None:
    core, _ = node
    before = decode(Telemetry, encode(core.telemetry()), NODE)
    off = GpuSmoothingState(enabled=False, preset=0, floor_percent=0.0)
    assert [g.smoothing for g in before.gpus] == [off, off]
    core.on_command(command(1, 1, smooth(1)))
    data = encode(core.telemetry())
    after = decode(Telemetry, data, NODE)
    assert [g.smoothing for g in after.gpus] == [
        None,  # unchanged since the last sample carried it: not repeated
        GpuSmoothingState(enabled=True, preset=1, floor_percent=40.0),  # changed: at once
    ]
    # compact: the switch, the preset and the floor; the ramps are in the ack
    assert json.loads(data)["gpus"][1]["smoothing"] == {
        "enabled": True,
        "preset": 1,
        "floor_percent": 40.0,
    }


def test_an_unchanged_state_is_carried_again_every_tenth_sample(node: Node) -> None:
    """A state changes a few times a day: telemetry carries it when it changes and every
    SMOOTHING_STATE_EVERY_SAMPLES samples, so that a controller that starts late learns it
    soon, at a tenth of the cost of carrying it every time (docs/PROTOCOL.md)."""
    core, _ = node
    off = GpuSmoothingState(enabled=False, preset=0, floor_percent=0.0)
    on = GpuSmoothingState(enabled=True, preset=1, floor_percent=40.0)

    def states() -> list[GpuSmoothingState | None]:
        return [g.smoothing for g in decode(Telemetry, encode(core.telemetry()), NODE).gpus]

    seen = [states() for _ in range(2 * SMOOTHING_STATE_EVERY_SAMPLES + 1)]
    carried = [k for k, s in enumerate(seen) if s == [off, off]]
    assert carried == [0, SMOOTHING_STATE_EVERY_SAMPLES, 2 * SMOOTHING_STATE_EVERY_SAMPLES]
    assert all(s == [None, None] for k, s in enumerate(seen) if k not in carried)
    core.on_command(command(1, 1, smooth(0)))
    assert states() == [on, None]  # a change goes out at once, and counts afresh from there
    later = [states() for _ in range(SMOOTHING_STATE_EVERY_SAMPLES)]
    assert later[-1] == [on, None]  # GPU 0: ten samples after its change
    assert later[-2] == [None, off]  # GPU 1: on its own count, unchanged
    assert all(s == [None, None] for s in later[:-2])


def test_a_new_controller_epoch_hears_every_state_on_the_next_sample() -> None:
    """A controller that takes over must not wait up to ten samples to learn which GPUs it
    can ask for its profile: the first heartbeat of a newer epoch resets the count."""
    clock = core_clock()
    core, _ = controlled_core(clock, "2xGB200")
    off = GpuSmoothingState(enabled=False, preset=0, floor_percent=0.0)

    def states() -> list[GpuSmoothingState | None]:
        return [g.smoothing for g in decode(Telemetry, encode(core.telemetry()), NODE).gpus]

    assert states() == [off, off]
    assert states() == [None, None]
    core.on_heartbeat(heartbeat(clock, epoch=1))  # the same leader again: nothing new
    assert states() == [None, None]
    core.on_heartbeat(heartbeat(clock, epoch=2))
    assert states() == [off, off]
    assert states() == [None, None]


def test_telemetry_of_a_gpu_without_smoothing_has_no_field() -> None:
    core, _ = controlled_core(core_clock(), "1xH100")
    data = json.loads(encode(core.telemetry()))
    assert "smoothing" not in data["gpus"][0]


def test_a_failed_smoothing_read_leaves_the_field_out_not_the_gpu(node: Node) -> None:
    core, gpus = node
    gpus[1].inject_error("smoothing", GpuPermissionError("busy"))
    telemetry = core.telemetry()
    assert [g.index for g in telemetry.gpus] == [0, 1]
    assert telemetry.gpus[0].smoothing is not None
    assert telemetry.gpus[1].smoothing is None
    assert core.counters.gpu_read_errors == 1


# --- failsafe and exit -------------------------------------------------------------


def test_failsafe_leaves_smoothing_as_it_is(node: Node) -> None:
    core, gpus = node
    core.on_command(command(1, 1, smooth(0, cap_w=900.0)))
    core.enter_failsafe("test")
    assert gpus[0].power_limit_w() == FAILSAFE_W
    active = gpus[0].smoothing()
    assert active is not None and active.close_to(profile_of(WANTED))
    # the floor is a share of the enforced cap: the failsafe cap bounds it too
    assert active.floor_w(gpus[0].enforced_cap_w()) <= FAILSAFE_W


def test_restore_on_stop_puts_the_original_smoothing_back(node: Node) -> None:
    core, gpus = node
    # an operator's state, set out of band before the agent ran (nvidia-smi)
    operator = SmoothingProfile(
        preset=3,
        enabled=True,
        floor_percent=20.0,
        ramp_up_w_per_s=500.0,
        ramp_down_w_per_s=250.0,
        ramp_down_hysteresis_ms=1000.0,
    )
    gpus[0]._write_smoothing(operator, activate=True)
    core.on_command(command(1, 1, smooth(0, cap_w=900.0)))
    core.on_command(command(1, 2, smooth(0, GpuSmoothing(**{**wire(WANTED), "preset": 3}))))
    assert gpus[0].smoothing() != operator
    core.stop("restore")
    assert gpus[0].smoothing() == operator
    # every preset written is back too (``enabled`` is the device-wide switch, on again)
    assert gpus[0].smoothing(1) == dataclasses.replace(default_smoothing_preset(1), enabled=True)
    assert gpus[0].power_limit_w() == gpus[0].power_limit_range().default_w
    assert gpus[1].smoothing() == OFF


def test_keep_on_stop_keeps_smoothing(node: Node) -> None:
    core, gpus = node
    core.on_command(command(1, 1, smooth(0, cap_w=900.0)))
    core.stop("keep")
    active = gpus[0].smoothing()
    assert active is not None and active.close_to(profile_of(WANTED))
    assert gpus[0].power_limit_w() == 900.0


# --- property ---------------------------------------------------------------------

floors = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
rates = st.sampled_from([0.0, 0.5, SMOOTHING_DEFAULT_RAMP_W_PER_S, SMOOTHING_MAX_RAMP_W_PER_S]) | (
    st.floats(min_value=0.0, max_value=SMOOTHING_MAX_RAMP_W_PER_S)
)
profiles = st.builds(
    GpuSmoothing,
    preset=st.integers(min_value=0, max_value=4),
    enabled=st.booleans(),
    floor_percent=floors,
    ramp_up_w_per_s=rates,
    ramp_down_w_per_s=rates,
    ramp_down_hysteresis_ms=st.floats(min_value=0.0, max_value=SMOOTHING_MAX_HYSTERESIS_MS),
)
steps = st.lists(
    st.tuples(profiles, st.none() | st.floats(min_value=1.0, max_value=2000.0)),
    min_size=1,
    max_size=8,
)


@settings(max_examples=80, deadline=None)
@given(steps)
def test_the_device_profile_stays_in_its_range(sequence: list[tuple[GpuSmoothing, Any]]) -> None:
    core, gpus = controlled_core(core_clock(), "1xGB200")
    gpu = gpus[0]
    limits = gpu.smoothing_range()
    for seq, (profile, cap_w) in enumerate(sequence, start=1):
        ack = round_trip(core.on_command(command(1, seq, smooth(0, profile, cap_w))))
        assert ack.result == "applied", ack.errors
        active = gpu.smoothing()
        assert active is not None and limits.contains(active)
        assert all(limits.contains(p) for i in range(limits.presets) if (p := gpu.smoothing(i)))
        wanted = profile_of(profile)
        assert active.close_to(limits.clamp(wanted))
        assert ack.gpus[0].smoothing is not None
        assert profile_of(ack.gpus[0].smoothing) == active
        cap_clamped = cap_w is not None and not 200.0 <= cap_w <= 1200.0
        assert ack.gpus[0].clamped == (cap_clamped or not limits.contains(wanted))
        assert active.floor_w(gpu.enforced_cap_w()) <= gpu.enforced_cap_w()
    core.stop("restore")
    assert gpu.smoothing() == OFF


def test_command_with_smoothing_encodes_and_decodes() -> None:
    msg = Command(v=1, epoch=1, seq=1, ts=WALL0, ttl_s=30.0, gpus=[smooth(0, cap_w=500.0)])
    assert decode(Command, encode(msg)) == msg
