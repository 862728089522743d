"""Dashboard JSON checked against Grafana's dashboard schema, as grafana-foundation-sdk types it.

The SDK's Python models are generated from Grafana's schema (the version the
``test`` extra pins: Grafana 11.6's). They decode leniently:
``Dashboard.from_json`` drops a field it does not know and fills a missing
required one with a default, so a round trip alone proves little. This walks
the decoded model beside the JSON and reports what the decoding hides: a field
the schema does not have, a required field that is missing, a value outside an
enum, a scalar of the wrong type. Panel options and field config are checked
against the panel plugin's model (stat, timeseries, ...), as Grafana's
schema does; a data source's query is the data source's business, not the
dashboard's, and is not checked.

Grafana's schema leaves two places open where the SDK's closed types cannot
say so (``kinds/dashboard``: ``...``): an annotation's ``target`` carries the
data source's query beside the four fields the schema names, and an
annotation may carry field ``mappings``, the "target+mapping" form the schema
tells data sources to migrate to. ``OPEN_FIELDS`` and ``OPEN_MODELS`` say so
here; nothing else is allowed.
"""

from __future__ import annotations

import enum
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any

from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.cog.runtime import UnknownDataquery
from grafana_foundation_sdk.models import dashboard as schema

register_default_plugins()  # panel options and field config decode into their plugin's model

OPEN_FIELDS: dict[type, frozenset[str]] = {schema.AnnotationQuery: frozenset({"mappings"})}
OPEN_MODELS: tuple[type, ...] = (schema.AnnotationTarget,)
_PROBE = object()


@dataclass(frozen=True)
class Field:
    """One JSON field of an SDK model: its Python type and whether the schema requires it."""

    hint: Any
    required: bool


def problems(dash: dict) -> list[str]:
    """Every way ``dash`` departs from the schema, as ``$.path: what``; empty when it conforms."""
    return _problems(schema.Dashboard.from_json(dash), dash, "$")


def _problems(model: object, src: object, path: str) -> list[str]:
    if isinstance(model, UnknownDataquery):
        return []  # a data source's query
    if hasattr(model, "to_json"):
        if not isinstance(src, dict):
            return [f"{path}: an object expected, found {src!r}"]
        return _object_problems(model, src, path)
    if isinstance(model, list) and isinstance(src, list):
        return [
            p
            for i, (m, s) in enumerate(zip(model, src, strict=True))
            for p in _problems(m, s, f"{path}[{i}]")
        ]
    if isinstance(model, dict) and isinstance(src, dict):
        return [
            p for k in model.keys() & src.keys() for p in _problems(model[k], src[k], f"{path}.{k}")
        ]
    return []


def _object_problems(model: Any, src: dict, path: str) -> list[str]:
    kind: type = type(model)
    fields = json_fields(kind)
    encoded = model.to_json()
    open_fields = OPEN_FIELDS.get(kind, frozenset())
    out = [
        f"{path}.{k}: required, missing" for k, f in fields.items() if f.required and k not in src
    ]
    for key, value in src.items():
        if key not in fields:
            if key not in open_fields and not isinstance(model, OPEN_MODELS):
                out.append(f"{path}.{key}: not in the schema")
            continue
        if not accepts(fields[key].hint, value):
            out.append(f"{path}.{key}: {value!r} is not a {fields[key].hint}")
        elif key in encoded:
            out += _problems(encoded[key], value, f"{path}.{key}")
    return out


@cache
def json_fields(cls: type) -> dict[str, Field]:
    """The JSON fields of an SDK model: each attribute in turn set to a probe, found in to_json.

    A field the model writes even when every attribute is None is required
    (the generated ``to_json`` writes an optional field only when it is set).
    """
    hints = typing.get_type_hints(cls)
    required = set(_blank(cls).to_json())
    out = {}
    for attr in vars(cls()):
        probe = _blank(cls)
        setattr(probe, attr, _PROBE)
        for key, value in probe.to_json().items():
            if value is _PROBE:
                out[key] = Field(hints.get(attr, Any), key in required)
    return out


def _blank(cls: type) -> Any:
    model = cls()
    for attr in vars(model):
        setattr(model, attr, None)
    return model


def accepts(hint: Any, value: object) -> bool:
    """Whether a JSON value can be of the Python type ``hint`` (models: checked by the walk)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(accepts(h, value) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(accepts(item, v) for v in value)
    if hint is type(None):
        return value is None
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return value in {m.value for m in hint}
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if isinstance(hint, type) and hasattr(hint, "from_json"):
        return isinstance(value, dict)
    return True  # object, Any, dict[str, ...]: open
