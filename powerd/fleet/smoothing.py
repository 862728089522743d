"""Hardware power smoothing on the fleet simulator's GPUs, as the simulated GPU offers it.

On the models that have it (GB200): ``SMOOTHING_PRESETS`` presets a GPU, one active,
and the switch. A command's profile is taken as ``powerd.agent.controls.set_smoothing``
and ``powerd.gpu.simulated`` take it (the floor clamped into the device's range, the
preset written and activated, the switch set); while the switch is on the draw moves by
the one ramp rule, ``policies.smoothing.ramp_toward``. Per-GPU state is kept in lists
(the fleet's hot loop reads them): index ``g`` is the fleet's GPU number.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from policies.smoothing import GpuRamps, ramp_toward
from powerd.agent import rules
from powerd.agent.controls import profile_of
from powerd.gpu.base import SmoothingProfile, SmoothingRange
from powerd.gpu.errors import GpuValueError
from powerd.gpu.simulated import (
    SMOOTHING_FLOOR_MAX_PERCENT,
    SMOOTHING_FLOOR_MIN_PERCENT,
    SMOOTHING_PRESETS,
    default_smoothing_preset,
)
from powerd.protocol import GpuSmoothing

SMOOTHING_RANGE = SmoothingRange(
    SMOOTHING_FLOOR_MIN_PERCENT, SMOOTHING_FLOOR_MAX_PERCENT, SMOOTHING_PRESETS
)


class FleetSmoothing:
    """Every fleet GPU's smoothing presets, switch and ramp state."""

    def __init__(self, has: list[bool]) -> None:
        """``has``: per GPU, whether its model has power smoothing."""
        n_gpus = len(has)
        # presets are tuples shared until a GPU's are written; None: a GPU without smoothing
        fresh = tuple(default_smoothing_preset(i) for i in range(SMOOTHING_PRESETS))
        self.presets: list[tuple[SmoothingProfile, ...] | None] = [
            fresh if h else None for h in has
        ]
        self.active_preset: list[int] = [0] * n_gpus
        self.falling_s: list[float] = [0.0] * n_gpus  # how long each has wanted to fall
        # per GPU: the active profile's ramps while the switch is on, None while it is off;
        # equal ramps are one object (so a node's GPUs ramp in one call)
        self.ramps: list[GpuRamps | None] = [None] * n_gpus
        self.on = 0  # GPUs with the switch on
        self._ramps_of: dict[GpuRamps, GpuRamps] = {}
        self._json: dict[tuple[bool, int, float], str] = {}
        # telemetry's state of each GPU that has smoothing, as the JSON member carrying it
        self.state: list[str | None] = [
            None if p is None else self._state_json(False, 0, p[0].floor_percent)
            for p in self.presets
        ]
        # what each GPU's telemetry last carried, and how many samples ago (an agent sends a
        # state when it changes and every SMOOTHING_STATE_EVERY_SAMPLES samples)
        self.sent: list[str | None] = [None] * n_gpus
        self.since: list[int] = [0] * n_gpus
        self.gpus = sum(has)

    def new_leader(self) -> None:
        """A new controller epoch: every state goes out on the next sample."""
        self.sent = [None] * len(self.sent)

    def active(self, g: int) -> SmoothingProfile | None:
        """What the agent's ``Gpu.smoothing()`` reads back: the active preset, with the switch;
        None on a GPU without smoothing."""
        presets = self.presets[g]
        if presets is None:
            return None
        active = presets[self.active_preset[g]]  # written with the switch off
        return active if self.ramps[g] is None else _with_switch(active, True)

    def set(self, g: int, index: int, model: str, wire: GpuSmoothing, errors: list[str]) -> bool:
        """A command's profile for GPU ``g`` (``index`` on its node, of ``model``); what went
        wrong is appended to ``errors``. Returns whether the floor was clamped."""
        presets = self.presets[g]
        if presets is None:
            errors.append(
                f"GPU {index}: power smoothing not supported on this GPU: "
                f"{model} has no power smoothing"
            )
            return False
        try:
            wanted = profile_of(wire)
        except GpuValueError as exc:
            errors.append(f"GPU {index}: power smoothing: {exc}")
            return False
        problems = SMOOTHING_RANGE.problems(SMOOTHING_RANGE.clamp(wanted))
        if problems:  # a preset beyond the device's: refused, nothing written
            errors.append(f"GPU {index}: power smoothing: {'; '.join(problems)}")
            return False
        active = self.active(g)
        assert active is not None  # the GPU has presets
        target, clamped = rules.smoothing_to_write(active, wanted, SMOOTHING_RANGE)
        if target is not None:
            written = _with_switch(target, False)
            self.presets[g] = (*presets[: target.preset], written, *presets[target.preset + 1 :])
            self.active_preset[g] = target.preset
            self.falling_s[g] = 0.0
            self.on -= self.ramps[g] is not None
            self.ramps[g] = self._ramps(target) if target.enabled else None
            self.on += self.ramps[g] is not None
            self.state[g] = self._state_json(target.enabled, target.preset, target.floor_percent)
        return clamped

    def ramp(
        self,
        starts: list[int],
        drawn: list[list[float]],
        cap_w: list[float],
        was_w: list[float],
        dt_s: float,
    ) -> None:
        """Move the draw of the GPUs with the switch on over ``dt_s``, in place in ``drawn``:
        ``drawn[k]`` holds what GPUs ``starts[k]``, ``starts[k] + 1`` ... would draw (their
        natural draw under their caps). From what they drew (``was_w``) towards that, raised
        to the floor (every fleet GPU runs a job); GPUs with equal ramps in one call."""
        groups: dict[GpuRamps, list[tuple[int, int, int]]] = {}  # (gpu, node k, gpu on node)
        ramps_of = self.ramps
        for k, (start, values) in enumerate(zip(starts, drawn, strict=True)):
            for i in range(len(values)):
                ramps = ramps_of[start + i]
                if ramps is not None:
                    groups.setdefault(ramps, []).append((start + i, k, i))
        for ramps, members in groups.items():
            caps = np.array([cap_w[g] for g, _, _ in members])
            natural = np.array([drawn[k][i] for _, k, i in members])
            target = np.maximum(natural, caps * ramps.floor_fraction)
            was = np.array([was_w[g] for g, _, _ in members])
            falling = np.array([self.falling_s[g] for g, _, _ in members])
            moved, falling = ramp_toward(was, target, caps, ramps, dt_s, falling)
            for (g, k, i), power, fell in zip(
                members, moved.tolist(), falling.tolist(), strict=True
            ):
                drawn[k][i] = power
                self.falling_s[g] = fell

    def _ramps(self, profile: SmoothingProfile) -> GpuRamps:
        ramps = GpuRamps(
            up_w_per_s=profile.ramp_up_w_per_s,
            down_w_per_s=profile.ramp_down_w_per_s,
            floor_fraction=profile.floor_percent / 100.0,
            hysteresis_s=profile.ramp_down_hysteresis_ms / 1000.0,
        )
        return self._ramps_of.setdefault(ramps, ramps)

    def _state_json(self, enabled: bool, preset: int, floor_percent: float) -> str:
        """Telemetry's ``smoothing`` (switch, active preset, floor) as the JSON member that
        carries it; one string for each distinct state, shared by every GPU in it."""
        key = (enabled, preset, floor_percent)
        state = self._json.get(key)
        if state is None:
            state = self._json[key] = (
                ',"smoothing":{"enabled":%s,"preset":%d,"floor_percent":%s}'  # noqa: UP031
                % ("true" if enabled else "false", preset, repr(float(floor_percent)))
            )
        return state


def _with_switch(profile: SmoothingProfile, enabled: bool) -> SmoothingProfile:
    return dataclasses.replace(profile, enabled=enabled)
