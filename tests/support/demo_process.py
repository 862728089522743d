"""The shortest demo as its own process, the way a user starts it: shared by the tests that
read what a whole run leaves behind (its summary, its plot, what it recorded)."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SHORTEST_S = 20  # the shortest --duration-s the demo accepts


def run_demo(where: Path, *extra: str, timeout_s: float = 150) -> subprocess.CompletedProcess:
    """``powerd demo --no-live`` for ``SHORTEST_S`` in ``where``, writing its summary to
    ``where/summary.json`` and its plot to ``where/power.png``; ``extra`` options after."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "powerd", "demo", "--duration-s", str(SHORTEST_S)),
            *("--no-live", "--summary-json", str(where / "summary.json")),
            *("--plot", str(where / "power.png"), *extra),
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=where,
    )


@dataclass(frozen=True)
class DemoRun:
    """What the shortest demo left behind, recording to ``where/telemetry.lp``."""

    result: subprocess.CompletedProcess
    where: Path
    started_s: float  # wall clock before it started: every point recorded is later

    @property
    def recorded(self) -> Path:
        return self.where / "telemetry.lp"


def run_recorded_demo(where: Path) -> DemoRun:
    """The shortest demo recording the controller's telemetry to a file: run once for the
    suite (the ``shortest_demo`` fixture of tests/conftest.py), since the demo tests read its
    summary, plot and file, and the Grafana tests load the same file into InfluxDB."""
    started_s = time.time()
    result = run_demo(where, "--record", str(where / "telemetry.lp"), timeout_s=120)
    return DemoRun(result, where, started_s)
