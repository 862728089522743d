"""The one way the suite runs a real server: a child process on a free port, awaited until ready.

Mosquitto (``tests.support.brokers``), VictoriaMetrics and InfluxDB 1.x (``tests.support.tsdb``)
build on ``ServerProcess``: it starts the command with its output in a log
file, waits for ``ready()`` (or for the process to die, which is an error
showing the log's tail), and stops it with SIGTERM, then SIGKILL.

Each kind of server names the pytest marker of the tests that start it
(``marker``: ``broker``, ``tsdb``); ``tests/conftest.py`` marks every test
that uses one (``tests.support.markers``), and while a test runs, a server
its markers do not name refuses to start (``ALLOWED_ENV``): so
``pytest -m "not broker and not tsdb"`` starts none.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_program(candidates: Sequence[str], package: str) -> str:
    """The first of ``candidates`` on PATH (or absolute); an error saying how to install it."""
    for candidate in candidates:
        found = shutil.which(candidate)
        if found:
            return found
    raise RuntimeError(
        f"{candidates[0]} is not installed; `make test` installs it (apt-get install -y {package})"
    )


ALLOWED_ENV = "POWERD_TEST_SERVER_MARKERS"
"""Set by ``tests/conftest.py`` while a test runs (child processes inherit it): the server
markers, comma-separated, that the running test carries. Unset outside pytest."""


def check_allowed(server: ServerProcess) -> None:
    """Refuse to start ``server`` in a test whose markers do not say it starts one."""
    allowed = os.environ.get(ALLOWED_ENV)
    if allowed is not None and server.marker not in allowed.split(","):
        raise RuntimeError(
            f"{server.name} started by a test not marked {server.marker!r}: the test reaches "
            "it in a way tests/support/markers.py does not follow; make the reference "
            f"visible (a fixture, a helper function) or mark the test {server.marker!r}"
        )


class ServerProcess:
    """A server child process with a log file; subclasses give ``command()`` and ``ready()``."""

    name = "server"
    marker: str | None = None  # the pytest marker of tests that start one: "broker", "tsdb"
    stop_timeout_s = 10.0

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()  # kept across restarts
        self.log_path = workdir / f"{self.name}.log"
        self._proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str] | None:
        return None  # inherit

    def ready(self) -> bool:
        """True once the server answers."""
        raise NotImplementedError

    def start(self, timeout_s: float = 20.0) -> None:
        check_allowed(self)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.env()
            )
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if self._proc.poll() is not None:
                self._proc = None
                raise RuntimeError(f"{self.name} exited: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} not ready in {timeout_s} s: {self.log_tail()}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


S = TypeVar("S", bound=ServerProcess)


@contextmanager
def running(server: S) -> Iterator[S]:
    """``server`` started for the ``with`` block, stopped after it whatever happens."""
    server.start()
    try:
        yield server
    finally:
        server.stop()
