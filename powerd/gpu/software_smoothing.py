"""Power smoothing in software, for GPUs without the hardware (every GPU before Blackwell).

The software approach of "Power Stabilization for AI Training Datacenters"
(docs/DOMAIN.md): during waits and at its end the training process itself
keeps the GPU busy (a matmul loop, say) so that its draw falls no faster than
the grid allows and stays above a floor while the job runs.
``SoftwareSmoothing`` wraps such a GPU and gives it the ``Gpu`` smoothing
interface, so the agent applies, reads back, reports and restores a profile
exactly as it does on hardware (``powerd.agent.controls``); what the GPU cannot
do, the job does, told by ``fill_target`` through the agent (``FillRequest``).

What the job is told, per GPU, every agent sample (``fill_target``): the
GPU's draw ``power_w`` as sampled, the profile's ``ramp_down_w_per_s`` and
hysteresis, and ``floor_w`` (``floor_percent`` of the enforced cap, never above
it). The job does the rest, because only the job knows when it stops working
(a draw held up by its own busy work looks the same to the agent as a draw of
real work): when it enters a wait it lets the draw it last worked at fall no
faster than the rate, at once, but no lower than one window's rise under where
compute resumes for as long as a fall held through the hysteresis would stay
there, and never below the floor; working again, it needs no filling above the
floor. At its end it falls at the rate without the floor, until the target
reaches its idle draw (``powerd.jobhook.FillFollower``). While it starts, its
busy work raises the
draw from where it was, no faster than ``ramp_up_w_per_s``, up to the cap, so
that its first step of compute does not jump from a starting GPU's draw to the
cap; after that the controller raises the caps within the site ramp
(``policies.capping`` rules 2 and 4): the rise of compute itself is not the
job's to slow.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from powerd.gpu.base import (
    SMOOTHING_MAX_PRESETS,
    Gpu,
    SmoothingProfile,
    SmoothingRange,
    attempt_all,
)
from powerd.gpu.errors import GpuError
from powerd.gpu.wrapped import WrappedGpu

log = logging.getLogger("powerd.gpu")

SOFTWARE_FLOOR_RANGE = SmoothingRange(0.0, 100.0, SMOOTHING_MAX_PRESETS)


def _default_preset(preset: int) -> SmoothingProfile:
    """What a software preset holds before anyone writes it: off, no floor, no limit."""
    return SmoothingProfile(preset, False, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class FillTarget:
    """What the job needs to hold one GPU up (module docstring): W, W/s, s."""

    power_w: float  # the draw as sampled
    cap_w: float  # the enforced cap: no busy work draws more
    floor_w: float  # to hold while the job runs; never above the enforced cap
    ramp_up_w_per_s: float  # how fast busy work may raise the draw while the job starts
    ramp_down_w_per_s: float
    hysteresis_s: float


class SoftwareSmoothing(WrappedGpu):
    """A GPU without hardware smoothing, with smoothing carried out by its job."""

    mechanism = "software"

    def __init__(self, gpu: Gpu) -> None:
        if gpu.supports_smoothing():
            raise ValueError(f"GPU {gpu.index} has hardware power smoothing: use it")
        super().__init__(gpu)
        self._presets = [_default_preset(p) for p in range(SMOOTHING_MAX_PRESETS)]
        self._active = 0
        self._on = False

    # -- smoothing, in software ---------------------------------------------------------

    def supports_smoothing(self) -> bool:
        return True

    def smoothing_range(self) -> SmoothingRange:
        return SOFTWARE_FLOOR_RANGE

    def smoothing(self, preset: int | None = None) -> SmoothingProfile | None:
        which = self._active if preset is None else preset
        values = self._presets[which]
        return SmoothingProfile(
            which,
            self._on,
            values.floor_percent,
            values.ramp_up_w_per_s,
            values.ramp_down_w_per_s,
            values.ramp_down_hysteresis_ms,
        )

    def _write_smoothing(self, profile: SmoothingProfile, *, activate: bool = True) -> None:
        self._presets[profile.preset] = profile
        if activate:
            self._active, self._on = profile.preset, profile.enabled

    # the shared save, write and read-back of ``Gpu``, on the presets above (not the inner
    # GPU's, which has none)
    set_smoothing = Gpu.set_smoothing
    restore_smoothing = Gpu.restore_smoothing

    def restore_defaults(self) -> None:
        """The wrapped GPU's restore (caps, clocks, module limit), then this smoothing's:
        both attempted, the first failure raised."""
        attempt_all(self.inner.restore_defaults, self.restore_smoothing)

    def fill_target(self, power_w: float, cap_w: float) -> FillTarget | None:
        """What the job needs to hold this GPU up (module docstring); None while smoothing
        is off or the profile limits nothing (no ramp-down rate and no floor)."""
        profile = self.smoothing()
        if profile is None or not profile.enabled:
            return None
        if profile.ramp_down_w_per_s <= 0 and profile.floor_percent <= 0:
            return None
        return FillTarget(
            power_w=max(0.0, power_w),
            cap_w=max(0.0, cap_w),
            floor_w=min(profile.floor_w(cap_w), cap_w),
            ramp_up_w_per_s=profile.ramp_up_w_per_s,
            ramp_down_w_per_s=profile.ramp_down_w_per_s,
            hysteresis_s=profile.ramp_down_hysteresis_ms / 1000.0,
        )


def with_software_smoothing(gpus: Sequence[Gpu]) -> list[Gpu]:
    """Each GPU that lacks hardware smoothing wrapped in ``SoftwareSmoothing``; the others
    as they are (hardware first: it needs no help from the job)."""
    out: list[Gpu] = []
    for gpu in gpus:
        try:
            hardware = gpu.supports_smoothing()
        except GpuError as exc:  # cannot tell: leave it alone rather than guess
            log.warning(
                "gpu %d: no software smoothing: cannot tell if it has hardware: %s", gpu.index, exc
            )
            hardware = True
        out.append(gpu if hardware else SoftwareSmoothing(gpu))
    return out
