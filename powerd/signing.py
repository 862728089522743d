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
SubjectPublicKeyInfo (refused if the group or others may write it: they could swap in
their own key). A key file is read only if it is a regular file of at most
``MAX_KEY_FILE_BYTES``, and one public key serves one role only (``check_roles``).
``openssl genpkey -algorithm ed25519`` makes the same files as ``powerd keys
generate``. A key is named on the wire by its id: the first 8 bytes of the SHA-256 of
its raw public key, in hex. Rotation: give agents the new public key beside the old
one (they accept both), move the controllers to the new private key, then drop the
old public key (docs/PROTOCOL.md, "Signed messages").
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
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _write_new(key_path, pem, 0o600)
    _write_new(pub_path, public_pem, 0o644)  # whatever the umask: others may not write it
    return key_path, pub_path


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """``data`` in a new file of (at most) ``mode``: never over an existing one."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except OSError as exc:
        raise KeyFileError(f"{path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def load_signer(path: str | Path) -> Signer:
    """The private key in ``path``; refused if others may read it or it is not Ed25519."""
    path = Path(path)
    key_file = _read(path)
    if _is_public_key(path, key_file.data):  # before the mode: 0644 is right for a .pub
        raise KeyFileError(f"{path}: this is a public key; give the private key{_private_of(path)}")
    if key_file.mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"{path}: a private key must be readable by its owner only "
            f"(mode {stat.S_IMODE(key_file.mode):04o}); chmod 600 {path}"
        )
    try:
        private = serialization.load_pem_private_key(key_file.data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise KeyFileError(f"{path}: an Ed25519 key is needed, not {type(private).__name__}")
    return Signer(private, source=str(path))


def load_trusted_key(path: str | Path) -> TrustedKey:
    """The public key in ``path`` (PEM). A private key here is refused: it would leak. So is
    a file others may write: whoever can write it can make this side trust their key."""
    path = Path(path)
    key_file = _read(path)
    if b"PRIVATE KEY" in key_file.data:
        raise KeyFileError(
            f"{path}: this is a private key; give agents the public key (the .pub file)"
        )
    if key_file.mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise KeyFileError(
            f"{path}: a trusted key must be writable by its owner only (mode "
            f"{stat.S_IMODE(key_file.mode):04o}: whoever may write it may replace the key "
            f"this side trusts); chmod go-w {path}"
        )
    try:
        public = serialization.load_pem_public_key(key_file.data)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path}: not a PEM public key ({exc})") from None
    if not isinstance(public, Ed25519PublicKey):
        raise KeyFileError(f"{path}: an Ed25519 key is needed, not {type(public).__name__}")
    return TrustedKey(key_id(public), public, str(path))


def key_id_of_file(path: str | Path) -> str:
    """The key id of the private or public key in ``path`` (``powerd keys id``)."""
    path = Path(path)
    private = b"PRIVATE KEY" in _read(path).data
    return load_signer(path).key_id if private else load_trusted_key(path).key_id


def load_verifier(paths: Iterable[str | Path], *also: TrustedKey) -> Verifier:
    """A verifier trusting the public keys in ``paths`` and ``also``."""
    keys = [load_trusted_key(p) for p in paths] + list(also)
    if not keys:
        raise KeyFileError("no trusted controller key given")
    return Verifier(keys)


@dataclass(frozen=True)
class RoleKeys:
    """The keys one configuration entry trusts (or signs with) for one role."""

    role: str  # "controller", "coordinator", "operator"
    entry: str  # where they are configured: "trust.operator_keys"
    keys: tuple[TrustedKey, ...]


def check_roles(entries: Iterable[RoleKeys]) -> None:
    """KeyFileError when one public key appears under two roles.

    A key trusted as an operator's and a controller's lets whoever holds it (a
    controller, then) sign site limits; a controller's key as a leaf's coordinator key
    lets a leaf sign its own grants. The same key in two entries of one role (our own
    key and ``controller_keys``) is fine.
    """
    first: dict[str, tuple[RoleKeys, TrustedKey]] = {}
    for entry in entries:
        for key in entry.keys:
            seen, seen_key = first.setdefault(key.key_id, (entry, key))
            if seen.role != entry.role:
                raise KeyFileError(
                    f"one key (id {key.key_id}) in two roles: {seen.entry} "
                    f"({seen_key.source}, the {seen.role} role) and {entry.entry} "
                    f"({key.source}, the {entry.role} role); whoever holds its private key "
                    "could sign as both: give each role its own pair (`powerd keys generate`)"
                )


# A PEM Ed25519 key is under 200 bytes: anything this big is no key file, and a read of it
# is bounded (a trusted key named /dev/zero or a huge file must not eat memory or hang).
MAX_KEY_FILE_BYTES = 64 * 1024


@dataclass(frozen=True)
class _KeyFile:
    data: bytes
    mode: int  # st_mode of the file as opened: the bytes and the mode are of one file


def _read(path: Path) -> _KeyFile:
    """A regular file of at most ``MAX_KEY_FILE_BYTES``, and its mode (KeyFileError)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise KeyFileError(f"{path}: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise KeyFileError(
            f"{path}: not a regular file ({_file_kind(mode)}); a key file is a PEM file"
        )
    with os.fdopen(fd, "rb") as file:
        try:
            data = file.read(MAX_KEY_FILE_BYTES + 1)
        except OSError as exc:
            raise KeyFileError(f"{path}: {exc.strerror or exc}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(
            f"{path}: over {MAX_KEY_FILE_BYTES} bytes: not a key file (a PEM key is under 1 KiB)"
        )
    return _KeyFile(data, mode)


def _file_kind(mode: int) -> str:
    kinds = {
        stat.S_ISDIR: "a directory",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISFIFO: "a pipe",
        stat.S_ISSOCK: "a socket",
    }
    return next((name for test, name in kinds.items() if test(mode)), "not a plain file")


# How an OpenSSH public key line begins (``ssh-keygen``'s .pub files).
SSH_PUBLIC_PREFIXES = (b"ssh-", b"ecdsa-sha2-", b"sk-ssh-", b"sk-ecdsa-")


def _is_public_key(path: Path, data: bytes) -> bool:
    """A public key, whatever its form: PEM, an OpenSSH line, or a ``.pub`` file with no
    private key in it."""
    if b"PRIVATE KEY" in data:
        return False
    return (
        b"PUBLIC KEY-----" in data
        or data.lstrip().startswith(SSH_PUBLIC_PREFIXES)
        or path.suffix == ".pub"
    )


def _private_of(path: Path) -> str:
    """Where the private half of the public key at ``path`` is, as far as its name says:
    ': PREFIX.key' (``powerd keys generate``), ': FILE' (the file without .pub: openssl,
    ssh-keygen), else a hint."""
    stem = path.with_suffix("") if path.suffix == ".pub" else path
    for candidate in (stem.with_name(stem.name + ".key"), stem):
        if candidate != path and candidate.is_file():
            return f": {candidate}"
    return " (the file without .pub, or the .key file `powerd keys generate` wrote beside the .pub)"


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
