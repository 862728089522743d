"""Real time-series servers for the test suite: VictoriaMetrics on a free port, and a scripted
``/api/v2/write`` endpoint for the answers VictoriaMetrics never gives (400, 413, 503, silence).

VictoriaMetrics (Debian's ``victoria-metrics``) speaks InfluxDB's v2 write API
and exports what it stored. It names each stored series
``{measurement}_{field}`` (``gpu_power_w``), keeps tags as labels, stores
integers and booleans as numbers (``1i`` → 1, ``true`` → 1), drops string
field values (stored as 0), keeps timestamps to the millisecond, and
unescapes line protocol the InfluxDB 2.x way (``\\\\`` → ``\\``). It answers
204 even for lines it cannot parse (it logs and skips them).
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.servers import ServerProcess, find_program, free_port

VICTORIA_METRICS_CANDIDATES = ("victoria-metrics", "/usr/bin/victoria-metrics")


def find_victoria_metrics() -> str:
    return find_program(VICTORIA_METRICS_CANDIDATES, "victoria-metrics")


@dataclass
class Series:
    """One exported series: its metric name, labels, and samples (timestamps in ms)."""

    name: str
    labels: dict[str, str]
    values: list[float]
    timestamps_ms: list[int]


class VictoriaMetrics(ServerProcess):
    """One VictoriaMetrics process with its own data directory, on a free port kept across restarts."""

    name = "victoria-metrics"
    marker = "tsdb"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.data_dir = workdir / "victoria-metrics-data"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def recorder_url(self, org: str = "powerd", bucket: str = "telemetry", **options: Any) -> str:
        """The ``open_recorder`` URL for this server (VictoriaMetrics ignores org and bucket)."""
        query = urllib.parse.urlencode({"org": org, "bucket": bucket, **options})
        return f"influx+http://127.0.0.1:{self.port}?{query}"

    def command(self) -> list[str]:
        return [
            find_victoria_metrics(),
            f"-httpListenAddr=127.0.0.1:{self.port}",
            f"-storageDataPath={self.data_dir}",
            "-retentionPeriod=100y",  # tests may write timestamps of any recent year
            "-search.disableCache",
        ]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as reply:
                return reply.status == 200
        except OSError:
            return False

    # SIGTERM (ServerProcess.stop): VictoriaMetrics writes what it holds in memory first.

    # --- reading back -------------------------------------------------------------------

    def _get(self, path: str, params: dict[str, str] | None = None) -> bytes:
        query = "?" + urllib.parse.urlencode(params) if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as reply:
            return reply.read()

    def force_flush(self) -> None:
        """Make what was just ingested searchable (otherwise up to about a second later)."""
        self._get("/internal/force_flush")

    def export(self, match: str) -> list[Series]:
        """Every series matching a series selector, e.g. ``{__name__=~"gpu_.*"}``."""
        self.force_flush()
        body = self._get("/api/v1/export", {"match[]": match})
        series = []
        for line in body.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            labels = dict(item["metric"])
            name = labels.pop("__name__")
            series.append(Series(name, labels, item["values"], item["timestamps"]))
        return series

    def wait_for(
        self,
        match: str,
        predicate: Callable[[list[Series]], bool],
        timeout_s: float = 10.0,
        interval_s: float = 0.05,
    ) -> list[Series]:
        """Poll ``export(match)`` until ``predicate`` holds; the series then. AssertionError on timeout.

        No event says when VictoriaMetrics has made a write searchable, so this
        polls, briefly and with a deadline.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            series = self.export(match)
            if predicate(series):
                return series
            if time.monotonic() > deadline:
                summary = {s.name: len(s.values) for s in series}
                raise AssertionError(
                    f"{match}: condition not met within {timeout_s} s; samples per metric: {summary}"
                )
            time.sleep(interval_s)

    def wait_for_samples(self, match: str, count: int, timeout_s: float = 10.0) -> list[Series]:
        """Wait until the matching series hold at least ``count`` samples in all."""
        return self.wait_for(match, lambda ss: sum(len(s.values) for s in ss) >= count, timeout_s)


# --- a scripted write endpoint --------------------------------------------------------


@dataclass
class WriteRequest:
    path: str
    headers: dict[str, str]
    body: bytes


class ScriptedWriteServer:
    """An HTTP server on a free port that answers ``POST /api/v2/write`` as told.

    ``answers`` is consumed one per request: an int status, or a (status,
    headers, body) tuple; when empty, ``default`` (204). ``hold`` (an Event)
    stalls every request until set: a server that accepts and never answers.
    Every request is recorded in ``requests``.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.requests: list[WriteRequest] = []
        self.answers: list[int | tuple[int, dict[str, str], bytes]] = []
        self.default: int = 204
        self.hold: threading.Event | None = None
        self.received = threading.Condition()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                with outer.received:
                    outer.requests.append(WriteRequest(self.path, dict(self.headers), body))
                    answer = outer.answers.pop(0) if outer.answers else outer.default
                    outer.received.notify_all()
                if outer.hold is not None:
                    outer.hold.wait()
                status, headers, reply = (answer, {}, b"") if isinstance(answer, int) else answer
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self.hold is not None:
            self.hold.set()
        self._server.shutdown()
        self._server.server_close()

    def lines(self) -> list[str]:
        """Every line received, in order."""
        return [line for r in self.requests for line in r.body.decode().splitlines() if line]

    def wait_requests(self, count: int, timeout_s: float = 10.0) -> None:
        with self.received:
            if not self.received.wait_for(lambda: len(self.requests) >= count, timeout_s):
                raise AssertionError(
                    f"{len(self.requests)} write requests within {timeout_s} s, not {count}"
                )


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, what: str = "") -> None:
    """Poll a cheap in-process condition (a recorder counter) with a deadline."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what or predicate}")
        time.sleep(0.005)


INFLUXD_CANDIDATES = ("influxd", "/usr/bin/influxd")


class InfluxDB1(ServerProcess):
    """Debian's InfluxDB 1.x (``influxdb``): the InfluxQL ``/query`` and ``/write`` endpoints.

    Configured through environment variables only (``-config /dev/null``), data
    in the test's directory, HTTP on a free port, the RPC port on another.
    """

    name = "influxd"
    marker = "tsdb"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.rpc_port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [find_program(INFLUXD_CANDIDATES, "influxdb"), "-config", "/dev/null"]

    def env(self) -> dict[str, str]:
        import os

        return dict(
            os.environ,
            INFLUXDB_META_DIR=str(self.workdir / "influx-meta"),
            INFLUXDB_DATA_DIR=str(self.workdir / "influx-data"),
            INFLUXDB_DATA_WAL_DIR=str(self.workdir / "influx-wal"),
            INFLUXDB_HTTP_BIND_ADDRESS=f"127.0.0.1:{self.port}",
            INFLUXDB_BIND_ADDRESS=f"127.0.0.1:{self.rpc_port}",
            INFLUXDB_REPORTING_DISABLED="true",
            INFLUXDB_MONITOR_STORE_ENABLED="false",
            INFLUXDB_HTTP_LOG_ENABLED="false",
        )

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/ping", timeout=1) as reply:
                return reply.status == 204
        except OSError:
            return False

    def create_database(self, name: str) -> None:
        self.query(f"CREATE DATABASE {name}", method="POST")

    def write(self, database: str, lines: bytes) -> None:
        """Line protocol, nanosecond timestamps."""
        url = f"{self.url}/write?db={urllib.parse.quote(database)}&precision=ns"
        with urllib.request.urlopen(url, data=lines, timeout=10) as reply:
            if reply.status != 204:
                raise RuntimeError(f"influxd write: HTTP {reply.status}")

    def query(self, q: str, database: str | None = None, method: str = "GET") -> dict:
        params = {"q": q, "epoch": "ns"}
        if database:
            params["db"] = database
        body = urllib.parse.urlencode(params).encode()
        if method == "POST":
            request = urllib.request.Request(f"{self.url}/query", data=body)
        else:
            request = urllib.request.Request(f"{self.url}/query?{body.decode()}")
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.loads(reply.read())
