"""Encoding and decoding: the one place a message becomes bytes and bytes a message."""

from __future__ import annotations

import json
import typing
from typing import Any

import msgspec

from powerd.protocol import constraints
from powerd.protocol.constraints import (
    INT64_MAX,
    MAX_PAYLOAD_BYTES,
    ProtocolError,
    all_finite,
    check_finite,
)
from powerd.protocol.messages import (
    Ack,
    FillRequest,
    Grant,
    M,
    Message,
    PhaseEvent,
    Status,
    Summary,
    Telemetry,
)

_ENCODER = msgspec.json.Encoder()
_DECODERS: dict[type, msgspec.json.Decoder[Any]] = {
    cls: msgspec.json.Decoder(cls) for cls in typing.get_args(Message)
}
_NAME_FIELD: dict[type, str] = {
    Telemetry: "node",
    FillRequest: "node",
    Ack: "node",
    Status: "node",
    PhaseEvent: "job",
    Summary: "scope",
    Grant: "scope",
}


def encode(message: Message) -> bytes:
    """Encode a message as compact UTF-8 JSON.

    Refuses, with ProtocolError, to send anything ``decode`` would reject: the
    encoded bytes are decoded again, because msgspec checks constraints only
    when decoding. That costs microseconds and keeps every sender honest.
    """
    try:
        if not all_finite(message):  # then find where, for the message
            check_finite(message, type(message).__name__)
    except ValueError as exc:
        raise ProtocolError(f"cannot encode {type(message).__name__}: {exc}") from None
    data = _ENCODER.encode(message)
    decode(type(message), data)  # type: ignore[type-var]  # (a Message is one of M's types)
    return data


def decode(
    cls: type[M], payload: bytes | bytearray | memoryview | str, name: str | None = None
) -> M:
    """Decode and validate one payload as ``cls``.

    ``name`` is the node or job name from the topic; where the message carries
    one, the two must match. Raises ProtocolError, and only that, on any
    invalid input.
    """
    if isinstance(payload, str):
        payload = payload.encode("utf-8", "surrogatepass")
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise ProtocolError(f"payload must be bytes, not {type(payload).__name__}")
    size = memoryview(payload).nbytes  # bytes, whatever the memoryview's item size
    if size > MAX_PAYLOAD_BYTES:
        raise ProtocolError(f"payload of {size} bytes is over {MAX_PAYLOAD_BYTES}")
    constraints._decoding = True  # Payload.__post_init__: the decoder checks numbers
    try:
        message: M = _DECODERS[cls].decode(payload)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"invalid {cls.__name__}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"not a valid JSON {cls.__name__}: {exc}") from None
    except (ValueError, TypeError, RecursionError) as exc:  # belt and braces
        raise ProtocolError(f"invalid {cls.__name__}: {exc}") from None
    finally:
        constraints._decoding = False
    field = _NAME_FIELD.get(cls)
    if field is not None and name is not None and getattr(message, field) != name:
        raise ProtocolError(
            f"{cls.__name__}.{field} {getattr(message, field)!r} does not match topic name {name!r}"
        )
    return message


def peek_order(payload: bytes | str) -> tuple[int, int]:
    """Best-effort (epoch, seq) of a command that failed validation, for its rejected ack.

    Returns (0, 0) when the payload does not even carry them as integers.
    """
    try:
        # the stdlib parser, not msgspec: it reads 1e999 elsewhere in the payload
        # as inf instead of giving up, so epoch and seq are still found
        raw = json.loads(payload, parse_constant=_not_json)
    except Exception:  # anything at all: this runs on payloads already known to be bad
        return 0, 0
    if not isinstance(raw, dict):
        return 0, 0
    epoch, seq = raw.get("epoch"), raw.get("seq")
    # within int64, as a valid message's (found by bench/fuzz.py: a bigger one made the
    # rejected ack itself unencodable)
    if (
        type(epoch) is int
        and type(seq) is int
        and 0 <= epoch <= INT64_MAX
        and 0 <= seq <= INT64_MAX
    ):
        return epoch, seq
    return 0, 0


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")
