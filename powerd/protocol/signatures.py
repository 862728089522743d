"""Signatures on the wire: the last two members of every command and heartbeat, and what
they cover (``powerd.signing`` signs and verifies)."""

from __future__ import annotations

import re

from powerd.protocol.constraints import ProtocolError

SIGNED_CONTEXT = b"powerd/v1 signed\n"
# `,"key":"<16 hex>","sig":"<86 base64url>"}`: fixed in form and length, always last
_SIGNATURE_SUFFIX = re.compile(rb',"key":"([0-9a-f]{16})","sig":"([A-Za-z0-9_-]{86})"\}\Z')


def signed_bytes(topic: str, body: bytes) -> bytes:
    """What a signature covers: a context string, the topic, the message as encoded without
    its signature. The topic binds a command to its node and cluster: moved to another
    topic, the signature fails."""
    return SIGNED_CONTEXT + topic.encode("utf-8") + b"\n" + body


def attach_signature(body: bytes, key: str, sig: str) -> bytes:
    """``body`` (an encoded message: a JSON object) with ``key`` and ``sig`` appended as its
    last members. Readers that do not verify see two optional fields (docs/PROTOCOL.md)."""
    if not body.endswith(b"}") or body == b"{}":
        raise ProtocolError("only a non-empty JSON object can be signed")
    return b'%s,"key":"%s","sig":"%s"}' % (body[:-1], key.encode(), sig.encode())


def detach_signature(payload: bytes) -> tuple[bytes, str, str] | None:
    """The signed message (``payload`` as it was before ``attach_signature``), its key id and
    signature; None when ``payload`` does not end in a signature of the right form."""
    found = _SIGNATURE_SUFFIX.search(payload)
    if found is None:
        return None
    return payload[: found.start()] + b"}", found[1].decode(), found[2].decode()
