"""Signed control messages: what lets an agent tell its controller from anyone on the broker.

A controller signs every command and heartbeat with the private key of its role
(Ed25519, from the ``cryptography`` package: no cryptography of our own); agents,
and the controllers watching each other's heartbeats, verify against the public
keys they trust before they act. A broker login is not enough to move a GPU:
whoever can publish on a command topic still cannot sign.

A signed message is the message as encoded, with two members appended last:
``"key"`` (the signing key's id) and ``"sig"`` (the Ed25519 signature,
base64url); a reader that does not verify sees two optional fields
(``protocol.attach_signature``). What is signed is the message as it was before
(byte for byte: no canonical JSON needed) bound to its topic
(``protocol.signed_bytes``), so a command signed for one node is no command for
another, and a heartbeat is no command. Replays are the protocol's business, not
this module's: agents apply commands only in ``(epoch, seq)`` order and judge
heartbeats by their age.

Key files are PEM: the private key PKCS#8 (readable by its owner only: this
module refuses one that the group or others may read), the public key
SubjectPublicKeyInfo. ``openssl genpkey -algorithm ed25519`` makes the same
files as ``powerd keys generate``. A key is named on the wire by its id: the
first 8 bytes of the SHA-256 of its raw public key, in hex. Rotation: give
agents the new public key beside the old one (they accept both), move the
controllers to the new private key, then drop the old public key
(docs/PROTOCOL.md, "Signed messages").
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from powerd.protocol import (
    M,
    ProtocolError,
    attach_signature,
    decode,
    detach_signature,
    signed_bytes,
)


class SignatureError(ProtocolError):
    """A control message that is not signed, or not by a key this side trusts."""


class KeyFileError(ValueError):
    """A key file that cannot be used; the message names the file and what to do."""


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class TrustedKey:
    key_id: str
    public: Ed25519PublicKey
    source: str  # where it came from, for logs


class Signer:
    """Signs control messages with one private key."""

    def __init__(self, private: Ed25519PrivateKey, source: str = "<memory>") -> None:
        self._private = private
        self.public = private.public_key()
        self.key_id = key_id(self.public)
        self.source = source

    @classmethod
    def generate(cls) -> Signer:
        """A fresh key that lives in memory only (the demo, tests)."""
        return cls(Ed25519PrivateKey.generate())

    def trusted(self) -> TrustedKey:
        """This key's public half, to trust."""
        return TrustedKey(self.key_id, self.public, self.source)

    def sign(self, topic: str, body: bytes) -> bytes:
        """``body`` (an encoded message) signed for ``topic``: ``key`` and ``sig`` appended."""
        signature = self._private.sign(signed_bytes(topic, body))
        return attach_signature(body, self.key_id, _b64(signature))


class Verifier:
    """Opens signed payloads made by any of the trusted keys."""

    def __init__(self, keys: Iterable[TrustedKey]) -> None:
        self.keys = {key.key_id: key for key in keys}
        if not self.keys:
            raise ValueError("a verifier needs at least one trusted key")

    def open(self, topic: str, payload: bytes | bytearray | memoryview | str) -> bytes:
        """``payload`` if a trusted key signed it for ``topic``: what to decode.

        Raises ``SignatureError`` (unsigned, unknown key, bad signature), and
        nothing else.
        """
        if isinstance(payload, str):
            payload = payload.encode("utf-8", "surrogatepass")
        payload = bytes(payload)
        parts = detach_signature(payload)
        if parts is None:
            raise SignatureError(
                f"not signed (no key and sig at the end of the message on {topic})"
            )
        body, key, sig = parts
        trusted = self.keys.get(key)
        if trusted is None:
            raise SignatureError(f"signed by key {key}, which this side does not trust")
        try:
            trusted.public.verify(_unb64(sig), signed_bytes(topic, body))
        except (InvalidSignature, binascii.Error, ValueError):
            raise SignatureError(
                f"bad signature for key {key} on {topic} (forged or altered)"
            ) from None
        return payload

    def decode(self, cls: type[M], topic: str, payload: bytes | bytearray | memoryview | str) -> M:
        """``open`` then ``protocol.decode``: a verified, validated message."""
        return decode(cls, self.open(topic, payload))


# --- key files --------------------------------------------------------------------------


def generate_key_files(prefix: str | Path) -> tuple[Path, Path]:
    """Write ``PREFIX.key`` (private, mode 0600) and ``PREFIX.pub``; never overwrites."""
    prefix = Path(prefix)
    key_path, pub_path = (
        prefix.with_name(prefix.name + ".key"),
        prefix.with_name(prefix.name + ".pub"),
    )
    for path in (key_path, pub_path):
        if path.exists():
            raise KeyFileError(f"{path} exists: not overwriting a key (remove it first)")
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    try:
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise KeyFileError(f"{key_path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    pub_path.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return key_path, pub_path


def load_signer(path: str | Path) -> Signer:
    """The private key in ``path``; refused if others may read it or it is not Ed25519."""
    path = Path(path)
    data = _read(path)
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"{path}: a private key must be readable by its owner only "
            f"(mode {stat.S_IMODE(mode):04o}); chmod 600 {path}"
        )
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise KeyFileError(f"{path}: an Ed25519 key is needed, not {type(private).__name__}")
    return Signer(private, source=str(path))


def load_trusted_key(path: str | Path) -> TrustedKey:
    """The public key in ``path`` (PEM). A private key here is refused: it would leak."""
    path = Path(path)
    data = _read(path)
    if b"PRIVATE KEY" in data:
        raise KeyFileError(
            f"{path}: this is a private key; give agents the public key (the .pub file)"
        )
    try:
        public = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path}: not a PEM public key ({exc})") from None
    if not isinstance(public, Ed25519PublicKey):
        raise KeyFileError(f"{path}: an Ed25519 key is needed, not {type(public).__name__}")
    return TrustedKey(key_id(public), public, str(path))


def load_verifier(paths: Iterable[str | Path], *also: TrustedKey) -> Verifier:
    """A verifier trusting the public keys in ``paths`` and ``also``."""
    keys = [load_trusted_key(p) for p in paths] + list(also)
    if not keys:
        raise KeyFileError("no trusted controller key given")
    return Verifier(keys)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"{path}: {exc.strerror or exc}") from None


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    """``_b64`` undone, strictly: base64 can spell the same bytes more than one way (the
    unused low bits of the last character), and a signature that does not read back as
    written is refused, so no two payloads carry one signature (ValueError)."""
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(raw) != text:
        raise ValueError("not the canonical base64 of its bytes")
    return raw
