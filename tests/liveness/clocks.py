"""Real processes with skewed wall clocks, and what the wire says of leadership and failsafe.

A controller or coordinator process runs under libfaketime (Debian package ``faketime``):
``LD_PRELOAD`` of its library, ``FAKETIME_DONT_FAKE_MONOTONIC=1`` so only the wall clock
(``time.time()``) is moved, and a timestamp file read at every call
(``FAKETIME_NO_CACHE=1``) that a test rewrites to step the clock while it runs
(``SkewedClock.step``: ``+1h``, ``-1h``, ``+0``).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from powerd.protocol import Heartbeat, Telemetry, decode
from tests.support.brokers import MqttProbe, Received
from tests.support.controller_harness import TOPICS, controller_argv, node_of

FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")

needs_faketime = pytest.mark.skipif(
    not FAKETIME_LIB.exists(), reason="libfaketime is not installed (`make deps`: faketime)"
)


@dataclass
class SkewedClock:
    """A wall-clock offset for a process, in a file it reads at every call."""

    path: Path

    def step(self, offset: str) -> None:
        """Set the offset: ``+1h``, ``-1h``, ``+20m``, ``+0``... (faketime's relative form)."""
        self.path.write_text(offset + "\n")

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "LD_PRELOAD": str(FAKETIME_LIB),
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }


def skewed_clock(directory: Path, name: str, offset: str = "+0") -> SkewedClock:
    clock = SkewedClock(directory / f"{name}.faketime")
    clock.step(offset)
    return clock


def spawn(argv: list[str], log: Path, clock: SkewedClock | None = None) -> subprocess.Popen:
    """A process, its output in ``log``, its wall clock ``clock``'s (None: the real one)."""
    env = clock.env() if clock is not None else {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)


def spawn_controller(
    args: list[str], log: Path, clock: SkewedClock | None = None
) -> subprocess.Popen:
    """``python -m powerd controller ARGS`` (signing with the suite's key) on ``clock``."""
    return spawn(controller_argv(args), log, clock)


def stop(proc: subprocess.Popen) -> None:
    """SIGKILL if still running (the tests' own stops come before), then reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def tail(log: Path, chars: int = 2500) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


# --- what the wire says ------------------------------------------------------------------


def leader_beats(messages: list[Received], topic: str = TOPICS.heartbeat) -> list[Heartbeat]:
    """The leader heartbeats sent live (not the retained one a subscriber is handed)."""
    beats = [decode(Heartbeat, m.payload) for m in messages if m.topic == topic and not m.retain]
    return [b for b in beats if b.state == "leader"]


def leaders(messages: list[Received], topic: str = TOPICS.heartbeat) -> list[tuple[str, int]]:
    """Each (controller, epoch) that sent a live leader heartbeat, in order of its first."""
    seen: list[tuple[str, int]] = []
    for beat in leader_beats(messages, topic):
        if (beat.controller, beat.epoch) not in seen:
            seen.append((beat.controller, beat.epoch))
    return seen


@dataclass(frozen=True)
class Sample:
    at: float  # monotonic arrival at the probe
    mode: str
    epoch: int | None


def samples(messages: list[Received], start: int = 0) -> dict[str, list[Sample]]:
    """Every node's telemetry from message ``start`` on: its mode and the epoch it follows."""
    out: dict[str, list[Sample]] = {}
    for m in messages[start:]:
        if m.topic.endswith("/telemetry"):
            t = decode(Telemetry, m.payload, node_of(m.topic))
            out.setdefault(t.node, []).append(Sample(m.at, t.mode, t.epoch))
    return out


def longest_failsafe_s(node_samples: list[Sample]) -> float:
    """The longest run of samples in failsafe (first to first sample out of it)."""
    longest, since = 0.0, None
    for s in node_samples:
        if s.mode == "failsafe" and since is None:
            since = s.at
        elif s.mode != "failsafe" and since is not None:
            longest, since = max(longest, s.at - since), None
    if since is not None and node_samples:
        longest = max(longest, node_samples[-1].at - since)
    return longest


def following(p: MqttProbe, nodes: list[str], epoch: int, after: int) -> bool:
    """Whether every node's newest sample since ``after`` is controlled, under ``epoch``."""
    last = {n: s[-1] for n, s in samples(p.messages, after).items()}
    return all(n in last and (last[n].mode, last[n].epoch) == ("controlled", epoch) for n in nodes)
