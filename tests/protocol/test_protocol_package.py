"""The protocol package as its users see it: one import path for every public name, and the
decoder's pause of the finiteness check (set in ``codec``, read in ``constraints``) undone."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

import powerd.protocol
from powerd.protocol import GpuTelemetry, ProtocolError, Telemetry, decode, encode

INTERNAL = {"NAME_RE", "Payload", "all_finite", "check_finite", "name_float_fields"}


def defined_names(path: Path) -> set[str]:
    """The public names a module defines at its top level (not those it imports)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text("utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {name for name in found if not name.startswith("_")}


def test_every_public_name_of_the_package_is_exported_from_powerd_protocol() -> None:
    package = Path(powerd.protocol.__file__).parent
    defined = {
        name
        for path in package.glob("*.py")
        if path.name != "__init__.py"
        for name in defined_names(path)
    }
    assert defined - INTERNAL - set(powerd.protocol.__all__) == set()
    for name in powerd.protocol.__all__:
        assert hasattr(powerd.protocol, name), name


def gpu(power_w: float = 300.0) -> GpuTelemetry:
    return GpuTelemetry(
        index=0,
        uuid="GPU-0",
        power_w=power_w,
        energy_j=None,
        cap_w=700.0,
        cap_min_w=200.0,
        cap_max_w=700.0,
        sm_clock_mhz=1980,
        max_sm_clock_mhz=None,
        util_pct=90.0,
        temp_c=60.0,
    )


@pytest.mark.parametrize("payload", [b'{"v": 1}', b"not json", b"[]"])
def test_a_message_built_after_a_failed_decode_still_refuses_nan(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(Telemetry, payload)
    with pytest.raises(ValueError, match="non-finite"):
        gpu(math.nan)


def test_a_message_built_after_a_good_decode_still_refuses_nan() -> None:
    message = Telemetry(v=1, node="n1", ts=1.0, seq=1, mode="controlled", gpus=[gpu()])
    assert decode(Telemetry, encode(message), "n1") == message
    with pytest.raises(ValueError, match="non-finite"):
        gpu(math.inf)
