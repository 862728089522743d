"""Real Prometheus and Alertmanager for the suite (Debian's ``prometheus`` and
``prometheus-alertmanager``), each a ``ServerProcess`` on a free port with its data in the
test's directory.

Both carry the ``tsdb`` marker: Prometheus is a time-series store, and Alertmanager runs
only beside it, so a test that starts them is one ``pytest -m "not tsdb"`` leaves out.
Alertmanager runs alone (``--cluster.listen-address=``: no gossip port, which two tests at
once would fight over).
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.support.servers import ServerProcess, find_program

PROMETHEUS_CANDIDATES = ("prometheus", "/usr/bin/prometheus")
ALERTMANAGER_CANDIDATES = ("prometheus-alertmanager", "alertmanager")


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as reply:
            return reply.status == 200
    except OSError:
        return False


class Prometheus(ServerProcess):
    """Prometheus with the config ``config`` (a dict, written to its directory as YAML) and
    any rule files named in ``rule_texts`` (file name: YAML text) written beside it."""

    name = "prometheus"
    marker = "tsdb"

    def __init__(
        self, workdir: Path, config: dict[str, Any], rule_texts: dict[str, str] | None = None
    ) -> None:
        super().__init__(workdir)
        self.config_path = workdir / "prometheus.yml"
        for name, text in (rule_texts or {}).items():
            (workdir / name).write_text(text)
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            find_program(PROMETHEUS_CANDIDATES, "prometheus"),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
        ]

    def ready(self) -> bool:
        return _ready(self.url)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector: [{"metric": {...}, "value": [ts, "v"]}]."""
        doc = _get_json(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        assert doc["status"] == "success", doc
        return list(doc["data"]["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts its rules hold now, pending and firing."""
        return list(_get_json(f"{self.url}/api/v1/alerts")["data"]["alerts"])

    def targets_up(self) -> dict[str, str]:
        """Each active target's scrape URL and health ("up", "down", "unknown")."""
        doc = _get_json(f"{self.url}/api/v1/targets?state=active")
        return {t["scrapeUrl"]: t["health"] for t in doc["data"]["activeTargets"]}


class Alertmanager(ServerProcess):
    """Alertmanager with one route to a receiver that sends nothing: tests read what it
    received through its API (``alerts()``)."""

    name = "alertmanager"
    marker = "tsdb"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.config_path = workdir / "alertmanager.yml"
        config = {
            "route": {"receiver": "nowhere", "group_by": ["alertname"]},
            "receivers": [{"name": "nowhere"}],
        }
        self.config_path.write_text(yaml.safe_dump(config))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            find_program(ALERTMANAGER_CANDIDATES, "prometheus-alertmanager"),
            f"--config.file={self.config_path}",
            f"--storage.path={self.workdir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",
        ]

    def ready(self) -> bool:
        return _ready(self.url)

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts it holds (API v2): each with ``labels``, ``annotations``, ``status``."""
        return list(_get_json(f"{self.url}/api/v2/alerts"))


def poll(
    read: Callable[[], list[dict[str, Any]]],
    predicate: Callable[[list[dict[str, Any]]], bool],
    timeout_s: float,
    what: str,
) -> list[dict[str, Any]]:
    """Poll a server's API until ``predicate`` holds of what it returns (no server says when
    a scrape, an evaluation or a notification happened); AssertionError with the last
    answer on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = read()
        if predicate(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s; last: {got}")
        time.sleep(0.2)
