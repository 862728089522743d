"""Mosquitto's password file format (2.0): ``login:$7$ITERATIONS$SALT$HASH``.

PBKDF2-HMAC-SHA512 over the password, a 12-byte random salt, 101 iterations and a 64-byte
hash, salt and hash in standard base64: what ``mosquitto_passwd`` writes, so the broker
reads a file made here exactly as one it made (tests/deploy/test_site_generate.py checks
both ways).
"""

from __future__ import annotations

import base64
import hashlib
import os

ITERATIONS = 101  # mosquitto_passwd's default (2.0)
SALT_BYTES = 12
HASH_BYTES = 64


def hash_password(password: str, salt: bytes | None = None, iterations: int = ITERATIONS) -> str:
    """``$7$ITERATIONS$SALT$HASH`` for ``password``."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, HASH_BYTES)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_password(password: str, hashed: str) -> bool:
    """Whether ``password`` matches a ``$7$`` hash (one Mosquitto wrote, or ``hash_password``)."""
    parts = hashed.split("$")
    if len(parts) != 5 or parts[1] != "7":
        raise ValueError(f"not a Mosquitto $7$ hash: {hashed[:20]!r}")
    salt = base64.b64decode(parts[3])
    return hash_password(password, salt, int(parts[2])) == hashed


def password_file(logins: dict[str, str]) -> str:
    """The password file's text: one ``login:hash`` line per login, in the order given."""
    for login in logins:
        if ":" in login or not login or any(c.isspace() for c in login):
            raise ValueError(f"login {login!r}: no colon or space in a Mosquitto login")
    return "".join(f"{login}:{hash_password(pw)}\n" for login, pw in logins.items())
