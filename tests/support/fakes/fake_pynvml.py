"""A stateful fake of the pynvml API, built from ``GpuModel`` descriptions.

    fake = FakeNvml([gpu_model("H100"), gpu_model("A100")])
    gpus = open_nvml(fake)            # the fake object is usable as the ``nvml`` module
    fake.set_demand(0, 650.0)         # the workload wants 650 W on GPU 0
    fake.advance(2.0)                 # two seconds pass: energy accumulates
    fake.inject("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_GPU_IS_LOST, device=1)

It behaves like NVML where the backend depends on it:

* errors are the REAL ``pynvml.NVMLError`` subclasses (``pynvml.NVMLError(code)``),
  and the constants, ctypes structures (``c_nvmlFieldValue_t``, ``c_nvmlUtilization_t``)
  and ``NVMLError*`` classes are the real module's (attribute access falls through);
* every call except ``nvmlInit`` raises NVML_ERROR_UNINITIALIZED before ``nvmlInit``
  or after the matching ``nvmlShutdown`` (init is reference-counted, as in pynvml);
* units are NVML's: mW, mJ, MHz, and integer arguments go through ``ctypes.c_uint``
  like pynvml's, so a float power limit raises ``TypeError`` as the real binding does;
* setters feed getters: ``SetPowerManagementLimit`` -> ``GetPowerManagementLimit`` and
  ``GetEnforcedPowerLimit``; ``set_external_limit`` adds an out-of-band limiter, and
  the enforced limit is the minimum of both;
* ``enforce_delay_s``: a new power limit reads back at once from
  ``GetPowerManagementLimit`` but is enforced (``GetEnforcedPowerLimit`` and the draw)
  only that long after it was set, as on a real H200 (driver 580: up to 92 ms, bench/RESULTS.md
  "NVML on a real GPU"); 0 (the default) enforces it at once;
* ``limiter_lag_s``: when the workload's demand steps up, the limiter lets it through
  whole for that long before it clips the draw to the enforced limit, as on a real H200
  (~0.1 s: 648 W under a 476 W limit, 911 W under 700 W; bench/RESULTS.md, "A load step
  under a power limit"); 0 (the default) clips at once;
* out-of-range power limits and clock locks (min > max, or outside the supported
  clocks) raise NVML_ERROR_INVALID_ARGUMENT and change nothing; a bad device index
  raises NVML_ERROR_INVALID_ARGUMENT;
* ``require_root = True`` makes every setter raise NVML_ERROR_NO_PERMISSION;
* models without instant power answer ``nvmlDeviceGetFieldValues`` with a per-field
  ``nvmlReturn`` of NOT_SUPPORTED (the call itself succeeds, as in NVML); models
  without an energy counter raise NOT_SUPPORTED from GetTotalEnergyConsumption;
* power draw is the settable demand clipped by the enforced limit; the SM clock
  drops when the limit bites and never exceeds a clock lock; energy integrates
  the draw over time (an injected ``clock`` callable, plus ``advance(seconds)``);
* ``inject(call, code, times=1 | None, device=i | None)`` makes the next ``times``
  matching calls fail (None: forever); NVML_ERROR_GPU_IS_LOST injected on a device
  loses it: from then on every call on its handle fails with GPU_IS_LOST
  (``lose_gpu(i)`` does the same at once); ``set_field_return(i, field_id, code)``
  makes one field of ``nvmlDeviceGetFieldValues`` fail per field;
* ``calls`` logs every API call as ``(name, device index or None)``;
* hardware power smoothing on models with ``has_power_smoothing`` (GB200): the three
  ``nvmlDevicePowerSmoothing*`` setters take a reference to the structure
  (``ctypes.byref`` or a pointer; a structure passed by value raises ``TypeError``, as
  pynvml would hand it to C as is), check its ``version`` (else
  NVML_ERROR_ARGUMENT_VERSION_MISMATCH), refuse out-of-range presets, parameters and
  values with NVML_ERROR_INVALID_ARGUMENT and change nothing, obey ``require_root``;
  models without it raise NVML_ERROR_NOT_SUPPORTED and answer every
  ``NVML_FI_PWR_SMOOTHING_*`` field with a per-field NOT_SUPPORTED. The state reads back
  through the fields (per-preset ones take the preset as ``scopeId``; ramp rates in mW/s,
  the hysteresis in ms, the floor in percent, applied ceiling and floor in W). While
  smoothing is on and the workload demands more than idle, the draw is held at or above
  the floor, ``floor %`` of the enforced limit (ramp rates are not modelled here; the
  simulator models them);
* a module-scope power limit on models listed in ``MODULE_LIMITS_W`` (GB200), held in
  ``FakeDevice.module`` (None: the device has none): ``NVML_FI_DEV_POWER_MIN/MAX/DEFAULT/
  CURRENT_LIMIT`` read at scopeId ``NVML_POWER_SCOPE_MODULE`` answer it in mW, and with a
  per-field NOT_SUPPORTED on devices without one. ``nvmlDeviceSetPowerManagementLimit_v2``
  has pynvml's signature and, like pynvml, DROPS the C return code: it raises only what
  pynvml itself raises (NVML_ERROR_UNINITIALIZED before ``nvmlInit``, an injected
  NVML_ERROR_FUNCTION_NOT_FOUND: a driver without the function; a float limit's
  ``TypeError``), and returns NVML_SUCCESS whatever the "driver" said. A refused write
  (``require_root``, out of range, no module scope, a structure version other than
  pynvml's, a lost GPU, any other injected code) leaves the limit unchanged: only the
  read-back shows it. At scope ``NVML_POWER_SCOPE_GPU`` it sets the GPU limit, as the v1
  setter does. The module limit does not change the draw (not modelled).

Simplifications: ``nvmlDeviceGetPowerUsage`` returns the current draw (no 1 s
averaging); temperature and utilisation follow the draw unless set explicitly.
Power smoothing figures the real NVML reports per device (floor range, preset count,
defaults) are the simulator's assumptions (``powerd.gpu.simulated``); only preset
parameters 0-3 (floor, ramp up, ramp down, hysteresis) are modelled, and the fields
powerd does not read (privilege level, admin overrides, ...) answer NOT_SUPPORTED.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

from powerd.gpu.base import SMOOTHING_MAX_HYSTERESIS_MS, SMOOTHING_MAX_RAMP_W_PER_S
from powerd.gpu.models import GpuModel
from powerd.gpu.simulated import (
    SMOOTHING_FLOOR_MAX_PERCENT,
    SMOOTHING_FLOOR_MIN_PERCENT,
    SMOOTHING_PRESETS,
    default_smoothing_preset,
)

# Memory clocks every fake device lists, highest first (as NVML lists them).
MEMORY_CLOCKS_MHZ: tuple[int, ...] = (2619, 1593, 405)
GRAPHICS_CLOCK_STEP_MHZ = 15

SETTERS = frozenset(
    {
        "nvmlDeviceSetPowerManagementLimit",
        "nvmlDeviceSetGpuLockedClocks",
        "nvmlDeviceResetGpuLockedClocks",
        "nvmlDevicePowerSmoothingActivatePresetProfile",
        "nvmlDevicePowerSmoothingUpdatePresetProfileParam",
        "nvmlDevicePowerSmoothingSetState",
        "nvmlDeviceSetPowerManagementLimit_v2",
    }
)

# Module-scope power limits (min, max, default) in W, by model key. Illustrative figures
# chosen for the tests (a GPU's default limit plus 150 W for its share of the rest of the
# module), not measured on a GB200: NVML reports each device's own.
MODULE_LIMITS_W: dict[str, tuple[float, float, float]] = {"GB200": (400.0, 1350.0, 1350.0)}
# What pynvml's v2 setter raises itself (before the C call); every other code is dropped.
_RAISED_BY_PYNVML_V2 = frozenset(
    {pynvml.NVML_ERROR_UNINITIALIZED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}
)

# Preset parameters modelled: paramId -> (lowest, highest) value; the floor's comes
# from the device (its min/max % TMP floor setting fields).
SMOOTHING_PARAM_LIMITS: dict[int, tuple[float, float]] = {
    pynvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_UP_RATE: (0.0, SMOOTHING_MAX_RAMP_W_PER_S),
    pynvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_DOWN_RATE: (0.0, SMOOTHING_MAX_RAMP_W_PER_S),
    pynvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_DOWN_HYSTERESIS: (
        0.0,
        SMOOTHING_MAX_HYSTERESIS_MS,
    ),
}
_FLOOR = pynvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_PERCENT_TMP_FLOOR

_VALUE_MEMBERS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: ("dVal", float),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: ("uiVal", int),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: ("ulVal", int),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: ("ullVal", int),
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: ("sllVal", int),
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: ("siVal", int),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: ("usVal", int),
}


@dataclass(slots=True)
class ModuleLimit:
    """A device's module-scope power limit, in mW (NVML's units)."""

    min_mw: int
    max_mw: int
    default_mw: int
    current_mw: int

    @classmethod
    def of_model(cls, model: GpuModel) -> ModuleLimit | None:
        """The limit a model's devices start with (at its default); None without one."""
        figures = MODULE_LIMITS_W.get(model.key)
        if figures is None:
            return None
        low, high, default = (round(w * 1000) for w in figures)
        return cls(low, high, default, default)


# NVML_FI_DEV_POWER_*_LIMIT -> the ModuleLimit attribute it reads at module scope.
_MODULE_LIMIT_FIELDS = {
    pynvml.NVML_FI_DEV_POWER_MIN_LIMIT: "min_mw",
    pynvml.NVML_FI_DEV_POWER_MAX_LIMIT: "max_mw",
    pynvml.NVML_FI_DEV_POWER_DEFAULT_LIMIT: "default_mw",
    pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT: "current_mw",
}


def nvml_error(code: int) -> pynvml.NVMLError:
    """The real pynvml exception for ``code`` (its subclass, e.g. NVMLError_NoPermission)."""
    return pynvml.NVMLError(code)


def _uint(value: Any) -> int:
    """Convert an argument the way pynvml's ``c_uint(...)`` does (TypeError for floats)."""
    return ctypes.c_uint(value).value


@dataclass(frozen=True, slots=True)
class FakeHandle:
    """What ``nvmlDeviceGetHandleByIndex`` returns: opaque to the backend."""

    owner_id: int
    index: int


@dataclass(slots=True)
class FakeDevice:
    """The state of one fake GPU; tests may read it (and set it, with care)."""

    index: int
    model: GpuModel
    uuid: str
    limit_mw: int
    demand_w: float
    external_limit_mw: int | None = None
    locked_clocks_mhz: tuple[int, int] | None = None
    energy_mj: float = 0.0
    lost: bool = False
    util_pct: int | None = None  # None: follows the demand
    temp_c: int | None = None  # None: follows the draw
    # Power smoothing (models with has_power_smoothing): one [floor %, ramp up W/s,
    # ramp down W/s, hysteresis ms] per preset, indexed by paramId 0-3.
    smoothing_presets: list[list[float]] = field(default_factory=list)
    smoothing_active: int = 0
    smoothing_enabled: bool = False
    smoothing_floor_range: tuple[float, float] = (
        SMOOTHING_FLOOR_MIN_PERCENT,
        SMOOTHING_FLOOR_MAX_PERCENT,
    )
    module: ModuleLimit | None = None  # the module-scope power limit; None: no module scope
    # the limit the device enforces (limit_mw once a set takes effect) and a set on its
    # way: (its limit, the fake time it takes effect); see FakeNvml's enforce_delay_s
    enforcing_mw: int = 0
    pending_limit: tuple[int, float] | None = None
    # a demand step the limiter has not caught yet: the fake time it clips again
    unclipped_until: float | None = None

    def __post_init__(self) -> None:
        self.enforcing_mw = self.enforcing_mw or self.limit_mw

    @property
    def min_limit_mw(self) -> int:
        return round(self.model.cap_min_w * 1000)

    @property
    def max_limit_mw(self) -> int:
        return round(self.model.cap_max_w * 1000)

    @property
    def default_limit_mw(self) -> int:
        return round(self.model.cap_default_w * 1000)

    @property
    def enforced_limit_mw(self) -> int:
        if self.external_limit_mw is None:
            return self.enforcing_mw
        return min(self.enforcing_mw, self.external_limit_mw)

    @property
    def applied_ceiling_w(self) -> float:
        """NVML_FI_PWR_SMOOTHING_APPLIED_TMP_CEIL: taken to be the enforced limit."""
        return self.enforced_limit_mw / 1000

    @property
    def applied_floor_w(self) -> float:
        """NVML_FI_PWR_SMOOTHING_APPLIED_TMP_FLOOR: ceiling x floor % while smoothing is on."""
        if not self.smoothing_enabled:
            return 0.0
        floor_percent = self.smoothing_presets[self.smoothing_active][_FLOOR]
        return self.applied_ceiling_w * floor_percent / 100

    @property
    def draw_w(self) -> float:
        if self.unclipped_until is not None:  # a load step, before the limiter acts
            return max(0.0, self.demand_w)
        draw = max(0.0, min(self.demand_w, self.enforced_limit_mw / 1000))
        if self.smoothing_enabled and self.demand_w > self.model.idle_power_w:
            draw = max(draw, self.applied_floor_w)  # never above the limit: a share of it
        return draw

    @property
    def sm_clock_mhz(self) -> int:
        m = self.model
        idle = m.idle_power_w
        if self.demand_w <= idle:
            clock = float(m.sm_clock_min_mhz)
        else:
            # Linear in the share of the wanted dynamic power the limit lets through.
            share = min(1.0, max(0.0, (self.draw_w - idle) / (self.demand_w - idle)))
            clock = m.sm_clock_min_mhz + (m.sm_clock_max_mhz - m.sm_clock_min_mhz) * share
        if self.locked_clocks_mhz is not None:
            clock = min(clock, self.locked_clocks_mhz[1])
        return int(clock)

    def graphics_clocks_mhz(self, memory_clock_mhz: int) -> list[int]:
        """Supported graphics clocks, highest first; narrower (and lower) at low memory clocks."""
        m = self.model
        if memory_clock_mhz == MEMORY_CLOCKS_MHZ[0]:
            top, bottom = m.sm_clock_max_mhz, m.sm_clock_min_mhz
        else:
            # Lower memory clocks allow lower graphics clocks only: a backend that takes
            # the minimum over every memory clock would get a wrong floor.
            top, bottom = min(m.sm_clock_max_mhz, 1000), m.sm_clock_min_mhz // 2
        clocks = list(range(top, bottom, -GRAPHICS_CLOCK_STEP_MHZ))
        if clocks[-1] != bottom:
            clocks.append(bottom)
        return clocks


@dataclass(slots=True)
class Injection:
    call: str
    code: int
    times: int | None
    device: int | None


class FakeNvml:
    """A fake ``pynvml`` module with state: pass it wherever the backend takes ``nvml``."""

    def __init__(
        self,
        models: Iterable[GpuModel],
        *,
        clock: Callable[[], float] | None = None,
        start_energy_mj: float = 0.0,
        power_value_type: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
        names_as_bytes: bool = False,
        enforce_delay_s: float = 0.0,
        limiter_lag_s: float = 0.0,
    ) -> None:
        self.devices: list[FakeDevice] = [
            FakeDevice(
                index=i,
                model=m,
                uuid=f"GPU-{i:08x}-fake-{m.key.lower()}-0000-{i:012x}",
                limit_mw=round(m.cap_default_w * 1000),
                demand_w=m.idle_power_w,
                energy_mj=start_energy_mj,
                smoothing_presets=[
                    [
                        p.floor_percent,
                        p.ramp_up_w_per_s,
                        p.ramp_down_w_per_s,
                        p.ramp_down_hysteresis_ms,
                    ]
                    for p in map(default_smoothing_preset, range(SMOOTHING_PRESETS))
                ]
                if m.has_power_smoothing
                else [],
                module=ModuleLimit.of_model(m),
            )
            for i, m in enumerate(models)
        ]
        self.require_root = False
        self.enforce_delay_s = enforce_delay_s
        self.limiter_lag_s = limiter_lag_s
        self.power_value_type = power_value_type
        self.names_as_bytes = names_as_bytes
        self.injections: list[Injection] = []
        self.field_returns: dict[tuple[int, int], int] = {}  # (device, field id) -> nvmlReturn
        self.calls: list[tuple[str, int | None]] = []  # (NVML function, device index or None)
        self._clock = clock
        self._offset_s = 0.0
        self._last_s = self._now()
        self._refcount = 0

    # -- test controls ---------------------------------------------------------------------

    def as_module(self) -> FakeNvml:
        """The object to pass as the ``nvml`` module (the fake itself)."""
        return self

    @property
    def initialized(self) -> bool:
        return self._refcount > 0

    def device(self, index: int) -> FakeDevice:
        return self.devices[index]

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of fake time pass (on top of the injected clock, if any)."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        self._sync()
        self._offset_s += seconds
        self._sync()

    def set_demand(self, index: int, watts: float) -> None:
        """The power the workload would draw without any limit."""
        self._sync()
        dev = self.devices[index]
        if self.limiter_lag_s > 0 and watts > dev.demand_w:
            dev.unclipped_until = self._now() + self.limiter_lag_s
        dev.demand_w = watts

    def set_external_limit(self, index: int, mw: int | None) -> None:
        """An out-of-band limiter (BMC, power brake) in mW; None removes it."""
        self._sync()
        self.devices[index].external_limit_mw = mw

    def set_util(self, index: int, pct: int | None) -> None:
        self.devices[index].util_pct = pct

    def set_temperature(self, index: int, temp_c: int | None) -> None:
        self.devices[index].temp_c = temp_c

    def set_field_return(self, index: int, field_id: int, code: int | None) -> None:
        """Force the per-field ``nvmlReturn`` of ``field_id`` on a device (None: normal)."""
        if code is None:
            self.field_returns.pop((index, field_id), None)
        else:
            self.field_returns[(index, field_id)] = code

    def lose_gpu(self, index: int) -> None:
        """The GPU falls off the bus: every later call on it fails with GPU_IS_LOST."""
        self.devices[index].lost = True

    def inject(
        self, call: str, error_code: int, times: int | None = 1, device: int | None = None
    ) -> None:
        """Make the next ``times`` calls of ``call`` (None: all) fail with ``error_code``.

        ``device`` restricts it to calls on that device's handle. GPU_IS_LOST with a
        device loses that device for good.
        """
        if not call.startswith("nvml"):
            raise ValueError(f"{call!r} is not an NVML function name")
        if times is not None and times < 1:
            raise ValueError("times must be >= 1 or None")
        self.injections.append(Injection(call, error_code, times, device))

    def clear_injections(self) -> None:
        self.injections.clear()

    def calls_to(self, call: str, device: int | None = None) -> int:
        """How many times ``call`` was made (on ``device``, if given)."""
        return sum(1 for n, d in self.calls if n == call and (device is None or d == device))

    # -- machinery -------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Constants, error classes and ctypes structures come from the real module.
        if name.startswith(("NVML", "c_nvml", "_nvml")):
            return getattr(pynvml, name)
        raise AttributeError(f"FakeNvml does not implement {name!r}")

    def _now(self) -> float:
        return (self._clock() if self._clock is not None else 0.0) + self._offset_s

    def _sync(self) -> None:
        """Integrate every device's draw into its energy counter up to now."""
        now = self._now()
        for dev in self.devices:
            since = self._last_s
            if dev.pending_limit is not None and dev.pending_limit[1] <= now:
                limit_mw, effect_s = dev.pending_limit
                effect_s = max(effect_s, since)  # the draw changes there
                dev.energy_mj += dev.draw_w * (effect_s - since) * 1000
                dev.enforcing_mw, dev.pending_limit, since = limit_mw, None, effect_s
            if dev.unclipped_until is not None and dev.unclipped_until <= now:
                clipped_s = max(dev.unclipped_until, since)  # the limiter acts there
                dev.energy_mj += dev.draw_w * (clipped_s - since) * 1000
                dev.unclipped_until, since = None, clipped_s
            if now > since:
                dev.energy_mj += dev.draw_w * (now - since) * 1000  # W * s = J; counter in mJ
        self._last_s = max(now, self._last_s)

    def _set_gpu_limit(self, dev: FakeDevice, limit_mw: int) -> None:
        """The GPU-scope limit: read back at once, enforced ``enforce_delay_s`` later."""
        dev.limit_mw = limit_mw
        if self.enforce_delay_s <= 0:
            dev.enforcing_mw, dev.pending_limit = limit_mw, None
        else:
            dev.pending_limit = (limit_mw, self._now() + self.enforce_delay_s)

    def _enter(
        self, call: str, handle: Any = None, *, needs_init: bool = True
    ) -> FakeDevice | None:
        """Bookkeeping every API call does first; returns the handle's device."""
        dev = None if handle is None else self._device_of(handle)
        self.calls.append((call, None if dev is None else dev.index))
        if needs_init and not self.initialized:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        if handle is not None and dev is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if dev is not None and dev.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        self._fire_injection(call, dev)
        if call in SETTERS and self.require_root:
            raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        self._sync()
        return dev

    def _device_of(self, handle: Any) -> FakeDevice | None:
        if (
            isinstance(handle, FakeHandle)
            and handle.owner_id == id(self)
            and 0 <= handle.index < len(self.devices)
        ):
            return self.devices[handle.index]
        return None

    def _fire_injection(self, call: str, dev: FakeDevice | None) -> None:
        for inj in self.injections:
            if inj.call != call:
                continue
            if inj.device is not None and (dev is None or dev.index != inj.device):
                continue
            if inj.times is not None:
                inj.times -= 1
                if inj.times == 0:
                    self.injections.remove(inj)
            if inj.code == pynvml.NVML_ERROR_GPU_IS_LOST and dev is not None:
                dev.lost = True
            raise nvml_error(inj.code)

    def _dev(self, call: str, handle: Any) -> FakeDevice:
        dev = self._enter(call, handle)
        assert dev is not None
        return dev

    # -- library ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit", needs_init=False)
        self._refcount += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self._enter("nvmlInitWithFlags", needs_init=False)
        self._refcount += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self._refcount -= 1

    def nvmlErrorString(self, result: int) -> str:
        return str(nvml_error(result))

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return "999.99-fake"

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        index = _uint(index)
        if index >= len(self.devices):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.devices[index].lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return FakeHandle(id(self), index)

    # -- identity --------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes:
        name = self._dev("nvmlDeviceGetName", handle).model.name
        return name.encode() if self.names_as_bytes else name

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes:
        uuid = self._dev("nvmlDeviceGetUUID", handle).uuid
        return uuid.encode() if self.names_as_bytes else uuid

    # -- power and energy ------------------------------------------------------------------

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: Sequence[Any]) -> Any:
        dev = self._dev("nvmlDeviceGetFieldValues", handle)
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for i, fid in enumerate(fieldIds):
            try:
                values[i].fieldId, values[i].scopeId = fid
            except TypeError:
                values[i].fieldId = fid
            values[i].timestamp = int(self._now() * 1e6)
            forced = self.field_returns.get((dev.index, values[i].fieldId))
            if forced is not None:
                values[i].nvmlReturn = forced
                continue
            answer = self._field_answer(dev, values[i].fieldId, values[i].scopeId)
            if isinstance(answer, int):
                values[i].nvmlReturn = answer
                continue
            value_type, number = answer
            member, kind = _VALUE_MEMBERS[value_type]
            values[i].valueType = value_type
            setattr(values[i].value, member, kind(number))
            values[i].nvmlReturn = pynvml.NVML_SUCCESS
        return values

    def _field_answer(self, dev: FakeDevice, field_id: int, scope: int) -> int | tuple[int, Any]:
        """(valueType, value) of one field, or the per-field nvmlReturn that fails it."""
        uint, double = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_VALUE_TYPE_DOUBLE
        if field_id == pynvml.NVML_FI_DEV_POWER_INSTANT and dev.model.has_instant_power:
            return self.power_value_type, round(dev.draw_w * 1000)
        if field_id in _MODULE_LIMIT_FIELDS and scope == pynvml.NVML_POWER_SCOPE_MODULE:
            if dev.module is None:
                return pynvml.NVML_ERROR_NOT_SUPPORTED
            return uint, getattr(dev.module, _MODULE_LIMIT_FIELDS[field_id])
        if not dev.smoothing_presets:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        unscoped: dict[int, tuple[int, Any]] = {
            pynvml.NVML_FI_PWR_SMOOTHING_ENABLED: (uint, int(dev.smoothing_enabled)),
            pynvml.NVML_FI_PWR_SMOOTHING_ACTIVE_PRESET_PROFILE: (uint, dev.smoothing_active),
            pynvml.NVML_FI_PWR_SMOOTHING_MAX_NUM_PRESET_PROFILES: (
                uint,
                len(dev.smoothing_presets),
            ),
            pynvml.NVML_FI_PWR_SMOOTHING_MIN_PERCENT_TMP_FLOOR_SETTING: (
                double,
                dev.smoothing_floor_range[0],
            ),
            pynvml.NVML_FI_PWR_SMOOTHING_MAX_PERCENT_TMP_FLOOR_SETTING: (
                double,
                dev.smoothing_floor_range[1],
            ),
            pynvml.NVML_FI_PWR_SMOOTHING_APPLIED_TMP_CEIL: (double, dev.applied_ceiling_w),
            pynvml.NVML_FI_PWR_SMOOTHING_APPLIED_TMP_FLOOR: (double, dev.applied_floor_w),
        }
        if field_id in unscoped:
            return unscoped[field_id]
        per_preset: dict[int, tuple[int, Callable[[list[float]], Any]]] = {
            pynvml.NVML_FI_PWR_SMOOTHING_PROFILE_PERCENT_TMP_FLOOR: (double, lambda p: p[0]),
            pynvml.NVML_FI_PWR_SMOOTHING_PROFILE_RAMP_UP_RATE: (
                uint,
                lambda p: round(p[1] * 1000),  # set in W/s, read in mW/s
            ),
            pynvml.NVML_FI_PWR_SMOOTHING_PROFILE_RAMP_DOWN_RATE: (
                uint,
                lambda p: round(p[2] * 1000),
            ),
            pynvml.NVML_FI_PWR_SMOOTHING_PROFILE_RAMP_DOWN_HYST_VAL: (uint, lambda p: round(p[3])),
        }
        if field_id in per_preset:
            if scope >= len(dev.smoothing_presets):
                return pynvml.NVML_ERROR_INVALID_ARGUMENT
            value_type, pick = per_preset[field_id]
            return value_type, pick(dev.smoothing_presets[scope])
        return pynvml.NVML_ERROR_NOT_SUPPORTED

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return round(self._dev("nvmlDeviceGetPowerUsage", handle).draw_w * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        dev = self._dev("nvmlDeviceGetTotalEnergyConsumption", handle)
        if not dev.model.has_energy_counter:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(dev.energy_mj)

    # -- power limits ----------------------------------------------------------------------

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        dev = self._dev("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return [dev.min_limit_mw, dev.max_limit_mw]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        return self._dev("nvmlDeviceGetPowerManagementDefaultLimit", handle).default_limit_mw

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        return self._dev("nvmlDeviceGetPowerManagementLimit", handle).limit_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._dev("nvmlDeviceGetEnforcedPowerLimit", handle).enforced_limit_mw

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: int) -> None:
        dev = self._dev("nvmlDeviceSetPowerManagementLimit", handle)
        limit_mw = _uint(limit)
        if not dev.min_limit_mw <= limit_mw <= dev.max_limit_mw:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._set_gpu_limit(dev, limit_mw)

    def nvmlDeviceSetPowerManagementLimit_v2(
        self,
        device: Any,
        powerScope: int,
        powerLimit: int,
        version: int = pynvml.nvmlPowerValue_v2,
    ) -> int:
        """pynvml's binding: the C return code is dropped (module docstring)."""
        scope, limit_mw = ctypes.c_uint(powerScope).value, _uint(powerLimit)  # as pynvml
        try:
            self._set_limit_v2(device, scope, limit_mw, _uint(version))
        except pynvml.NVMLError as err:
            if err.value in _RAISED_BY_PYNVML_V2:
                raise
        return pynvml.NVML_SUCCESS

    def _set_limit_v2(self, handle: Any, scope: int, limit_mw: int, version: int) -> None:
        """What the driver does with the v2 structure; its error codes never reach pynvml's
        caller."""
        dev = self._dev("nvmlDeviceSetPowerManagementLimit_v2", handle)
        if version != pynvml.nvmlPowerValue_v2:
            raise nvml_error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if scope == pynvml.NVML_POWER_SCOPE_GPU:
            if not dev.min_limit_mw <= limit_mw <= dev.max_limit_mw:
                raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._set_gpu_limit(dev, limit_mw)
            return
        if scope != pynvml.NVML_POWER_SCOPE_MODULE or dev.module is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not dev.module.min_mw <= limit_mw <= dev.module.max_mw:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dev.module.current_mw = limit_mw

    # -- clocks ----------------------------------------------------------------------------

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        dev = self._dev("nvmlDeviceGetClockInfo", handle)
        if type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            return dev.sm_clock_mhz
        if type == pynvml.NVML_CLOCK_MEM:
            return MEMORY_CLOCKS_MHZ[0]
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        dev = self._dev("nvmlDeviceGetMaxClockInfo", handle)
        if type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            return dev.model.sm_clock_max_mhz
        if type == pynvml.NVML_CLOCK_MEM:
            return MEMORY_CLOCKS_MHZ[0]
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any) -> list[int]:
        self._dev("nvmlDeviceGetSupportedMemoryClocks", handle)
        return list(MEMORY_CLOCKS_MHZ)

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, memoryClockMHz: int) -> list[int]:
        dev = self._dev("nvmlDeviceGetSupportedGraphicsClocks", handle)
        if _uint(memoryClockMHz) not in MEMORY_CLOCKS_MHZ:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return dev.graphics_clocks_mhz(memoryClockMHz)

    def nvmlDeviceSetGpuLockedClocks(
        self, handle: Any, minGpuClockMHz: int, maxGpuClockMHz: int
    ) -> None:
        dev = self._dev("nvmlDeviceSetGpuLockedClocks", handle)
        lo, hi = _uint(minGpuClockMHz), _uint(maxGpuClockMHz)
        m = dev.model
        if lo > hi or lo < m.sm_clock_min_mhz or hi > m.sm_clock_max_mhz:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dev.locked_clocks_mhz = (lo, hi)

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        self._dev("nvmlDeviceResetGpuLockedClocks", handle).locked_clocks_mhz = None

    # -- power smoothing -------------------------------------------------------------------

    def _smoothing_dev(self, call: str, handle: Any, ref: Any, kind: Any) -> tuple[FakeDevice, Any]:
        """The device and the structure ``ref`` points to, checked the way NVML checks them."""
        dev = self._dev(call, handle)
        struct = getattr(ref, "_obj", None)  # ctypes.byref(struct)
        if struct is None and isinstance(ref, ctypes._Pointer):
            struct = ref.contents  # ctypes.pointer(struct)
        if not isinstance(struct, kind):
            raise TypeError(
                f"{call} takes a reference to a {kind.__name__} (ctypes.byref(struct)), "
                f"got {ref!r}: pynvml hands its argument to the C function as it is"
            )
        if not dev.smoothing_presets:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        expected = {
            pynvml.c_nvmlPowerSmoothingProfile_v1_t: pynvml.nvmlPowerSmoothingProfile_v1,
            pynvml.c_nvmlPowerSmoothingState_v1_t: pynvml.nvmlPowerSmoothingState_v1,
        }[kind]
        if struct.version != expected:
            raise nvml_error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return dev, struct

    def nvmlDevicePowerSmoothingActivatePresetProfile(self, device: Any, profile: Any) -> None:
        dev, struct = self._smoothing_dev(
            "nvmlDevicePowerSmoothingActivatePresetProfile",
            device,
            profile,
            pynvml.c_nvmlPowerSmoothingProfile_v1_t,
        )
        if struct.profileId >= len(dev.smoothing_presets):  # only profileId is read
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dev.smoothing_active = struct.profileId

    def nvmlDevicePowerSmoothingUpdatePresetProfileParam(self, device: Any, profile: Any) -> None:
        dev, struct = self._smoothing_dev(
            "nvmlDevicePowerSmoothingUpdatePresetProfileParam",
            device,
            profile,
            pynvml.c_nvmlPowerSmoothingProfile_v1_t,
        )
        if struct.profileId >= len(dev.smoothing_presets):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        limits = SMOOTHING_PARAM_LIMITS.get(struct.paramId)
        if struct.paramId == _FLOOR:
            limits = dev.smoothing_floor_range
        value = struct.value
        if limits is None or not math.isfinite(value) or not limits[0] <= value <= limits[1]:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dev.smoothing_presets[struct.profileId][struct.paramId] = value

    def nvmlDevicePowerSmoothingSetState(self, device: Any, state: Any) -> None:
        dev, struct = self._smoothing_dev(
            "nvmlDevicePowerSmoothingSetState", device, state, pynvml.c_nvmlPowerSmoothingState_v1_t
        )
        if struct.state not in (pynvml.NVML_FEATURE_DISABLED, pynvml.NVML_FEATURE_ENABLED):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dev.smoothing_enabled = struct.state == pynvml.NVML_FEATURE_ENABLED

    # -- utilisation and temperature -------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        dev = self._dev("nvmlDeviceGetUtilizationRates", handle)
        gpu = dev.util_pct
        if gpu is None:
            gpu = 100 if dev.demand_w > dev.model.idle_power_w else 0
        return pynvml.c_nvmlUtilization_t(gpu=gpu, memory=gpu // 2)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        dev = self._dev("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if dev.temp_c is not None:
            return dev.temp_c
        return int(30 + 50 * dev.draw_w / dev.model.cap_max_w)
