"""`powerd demo` runs the scripted loop end to end on its embedded broker and exits 0."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_and_shows_failsafe():
    result = subprocess.run(
        [sys.executable, "-m", "powerd", "demo", "--duration", "6", "--no-live"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "ack 1: applied" in out
    assert "clamped on GPU [0]" in out
    assert "mode: failsafe" in out
    assert "max power above cap 0.0 W" in out


def test_demo_refuses_a_too_short_duration():
    result = subprocess.run(
        [sys.executable, "-m", "powerd", "demo", "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "at least 6 s" in result.stderr
