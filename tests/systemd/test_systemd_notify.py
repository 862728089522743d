"""SystemdNotifier against a real Unix datagram socket standing in for systemd."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from powerd.systemd import SystemdNotifier


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)


def _receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.setblocking(False)
    return sock


@pytest.fixture
def path_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket bound to a file in tmp_path: (NOTIFY_SOCKET value, socket)."""
    path = tmp_path / "notify.sock"
    if len(os.fsencode(path)) >= 100:  # sun_path is 108 bytes
        pytest.skip(f"tmp_path too long for a Unix socket path: {path}")
    sock = _receiver(str(path))
    yield str(path), sock
    sock.close()


@pytest.fixture
def abstract_socket() -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket in the abstract namespace: ('@name', socket)."""
    name = f"powerd-test-{uuid.uuid4().hex}"
    sock = _receiver("\0" + name)
    yield "@" + name, sock
    sock.close()


def received(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_messages_reach_a_path_socket(
    monkeypatch: pytest.MonkeyPatch, path_socket: tuple[str, socket.socket]
) -> None:
    address, sock = path_socket
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    notifier = SystemdNotifier()
    assert notifier.enabled
    notifier.ready()
    notifier.watchdog()
    notifier.status("controlled, 4 GPUs")
    notifier.stopping()
    assert received(sock) == [
        "READY=1",
        "WATCHDOG=1",
        "STATUS=controlled, 4 GPUs",
        "STOPPING=1",
    ]
    notifier.close()
    assert not notifier.enabled


def test_ready_with_status(
    monkeypatch: pytest.MonkeyPatch, path_socket: tuple[str, socket.socket]
) -> None:
    address, sock = path_socket
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    notifier = SystemdNotifier()
    notifier.ready("failsafe caps applied on 4 GPU(s)")
    assert received(sock) == ["READY=1\nSTATUS=failsafe caps applied on 4 GPU(s)"]
    notifier.close()


def test_messages_reach_an_abstract_socket(
    monkeypatch: pytest.MonkeyPatch, abstract_socket: tuple[str, socket.socket]
) -> None:
    address, sock = abstract_socket
    assert address.startswith("@")
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    notifier = SystemdNotifier()
    notifier.ready()
    notifier.watchdog()
    notifier.stopping()
    assert received(sock) == ["READY=1", "WATCHDOG=1", "STOPPING=1"]
    notifier.close()


def test_explicit_socket_path_wins_over_environment(
    monkeypatch: pytest.MonkeyPatch,
    path_socket: tuple[str, socket.socket],
    abstract_socket: tuple[str, socket.socket],
) -> None:
    env_address, env_sock = abstract_socket
    address, sock = path_socket
    monkeypatch.setenv("NOTIFY_SOCKET", env_address)
    notifier = SystemdNotifier(socket_path=address)
    notifier.watchdog()
    assert received(sock) == ["WATCHDOG=1"]
    assert received(env_sock) == []
    notifier.close()


def test_nothing_without_notify_socket() -> None:
    notifier = SystemdNotifier()
    assert not notifier.enabled
    # every call is a no-op, and none raises
    notifier.ready("x")
    notifier.watchdog()
    notifier.status("x")
    notifier.stopping()
    notifier.close()
    assert not notifier.enabled


def test_empty_notify_socket_means_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "")
    assert not SystemdNotifier().enabled
    assert not SystemdNotifier(socket_path="").enabled


def test_socket_gone_is_not_fatal(
    monkeypatch: pytest.MonkeyPatch, path_socket: tuple[str, socket.socket]
) -> None:
    address, sock = path_socket
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    notifier = SystemdNotifier()
    sock.close()
    os.unlink(address)
    notifier.watchdog()  # systemd went away: logged at debug, never raised
    notifier.status("still running")
    assert notifier.enabled
    notifier.close()


@pytest.mark.parametrize(
    ("value", "interval_s"),
    [
        ("30000000", 30.0),
        ("500000", 0.5),
        ("1", 1e-6),
        ("", None),
        ("abc", None),
        ("-5", None),
        ("1.5", None),
    ],
)
def test_watchdog_usec(
    monkeypatch: pytest.MonkeyPatch, value: str, interval_s: float | None
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", value)
    notifier = SystemdNotifier()
    if interval_s is None:
        assert notifier.watchdog_interval_s is None
    else:
        assert notifier.watchdog_interval_s == pytest.approx(interval_s)


def test_no_watchdog_usec() -> None:
    assert SystemdNotifier().watchdog_interval_s is None
