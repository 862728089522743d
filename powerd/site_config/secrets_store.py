"""Secrets made once and kept: a second ``powerd site generate`` on the same folder keeps
every key, password and certificate already there, and lists what it kept.

Everything secret lives under ``OUT/secrets/`` (mode 0700): the MQTT passwords
(``mqtt-passwords``, ``login:password`` lines, mode 0600), the role keys, the CA and the
broker's key and certificate. The per-host folders get copies; they are written again
on every run from what is here.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path

from powerd.signing import generate_key_files

PASSWORD_BYTES = 24  # 32 characters of urlsafe base64: ~192 bits


def write_file(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    """``data`` in ``path`` (made or replaced) with exactly ``mode``; folders made first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), mode)
        out.write(raw)


class SecretStore:
    """The secrets under ``root`` (``OUT/secrets``): each made when missing, else kept."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        self.kept: list[str] = []
        self.made: list[str] = []
        self._passwords_path = root / "mqtt-passwords"
        self._passwords = self._read_passwords()
        self._passwords_kept = len(self._passwords)

    def _read_passwords(self) -> dict[str, str]:
        if not self._passwords_path.exists():
            return {}
        out: dict[str, str] = {}
        for line in self._passwords_path.read_text().splitlines():
            login, sep, password = line.partition(":")
            if sep and login:
                out[login] = password
        return out

    def passwords(self, logins: Iterable[str]) -> dict[str, str]:
        """A password per login: the one kept, else a new random one; all saved."""
        out = {}
        for login in logins:
            if login not in self._passwords:
                self._passwords[login] = secrets.token_urlsafe(PASSWORD_BYTES)
            out[login] = self._passwords[login]
        text = "".join(f"{login}:{pw}\n" for login, pw in self._passwords.items())
        write_file(self._passwords_path, text, 0o600)
        new = len(self._passwords) - self._passwords_kept
        if self._passwords_kept:
            self.kept.append(f"{self._passwords_kept} MQTT passwords ({self._passwords_path})")
        if new:
            self.made.append(f"{new} MQTT passwords")
        return out

    def key_pair(self, role: str) -> tuple[Path, Path]:
        """``secrets/ROLE.key`` (0600) and ``.pub``: kept, else generated."""
        key, pub = self.root / f"{role}.key", self.root / f"{role}.pub"
        if key.exists() and pub.exists():
            self.kept.append(f"the {role} key pair ({key})")
            return key, pub
        if key.exists() or pub.exists():
            raise FileExistsError(
                f"{key if key.exists() else pub} exists without its other half: not replacing "
                "a key silently (restore the pair, or remove it to make a new one)"
            )
        self.made.append(f"the {role} key pair")
        return generate_key_files(self.root / role)

    def pem_pair(
        self, name: str, make: Callable[[], tuple[bytes, bytes]], what: str
    ) -> tuple[bytes, bytes]:
        """``secrets/NAME.pem`` and ``secrets/NAME.key`` (0600): kept, else ``make()``."""
        cert, key = self.root / f"{name}.pem", self.root / f"{name}.key"
        if cert.exists() and key.exists():
            self.kept.append(f"{what} ({cert})")
            return cert.read_bytes(), key.read_bytes()
        if cert.exists() or key.exists():
            raise FileExistsError(
                f"{cert if cert.exists() else key} exists without its other half: not "
                f"replacing {what} silently (restore it, or remove both to make a new one)"
            )
        cert_pem, key_pem = make()
        write_file(key, key_pem, 0o600)
        write_file(cert, cert_pem, 0o644)
        self.made.append(what)
        return cert_pem, key_pem
