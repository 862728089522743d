"""The test suite's controller role key: one Ed25519 pair for the whole run.

In-process agents and controllers take ``VERIFIER`` / ``SIGNER``; processes take the
files ``key_files(dir)`` copies (the same pair, so a process and the in-process harness
speak for the same controller). ``STRANGER`` is someone with a broker login but not the
role's key.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from powerd.signing import Signer, Verifier, generate_key_files, load_signer

_HOME = Path(tempfile.mkdtemp(prefix="powerd-test-keys-"))
atexit.register(shutil.rmtree, _HOME, True)
_KEY, _PUB = generate_key_files(_HOME / "controller")

SIGNER = load_signer(_KEY)
VERIFIER = Verifier([SIGNER.trusted()])
STRANGER = Signer.generate()


def sign(topic: str, body: bytes) -> bytes:
    return SIGNER.sign(topic, body)


def key_files(directory: Path) -> tuple[Path, Path]:
    """SIGNER's private key (mode 0600) and public key, copied into ``directory``."""
    key_path, pub_path = directory / "controller.key", directory / "controller.pub"
    shutil.copy2(_KEY, key_path)  # copy2 keeps the 0600 mode
    shutil.copy2(_PUB, pub_path)
    return key_path, pub_path
