"""What every message shares: the bounds and named types of its fields, the name rule,
``ProtocolError``, and ``Payload``, the base that refuses non-finite numbers."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar

import msgspec
import msgspec.inspect
from msgspec import Meta, Struct

MAX_PAYLOAD_BYTES = 64 * 1024
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z"  # \Z: "$" would allow a final newline
MAX_NAME_CHARS = 64  # the longest name NAME_PATTERN allows
NAME_RE = re.compile(NAME_PATTERN)

Name = Annotated[str, Meta(pattern=NAME_PATTERN)]
# Counters (epoch, seq, telemetry seq) fit a signed 64-bit integer: what InfluxDB and
# every language's JSON reader keep exactly.
INT64_MAX = 2**63 - 1
NonNegInt = Annotated[int, Meta(ge=0, le=INT64_MAX)]
GpuIndex = Annotated[int, Meta(ge=0, le=1023)]
PositiveW = Annotated[float, Meta(gt=0)]
NonNegFloat = Annotated[float, Meta(ge=0)]
Percent = Annotated[float, Meta(ge=0, le=100)]
CLOCK_MAX_MHZ = 100_000  # the highest clock any message carries (a policy's is then clamped)
ClockMhz = Annotated[int, Meta(ge=0, le=CLOCK_MAX_MHZ)]
MAX_TTL_S = 86_400.0  # a command's ttl_s: the protocol's bound (agents set a tighter one)
# Hardware power smoothing (docs/POWER_SMOOTHING.md): what any device can hold, the bounds
# of powerd.gpu.base.SmoothingProfile (NVML's 5 presets; 32-bit mW/s and ms fields). Copied,
# not imported, so that the protocol stays free of the GPU layer; a test pins them equal.
SMOOTHING_PRESET_MAX = 4
SMOOTHING_MAX_RAMP_W_PER_S = (2**32 - 1) / 1000
SMOOTHING_MAX_HYSTERESIS_MS = float(2**32 - 1)
SmoothingPreset = Annotated[int, Meta(ge=0, le=SMOOTHING_PRESET_MAX)]
# Telemetry carries a GPU's smoothing state when it differs from the one that GPU's
# telemetry last carried, after a new controller epoch, and otherwise every this many
# samples (docs/PROTOCOL.md): a state changes a few times a day, and on every sample of
# every GB200 it cost the 150 MW site's controller a quarter more CPU to take telemetry in.
SMOOTHING_STATE_EVERY_SAMPLES = 10


class ProtocolError(ValueError):
    """A payload or topic that breaks the protocol; the message says how."""


# True while ``decode`` runs msgspec's decoder: the finiteness check of ``Payload`` is then
# redundant (the decoder refuses NaN, Infinity and numbers that overflow), and it cost
# ~2.5 us of the ~5 us it takes to decode one telemetry message. Another thread that
# builds a message meanwhile skips the check too; ``encode`` checks again before sending.
# (``powerd.protocol.codec.decode`` sets it.)
_decoding = False


class Payload(Struct, forbid_unknown_fields=False, omit_defaults=True):
    """Base of every message: refuses non-finite numbers when built in code.

    Decoding needs no check of its own: msgspec's JSON decoder has no NaN or
    Infinity tokens and refuses numbers that overflow a float ("Number out of
    range"; pinned by ``tests/protocol/test_protocol_payloads.py``). This check is for
    messages built in code; ``encode`` checks again, since structs are mutable.
    msgspec calls ``__post_init__`` when decoding too, where ``decode`` turns
    it off (``_decoding``): telemetry decoding is the controller's hottest path
    (docs/CONTROLLER.md). It looks only at the fields that can hold a float,
    named once per class in ``_finite_fields`` (``name_float_fields``).
    """

    _finite_fields: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        if _decoding:  # msgspec's decoder has refused any non-finite number already
            return
        # Nested structs run their own __post_init__ when decoded or built, so only
        # this struct's own numbers are checked here (msgspec adds the path, `$.gpus[0]`).
        for name in self._finite_fields:
            value = getattr(self, name)
            if value.__class__ is list:  # a list of numbers (Summary's watts by class)
                if not all(math.isfinite(item) for item in value):
                    raise ValueError(f"non-finite number in {type(self).__name__}.{name}")
            elif value.__class__ is float and value - value != 0.0:  # inf - inf, nan - nan
                raise ValueError(f"non-finite number at {type(self).__name__}.{name}")


def all_finite(struct: Struct) -> bool:
    """No NaN or infinity anywhere inside ``struct``: ``check_finite``'s fast path, no paths."""
    for name in struct.__struct_fields__:
        value = getattr(struct, name)
        kind = value.__class__
        if kind is float:
            if value - value != 0.0:
                return False
        elif kind is list or kind is tuple:
            for item in value:
                if item.__class__ is float:
                    if item - item != 0.0:
                        return False
                elif isinstance(item, Struct) and not all_finite(item):
                    return False
        elif isinstance(value, Struct) and not all_finite(value):
            return False
    return True


def check_finite(obj: Any, where: str) -> None:
    """Every number inside ``obj``, nested structs included (encode: set after construction)."""
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError(f"non-finite number at {where}")
    elif isinstance(obj, Struct):
        for field in obj.__struct_fields__:
            check_finite(getattr(obj, field), f"{where}.{field}")
    elif isinstance(obj, list | tuple):
        for i, item in enumerate(obj):
            check_finite(item, f"{where}[{i}]")


def _can_hold_float(info: msgspec.inspect.Type) -> bool:
    if isinstance(info, msgspec.inspect.FloatType):
        return True
    if isinstance(info, msgspec.inspect.UnionType):
        return any(_can_hold_float(t) for t in info.types)
    if isinstance(info, msgspec.inspect.ListType | msgspec.inspect.TupleType):
        item_types = getattr(info, "item_types", None) or (getattr(info, "item_type", None),)
        # a list of floats: __post_init__ checks each (_FINITE_LISTS)
        return any(t is not None and _can_hold_float(t) for t in item_types)
    return False


def name_float_fields(*classes: type[Payload]) -> None:
    """Set each class's ``_finite_fields``: the fields whose type admits a float."""
    for cls in classes:
        info = msgspec.inspect.type_info(cls)
        assert isinstance(info, msgspec.inspect.StructType)
        cls._finite_fields = tuple(f.name for f in info.fields if _can_hold_float(f.type))


def check_name(name: str, what: str) -> str:
    """Return ``name`` if it is a valid cluster, node or job name, else raise ProtocolError."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ProtocolError(f"{what} name {name!r} must match {NAME_PATTERN}")
    return name


def names(items: Iterable[str], what: str) -> list[str]:
    """Validate a list of names (nodes, jobs)."""
    return [check_name(item, what) for item in items]
