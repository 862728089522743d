"""NVML backend: real NVIDIA GPUs through nvidia-ml-py (``import pynvml``).

Modelled on Zeus's ``zeus/device/gpu/nvidia.py``. Every NVML call goes through
``NvmlGpu._call`` (or ``_nvml_errors`` directly in ``open_nvml``), the one place
where ``pynvml.NVMLError`` is translated into the exception types of
``powerd.gpu.errors``; no raw ``NVMLError`` leaves this module.

The ``nvml`` module is passed in rather than imported at each call so that the
tests can inject a fake (``tests/support/fakes/fake_pynvml.py``). Constants and the
``NVMLError`` class always come from the real ``pynvml``, which imports
without a driver (the shared library is loaded by ``nvmlInit``).

NVML speaks milliwatts, millijoules and MHz; this backend speaks watts, joules
and MHz, with the unit in each name.

Hardware power smoothing (Blackwell, driver R570+) is written with the three
``nvmlDevicePowerSmoothing*`` calls and read back through field values
(``NVML_FI_PWR_SMOOTHING_*``); see ``docs/POWER_SMOOTHING.md`` for what is
documented by NVIDIA and what this backend assumes. The module-scope power limit
(GB200) is written with ``nvmlDeviceSetPowerManagementLimit_v2`` and read through
the ``NVML_FI_DEV_POWER_*_LIMIT`` fields at ``NVML_POWER_SCOPE_MODULE``; that setter
drops NVML's return code in nvidia-ml-py, so every write is read back (same page,
"Module-scope power limits").
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import numbers
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any, NoReturn

import pynvml

from powerd.gpu.base import (
    SMOOTHING_MAX_PRESETS,
    ClockRange,
    Gpu,
    PowerLimitRange,
    PowerReading,
    SmoothingProfile,
    SmoothingRange,
)
from powerd.gpu.errors import (
    GpuError,
    GpuLibraryError,
    GpuLostError,
    GpuNotFoundError,
    GpuNotSupportedError,
    GpuPermissionError,
    GpuValueError,
)

logger = logging.getLogger("powerd.gpu.nvml")

__all__ = ["NvmlGpu", "open_nvml", "shutdown_nvml"]

_ROOT_HINT = "run the agent as root (or grant CAP_SYS_ADMIN)"
_DRIVER_HINT = (
    "is the NVIDIA driver installed and loaded? Check that `nvidia-smi` works on this node"
)

# Errors that say the library or driver is not usable at all.
_LIBRARY_ERRORS = frozenset(
    {
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_UNINITIALIZED,
        # Driver upgraded under a running system: the library and kernel module disagree.
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)
# The call does not exist in this driver's NVML: as good as not supported.
_NOT_SUPPORTED_ERRORS = frozenset(
    {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}
)

_SMOOTHING_HINT = (
    "hardware power smoothing needs a Blackwell-class GPU (GB200, B200 or newer) and an "
    "NVIDIA driver of branch R570 or newer"
)
_SMOOTHING_FIELD_SKEW_HINT = (
    "are nvidia-ml-py and the driver from the same branch? The NVML_FI_PWR_SMOOTHING_* "
    "field ids differ between NVML headers (251-268 in most, 256-273 in the CUDA 12.9 / "
    "R575 ones such as nvidia-ml-py 12.575.51); see docs/POWER_SMOOTHING.md"
)
_MODULE_LIMIT_HINT = (
    "module-scope power limits need a device that has them (GB200) and a driver whose NVML "
    "offers nvmlDeviceSetPowerManagementLimit_v2 with NVML_POWER_SCOPE_MODULE; the agent "
    "uses the GPU power limit instead"
)
# ARGUMENT_VERSION_MISMATCH is newer than some nvidia-ml-py releases the project allows.
_VERSION_MISMATCH = getattr(pynvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", None)

# Which member of the c_nvmlValue_t union holds a field value, by its valueType.
_VALUE_MEMBERS: dict[int, str] = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def _nvml_error_text(err: pynvml.NVMLError) -> str:
    """NVML's own words for an error, never raising (``str()`` may call into the library)."""
    try:
        return str(err)
    except Exception:  # pragma: no cover - defensive: str() of an unknown code needs the library
        return f"NVML error {getattr(err, 'value', '?')}"


def _translate(err: pynvml.NVMLError, call: str, where: str) -> GpuError:
    """Map one NVMLError onto the project's exception types, with an operator-useful message.

    ``call`` names the NVML function, ``where`` the GPU ("GPU 0 (NVIDIA H100 ...)") or "NVML".
    """
    code = getattr(err, "value", None)
    text = _nvml_error_text(err)
    smoothing = "PowerSmoothing" in call or "PWR_SMOOTHING" in call
    module = "module scope" in call or "PowerManagementLimit_v2" in call
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return GpuPermissionError(
            f"{call} on {where} was refused: insufficient permissions "
            f"(NVML_ERROR_NO_PERMISSION); {_ROOT_HINT}"
        )
    if code in _NOT_SUPPORTED_ERRORS:
        if smoothing or module:
            hint = _SMOOTHING_HINT if smoothing else _MODULE_LIMIT_HINT
            return GpuNotSupportedError(f"{call} is not supported on {where} ({text}): {hint}")
        return GpuNotSupportedError(
            f"{call} is not supported on {where} by this GPU or driver ({text})"
        )
    if code == pynvml.NVML_ERROR_GPU_IS_LOST:
        return GpuLostError(
            f"{where} is lost during {call}: the GPU fell off the bus or stopped answering "
            "(NVML_ERROR_GPU_IS_LOST). Check `nvidia-smi` and `dmesg` (Xid errors); "
            "the node needs attention (drain it; a GPU reset or reboot is usually required)"
        )
    if code == pynvml.NVML_ERROR_INVALID_ARGUMENT:
        return GpuValueError(f"{call} on {where} rejected its arguments (NVML: {text})")
    if _VERSION_MISMATCH is not None and code == _VERSION_MISMATCH:
        return GpuError(
            f"{call} on {where} failed: the driver does not accept the structure version "
            f"nvidia-ml-py passed (NVML_ERROR_ARGUMENT_VERSION_MISMATCH); install the "
            "nvidia-ml-py release that matches the driver branch"
        )
    if code in _LIBRARY_ERRORS:
        hint = _DRIVER_HINT
        if code == pynvml.NVML_ERROR_UNINITIALIZED:
            hint += " (or NVML was shut down before this call)"
        return GpuLibraryError(f"NVML is not usable for {call} on {where}: {text}; {hint}")
    return GpuError(f"{call} on {where} failed: {text} (NVML error code {code})")


@contextlib.contextmanager
def _nvml_errors(call: str, where: str) -> Iterator[None]:
    """Translate any NVMLError raised inside the block (the only translation point)."""
    try:
        yield
    except pynvml.NVMLError as err:
        raise _translate(err, call, where) from err


def _as_text(value: str | bytes) -> str:
    """NVML strings come back as ``str`` from nvidia-ml-py >= 11.5, as ``bytes`` before."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


# The power smoothing fields and structures, absent from nvidia-ml-py before 12.570.
_FI_SMOOTHING: dict[str, int | None] = {
    name: getattr(pynvml, f"NVML_FI_PWR_SMOOTHING_{name}", None)
    for name in (
        "ENABLED",
        "ACTIVE_PRESET_PROFILE",
        "MAX_NUM_PRESET_PROFILES",
        "MIN_PERCENT_TMP_FLOOR_SETTING",
        "MAX_PERCENT_TMP_FLOOR_SETTING",
        "PROFILE_PERCENT_TMP_FLOOR",
        "PROFILE_RAMP_UP_RATE",
        "PROFILE_RAMP_DOWN_RATE",
        "PROFILE_RAMP_DOWN_HYST_VAL",
    )
}
_HAS_SMOOTHING_BINDINGS = all(v is not None for v in _FI_SMOOTHING.values()) and all(
    hasattr(pynvml, name)
    for name in (
        "c_nvmlPowerSmoothingProfile_v1_t",
        "c_nvmlPowerSmoothingState_v1_t",
        "NVML_POWER_SMOOTHING_PROFILE_PARAM_PERCENT_TMP_FLOOR",
    )
)
# The four preset parameters powerd sets, in the order written: (param id name, field name).
_SMOOTHING_PARAMS = (
    ("NVML_POWER_SMOOTHING_PROFILE_PARAM_PERCENT_TMP_FLOOR", "PROFILE_PERCENT_TMP_FLOOR"),
    ("NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_UP_RATE", "PROFILE_RAMP_UP_RATE"),
    ("NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_DOWN_RATE", "PROFILE_RAMP_DOWN_RATE"),
    ("NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_DOWN_HYSTERESIS", "PROFILE_RAMP_DOWN_HYST_VAL"),
)


# The module-scope power limit: the v2 setter and the power scope, absent from older
# nvidia-ml-py releases, and the limit fields read at that scope (values in mW).
_POWER_SCOPE_MODULE: int | None = getattr(pynvml, "NVML_POWER_SCOPE_MODULE", None)
_FI_POWER_LIMIT: dict[str, int | None] = {
    name: getattr(pynvml, f"NVML_FI_DEV_POWER_{name}_LIMIT", None)
    for name in ("MIN", "MAX", "DEFAULT", "CURRENT")
}
_HAS_MODULE_LIMIT_BINDINGS = (
    _POWER_SCOPE_MODULE is not None
    and all(v is not None for v in _FI_POWER_LIMIT.values())
    and hasattr(pynvml, "nvmlDeviceSetPowerManagementLimit_v2")
)
_MODULE_LIMIT_NOT_TAKEN_WHY = (
    "nvidia-ml-py's nvmlDeviceSetPowerManagementLimit_v2 drops NVML's return code, so a "
    "refused write looks like a successful one. Likely causes: the agent is not root "
    f"({_ROOT_HINT}); the driver refused the structure version nvidia-ml-py passes "
    "(install the nvidia-ml-py release of the driver's branch); an out-of-band limit "
    'holds the module. See docs/POWER_SMOOTHING.md, "Module-scope power limits"'
)


def _field_value(field: Any) -> float:
    """The number in a ``c_nvmlFieldValue_t``, read from the union member its valueType names."""
    member = _VALUE_MEMBERS.get(int(field.valueType))
    if member is None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
    return float(getattr(field.value, member))


class NvmlGpu(Gpu):
    """One NVIDIA GPU driven through NVML.

    Probes at construction which power reading the device offers (instantaneous
    field or 1 s average), whether it has an energy counter, and its SM clock
    range. Power limits and their constraints are read from NVML on each call.
    """

    def __init__(self, nvml: ModuleType | Any, index: int, handle: Any) -> None:
        """Wrap the device at ``index`` whose NVML handle is ``handle``.

        ``nvml`` is the ``pynvml`` module, or anything with the same functions.
        """
        self._nvml = nvml
        self._handle = handle
        self.index = index
        self.name = "name unknown"  # until the real name is read, for error messages
        self.name = _as_text(self._call("nvmlDeviceGetName"))
        self.uuid = _as_text(self._call("nvmlDeviceGetUUID"))
        self._locked_max_mhz: int | None = None
        self._smoothing_supported: bool | None = None  # asked on first use, then remembered
        self._module_limit_supported: bool | None = None  # the same
        self._power_reading = self._probe_power()
        self._has_energy = self._probe_energy()
        self._clock_range, self._clock_range_error = self._probe_clock_range()

    def __repr__(self) -> str:
        return f"NvmlGpu(index={self.index}, name={self.name!r}, uuid={self.uuid!r})"

    # -- NVML access -------------------------------------------------------------------------

    @property
    def _where(self) -> str:
        return f"GPU {self.index} ({self.name})"

    def _call(self, fn_name: str, *args: Any) -> Any:
        """Call ``nvml.<fn_name>(handle, *args)``, translating NVML errors."""
        with _nvml_errors(fn_name, self._where):
            return getattr(self._nvml, fn_name)(self._handle, *args)

    def _instant_power_mw(self) -> float:
        call = "nvmlDeviceGetFieldValues(NVML_FI_DEV_POWER_INSTANT)"
        with _nvml_errors(call, self._where):
            fields = self._nvml.nvmlDeviceGetFieldValues(
                self._handle, [pynvml.NVML_FI_DEV_POWER_INSTANT]
            )
            field = fields[0]
            if field.nvmlReturn != pynvml.NVML_SUCCESS:  # per-field status, not the call's
                raise pynvml.NVMLError(field.nvmlReturn)
            return _field_value(field)

    # -- probes at open ----------------------------------------------------------------------

    def _probe_power(self) -> PowerReading:
        try:
            self._instant_power_mw()
        except (GpuLostError, GpuLibraryError):
            raise
        except GpuError as err:
            # Drivers that do not know the field answer NOT_SUPPORTED or INVALID_ARGUMENT.
            logger.info(
                "%s: power from nvmlDeviceGetPowerUsage (1 s average on Ampere and newer); "
                "instantaneous power unavailable: %s",
                self._where,
                err,
            )
            return PowerReading.AVERAGE_1S
        logger.info("%s: power from NVML_FI_DEV_POWER_INSTANT (instantaneous)", self._where)
        return PowerReading.INSTANT

    def _probe_energy(self) -> bool:
        try:
            self._call("nvmlDeviceGetTotalEnergyConsumption")
        except GpuNotSupportedError:
            logger.info("%s: no energy counter (pre-Volta?); energy_j() returns None", self._where)
            return False
        return True

    def _probe_clock_range(self) -> tuple[ClockRange | None, GpuNotSupportedError | None]:
        """SM clock range: max from GetMaxClockInfo, min = the lowest graphics clock
        supported at the highest memory clock.

        Fallback where the supported-clock lists are unavailable: ``min_mhz = 0``,
        meaning "no floor": a lock then asks NVML for ``(0, max)``, as
        ``nvidia-smi -lgc 0,MAX`` does, and the driver keeps its own lowest clock.
        Where not even the max clock can be read, clock control is reported as
        unsupported by ``sm_clock_range`` and ``lock_max_sm_clock_mhz``.
        """
        try:
            max_mhz = int(self._call("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_SM))
        except GpuNotSupportedError as err:
            logger.warning(
                "%s: SM clock range unknown, clock locking disabled: %s", self._where, err
            )
            return None, err
        try:
            mem_clocks = self._call("nvmlDeviceGetSupportedMemoryClocks")
            if not mem_clocks:
                raise GpuNotSupportedError(f"{self._where} lists no supported memory clocks")
            graphics = self._call("nvmlDeviceGetSupportedGraphicsClocks", max(mem_clocks))
            if not graphics:
                raise GpuNotSupportedError(f"{self._where} lists no supported graphics clocks")
            min_mhz = int(min(graphics))
        except GpuNotSupportedError as err:
            logger.warning(
                "%s: supported SM clocks unknown (%s); assuming 0-%d MHz, "
                "a clock lock will leave the floor to the driver",
                self._where,
                err,
                max_mhz,
            )
            min_mhz = 0
        return ClockRange(min_mhz=min(min_mhz, max_mhz), max_mhz=max_mhz), None

    # -- reads -------------------------------------------------------------------------------

    def _limit_constraints_mw(self) -> tuple[int, int]:
        min_mw, max_mw = self._call("nvmlDeviceGetPowerManagementLimitConstraints")
        return int(min_mw), int(max_mw)

    def power_limit_range(self) -> PowerLimitRange:
        """Min and max power limit the device accepts, and its default, in watts."""
        min_mw, max_mw = self._limit_constraints_mw()
        default_mw = self._call("nvmlDeviceGetPowerManagementDefaultLimit")
        return PowerLimitRange(
            min_w=min_mw / 1000, max_w=max_mw / 1000, default_w=default_mw / 1000
        )

    def sm_clock_range(self) -> ClockRange:
        """Lowest and highest SM clock the device supports, in MHz (probed at open)."""
        if self._clock_range is None:
            raise GpuNotSupportedError(str(self._clock_range_error))
        return self._clock_range

    def power_reading(self) -> PowerReading:
        """``INSTANT`` where NVML_FI_DEV_POWER_INSTANT works, else ``AVERAGE_1S``."""
        return self._power_reading

    def power_w(self) -> float:
        """Current board power draw in watts (see ``power_reading`` for which kind)."""
        if self._power_reading is PowerReading.INSTANT:
            return self._instant_power_mw() / 1000
        return float(self._call("nvmlDeviceGetPowerUsage")) / 1000

    def energy_j(self) -> float | None:
        """Energy since the driver loaded, in joules; None where the device has no counter."""
        if not self._has_energy:
            return None
        return float(self._call("nvmlDeviceGetTotalEnergyConsumption")) / 1000

    def power_limit_w(self) -> float:
        """The power management limit set on the device, in watts."""
        return float(self._call("nvmlDeviceGetPowerManagementLimit")) / 1000

    def enforced_cap_w(self) -> float:
        """The limit enforced now (minimum over all limiters, out-of-band ones too), in watts."""
        return float(self._call("nvmlDeviceGetEnforcedPowerLimit")) / 1000

    def sm_clock_mhz(self) -> int:
        """Current SM clock in MHz."""
        return int(self._call("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_SM))

    def locked_max_sm_clock_mhz(self) -> int | None:
        """The max SM clock this backend locked, None when unlocked (or locked by others)."""
        return self._locked_max_mhz

    def util_pct(self) -> float:
        """GPU utilisation over NVML's last sample period, in percent."""
        return float(self._call("nvmlDeviceGetUtilizationRates").gpu)

    def temp_c(self) -> float:
        """GPU core temperature in degrees Celsius."""
        return float(self._call("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU))

    # -- field values ------------------------------------------------------------------------

    def _read_fields(self, wanted: Sequence[tuple[str, int | tuple[int, int]]]) -> list[float]:
        """Read field values, each given as (its name for messages, field id or (id, scopeId)).

        A field that fails on its own (its per-field ``nvmlReturn``) raises its translated
        error, named after the field.
        """
        names = ", ".join(name for name, _ in wanted)
        with _nvml_errors(f"nvmlDeviceGetFieldValues({names})", self._where):
            fields = self._nvml.nvmlDeviceGetFieldValues(self._handle, [i for _, i in wanted])
        values = []
        for (name, _), field in zip(wanted, fields, strict=True):
            with _nvml_errors(f"nvmlDeviceGetFieldValues({name})", self._where):
                if field.nvmlReturn != pynvml.NVML_SUCCESS:  # per-field status
                    raise pynvml.NVMLError(field.nvmlReturn)
                values.append(_field_value(field))
        return values

    # -- hardware power smoothing ------------------------------------------------------------

    def _smoothing_fields(self, *wanted: tuple[str, int | None]) -> list[float]:
        """Read ``NVML_FI_PWR_SMOOTHING_<name>`` fields, each with its scope (a preset) or None."""
        fields: list[tuple[str, int | tuple[int, int]]] = []
        for name, scope in wanted:
            field_id = _FI_SMOOTHING[name]
            assert field_id is not None  # callers check _HAS_SMOOTHING_BINDINGS
            if scope is None:
                fields.append((f"NVML_FI_PWR_SMOOTHING_{name}", field_id))
            else:
                fields.append((f"NVML_FI_PWR_SMOOTHING_{name}, preset {scope}", (field_id, scope)))
        return self._read_fields(fields)

    def _smoothing_nonsense(self, what: str) -> GpuError:
        return GpuError(
            f"{self._where}: power smoothing fields read back nonsense ({what}); "
            f"{_SMOOTHING_FIELD_SKEW_HINT}"
        )

    def supports_smoothing(self) -> bool:
        """Whether NVML answers NVML_FI_PWR_SMOOTHING_ENABLED on this GPU (asked once)."""
        if self._smoothing_supported is None:
            if not _HAS_SMOOTHING_BINDINGS:
                logger.info(
                    "%s: this nvidia-ml-py has no power smoothing calls (12.570 or newer has)",
                    self._where,
                )
                self._smoothing_supported = False
            else:
                try:
                    self._smoothing_fields(("ENABLED", None))
                except (GpuNotSupportedError, GpuValueError) as err:
                    # Drivers that do not know the field answer NOT_SUPPORTED or INVALID_ARGUMENT.
                    logger.info("%s: no hardware power smoothing: %s", self._where, err)
                    self._smoothing_supported = False
                else:
                    self._smoothing_supported = True
        return self._smoothing_supported

    def _smoothing_unsupported(self) -> GpuNotSupportedError:
        if not _HAS_SMOOTHING_BINDINGS:
            return GpuNotSupportedError(
                f"{self._where}: the installed nvidia-ml-py has no power smoothing calls; "
                f"install nvidia-ml-py 12.570 or newer ({_SMOOTHING_HINT})"
            )
        return super()._smoothing_unsupported()

    def smoothing_range(self) -> SmoothingRange:
        """Floor range (NVML_FI_PWR_SMOOTHING_MIN/MAX_PERCENT_TMP_FLOOR_SETTING) and presets."""
        if not self.supports_smoothing():
            raise self._smoothing_unsupported()
        low, high, presets = self._smoothing_fields(
            ("MIN_PERCENT_TMP_FLOOR_SETTING", None),
            ("MAX_PERCENT_TMP_FLOOR_SETTING", None),
            ("MAX_NUM_PRESET_PROFILES", None),
        )
        if not (0 <= low <= high <= 100 and 1 <= presets <= SMOOTHING_MAX_PRESETS):
            raise self._smoothing_nonsense(
                f"floor setting {low:g}-{high:g}%, {presets:g} preset profiles"
            )
        return SmoothingRange(floor_min_percent=low, floor_max_percent=high, presets=int(presets))

    def smoothing(self, preset: int | None = None) -> SmoothingProfile | None:
        """The values of ``preset`` (None: the active preset) and the switch, read from NVML.

        None where the GPU has no power smoothing. Ramp rates are read in mW/s and
        returned in W/s; the floor is a percentage, the hysteresis in ms.
        """
        if not self.supports_smoothing():
            return None
        if preset is not None and (
            isinstance(preset, bool)
            or not isinstance(preset, numbers.Integral)
            or not 0 <= preset < SMOOTHING_MAX_PRESETS
        ):
            self._reject(f"smoothing preset must be 0-{SMOOTHING_MAX_PRESETS - 1}, got {preset!r}")
        enabled, active = self._smoothing_fields(("ENABLED", None), ("ACTIVE_PRESET_PROFILE", None))
        if (
            enabled not in (0, 1)
            or active != int(active)
            or not 0 <= active < SMOOTHING_MAX_PRESETS
        ):
            raise self._smoothing_nonsense(f"enabled={enabled:g}, active preset {active:g}")
        which = int(active) if preset is None else int(preset)
        floor, up_mw_s, down_mw_s, hyst_ms = self._smoothing_fields(
            *((field, which) for _, field in _SMOOTHING_PARAMS)
        )
        try:
            return SmoothingProfile(
                preset=which,
                enabled=bool(enabled),
                floor_percent=floor,
                ramp_up_w_per_s=up_mw_s / 1000,
                ramp_down_w_per_s=down_mw_s / 1000,
                ramp_down_hysteresis_ms=hyst_ms,
            )
        except GpuValueError as err:
            raise self._smoothing_nonsense(str(err)) from err

    def _write_smoothing(self, profile: SmoothingProfile, *, activate: bool = True) -> None:
        """Four UpdatePresetProfileParam calls, then ActivatePresetProfile and SetState.

        NVML takes ramp rates in W/s here (and reads them back in mW/s). pynvml hands the
        structure to the C function as it is, so it goes by reference (``ctypes.byref``).
        """
        values = (
            profile.floor_percent,
            profile.ramp_up_w_per_s,
            profile.ramp_down_w_per_s,
            profile.ramp_down_hysteresis_ms,
        )
        for (param_name, _), value in zip(_SMOOTHING_PARAMS, values, strict=True):
            param = pynvml.c_nvmlPowerSmoothingProfile_v1_t()
            param.profileId = profile.preset
            param.paramId = getattr(pynvml, param_name)
            param.value = float(value)
            self._call("nvmlDevicePowerSmoothingUpdatePresetProfileParam", ctypes.byref(param))
        if not activate:
            return
        chosen = pynvml.c_nvmlPowerSmoothingProfile_v1_t()
        chosen.profileId = profile.preset  # the only member NVML reads here
        self._call("nvmlDevicePowerSmoothingActivatePresetProfile", ctypes.byref(chosen))
        state = pynvml.c_nvmlPowerSmoothingState_v1_t()
        state.state = (
            pynvml.NVML_FEATURE_ENABLED if profile.enabled else pynvml.NVML_FEATURE_DISABLED
        )
        self._call("nvmlDevicePowerSmoothingSetState", ctypes.byref(state))

    # -- module-scope power limit ------------------------------------------------------------

    def _module_limit_fields_mw(self, *names: str) -> list[float]:
        """Read ``NVML_FI_DEV_POWER_<name>_LIMIT`` at module scope, in mW."""
        assert _POWER_SCOPE_MODULE is not None  # callers check _HAS_MODULE_LIMIT_BINDINGS
        fields: list[tuple[str, int | tuple[int, int]]] = []
        for name in names:
            field_id = _FI_POWER_LIMIT[name]
            assert field_id is not None
            label = f"NVML_FI_DEV_POWER_{name}_LIMIT, module scope"
            fields.append((label, (field_id, _POWER_SCOPE_MODULE)))
        return self._read_fields(fields)

    def supports_module_power_limit(self) -> bool:
        """Whether NVML answers the module-scope limit fields on this GPU (asked once)."""
        if self._module_limit_supported is None:
            if not _HAS_MODULE_LIMIT_BINDINGS:
                logger.info(
                    "%s: this nvidia-ml-py has no module-scope power limit calls", self._where
                )
                self._module_limit_supported = False
            else:
                try:
                    self._module_limit_fields_mw("MIN", "MAX", "DEFAULT", "CURRENT")
                except (GpuNotSupportedError, GpuValueError) as err:
                    # Devices without module scope answer NOT_SUPPORTED, old drivers
                    # INVALID_ARGUMENT.
                    logger.info("%s: no module-scope power limit: %s", self._where, err)
                    self._module_limit_supported = False
                else:
                    self._module_limit_supported = True
        return self._module_limit_supported

    def _module_limit_unsupported(self) -> GpuNotSupportedError:
        if not _HAS_MODULE_LIMIT_BINDINGS:
            return GpuNotSupportedError(
                f"{self._where}: module-scope power limits are not supported by the installed "
                "nvidia-ml-py (no nvmlDeviceSetPowerManagementLimit_v2 or "
                "NVML_POWER_SCOPE_MODULE); install a newer nvidia-ml-py, of the driver's branch"
            )
        return super()._module_limit_unsupported()

    def _module_limit_not_taken(self, asked_w: float, read_w: float) -> GpuError:
        return GpuError(
            f"{self._where}: module power limit {asked_w:g} W not taken: the device reads "
            f"back {read_w:g} W (NVML_FI_DEV_POWER_CURRENT_LIMIT, module scope). "
            f"{_MODULE_LIMIT_NOT_TAKEN_WHY}"
        )

    def module_power_limit_range(self) -> PowerLimitRange:
        """Min, max and default module limit (NVML_FI_DEV_POWER_MIN/MAX/DEFAULT_LIMIT)."""
        if not self.supports_module_power_limit():
            raise self._module_limit_unsupported()
        min_mw, max_mw, default_mw = self._module_limit_fields_mw("MIN", "MAX", "DEFAULT")
        if not 0 < min_mw <= max_mw:
            raise GpuError(
                f"{self._where}: module power limit range reads back nonsense "
                f"({min_mw:g}-{max_mw:g} mW); are nvidia-ml-py and the driver from the same "
                "branch?"
            )
        return PowerLimitRange(
            min_w=min_mw / 1000, max_w=max_mw / 1000, default_w=default_mw / 1000
        )

    def module_power_limit_w(self) -> float:
        """The module limit set now (NVML_FI_DEV_POWER_CURRENT_LIMIT, module scope), in W."""
        if not self.supports_module_power_limit():
            raise self._module_limit_unsupported()
        (current_mw,) = self._module_limit_fields_mw("CURRENT")
        return current_mw / 1000

    def _write_module_power_limit_w(self, limit_w: float) -> None:
        """``nvmlDeviceSetPowerManagementLimit_v2`` at module scope, in mW (pynvml fills the
        structure and its version). It raises only when the call cannot be made at all: the
        base class reads the limit back."""
        if not self.supports_module_power_limit():
            raise self._module_limit_unsupported()
        self._call(
            "nvmlDeviceSetPowerManagementLimit_v2", _POWER_SCOPE_MODULE, round(limit_w * 1000)
        )

    # -- setters -----------------------------------------------------------------------------

    def _reject(self, message: str) -> NoReturn:
        raise GpuValueError(f"{self._where}: {message}")

    def set_power_limit_w(self, cap_w: float) -> None:
        """Set the power management limit; ``GpuValueError`` outside the device's range.

        Validated before NVML is called, so a rejected value changes nothing.
        """
        if isinstance(cap_w, bool) or not isinstance(cap_w, numbers.Real):
            self._reject(f"power limit must be a number of watts, got {cap_w!r}")
        min_mw, max_mw = self._limit_constraints_mw()
        if not math.isfinite(cap_w) or not min_mw / 1000 <= cap_w <= max_mw / 1000:
            self._reject(
                f"power limit {cap_w} W is outside the range the device accepts, "
                f"{min_mw / 1000:g}-{max_mw / 1000:g} W (clamp with PowerLimitRange.clamp)"
            )
        self._call("nvmlDeviceSetPowerManagementLimit", round(cap_w * 1000))

    def lock_max_sm_clock_mhz(self, max_mhz: int) -> None:
        """Lock SM clocks to [lowest supported, ``max_mhz``]; ``GpuValueError`` outside range."""
        if isinstance(max_mhz, bool) or not isinstance(max_mhz, numbers.Integral):
            self._reject(f"max SM clock must be a whole number of MHz, got {max_mhz!r}")
        clocks = self.sm_clock_range()
        if not clocks.min_mhz <= max_mhz <= clocks.max_mhz:
            self._reject(
                f"max SM clock {max_mhz} MHz is outside the supported range "
                f"{clocks.min_mhz}-{clocks.max_mhz} MHz (clamp with ClockRange.clamp)"
            )
        self._call("nvmlDeviceSetGpuLockedClocks", clocks.min_mhz, int(max_mhz))
        self._locked_max_mhz = int(max_mhz)

    def unlock_sm_clock(self) -> None:
        """Remove any SM clock lock (``nvmlDeviceResetGpuLockedClocks``)."""
        self._call("nvmlDeviceResetGpuLockedClocks")
        self._locked_max_mhz = None


def open_nvml(
    nvml: ModuleType | Any | None = None, indices: Sequence[int] | None = None
) -> list[NvmlGpu]:
    """Initialise NVML and open the GPUs at ``indices`` (all of them when None).

    Raises ``GpuNotFoundError`` for an index the node does not have, or when it
    has no GPU; NVML is shut down again if opening fails. Pair with ``shutdown_nvml``.
    """
    nvml = nvml if nvml is not None else pynvml
    with _nvml_errors("nvmlInit", "NVML"):
        nvml.nvmlInit()
    try:
        with _nvml_errors("nvmlDeviceGetCount", "NVML"):
            count = int(nvml.nvmlDeviceGetCount())
        if count == 0:
            raise GpuNotFoundError("NVML sees no GPU on this node; check `nvidia-smi`")
        wanted = list(range(count)) if indices is None else list(indices)
        if len(set(wanted)) != len(wanted):
            raise GpuValueError(f"GPU indices repeat: {wanted}")
        for index in wanted:
            if not 0 <= index < count:
                raise GpuNotFoundError(
                    f"no GPU at index {index}: this node has {count} GPU(s), indices 0-{count - 1}"
                )
        gpus = []
        for index in wanted:
            with _nvml_errors("nvmlDeviceGetHandleByIndex", f"GPU {index}"):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(NvmlGpu(nvml, index, handle))
    except BaseException:
        with contextlib.suppress(pynvml.NVMLError):
            nvml.nvmlShutdown()
        raise
    return gpus


def shutdown_nvml(nvml: ModuleType | Any | None = None) -> None:
    """Shut NVML down (once per ``open_nvml``); the GPUs opened become unusable."""
    nvml = nvml if nvml is not None else pynvml
    with _nvml_errors("nvmlShutdown", "NVML"):
        nvml.nvmlShutdown()
