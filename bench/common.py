"""What every benchmark reports besides its numbers: the machine and how to print results."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from powerd.click_types import SAFETY_CHOICES, SAFETY_HELP

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU time (user + system) a process has used so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def mem_mb(pid: int) -> tuple[float, float]:
    """Resident memory now and at its peak (VmRSS, VmHWM), MB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def machine() -> str:
    """CPU model, core count, Python and numpy versions: enough to compare runs."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    cpu = next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
        platform.machine(),
    )
    return (
        f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, numpy {np.__version__}"
    )


def report(result: dict, json_path: Path | None) -> None:
    """Print the result as JSON, and write it to ``json_path`` when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if json_path:
        json_path.write_text(text + "\n")


@contextlib.contextmanager
def run_dir(name: str, keep: Path | None = None, temp_prefix: str = "") -> Iterator[Path]:
    """Where one run's files go (logs, records, reports): a temporary directory named
    ``<temp_prefix><name>-...`` removed after it, or, with ``keep``, ``keep/<name>`` (made,
    and left for reading)."""
    if keep is None:
        with tempfile.TemporaryDirectory(prefix=f"{temp_prefix}{name}-") as tmp:
            yield Path(tmp)
        return
    out = keep / re.sub(r"[^A-Za-z0-9.-]+", "-", name)
    out.mkdir(parents=True, exist_ok=True)
    yield out


def add_safety_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--safety caps|bands`` (default caps), as ``powerd.click_types.safety_option`` gives
    the click commands: the controller's ``[policy] safety_by_caps``; ``what`` it applies to."""
    parser.add_argument(
        "--safety",
        choices=SAFETY_CHOICES,
        default=SAFETY_CHOICES[0],
        help=f"{what} {SAFETY_HELP} [default: {SAFETY_CHOICES[0]}]",
    )
