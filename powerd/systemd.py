"""systemd: the units powerd ships, and sd_notify for ``Type=notify`` units.

The unit files (``powerd/data/powerd-*.service``) are rendered with ExecStart
and the config paths of this installation (``powerd unit agent|controller|coordinator``).

sd_notify (readiness, watchdog pings, status, stopping) is a few lines over a
Unix datagram socket, so no dependency on python-systemd. Outside systemd (no
``$NOTIFY_SOCKET``) every call does nothing.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
from importlib import resources
from pathlib import Path

log = logging.getLogger("powerd.systemd")

# --- unit files --------------------------------------------------------------------------


def _render_unit(file_name: str, replacements: dict[str, str]) -> str:
    text = resources.files("powerd.data").joinpath(file_name).read_text()
    for default, value in replacements.items():
        text = text.replace(default, value)
    return text


def render_agent_unit(exec_path: str, config_path: str) -> str:
    """``powerd-agent.service`` with ExecStart running ``exec_path agent --config config_path``."""
    return _render_unit(
        "powerd-agent.service",
        {"/usr/local/bin/powerd": exec_path, "/etc/powerd/agent.toml": config_path},
    )


def render_controller_unit(
    exec_path: str,
    config_path: str,
    budgets_path: str,
    signing_key_path: str = "/etc/powerd/controller.key",
    scoped: bool = False,
) -> str:
    """``powerd-controller.service`` with ExecStart, the config, the budgets file and the
    signing key (handed over as a systemd credential) set; with ``scoped``, the template
    ``powerd-controller@.service`` of the leaf controllers (the instance is the scope)."""
    return _render_unit(
        "powerd-controller@.service" if scoped else "powerd-controller.service",
        {
            "/usr/local/bin/powerd": exec_path,
            "/etc/powerd/controller.toml": config_path,
            "/etc/powerd/budgets.toml": budgets_path,
            "/etc/powerd/controller.key": signing_key_path,
        },
    )


def render_coordinator_unit(
    exec_path: str,
    config_path: str,
    budgets_path: str,
    signing_key_path: str = "/etc/powerd/coordinator.key",
) -> str:
    """``powerd-coordinator.service``, set up as ``render_controller_unit`` does."""
    return _render_unit(
        "powerd-coordinator.service",
        {
            "/usr/local/bin/powerd": exec_path,
            "/etc/powerd/coordinator.toml": config_path,
            "/etc/powerd/budgets.toml": budgets_path,
            "/etc/powerd/coordinator.key": signing_key_path,
        },
    )


# ProtectHome=yes makes these empty for every unit's service, PrivateTmp=yes gives it its own
# empty /tmp and /var/tmp: an ExecStart (or its interpreter) under one cannot run.
HIDDEN_FROM_UNITS = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")


def hidden_install_paths(exec_path: str) -> list[str]:
    """Those of ``exec_path``, its resolved path and its script's interpreter (its ``#!``
    line: a virtual environment's python) that the units' hardening hides from the
    service; empty when the unit can run it."""
    candidates = [exec_path, os.path.realpath(exec_path)]
    try:
        with open(exec_path, "rb") as script:
            first = script.readline(4096)
    except OSError:
        first = b""
    if first.startswith(b"#!") and first[2:].split():
        interpreter = first[2:].split()[0].decode(errors="replace")
        candidates += [interpreter, os.path.realpath(interpreter)]
    hidden = [
        path
        for path in dict.fromkeys(candidates)
        if any(path == top or path.startswith(top + "/") for top in HIDDEN_FROM_UNITS)
    ]
    return hidden


def this_executable() -> str:
    """The ``powerd`` executable of this installation: on PATH, else the running one."""
    found = shutil.which("powerd")
    return str(Path(found).resolve()) if found else str(Path(sys.argv[0]).resolve())


# --- sd_notify ---------------------------------------------------------------------------


class SystemdNotifier:
    def __init__(self, socket_path: str | None = None) -> None:
        path = socket_path if socket_path is not None else os.environ.get("NOTIFY_SOCKET")
        self._address: str | None = None
        self._sock: socket.socket | None = None
        if path:
            # A leading '@' names a socket in the abstract namespace.
            self._address = "\0" + path[1:] if path.startswith("@") else path
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        usec = os.environ.get("WATCHDOG_USEC", "")
        self.watchdog_interval_s: float | None = int(usec) / 1e6 if usec.isdigit() else None

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def notify(self, message: str) -> None:
        if self._sock is None or self._address is None:
            return
        try:
            self._sock.sendto(message.encode(), self._address)
        except OSError as exc:  # systemd gone or socket full: never fatal
            log.debug("sd_notify %r failed: %s", message, exc)

    def ready(self, status: str = "") -> None:
        self.notify("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def watchdog(self) -> None:
        self.notify("WATCHDOG=1")

    def status(self, status: str) -> None:
        self.notify(f"STATUS={status}")

    def stopping(self) -> None:
        self.notify("STOPPING=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
