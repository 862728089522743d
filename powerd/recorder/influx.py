"""InfluxDB over HTTP: the v2 write API (influxdb-client) and 1.x's ``/write`` (urllib).

Each transport sends one batch per ``send`` and sorts the answer by its HTTP status
(``result_of``): 400 and 422 are ``REJECTED`` (the points are invalid), 413 is
``TOO_LARGE``, anything else that fails (unreachable, timeout, 5xx, 429, 401,
403, 404) is ``RETRY``, with the server's ``Retry-After`` on 429 and 503.
``InfluxRecorder`` and ``Influx1Recorder`` are a ``BufferedWriter`` over each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from powerd.extras import require
from powerd.recorder.transport import OK, Outcome, Result, Transport
from powerd.recorder.writer import BufferedWriter

log = logging.getLogger("powerd.recorder")


class HttpStatusError(Exception):
    """An error status from the server, shaped like influxdb-client's exceptions."""

    def __init__(self, status: int, body: str, headers: Any) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body
        self.headers = headers


def result_of(exc: BaseException) -> Result:
    """A failed write as a ``Result``, from its HTTP status if it has one."""
    status = getattr(exc, "status", None)
    if status in (400, 422):
        return Result(Outcome.REJECTED, describe(exc))
    if status == 413:
        return Result(Outcome.TOO_LARGE, describe(exc))
    retry_after = None
    headers = getattr(exc, "headers", None)
    if status in (429, 503) and headers is not None:
        try:
            retry_after = float(headers.get("Retry-After"))
        except (TypeError, ValueError):
            retry_after = None
    return Result(Outcome.RETRY, describe(exc), retry_after)


def describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status is not None:
        body = (getattr(exc, "body", None) or getattr(exc, "reason", "") or "").strip()
        if isinstance(body, bytes):
            body = body.decode("utf-8", "replace")
        return f"HTTP {status}: {str(body)[:300]}"
    text = str(exc)
    return f"{type(exc).__name__}: {text[:300]}"


def _check_timeout(timeout_s: float) -> None:
    if not timeout_s > 0:
        raise ValueError("timeout_s must be positive")


# --- InfluxDB 2.x / 3.x --------------------------------------------------------------


class Influx2Transport(Transport):
    """``POST /api/v2/write?org=&bucket=&precision=ns`` through influxdb-client's synchronous
    write API, with no retries of its own (a failed batch goes back to the writer)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        org: str,
        bucket: str,
        *,
        timeout_s: float = 10.0,
        gzip: bool = False,
    ) -> None:
        _check_timeout(timeout_s)
        # imported here: the file recorder (the demo, a lean install) does not need it
        require("recorder", "recording to InfluxDB's v2 write API")
        from influxdb_client.client.influxdb_client import InfluxDBClient
        from influxdb_client.client.write_api import SYNCHRONOUS
        from influxdb_client.domain.write_precision import WritePrecision

        self.target = url
        self.org = org
        self.bucket = bucket
        self.client = InfluxDBClient(
            url=url,
            token=token or "",
            org=org,
            timeout=int(timeout_s * 1000),
            enable_gzip=gzip,
            retries=False,
        )
        self._write_api = self.client.write_api(write_options=SYNCHRONOUS)
        self._precision = WritePrecision.NS

    def send(self, lines: list[str]) -> Result:
        try:
            self._write_api.write(
                bucket=self.bucket,
                org=self.org,
                record="\n".join(lines),
                write_precision=self._precision,  # type: ignore[arg-type]  # typed str there
            )
            return OK
        except Exception as exc:
            return result_of(exc)

    def close(self) -> Result:
        try:
            self.client.close()  # type: ignore[no-untyped-call]  # influxdb-client's own
        except Exception:  # nothing is lost with it
            log.debug("closing the InfluxDB client", exc_info=True)
        return OK


class InfluxRecorder(BufferedWriter):
    """Writes to InfluxDB 2.x / 3.x (anything with ``/api/v2/write``) from its own thread:
    a ``BufferedWriter`` over an ``Influx2Transport``."""

    transport: Influx2Transport

    def __init__(
        self,
        url: str,
        token: str | None,
        org: str,
        bucket: str,
        batch_size: int = 5000,
        flush_interval_s: float = 1.0,
        max_buffer_points: int = 1_000_000,
        *,
        timeout_s: float = 10.0,
        retry_min_s: float = 1.0,
        retry_max_s: float = 30.0,
        gzip: bool = False,
        close_timeout_s: float = 5.0,
        log_interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.org = org
        self.bucket = bucket
        transport = Influx2Transport(url, token, org, bucket, timeout_s=timeout_s, gzip=gzip)
        try:
            super().__init__(
                transport,
                batch_size=batch_size,
                flush_interval_s=flush_interval_s,
                max_buffer_points=max_buffer_points,
                retry_min_s=retry_min_s,
                retry_max_s=retry_max_s,
                close_timeout_s=close_timeout_s,
                log_interval_s=log_interval_s,
                clock=clock,
            )
        except BaseException:
            transport.close()
            raise

    def __repr__(self) -> str:
        return f"InfluxRecorder({self.url!r}, org={self.org!r}, bucket={self.bucket!r})"


# --- InfluxDB 1.x ----------------------------------------------------------------------


class Influx1Transport(Transport):
    """``POST /write?db=DB[&rp=RP]&precision=ns``: 1.6 and 1.7 (Debian's ``influxdb``) have no
    v2 write API. ``token`` ``user:password`` is sent as HTTP basic auth; none when auth is off.
    """

    def __init__(
        self,
        url: str,
        token: str | None,
        database: str,
        retention_policy: str | None = None,
        *,
        timeout_s: float = 10.0,
        gzip: bool = False,
    ) -> None:
        import base64
        from urllib.parse import urlencode

        _check_timeout(timeout_s)
        self.target = url
        query = {"db": database, "precision": "ns"}
        if retention_policy:
            query["rp"] = retention_policy
        self._write_url = f"{url}/write?{urlencode(query)}"
        self._timeout_s = timeout_s
        self._gzip = gzip
        self._headers = {"Content-Type": "text/plain; charset=utf-8"}
        if gzip:
            self._headers["Content-Encoding"] = "gzip"
        if token:
            if ":" not in token:
                raise ValueError("an InfluxDB 1.x token is user:password")
            basic = base64.b64encode(token.encode()).decode()
            self._headers["Authorization"] = f"Basic {basic}"

    def send(self, lines: list[str]) -> Result:
        import gzip
        import urllib.error
        import urllib.request

        body = "\n".join(lines).encode("utf-8")
        if self._gzip:
            body = gzip.compress(body)
        request = urllib.request.Request(
            self._write_url, data=body, headers=self._headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as reply:
                reply.read()
            return OK
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")
            return result_of(HttpStatusError(exc.code, text, exc.headers))
        except Exception as exc:
            return result_of(exc)


class Influx1Recorder(BufferedWriter):
    """Writes to InfluxDB 1.x's ``/write?db=DB[&rp=RP]``: a ``BufferedWriter`` (the same
    buffering, batching, retries and drops as ``InfluxRecorder``) over an ``Influx1Transport``.
    ``options`` are the writer's (``batch_size``, ``flush_interval_s``, ...).
    """

    transport: Influx1Transport

    def __init__(
        self,
        url: str,
        token: str | None,
        database: str,
        retention_policy: str | None = None,
        *,
        timeout_s: float = 10.0,
        gzip: bool = False,
        **options: Any,
    ) -> None:
        self.url = url
        self.database = database
        self.retention_policy = retention_policy or None
        transport = Influx1Transport(
            url, token, database, self.retention_policy, timeout_s=timeout_s, gzip=gzip
        )
        try:
            super().__init__(transport, **options)
        except BaseException:
            transport.close()
            raise

    def __repr__(self) -> str:
        db = self.database + (f"/{self.retention_policy}" if self.retention_policy else "")
        return f"Influx1Recorder({self.url!r}, db={db!r})"
