"""Scraping a daemon's /metrics over HTTP, as Prometheus does, and waiting on what it says."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Series:
    """Every sample at http://127.0.0.1:PORT/metrics, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(series: Series, metric: str, /, **labels: str) -> float:
    return series[(metric, frozenset(labels.items()))]


def scrape_until(
    port: int, predicate: Callable[[Series], bool], what: str, timeout_s: float = 15.0
) -> Series:
    """Scrape until ``predicate`` holds (a refused connection or a series not there yet:
    not yet)."""
    deadline, last = time.monotonic() + timeout_s, None
    while True:
        try:
            last = scrape(port)
            if predicate(last):
                return last
        except (OSError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}; last scrape: {last}")
        time.sleep(0.05)


def spawn(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """``python -m powerd ARGS``, its output in ``log_path``."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "powerd", *args], stdout=log, stderr=subprocess.STDOUT
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
