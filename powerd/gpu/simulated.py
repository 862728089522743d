"""A simulated GPU for demos and tests, behaving like NVML.

Power and throughput follow ``powerd.gpu.workload_model`` with curves fitted on
the Zeus power-limit sweeps (``powerd/data/workload_curves.json``), scaled to
the simulated GPU's maximum power limit. Under a clock lock they follow the
model's measured clock table instead (``powerd/data/clocks/``, the one the
budgets file's ``comm_max_slowdown`` picks the controller's clock from; see
``workload_model.table_operating_point``); a model without one (H200, A40,
V100, P100) keeps the parametric clock response. What the GPU is doing is set from
outside: ``set_phase`` (the protocol's job phases) and ``set_workload``.

Like NVML, setters reject values outside the device's ranges with
``GpuValueError`` and change nothing; the power limit reads back in whole
milliwatts; the enforced limit is the lower of ours and an out-of-band one
(``set_external_limit_w``). ``inject_error`` and ``lose`` fail calls the way a
driver does.

Time comes from the injected ``clock``: the state is advanced on every call,
energy integrates the piecewise-constant power exactly, and the temperature
follows the power with a first-order lag, so tests need no sleeps.

Models with ``has_power_smoothing`` (GB200) offer hardware power smoothing with
``SMOOTHING_PRESETS`` presets. While it is on, the draw changes only as time
passes (at the calls that advance it), by at most the active preset's ramp
rates times the time elapsed; it starts falling only once it has wanted to fall
for the ramp-down hysteresis; and while a job runs (a phase with load) it is
held at or above the floor, ``floor_percent`` of the enforced cap. A lower cap
still bites at once: the cap is a hard limit, smoothing never draws above it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import random
import re
import threading
import time
import uuid as uuid_lib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal, ParamSpec, TypeVar

import numpy as np

from policies.smoothing import GpuRamps, ramp_toward
from powerd.gpu.base import (
    SMOOTHING_MAX_PRESETS,
    ClockRange,
    Gpu,
    PowerLimitRange,
    PowerReading,
    SmoothingProfile,
    SmoothingRange,
)
from powerd.gpu.clock_table import ClockTable, shipped_clock_table
from powerd.gpu.errors import GpuError, GpuLostError, GpuValueError
from powerd.gpu.models import GPU_MODELS, GpuModel, gpu_model
from powerd.gpu.workload_model import (
    Device,
    OperatingPoint,
    WorkloadCurve,
    operating_point,
    table_operating_point,
)
from powerd.vocabulary import PHASES

CURVES_RESOURCE = "data/workload_curves.json"
MAX_GPUS = 64

# Representative workloads by role; the names they stand for are fitted curves.
WORKLOAD_ALIASES: dict[str, str] = {
    # BERT fine-tuning on SQuAD (V100): a transformer that draws ~90 % of the max
    # limit unconstrained and slows down below ~85 % of it.
    "llm-train": "v100/squad/bert_base_uncased/bs32/adamw",
    "vision-train": "v100/imagenet/resnet50/bs256/adadelta",
    # Input-bound recommender: low power, insensitive to caps.
    "recsys-train": "a40/movielens-1m/ncf/bs1024/adam",
}
DEFAULT_WORKLOAD = "llm-train"


@dataclass(frozen=True, slots=True)
class PhaseProfile:
    """How a job phase uses the GPU."""

    load: float  # share of the workload's power above idle drawn (workload_model ``load``)
    util_pct: float
    progress: bool  # whether the phase does training work (throughput_rel > 0)


PHASE_PROFILES: dict[str, PhaseProfile] = {
    "startup": PhaseProfile(load=0.05, util_pct=3.0, progress=False),
    "compute": PhaseProfile(load=1.0, util_pct=98.0, progress=True),
    # GPUs wait on collectives: kernels poll, the SMs mostly stall.
    "communication": PhaseProfile(load=0.2, util_pct=30.0, progress=False),
    "checkpoint": PhaseProfile(load=0.05, util_pct=5.0, progress=False),
    "eval": PhaseProfile(load=0.85, util_pct=90.0, progress=True),
    "idle": PhaseProfile(load=0.0, util_pct=0.0, progress=False),
    "shutdown": PhaseProfile(load=0.0, util_pct=0.0, progress=False),
}
assert set(PHASE_PROFILES) == set(PHASES), "PHASE_PROFILES must cover the protocol's phases"

NOISE_SIGMA = 0.005  # relative standard deviation of the power reading
NOISE_LIMIT = 0.015  # the noise is clipped to +-1.5 %
AMBIENT_C = 30.0
TEMP_RISE_AT_MAX_C = 55.0  # steady-state rise over ambient at the max power limit
TEMP_TAU_S = 20.0  # thermal time constant

# Hardware power smoothing on models that have it. Assumed figures (NVML reports the
# real ones per device; docs/POWER_SMOOTHING.md): floors of 0-90 % of the power
# ceiling, NVML's maximum of 5 presets, each starting with no floor and 1000 W/s ramps.
SMOOTHING_FLOOR_MIN_PERCENT = 0.0
SMOOTHING_FLOOR_MAX_PERCENT = 90.0
SMOOTHING_PRESETS = SMOOTHING_MAX_PRESETS
SMOOTHING_DEFAULT_RAMP_W_PER_S = 1000.0


def default_smoothing_preset(preset: int) -> SmoothingProfile:
    """What a simulated (and fake NVML) preset holds before anyone writes it."""
    return SmoothingProfile(
        preset=preset,
        enabled=False,
        floor_percent=0.0,
        ramp_up_w_per_s=SMOOTHING_DEFAULT_RAMP_W_PER_S,
        ramp_down_w_per_s=SMOOTHING_DEFAULT_RAMP_W_PER_S,
        ramp_down_hysteresis_ms=0.0,
    )


# The calls of the ``Gpu`` interface: what ``inject_error`` and ``lose`` affect.
NVML_METHODS: frozenset[str] = frozenset(
    {
        "power_limit_range",
        "sm_clock_range",
        "power_reading",
        "power_w",
        "energy_j",
        "power_limit_w",
        "enforced_cap_w",
        "sm_clock_mhz",
        "locked_max_sm_clock_mhz",
        "util_pct",
        "temp_c",
        "set_power_limit_w",
        "lock_max_sm_clock_mhz",
        "unlock_sm_clock",
        "supports_smoothing",
        "smoothing_range",
        "smoothing",
        "set_smoothing",
        "restore_smoothing",
    }
)


@functools.cache
def _curves_document() -> dict[str, Any]:
    text = resources.files("powerd").joinpath(CURVES_RESOURCE).read_text(encoding="utf-8")
    document: dict[str, Any] = json.loads(text)
    return document


@functools.cache
def load_curves() -> dict[str, WorkloadCurve]:
    """Every named curve: the fitted ones and the aliases."""
    fitted = {
        name: WorkloadCurve.from_dict(entry["curve"])
        for name, entry in _curves_document()["workloads"].items()
    }
    return fitted | {alias: fitted[target] for alias, target in WORKLOAD_ALIASES.items()}


WORKLOAD_NAMES: tuple[str, ...] = (*WORKLOAD_ALIASES, *_curves_document()["workloads"])


def workload_curve(name: str) -> WorkloadCurve:
    """The curve of a workload name or alias; ValueError for an unknown one."""
    try:
        return load_curves()[name]
    except KeyError:
        raise ValueError(
            f"unknown workload {name!r}: use one of {', '.join(WORKLOAD_ALIASES)} "
            f"or a fitted curve such as {WORKLOAD_ALIASES[DEFAULT_WORKLOAD]!r} "
            "(see WORKLOAD_NAMES)"
        ) from None


def _check_phase(phase: str) -> PhaseProfile:
    try:
        return PHASE_PROFILES[phase]
    except (KeyError, TypeError):
        raise ValueError(f"unknown phase {phase!r}; phases: {', '.join(PHASES)}") from None


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _nvml_call(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A call of the ``Gpu`` interface: fails when lost or injected, else advances time."""
    name = method.__name__
    assert name in NVML_METHODS, name

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        self: SimulatedGpu = args[0]  # type: ignore[assignment]
        with self._lock:
            self._fail_if_needed(name)
            self._advance()
            return method(*args, **kwargs)

    return wrapper


class SimulatedGpu(Gpu):
    """One simulated GPU of ``model`` running a workload in a job phase."""

    def __init__(
        self,
        model: GpuModel | str = "H100",
        index: int = 0,
        *,
        clock: Callable[[], float] = time.monotonic,
        workload: str = DEFAULT_WORKLOAD,
        phase: str = "compute",
        seed: int = 0,
        uuid: str | None = None,
        clock_table: ClockTable | Literal["shipped"] | None = "shipped",
    ) -> None:
        """``clock_table``: how a clock lock acts; "shipped" is the model's shipped table
        (``shipped_clock_table``), None the parametric model alone."""
        self.model = gpu_model(model) if isinstance(model, str) else model
        self.clock_table = (
            shipped_clock_table(self.model.key) if clock_table == "shipped" else clock_table
        )
        self.index = index
        self.name = self.model.name
        self.uuid = uuid if uuid is not None else simulated_uuid(self.model.key, index, seed)
        self.device = Device.of(self.model)
        self._clock = clock
        self._lock = threading.RLock()
        self._rng = random.Random(f"powerd-sim/{seed}/{index}")
        self._phase = phase
        self._profile = _check_phase(phase)
        self._workload = workload
        self._curve = workload_curve(workload)
        self._limit_mw = round(self.model.cap_default_w * 1000)
        self._external_w: float | None = None
        self._lock_mhz: int | None = None
        self._lost = False
        self._faults: dict[str, list[list[Any]]] = {}
        self._noise = 0.0
        self._energy_j = 0.0
        self._t_last = clock()
        self._smoothing_on = False
        self._smoothing_active = 0
        self._smoothing_presets: list[SmoothingProfile] = (
            [default_smoothing_preset(i) for i in range(SMOOTHING_PRESETS)]
            if self.model.has_power_smoothing
            else []
        )
        self._falling_s = 0.0  # how long the draw has wanted to fall (smoothing)
        self._fill_w: float | None = None  # the job's busy work (software smoothing)
        self._fill_energy_j = 0.0  # drawn above what the phase alone draws
        self._point = self._operating_point()
        self._power = self._noisy_power()
        self._natural_w = self._power  # the draw without the job's busy work
        self._temp_c = self._temp_target(self._power)

    # --- the Gpu interface ------------------------------------------------

    @_nvml_call
    def power_limit_range(self) -> PowerLimitRange:
        m = self.model
        return PowerLimitRange(m.cap_min_w, m.cap_max_w, m.cap_default_w)

    @_nvml_call
    def sm_clock_range(self) -> ClockRange:
        return ClockRange(self.model.sm_clock_min_mhz, self.model.sm_clock_max_mhz)

    @_nvml_call
    def power_reading(self) -> PowerReading:
        return PowerReading.SIMULATED

    @_nvml_call
    def power_w(self) -> float:
        return self._power

    @_nvml_call
    def energy_j(self) -> float | None:
        return self._energy_j if self.model.has_energy_counter else None

    @_nvml_call
    def power_limit_w(self) -> float:
        return self._limit_mw / 1000

    @_nvml_call
    def enforced_cap_w(self) -> float:
        return self._enforced_w()

    @_nvml_call
    def sm_clock_mhz(self) -> int:
        if self._profile.load == 0.0:
            return self.model.sm_clock_min_mhz  # idle: the clock drops to its floor
        return ClockRange(self.model.sm_clock_min_mhz, self.model.sm_clock_max_mhz).clamp(
            self._point.clock_mhz
        )

    @_nvml_call
    def locked_max_sm_clock_mhz(self) -> int | None:
        return self._lock_mhz

    @_nvml_call
    def util_pct(self) -> float:
        return self._profile.util_pct

    @_nvml_call
    def temp_c(self) -> float:
        return self._temp_c

    @_nvml_call
    def set_power_limit_w(self, cap_w: float) -> None:
        m = self.model
        if not (isinstance(cap_w, int | float) and math.isfinite(cap_w)):
            raise GpuValueError(f"GPU {self.index}: power limit {cap_w!r} is not a number")
        milliwatts = round(cap_w * 1000)
        if not round(m.cap_min_w * 1000) <= milliwatts <= round(m.cap_max_w * 1000):
            raise GpuValueError(
                f"GPU {self.index} ({m.key}): power limit {cap_w:g} W is outside "
                f"[{m.cap_min_w:g}, {m.cap_max_w:g}] W; clamp it before setting"
            )
        self._limit_mw = milliwatts
        self._update()

    @_nvml_call
    def lock_max_sm_clock_mhz(self, max_mhz: int) -> None:
        m = self.model
        if isinstance(max_mhz, bool) or not isinstance(max_mhz, int | float):
            raise GpuValueError(f"GPU {self.index}: clock {max_mhz!r} is not a number")
        if not (math.isfinite(max_mhz) and max_mhz == int(max_mhz)):
            raise GpuValueError(f"GPU {self.index}: clock {max_mhz!r} is not a whole MHz")
        if not m.sm_clock_min_mhz <= max_mhz <= m.sm_clock_max_mhz:
            raise GpuValueError(
                f"GPU {self.index} ({m.key}): SM clock {max_mhz:g} MHz is outside "
                f"[{m.sm_clock_min_mhz}, {m.sm_clock_max_mhz}] MHz; clamp it before locking"
            )
        self._lock_mhz = int(max_mhz)
        self._update()

    @_nvml_call
    def unlock_sm_clock(self) -> None:
        self._lock_mhz = None
        self._update()

    @_nvml_call
    def supports_smoothing(self) -> bool:
        return self.model.has_power_smoothing

    @_nvml_call
    def smoothing_range(self) -> SmoothingRange:
        if not self.model.has_power_smoothing:
            raise self._smoothing_unsupported()
        return SmoothingRange(
            SMOOTHING_FLOOR_MIN_PERCENT, SMOOTHING_FLOOR_MAX_PERCENT, SMOOTHING_PRESETS
        )

    @_nvml_call
    def smoothing(self, preset: int | None = None) -> SmoothingProfile | None:
        if not self.model.has_power_smoothing:
            return None
        which = self._smoothing_active if preset is None else preset
        if (
            isinstance(which, bool)
            or not isinstance(which, int)
            or not 0 <= which < SMOOTHING_PRESETS
        ):
            raise GpuValueError(
                f"GPU {self.index} ({self.model.key}): smoothing preset must be "
                f"0-{SMOOTHING_PRESETS - 1}, got {preset!r}"
            )
        return dataclasses.replace(self._smoothing_presets[which], enabled=self._smoothing_on)

    @_nvml_call
    def set_smoothing(self, profile: SmoothingProfile) -> SmoothingProfile:
        return super().set_smoothing(profile)  # under the lock, failing like a call

    @_nvml_call
    def restore_smoothing(self) -> None:
        super().restore_smoothing()

    def _write_smoothing(self, profile: SmoothingProfile, *, activate: bool = True) -> None:
        # Called by set_smoothing and restore_smoothing, with the lock held.
        if not self.model.has_power_smoothing:
            raise self._smoothing_unsupported()
        problems = SmoothingRange(
            SMOOTHING_FLOOR_MIN_PERCENT, SMOOTHING_FLOOR_MAX_PERCENT, SMOOTHING_PRESETS
        ).problems(profile)
        if problems:  # what NVML answers with INVALID_ARGUMENT
            raise GpuValueError(f"GPU {self.index} ({self.model.key}): {'; '.join(problems)}")
        self._smoothing_presets[profile.preset] = dataclasses.replace(profile, enabled=False)
        if activate:
            self._smoothing_active = profile.preset
            self._smoothing_on = profile.enabled
        self._falling_s = 0.0
        self._update()

    # --- what the job does (not NVML: work even on a lost GPU) --------------

    @property
    def phase(self) -> str:
        return self._phase

    def set_phase(self, phase: str) -> None:
        """Switch to a protocol job phase; ValueError for an unknown one."""
        profile = _check_phase(phase)
        with self._lock:
            self._advance()
            self._phase, self._profile = phase, profile
            self._update()

    @property
    def workload(self) -> str:
        return self._workload

    @property
    def curve(self) -> WorkloadCurve:
        return self._curve

    def set_workload(self, name: str) -> None:
        """Run another named workload (see ``WORKLOAD_NAMES``); ValueError for an unknown one."""
        curve = workload_curve(name)
        with self._lock:
            self._advance()
            self._workload, self._curve = name, curve
            self._update()

    def throughput_rel(self) -> float:
        """Training throughput relative to the same phase unconstrained, in [0, 1].

        Unconstrained is the device's max power limit with no clock lock and no
        external limit; in compute that is the workload's full speed. Phases that
        make no training progress (startup, communication, checkpoint, idle,
        shutdown) and a lost GPU give 0.
        """
        with self._lock:
            if self._lost or not self._profile.progress:
                return 0.0
            self._advance()
            best = operating_point(
                self._curve, self.device, self.model.cap_max_w, None, self._profile.load
            )
            return min(self._point.speed / best.speed, 1.0) if best.speed > 0 else 0.0

    def demand_w(self) -> float:
        """What the current phase would draw at the max power limit, under the clock lock."""
        with self._lock:
            return table_operating_point(
                self._curve,
                self.device,
                self.clock_table,
                self.model.cap_max_w,
                self._lock_mhz,
                self._profile.load,
            ).power_w

    def set_fill_w(self, fill_w: float | None) -> None:
        """The job keeps the GPU busy so that it draws at least ``fill_w`` (never above the
        enforced cap): software power smoothing (powerd.gpu.software_smoothing). None stops.
        Not NVML: the job's own kernels, so it works even on a lost GPU's job."""
        if fill_w is not None and not (math.isfinite(fill_w) and fill_w >= 0):
            raise ValueError(f"fill_w must be a finite number of watts ≥ 0 or None, not {fill_w!r}")
        with self._lock:
            self._advance()
            self._fill_w = None if fill_w is None else float(fill_w)
            self._update()

    @property
    def fill_w(self) -> float | None:
        return self._fill_w

    def fill_energy_j(self) -> float:
        """Energy drawn above what the phase alone would have drawn: what holding a floor
        or a ramp-down costs, by the job's busy work or the hardware's smoothing."""
        with self._lock:
            self._advance()
            return self._fill_energy_j

    def _filled(self, natural_w: float) -> float:
        if self._fill_w is None:
            return natural_w
        return max(natural_w, min(self._fill_w, self._enforced_w()))

    # --- out-of-band limits and faults ------------------------------------

    @property
    def external_limit_w(self) -> float | None:
        return self._external_w

    def set_external_limit_w(self, limit_w: float | None) -> None:
        """Emulate an out-of-band limiter (BMC, power brake); None removes it.

        The enforced cap becomes the lower of it and the power limit. A limit
        below the GPU's idle power cannot be honoured and raises ValueError.
        """
        if limit_w is not None and not (
            math.isfinite(limit_w) and limit_w >= self.model.idle_power_w
        ):
            raise ValueError(
                f"external limit {limit_w!r} W must be finite and at least the idle power "
                f"{self.model.idle_power_w:g} W"
            )
        with self._lock:
            self._advance()
            self._external_w = None if limit_w is None else float(limit_w)
            self._update()

    def inject_error(self, method_name: str, exc: GpuError, times: int | None = 1) -> None:
        """Make the next ``times`` calls of ``method_name`` raise ``exc`` (None: every call).

        The failing calls change nothing. Injections for one method queue up.
        """
        if method_name not in NVML_METHODS:
            raise ValueError(
                f"{method_name!r} is not a Gpu call; one of {', '.join(sorted(NVML_METHODS))}"
            )
        if not isinstance(exc, GpuError):
            raise TypeError(f"inject a GpuError, not {type(exc).__name__}")
        if times is not None and times < 1:
            raise ValueError(f"times must be >= 1 or None, got {times}")
        with self._lock:
            self._faults.setdefault(method_name, []).append([exc, times])

    def clear_errors(self) -> None:
        """Remove every injected error (a lost GPU stays lost)."""
        with self._lock:
            self._faults.clear()

    def lose(self) -> None:
        """The GPU falls off the bus: every ``Gpu`` call raises GpuLostError from now on."""
        with self._lock:
            self._advance()
            self._lost = True

    @property
    def lost(self) -> bool:
        return self._lost

    # --- the simulation ---------------------------------------------------

    def _fail_if_needed(self, name: str) -> None:
        if self._lost:
            raise GpuLostError(
                f"GPU {self.index} ({self.uuid}) is lost (fell off the bus); "
                "drain the node and reset or replace the GPU"
            )
        queue = self._faults.get(name)
        if queue:
            exc, times = queue[0]
            if times is not None:
                queue[0][1] = times - 1
                if times == 1:
                    queue.pop(0)
            raise exc

    def _enforced_w(self) -> float:
        cap = self._limit_mw / 1000
        return cap if self._external_w is None else min(cap, self._external_w)

    def _operating_point(self) -> OperatingPoint:
        return table_operating_point(
            self._curve,
            self.device,
            self.clock_table,
            self._enforced_w(),
            self._lock_mhz,
            self._profile.load,
        )

    def _noisy_power(self) -> float:
        return min(max(self._point.power_w * (1.0 + self._noise), 0.0), self._enforced_w())

    def _temp_target(self, power_w: float) -> float:
        return AMBIENT_C + TEMP_RISE_AT_MAX_C * power_w / self.model.cap_max_w

    def _active_smoothing(self) -> SmoothingProfile | None:
        """The active preset while smoothing is on, else None."""
        return self._smoothing_presets[self._smoothing_active] if self._smoothing_on else None

    def _smoothing_target(self, smoothing: SmoothingProfile) -> float:
        """What the draw heads for: the noisy operating point, raised to the floor while a
        job runs. Never above the enforced cap: the floor is a share of it."""
        power = self._noisy_power()
        if self._profile.load > 0.0:
            power = max(power, smoothing.floor_w(self._enforced_w()))
        return min(power, self._enforced_w())

    def _ramped(self, smoothing: SmoothingProfile, target: float, t0: float, t1: float) -> float:
        """The draw at ``t1``, moved from the draw at ``t0`` towards ``target`` (the floor
        applied) by the one ramp rule, ``policies.smoothing.ramp_toward``."""
        ramps = GpuRamps(
            up_w_per_s=smoothing.ramp_up_w_per_s,
            down_w_per_s=smoothing.ramp_down_w_per_s,
            floor_fraction=0.0,
            hysteresis_s=smoothing.ramp_down_hysteresis_ms / 1000.0,
        )
        power, falling_s = ramp_toward(
            np.array(self._power),
            np.array(target),
            np.array(self._enforced_w()),
            ramps,
            t1 - t0,
            np.array(self._falling_s),
        )
        self._falling_s = float(falling_s)
        return float(power)

    def _update(self) -> None:
        """Recompute the operating point after a change of state (time already advanced).

        With smoothing on the draw does not jump: it ramps as time passes (``_advance``),
        except that a lower enforced cap bites at once.
        """
        self._point = self._operating_point()
        if self._active_smoothing() is None:
            self._natural_w = self._noisy_power()
            self._power = self._filled(self._natural_w)
        else:
            self._power = min(self._power, self._enforced_w())
            self._natural_w = self._noisy_power()

    def _advance(self) -> None:
        """Bring energy and temperature up to now; the power was constant since the last call."""
        now = self._clock()
        dt = now - self._t_last
        if dt <= 0:
            return
        t0, self._t_last = self._t_last, now
        self._energy_j += self._power * dt
        self._fill_energy_j += max(0.0, self._power - self._natural_w) * dt
        target = self._temp_target(self._power)
        self._temp_c = target + (self._temp_c - target) * math.exp(-dt / TEMP_TAU_S)
        self._noise = max(-NOISE_LIMIT, min(NOISE_LIMIT, self._rng.gauss(0.0, NOISE_SIGMA)))
        smoothing = self._active_smoothing()
        if smoothing is None:
            self._natural_w = self._noisy_power()
            self._power = self._filled(self._natural_w)
        else:
            self._power = self._ramped(smoothing, self._smoothing_target(smoothing), t0, now)
            self._natural_w = self._noisy_power()

    def __repr__(self) -> str:
        return (
            f"SimulatedGpu({self.model.key!r}, index={self.index}, workload={self._workload!r}, "
            f"phase={self._phase!r})"
        )


def simulated_uuid(model_key: str, index: int, seed: int = 0) -> str:
    """A stable NVML-style UUID (``GPU-xxxxxxxx-...``) for a simulated GPU."""
    digest = hashlib.sha256(f"powerd-sim/{model_key}/{seed}/{index}".encode()).digest()
    return f"GPU-{uuid_lib.UUID(bytes=digest[:16])}"


_SPEC_RE = re.compile(r"^\s*(?:(\d+)\s*[xX×*]\s*)?([A-Za-z][A-Za-z0-9]*)\s*$")


def parse_spec(spec: str) -> tuple[int, GpuModel]:
    """``"4xH100"`` -> (4, H100); ``"H100"`` is one GPU. ValueError with the reason."""
    match = _SPEC_RE.match(spec) if isinstance(spec, str) else None
    if match is None:
        raise ValueError(
            f"bad GPU spec {spec!r}: expected COUNTxMODEL such as '4xH100' or a bare MODEL; "
            f"models: {', '.join(GPU_MODELS)}"
        )
    count = int(match.group(1)) if match.group(1) is not None else 1
    if not 1 <= count <= MAX_GPUS:
        raise ValueError(f"bad GPU spec {spec!r}: count must be 1 to {MAX_GPUS}, got {count}")
    try:
        model = gpu_model(match.group(2))
    except KeyError:
        raise ValueError(
            f"bad GPU spec {spec!r}: unknown model {match.group(2)!r}; "
            f"models: {', '.join(GPU_MODELS)}"
        ) from None
    return count, model


def open_simulated(
    spec: str,
    clock: Callable[[], float] = time.monotonic,
    workload: str = DEFAULT_WORKLOAD,
    seed: int = 0,
    *,
    phase: str = "compute",
) -> list[SimulatedGpu]:
    """Simulated GPUs for a spec like ``"8xGB200"``, indexed from 0, sharing ``clock``.

    Each GPU has its own noise stream and UUID, derived from ``seed`` and its index:
    give simulated nodes different seeds to tell their GPUs apart.
    """
    count, model = parse_spec(spec)
    workload_curve(workload)
    _check_phase(phase)
    return [
        SimulatedGpu(model, i, clock=clock, workload=workload, phase=phase, seed=seed)
        for i in range(count)
    ]
