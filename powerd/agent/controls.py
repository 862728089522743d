"""Writing caps, clock locks and power smoothing to GPUs: clamped, written only when they
change, read back.

After GEOPM's service: a control is written only when its value differs from
what the device holds, and every result reported is what the device says
afterwards, not what was asked for.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import msgspec
from msgspec import UNSET

from powerd.agent.rules import smoothing_to_write
from powerd.gpu import Gpu, GpuError, GpuNotSupportedError
from powerd.gpu.base import POWER_LIMIT_RESOLUTION_W, SmoothingProfile
from powerd.protocol import (
    SOFTWARE_MECHANISM,
    AckError,
    GpuAck,
    GpuCommand,
    GpuSmoothing,
    GpuSmoothingState,
)

log = logging.getLogger("powerd.agent")


@dataclass(frozen=True, slots=True)
class GpuCommandResult:
    ack: GpuAck
    errors: list[AckError]


def set_cap(gpu: Gpu, cap_w: float) -> tuple[float, bool]:
    """Clamp ``cap_w`` into the device's range and write it if it differs.

    Returns (the value written or kept, whether it was clamped).
    """
    limits = gpu.power_limit_range()
    target_w = limits.clamp(cap_w)
    if abs(gpu.power_limit_w() - target_w) > POWER_LIMIT_RESOLUTION_W:
        gpu.set_power_limit_w(target_w)
    return target_w, target_w != cap_w


def set_clock_lock(gpu: Gpu, max_mhz: float | None) -> bool:
    """Lock the max SM clock (clamped to the supported range) or unlock with None.

    Returns whether the value was clamped.
    """
    if max_mhz is None:
        if gpu.locked_max_sm_clock_mhz() is not None:
            gpu.unlock_sm_clock()
        return False
    target = gpu.sm_clock_range().clamp(max_mhz)
    if gpu.locked_max_sm_clock_mhz() != target:
        gpu.lock_max_sm_clock_mhz(target)
    return target != round(max_mhz)


def profile_of(wire: GpuSmoothing) -> SmoothingProfile:
    """The GPU layer's profile for a command's ``smoothing`` (GpuValueError if invalid): the
    two have the same fields, by name."""
    return SmoothingProfile(**msgspec.structs.asdict(wire))


def smoothing_wire(profile: SmoothingProfile) -> GpuSmoothing:
    """A profile read from a device, as the ack carries it."""
    return GpuSmoothing(**dataclasses.asdict(profile))


def smoothing_state(profile: SmoothingProfile, software: bool = False) -> GpuSmoothingState:
    """A profile read from a device, as telemetry carries it (switch, preset, floor; and
    ``software`` where the job carries it out: powerd.gpu.software_smoothing)."""
    return GpuSmoothingState(
        enabled=profile.enabled,
        preset=profile.preset,
        floor_percent=profile.floor_percent,
        mechanism=SOFTWARE_MECHANISM if software else None,
    )


def set_smoothing(gpu: Gpu, wanted: SmoothingProfile) -> bool:
    """Clamp ``wanted``'s floor into the device's range and apply it if the device's active
    profile differs (``close_to``). Returns whether the floor was clamped.

    ``GpuNotSupportedError`` on a GPU without smoothing; ``GpuValueError`` for a preset
    beyond the device's count (a preset is not a quantity: it is never clamped).
    """
    device = gpu.smoothing_range()  # raises GpuNotSupportedError without it
    active = gpu.smoothing()
    if active is None:
        raise GpuNotSupportedError(f"GPU {gpu.index} reads back no smoothing profile")
    write, clamped = smoothing_to_write(active, wanted, device)
    if write is not None:
        gpu.set_smoothing(write)
    return clamped


def apply_gpu_command(gpu: Gpu, command: GpuCommand) -> GpuCommandResult:
    """Apply one GPU's part of a command; failures become ack errors, never exceptions.

    Caps, then the clock lock, then power smoothing: each that fails is an error of its
    own, and the others still apply.
    """
    errors: list[AckError] = []
    clamped = False
    if command.cap_w is not UNSET:
        try:
            _, was_clamped = set_cap(gpu, command.cap_w)
            clamped |= was_clamped
        except GpuError as exc:
            errors.append(AckError(index=gpu.index, message=f"power cap: {exc}"))
    if command.max_sm_clock_mhz is not UNSET:
        try:
            clamped |= set_clock_lock(gpu, command.max_sm_clock_mhz)
        except GpuError as exc:
            errors.append(AckError(index=gpu.index, message=f"clock lock: {exc}"))
    supported = True
    if command.smoothing is not UNSET:
        try:
            clamped |= set_smoothing(gpu, profile_of(command.smoothing))
        except GpuNotSupportedError as exc:
            supported = False
            errors.append(
                AckError(
                    index=gpu.index,
                    message=f"power smoothing not supported on this GPU: {exc}",
                )
            )
        except GpuError as exc:
            errors.append(AckError(index=gpu.index, message=f"power smoothing: {exc}"))
    smoothing = command.smoothing is not UNSET and supported
    return GpuCommandResult(ack=read_back(gpu, clamped, errors, smoothing=smoothing), errors=errors)


def read_back(
    gpu: Gpu, clamped: bool, errors: list[AckError], *, smoothing: bool = False
) -> GpuAck:
    """What the device holds now; a failed read is reported as null plus an error.

    The cap is the power limit the device took, read back (``power_limit_w``), not the
    limit it enforces (telemetry's ``cap_w``): a real GPU enforces a new limit only
    ~0.1 s after it is set, so read at once the enforced limit is still the old one
    (docs/HARDWARE.md), and an ack of a cut would report the cap it replaced.
    With ``smoothing``, the active smoothing profile too (null where the device has none).
    """
    cap_w: float | None = None
    lock_mhz: int | None = None
    try:
        cap_w = gpu.power_limit_w()
        lock_mhz = gpu.locked_max_sm_clock_mhz()
    except GpuError as exc:
        errors.append(AckError(index=gpu.index, message=f"reading back: {exc}"))
    profile: GpuSmoothing | None = None
    if smoothing:
        try:
            active = gpu.smoothing()
            profile = None if active is None else smoothing_wire(active)
        except GpuError as exc:
            errors.append(AckError(index=gpu.index, message=f"reading back smoothing: {exc}"))
    return GpuAck(
        index=gpu.index,
        cap_w=cap_w,
        max_sm_clock_mhz=lock_mhz,
        clamped=clamped,
        smoothing=profile,
    )


def apply_failsafe(gpu: Gpu, cap_w: float) -> None:
    """Put one GPU in its failsafe state: the failsafe cap, clocks unlocked.

    Errors are logged, not raised: one broken GPU must not stop the others
    from being made safe.
    """
    try:
        written_w, clamped = set_cap(gpu, cap_w)
        if clamped:
            log.warning(
                "gpu %d: failsafe cap %.0f W is outside the device range, using %.0f W",
                gpu.index,
                cap_w,
                written_w,
            )
    except GpuError as exc:
        log.error("gpu %d: could not apply failsafe cap %.0f W: %s", gpu.index, cap_w, exc)
    try:
        set_clock_lock(gpu, None)
    except GpuError as exc:
        log.error("gpu %d: could not remove clock lock for failsafe: %s", gpu.index, exc)
