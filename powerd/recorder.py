"""Where the controller's points go: InfluxDB (v2 or 1.x write API), or a local line-protocol file.

Every recorder takes lines of line protocol (built by ``powerd.telemetry_schema``)
through one interface::

    recorder.write(lines)   # never blocks on the network, never raises
    recorder.flush(timeout_s)   # wait until what was written so far is stored
    recorder.close()
    recorder.written, recorder.buffered, recorder.dropped, recorder.write_errors

``InfluxRecorder`` keeps points in a bounded in-memory buffer and writes them
from its own thread, in batches, through ``influxdb_client``'s synchronous
write API (the library's batching mode gives up on a batch after its retries
and has no bound on what it holds, so the buffering is done here). While the
server cannot be reached the points stay in the buffer, oldest dropped first
past ``max_buffer_points``, and are written when it returns: an outage that
fits in the buffer loses nothing.

``FileRecorder`` appends the same lines to a file (the demo, a planning
laptop, a controller with no InfluxDB); the planner reads it back.

``open_recorder`` turns the configured URL into one of them.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any, Self
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from powerd.backoff import Backoff
from powerd.extras import require

log = logging.getLogger("powerd.recorder")

DEFAULT_FILE_NAME = "telemetry.lp"
DEFAULT_FILE_MAX_BYTES = 1024 * 10**6  # then rotated: telemetry.1.lp, ...
DEFAULT_FILE_KEEP = 4  # rotated files kept: at most ~5 GB on disk with the default size
TOKEN_ENV = "INFLUX_TOKEN"


class Recorder(ABC):
    """Common interface and counters (read them from any thread; they are plain ints).

    - ``written``: points the store (or the file) accepted,
    - ``buffered``: points waiting to be written now,
    - ``dropped``: points given up for good (buffer full, rejected by the
      server as invalid, still buffered when ``close`` gave up, written after ``close``),
    - ``write_errors``: failed write attempts (each a whole batch; a batch that
      failed and was retried counts once per attempt).
    """

    def __init__(self) -> None:
        self.written = 0
        self.dropped = 0
        self.write_errors = 0

    @property
    def buffered(self) -> int:
        return 0

    @abstractmethod
    def write(self, lines: Iterable[str | None]) -> None:
        """Queue lines of line protocol (no trailing newline). ``None`` and empty lines are skipped.

        Never blocks on I/O and never raises: whatever goes wrong is counted and logged.
        """

    @abstractmethod
    def flush(self, timeout_s: float | None = 10.0) -> bool:
        """Wait until every line written before the call is stored; True if it was.

        Blocks for at most ``timeout_s`` (None: until done), the only call that may wait.
        """

    @abstractmethod
    def close(self, timeout_s: float | None = None) -> None:
        """Flush (for at most ``timeout_s``) and release everything. Idempotent."""

    def stats(self) -> dict[str, int]:
        return {
            "written": self.written,
            "buffered": self.buffered,
            "dropped": self.dropped,
            "write_errors": self.write_errors,
        }

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _clean(lines: Iterable[str | None]) -> list[str]:
    """The lines as a list of single lines; one string may hold several (a document)."""
    out: list[str] = []
    for line in lines:
        if not line or not isinstance(line, str):
            continue
        if "\n" in line:
            out.extend(part for part in line.split("\n") if part.strip())
        else:
            out.append(line)
    return out


class _RateLimitedLog:
    """One log line per ``interval_s`` for a recurring condition, with a running count."""

    def __init__(self, interval_s: float, clock: Callable[[], float]) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None
        self.count_since = 0

    def due(self, count: int = 1) -> bool:
        """Add ``count`` to the tally; True once per interval (then log ``take()``)."""
        self.count_since += count
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        return True

    def take(self) -> int:
        count, self.count_since = self.count_since, 0
        return count


# --- InfluxDB ---------------------------------------------------------------------


class InfluxRecorder(Recorder):
    """Writes to InfluxDB 2.x / 3.x (anything with ``/api/v2/write``) from its own thread.

    The buffer is a deque of lines. The writer thread sends the oldest
    ``batch_size`` lines when that many are waiting, when the oldest has
    waited ``flush_interval_s``, or when asked to flush; it removes them only
    once the server has accepted them. A failed write (server unreachable,
    timeout, 5xx, 429, 401/403/404) leaves them in place and is retried after
    an exponential backoff (``retry_min_s`` .. ``retry_max_s``, jittered); a
    batch the server rejects as invalid (400, 422) is dropped, since sending it
    again cannot succeed; on 413 the batch is halved. ``write`` only appends
    to the deque under a lock: it never waits for the network. Past
    ``max_buffer_points`` the oldest lines are dropped, counted, and logged
    once per ``log_interval_s``.
    """

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
        super().__init__()
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if max_buffer_points < batch_size:
            raise ValueError("max_buffer_points must be at least batch_size")
        if not flush_interval_s > 0 or not timeout_s > 0:
            raise ValueError("flush_interval_s and timeout_s must be positive")
        self.url = url
        self.org = org
        self.bucket = bucket
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.max_buffer_points = max_buffer_points
        self.close_timeout_s = close_timeout_s
        self.rejected = 0  # points the server refused as invalid (also in `dropped`)
        self._clock = clock
        self._connect(token, timeout_s, gzip)
        self._backoff = Backoff(retry_min_s, max(retry_min_s, retry_max_s))
        self._buffer: collections.deque[str] = collections.deque()
        self._head = 0  # sequence number of _buffer[0]; a line's number never changes
        self._flush_to = 0  # lines numbered below this: flush them now
        self._oldest_at: float | None = None  # when the buffer last went from empty to not
        self._retry_at = 0.0
        self._send_limit = batch_size  # lowered after a 413
        self._closing = False
        self._closed = False
        self._close_deadline = math.inf
        self._cond = threading.Condition()
        self._drop_log = _RateLimitedLog(log_interval_s, clock)
        self._error_log = _RateLimitedLog(log_interval_s, clock)
        self._reject_log = _RateLimitedLog(log_interval_s, clock)
        self._failing_since: float | None = None
        self._thread = threading.Thread(target=self._run, name="powerd-recorder", daemon=True)
        self._thread.start()

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def __repr__(self) -> str:
        return f"InfluxRecorder({self.url!r}, org={self.org!r}, bucket={self.bucket!r})"

    def _connect(self, token: str | None, timeout_s: float, gzip: bool) -> None:
        # imported here: the file recorder (the demo) does not need it
        require("recorder", "recording to InfluxDB's v2 write API")
        from influxdb_client import InfluxDBClient, WritePrecision
        from influxdb_client.client.write_api import SYNCHRONOUS

        self._client = InfluxDBClient(
            url=self.url,
            token=token or "",
            org=self.org,
            timeout=int(timeout_s * 1000),
            enable_gzip=gzip,
            # no urllib3 retries: a failed batch goes back to our buffer and our backoff
            retries=False,
        )
        self._write_api = self._client.write_api(write_options=SYNCHRONOUS)
        self._precision = WritePrecision.NS

    def _close_client(self) -> None:
        self._client.close()

    # --- caller side ----------------------------------------------------------------

    def write(self, lines: Iterable[str | None]) -> None:
        try:
            batch = _clean(lines)
            if not batch:
                return
            with self._cond:
                if self._closing:
                    self.dropped += len(batch)
                    if self._drop_log.due(len(batch)):
                        log.warning("%s is closed: dropped %d points", self, self._drop_log.take())
                    return
                was_empty = not self._buffer
                if was_empty:
                    self._oldest_at = self._clock()
                self._buffer.extend(batch)
                over = len(self._buffer) - self.max_buffer_points
                if over > 0:
                    self._drop_oldest(over)
                # wake the writer: a batch is due, or it must start timing flush_interval_s
                if was_empty or len(self._buffer) >= self._send_limit:
                    self._cond.notify_all()
        except Exception:  # never raise into the controller's loop
            log.exception("recorder: could not queue points")

    def _drop_oldest(self, count: int) -> None:
        buffer = self._buffer
        if count >= len(buffer):
            count = len(buffer)
            buffer.clear()
        else:
            for _ in range(count):
                buffer.popleft()
        self._head += count
        self.dropped += count
        if self._drop_log.due(count):
            log.warning(
                "recorder buffer full (%d points): dropped the %d oldest points in the last %.0f s"
                " (%s unreachable?)",
                self.max_buffer_points,
                self._drop_log.take(),
                self._drop_log.interval_s,
                self.url,
            )

    def flush(self, timeout_s: float | None = 10.0) -> bool:
        """Send what is buffered now, without waiting for a full batch or the backoff."""
        try:
            with self._cond:
                target = self._head + len(self._buffer)
                self._flush_to = max(self._flush_to, target)
                self._retry_at = 0.0  # one attempt now, backoff or not
                self._cond.notify_all()
                return self._cond.wait_for(
                    lambda: self._head >= target or self._closed, timeout_s
                ) and (self._head >= target)
        except Exception:
            log.exception("recorder: flush failed")
            return False

    def close(self, timeout_s: float | None = None) -> None:
        if timeout_s is None:
            timeout_s = self.close_timeout_s
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._close_deadline = self._clock() + timeout_s
            self._flush_to = self._head + len(self._buffer)
            self._retry_at = 0.0
            self._cond.notify_all()
        # a batch still in flight past the deadline is abandoned (the thread is a daemon);
        # if it lands after all, its points move from `dropped` to `written`
        self._thread.join(timeout_s)
        with self._cond:
            left = len(self._buffer)
            if left:
                self._buffer.clear()
                self._head += left
                self.dropped += left
                log.warning(
                    "recorder closed with %d points not written to %s (dropped)", left, self.url
                )
            self._closed = True
            self._cond.notify_all()
        try:
            self._close_client()
        except Exception:
            log.debug("closing the InfluxDB client", exc_info=True)

    # --- writer thread ----------------------------------------------------------------

    def _next_batch(self) -> tuple[int, list[str]] | None:
        """Wait (holding the condition) until a batch is due; None when the thread should stop."""
        while True:
            now = self._clock()
            waiting = len(self._buffer)
            if self._closing and (waiting == 0 or now >= self._close_deadline):
                return None
            if waiting and now >= self._retry_at:
                due = (
                    waiting >= self._send_limit
                    or self._head < self._flush_to
                    or self._closing
                    or (
                        self._oldest_at is not None
                        and now - self._oldest_at >= self.flush_interval_s
                    )
                )
                if due:
                    count = min(waiting, self._send_limit)
                    return self._head, list(itertools.islice(self._buffer, count))
            # sleep until the next thing that could make a batch due
            wake = math.inf
            if waiting:
                wake = max(self._retry_at, (self._oldest_at or now) + self.flush_interval_s)
            if self._closing:
                wake = min(wake, self._close_deadline)
            self._cond.wait(None if wake == math.inf else max(0.001, wake - now))

    def _run(self) -> None:
        while True:
            with self._cond:
                job = self._next_batch()
            if job is None:
                return
            start, lines = job
            outcome, detail = self._send(lines)
            if outcome == "too_large" and len(lines) == 1:
                outcome = "rejected"  # one point too large: it never fits
            with self._cond:
                self._settle(start, lines, outcome, detail)
                self._cond.notify_all()

    def _send(self, lines: list[str]) -> tuple[str, Any]:
        try:
            self._write_api.write(
                bucket=self.bucket,
                org=self.org,
                record="\n".join(lines),
                write_precision=self._precision,  # type: ignore[arg-type]  # typed str there
            )
            return "ok", None
        except Exception as exc:
            return _outcome(exc)

    def _settle(self, start: int, lines: list[str], outcome: str, detail: Any) -> None:
        end = start + len(lines)
        # lines the overflow dropped while the batch was in flight are gone from the deque
        gone = max(0, min(self._head, end) - start)
        if outcome in ("ok", "rejected"):
            keep = max(0, end - self._head)
            for _ in range(keep):
                self._buffer.popleft()
            self._head += keep
            if self._failing_since is not None:
                log.info(
                    "writing to %s again after %.0f s of errors; %d points still buffered,"
                    " %d dropped so far",
                    self.url,
                    self._clock() - self._failing_since,
                    len(self._buffer),
                    self.dropped,
                )
                self._failing_since = None
            if outcome == "ok":
                self.written += len(lines)
                self.dropped -= gone  # counted as dropped, but they made it
            else:
                self.rejected += len(lines)
                self.dropped += keep
                self.write_errors += 1
                if self._reject_log.due(len(lines)):
                    log.error(
                        "%s rejected %d points as invalid in the last %.0f s (dropped): %s",
                        self.url,
                        self._reject_log.take(),
                        self._reject_log.interval_s,
                        _describe(detail),
                    )
            self._backoff.reset()
            self._retry_at = 0.0
            self._oldest_at = self._clock() if self._buffer else None
            if self._send_limit < self.batch_size and outcome == "ok":
                self._send_limit = min(self.batch_size, self._send_limit * 2)
        elif outcome == "too_large":
            self._send_limit = max(1, len(lines) // 2)
            log.warning("%s: batch of %d points too large; halving it", self.url, len(lines))
        else:
            exc, retry_after = detail
            self.write_errors += 1
            delay_s = self._backoff.next_delay_s()
            if retry_after is not None:
                delay_s = max(delay_s, min(retry_after, self._backoff.max_s))
            self._retry_at = self._clock() + delay_s
            if self._failing_since is None:
                self._failing_since = self._clock()
            if self._error_log.due():
                log.warning(
                    "cannot write to %s (%d failed attempts in the last %.0f s): %s;"
                    " %d points buffered, retrying",
                    self.url,
                    self._error_log.take(),
                    self._error_log.interval_s,
                    _describe(exc),
                    len(self._buffer),
                )


def _outcome(exc: BaseException) -> tuple[str, Any]:
    """A failed write as (outcome, detail) for ``_settle``, from its HTTP status if it has one."""
    status = getattr(exc, "status", None)
    if status in (400, 422):
        return "rejected", exc
    if status == 413:
        return "too_large", exc
    retry_after = None
    headers = getattr(exc, "headers", None)
    if status in (429, 503) and headers is not None:
        try:
            retry_after = float(headers.get("Retry-After"))
        except (TypeError, ValueError):
            retry_after = None
    return "failed", (exc, retry_after)


class HttpStatusError(Exception):
    """An error status from the server, shaped like influxdb-client's exceptions."""

    def __init__(self, status: int, body: str, headers: Any) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body
        self.headers = headers


class Influx1Recorder(InfluxRecorder):
    """Writes to InfluxDB 1.x's ``/write?db=DB[&rp=RP]``: 1.6 and 1.7 (Debian's ``influxdb``)
    have no v2 write API. Buffering, batching, retries and drops are ``InfluxRecorder``'s.

    ``token`` ``user:password`` is sent as HTTP basic auth; none when auth is off.
    """

    def __init__(
        self,
        url: str,
        token: str | None,
        database: str,
        retention_policy: str | None = None,
        **options: Any,
    ) -> None:
        self.database = database
        self.retention_policy = retention_policy or None
        bucket = database + (f"/{retention_policy}" if retention_policy else "")
        super().__init__(url, token, "", bucket, **options)

    def __repr__(self) -> str:
        return f"Influx1Recorder({self.url!r}, db={self.bucket!r})"

    def _connect(self, token: str | None, timeout_s: float, gzip: bool) -> None:
        import base64
        from urllib.parse import urlencode

        query = {"db": self.database, "precision": "ns"}
        if self.retention_policy:
            query["rp"] = self.retention_policy
        self._write_url = f"{self.url}/write?{urlencode(query)}"
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

    def _close_client(self) -> None:
        pass

    def _send(self, lines: list[str]) -> tuple[str, Any]:
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
            return "ok", None
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")
            return _outcome(HttpStatusError(exc.code, text, exc.headers))
        except Exception as exc:
            return _outcome(exc)


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status is not None:
        body = (getattr(exc, "body", None) or getattr(exc, "reason", "") or "").strip()
        if isinstance(body, bytes):
            body = body.decode("utf-8", "replace")
        return f"HTTP {status}: {str(body)[:300]}"
    text = str(exc)
    return f"{type(exc).__name__}: {text[:300]}"


# --- file --------------------------------------------------------------------------


class FileRecorder(Recorder):
    """Appends line protocol to a local file; flushed to the OS every ``flush_interval_s``.

    The directory must exist (``FileNotFoundError`` at construction, naming
    it); the file is created if needed and appended to otherwise. A write
    error (disk full) drops the lines, counts and logs it, once a minute; it
    never reaches the caller.

    Rotation bounds the disk it takes: once the file holds ``max_bytes`` (about:
    counted in characters), it is renamed ``<stem>.1<suffix>`` (``telemetry.1.lp``;
    an older ``.1`` becomes ``.2`` and so on, the oldest past ``keep`` deleted)
    and a new file is started. The rotated files keep the ``.lp`` suffix, so
    ``powerplan profiles telemetry*.lp`` reads them all. ``max_bytes=None``: never.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        flush_interval_s: float = 1.0,
        log_interval_s: float = 60.0,
        max_bytes: int | None = DEFAULT_FILE_MAX_BYTES,
        keep: int = DEFAULT_FILE_KEEP,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"recorder file max_bytes must be positive, not {max_bytes}")
        if keep < 0:
            raise ValueError(f"recorder file keep must be >= 0, not {keep}")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.keep = keep
        self.rotations = 0
        directory = self.path.parent
        if not directory.is_dir():
            raise FileNotFoundError(
                f"recorder file {self.path}: directory {directory} does not exist"
            )
        if self.path.is_dir():
            raise IsADirectoryError(f"recorder file {self.path} is a directory")
        self.flush_interval_s = flush_interval_s
        self._clock = clock
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8", buffering=1 << 16)
        self._size = self.path.stat().st_size
        self._lock = threading.Lock()
        self._last_flush = clock()
        self._error_log = _RateLimitedLog(log_interval_s, clock)

    def __repr__(self) -> str:
        return f"FileRecorder({str(self.path)!r})"

    def write(self, lines: Iterable[str | None]) -> None:
        try:
            batch = _clean(lines)
            if not batch:
                return
            with self._lock:
                if self._file is None:
                    self.dropped += len(batch)
                    return
                try:
                    text = "\n".join(batch) + "\n"
                    self._file.write(text)
                    self._size += len(text)
                    if self.max_bytes is not None and self._size >= self.max_bytes:
                        self._rotate()
                    now = self._clock()
                    if now - self._last_flush >= self.flush_interval_s:
                        self._last_flush = now
                        self._file.flush()
                    self.written += len(batch)
                except OSError as exc:
                    self._failed(len(batch), exc)
        except Exception:
            log.exception("recorder: could not write points to %s", self.path)

    def rotated_path(self, number: int) -> Path:
        return self.path.with_name(f"{self.path.stem}.{number}{self.path.suffix}")

    def _rotate(self) -> None:
        """Close the full file, shift the older ones up, start a new one (lock held)."""
        assert self._file is not None
        self._file.close()
        self._file = None
        try:
            if self.keep == 0:
                self.path.unlink(missing_ok=True)
            else:
                self.rotated_path(self.keep).unlink(missing_ok=True)
                for number in range(self.keep - 1, 0, -1):
                    older = self.rotated_path(number)
                    if older.exists():
                        older.replace(self.rotated_path(number + 1))
                self.path.replace(self.rotated_path(1))
        except OSError as exc:  # keep appending to the same file; try again after max_bytes
            log.warning("cannot rotate %s: %s; appending to it", self.path, exc)
        self._size = 0
        # if this fails, the caller counts the points dropped and every later write too
        self._file = self.path.open("a", encoding="utf-8", buffering=1 << 16)
        self.rotations += 1
        log.info("recorder file %s rotated (%d MB)", self.path, (self.max_bytes or 0) // 10**6)

    def _failed(self, count: int, exc: OSError) -> None:
        self.write_errors += 1
        self.dropped += count
        if self._error_log.due(count):
            log.warning(
                "cannot write to %s: %s (%d points dropped in the last %.0f s)",
                self.path,
                exc,
                self._error_log.take(),
                self._error_log.interval_s,
            )

    def flush(self, timeout_s: float | None = 10.0) -> bool:
        with self._lock:
            if self._file is None:
                return True
            try:
                self._file.flush()
                self._last_flush = self._clock()
                return True
            except OSError as exc:
                self._failed(0, exc)
                return False

    def close(self, timeout_s: float | None = None) -> None:
        with self._lock:
            if self._file is None:
                return
            file, self._file = self._file, None
            try:
                file.close()  # flushes
            except OSError as exc:
                self._failed(0, exc)


# --- configuration -------------------------------------------------------------------

_INFLUX_SCHEMES = {
    "influx+http": "http",
    "influx+https": "https",
    "http": "http",
    "https": "https",
    "influx1+http": "http",
    "influx1+https": "https",
}
_INFLUX_OPTIONS: dict[str, Callable[[str], Any]] = {
    "batch_size": int,
    "flush_interval_s": float,
    "max_buffer_points": int,
    "timeout_s": float,
    "retry_min_s": float,
    "retry_max_s": float,
    "gzip": lambda v: v.lower() in ("1", "true", "yes", "on"),
}


def default_file_path() -> Path:
    """Where points go with nothing configured: ``$STATE_DIRECTORY`` (systemd's
    ``StateDirectory=powerd``, i.e. /var/lib/powerd), else ``$XDG_STATE_HOME/powerd``,
    else ``~/.local/state/powerd``; the file is ``telemetry.lp``."""
    state = os.environ.get("STATE_DIRECTORY")
    if state:
        # systemd may list several, colon-separated: the first is ours
        return Path(state.split(":")[0]) / DEFAULT_FILE_NAME
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "powerd" / DEFAULT_FILE_NAME


def open_recorder(
    url: str | os.PathLike[str] | None,
    *,
    token: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Recorder:
    """The recorder a configured ``url`` names.

    - ``influx+http://HOST:PORT[/PREFIX]?org=ORG&bucket=BUCKET`` (or
      ``influx+https://``, or plain ``http://`` / ``https://``): InfluxDB's v2
      write API at that address (``/api/v2/write`` is appended). ``org`` and
      ``bucket`` are required; optional: ``batch_size``, ``flush_interval_s``,
      ``max_buffer_points``, ``timeout_s``, ``retry_min_s``, ``retry_max_s``, ``gzip``.
      The token is never part of the URL (it would end up in logs): ``token``,
      else the first line of ``token_file``, else ``$INFLUX_TOKEN``, else none
      (VictoriaMetrics needs none; InfluxDB 1.8 takes ``user:password``).
    - ``influx1+http://HOST:PORT?db=DB[&rp=POLICY]`` (or ``influx1+https://``): InfluxDB
      1.x's ``/write`` (1.6 and 1.7 have no v2 API); the token, if any, is ``user:password``.
      Same options as above.
    - ``file:///path/x.lp`` or a plain path: ``FileRecorder`` (the directory must exist).
    - ``None`` or empty: ``FileRecorder`` at ``default_file_path()``, its directory created.

    ``options`` go to the recorder's constructor and override the URL's. Raises
    ``ValueError`` (or ``OSError`` for the file) on a configuration error.
    """
    if url is None or str(url).strip() == "":
        path = default_file_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        return FileRecorder(path, **options)
    text = str(url).strip()
    if "://" not in text:
        return FileRecorder(Path(text).expanduser(), **options)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"recorder url {text!r}: a file URL has no host (file:///path)")
        return FileRecorder(Path(parts.path), **options)
    if scheme not in _INFLUX_SCHEMES:
        raise ValueError(
            f"recorder url {text!r}: scheme must be influx+http(s), http(s), influx1+http(s)"
            " or file"
        )
    if not parts.hostname:
        raise ValueError(f"recorder url {text!r} has no host")
    if parts.username or parts.password:
        raise ValueError(
            f"recorder url {_redact(parts)!r}: credentials go in the token, not the URL"
        )
    query: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in query:
            raise ValueError(f"recorder url {text!r}: {key} given twice")
        query[key] = value
    if "token" in query:
        raise ValueError(
            "recorder url: do not put the token in the URL; use token_file or $" + TOKEN_ENV
        )
    v1 = scheme.startswith("influx1+")
    if v1:
        database, policy = query.pop("db", ""), query.pop("rp", "")
        if not database or "org" in query or "bucket" in query:
            raise ValueError(
                f"recorder url {text!r}: InfluxDB 1.x takes db (and rp), not org and bucket:"
                " influx1+http://host:8086?db=powerd"
            )
    else:
        org, bucket = query.pop("org", ""), query.pop("bucket", "")
        if not org or not bucket:
            raise ValueError(
                f"recorder url {text!r} needs org and bucket:"
                " influx+http://host:8086?org=ORG&bucket=BUCKET"
            )
    kwargs: dict[str, Any] = {}
    for key, value in query.items():
        convert = _INFLUX_OPTIONS.get(key)
        if convert is None:
            known = ", ".join([*(("db", "rp") if v1 else ("org", "bucket")), *_INFLUX_OPTIONS])
            raise ValueError(f"recorder url: unknown option {key!r} (known: {known})")
        try:
            kwargs[key] = convert(value)
        except ValueError:
            raise ValueError(f"recorder url: {key}={value!r} is not valid") from None
    kwargs.update(options)
    if token is None:
        token = read_token(token_file, "recorder token file")
    base = urlunsplit((_INFLUX_SCHEMES[scheme], parts.netloc, parts.path.rstrip("/"), "", ""))
    try:
        if v1:
            return Influx1Recorder(base, token, database, policy or None, **kwargs)
        return InfluxRecorder(base, token, org, bucket, **kwargs)
    except TypeError as exc:
        raise ValueError(f"recorder: {exc}") from None


def read_token(token_file: str | os.PathLike[str] | None, what: str = "token file") -> str | None:
    """An InfluxDB token: the first line of ``token_file``, else ``$INFLUX_TOKEN``, else None.

    Kept out of URLs and command lines, which end up in logs and ``ps``. An empty
    file or first line means no token. ``ValueError`` naming the file if it
    cannot be read.
    """
    if token_file is None:
        return os.environ.get(TOKEN_ENV) or None
    try:
        lines = Path(token_file).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"{what} {token_file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what} {token_file}: not UTF-8 text") from None
    return (lines[0].strip() if lines else "") or None


def _redact(parts: Any) -> str:
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
