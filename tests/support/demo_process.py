"""The shortest demo as its own process, the way a user starts it: shared by the tests that
read what a whole run leaves behind (its summary, its plot, what it recorded)."""

from __future__ import annotations

import subprocess
import sys
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
