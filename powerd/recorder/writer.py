"""The one buffered writer: points in, batches out through a transport, every outcome counted.

``BufferedWriter`` keeps points in a bounded in-memory buffer and hands them to
its ``Transport`` from its own thread, in batches. It alone decides what a
transport's ``Outcome`` means for the points:

- ``OK``: they are stored (``written``);
- ``RETRY``: they stay in the buffer, and the batch is sent again after an
  exponential backoff (``retry_min_s`` .. ``retry_max_s``, jittered; longer if
  the server asked, up to ``retry_max_s``); each attempt counts in ``write_errors``;
- ``REJECTED``: they can never be stored; dropped and counted (``rejected``,
  ``dropped``, one ``write_errors``), the rest goes on;
- ``TOO_LARGE``: the batch is halved and sent again (a single point too
  large is ``REJECTED``); the size grows back after each success.

With ``inline=True`` there is no buffer and no thread: ``write`` hands each
call's lines to the transport at once, from the caller's thread, for a
transport that never waits on a network (the file). What fails there has
nowhere to wait: ``RETRY`` drops the lines too (``dropped``, ``write_errors``).
``flush_interval_s`` is then how often the transport's own buffer is flushed
(the file has none: what it calls ``OK`` is in the file).

``close`` returns the points not written (``dropped``) and logs them at error level.

Every recurring condition is logged at most once per ``log_interval_s``
(``powerd.ratelimit.LogOncePer``), with how many points or attempts it covers.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable

from powerd.backoff import Backoff
from powerd.ratelimit import LogOncePer
from powerd.recorder.base import Recorder, clean
from powerd.recorder.transport import Outcome, Result, Transport

log = logging.getLogger("powerd.recorder")


class BufferedWriter(Recorder):
    """A ``Recorder`` that buffers, batches and retries, writing through ``transport``.

    The buffer is a deque of lines. The writer thread sends the oldest
    ``batch_size`` lines when that many are waiting, when the oldest has
    waited ``flush_interval_s``, or when asked to flush; it removes them only
    once the transport reports them stored (or refused for good). ``write``
    only appends to the deque under a lock: it never waits for the store.
    Past ``max_buffer_points`` the oldest lines are dropped and counted.
    ``close`` keeps trying for ``close_timeout_s``, then counts what is left
    as dropped. The writer owns the transport and closes it.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        batch_size: int = 5000,
        flush_interval_s: float = 1.0,
        max_buffer_points: int = 1_000_000,
        retry_min_s: float = 1.0,
        retry_max_s: float = 30.0,
        close_timeout_s: float = 5.0,
        log_interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        inline: bool = False,
    ) -> None:
        super().__init__()
        if not inline:
            if batch_size < 1:
                raise ValueError("batch_size must be at least 1")
            if max_buffer_points < batch_size:
                raise ValueError("max_buffer_points must be at least batch_size")
            if not flush_interval_s > 0:
                raise ValueError("flush_interval_s must be positive")
        self.transport = transport
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.max_buffer_points = max_buffer_points
        self.close_timeout_s = close_timeout_s
        self.rejected = 0  # points the store refused as invalid (also in `dropped`)
        self._clock = clock
        self._backoff = Backoff(retry_min_s, max(retry_min_s, retry_max_s))
        self._logs = LogOncePer(log, log_interval_s)
        self._buffer: collections.deque[str] = collections.deque()
        self._head = 0  # sequence number of _buffer[0]; a line's number never changes
        self._flush_to = 0  # lines numbered below this: flush them now
        self._oldest_at: float | None = None  # when the buffer last went from empty to not
        self._last_flush = clock()  # inline: when the transport was last flushed
        self._retry_at = 0.0
        self._send_limit = batch_size  # lowered after TOO_LARGE
        self._closing = False
        self._closed = False
        self._close_deadline = math.inf
        self._cond = threading.Condition()
        self._failing_since: float | None = None
        self._thread: threading.Thread | None = None
        if not inline:
            self._thread = threading.Thread(target=self._run, name="powerd-recorder", daemon=True)
            self._thread.start()

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    @property
    def target(self) -> str:
        return self.transport.target

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target!r})"

    # --- caller side ----------------------------------------------------------------

    def write(self, lines: Iterable[str | None]) -> None:
        try:
            batch = clean(lines)
            if not batch:
                return
            with self._cond:
                if self._closing:
                    self.dropped += len(batch)
                    total = self._logs.tally("dropped", self._clock(), len(batch))
                    if total is not None:
                        log.warning("%s is closed: dropped %d points", self, total)
                    return
                if self._thread is None:
                    self._write_through(batch)
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
            log.exception("recorder: could not queue points for %s", self.target)

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
        total = self._logs.tally("dropped", self._clock(), count)
        if total is not None:
            log.warning(
                "recorder buffer full (%d points): dropped the %d oldest points in the last %.0f s"
                " (%s unreachable?)",
                self.max_buffer_points,
                total,
                self._logs.interval_s,
                self.target,
            )

    def flush(self, timeout_s: float | None = 10.0) -> bool:
        """Send what is buffered now, without waiting for a full batch or the backoff."""
        try:
            with self._cond:
                if self._thread is None:
                    return self._flush_through()
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

    def close(self, timeout_s: float | None = None) -> int:
        if timeout_s is None:
            timeout_s = self.close_timeout_s
        with self._cond:
            if self._closing:
                return self.dropped
            self._closing = True
            self._close_deadline = self._clock() + timeout_s
            self._flush_to = self._head + len(self._buffer)
            self._retry_at = 0.0
            self._cond.notify_all()
        # a batch still in flight past the deadline is abandoned (the thread is a daemon);
        # if it lands after all, its points move from `dropped` to `written`
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._cond:
            left = len(self._buffer)
            if left:
                self._buffer.clear()
                self._head += left
                self.dropped += left
                log.warning(
                    "recorder closed with %d points not written to %s (dropped)", left, self.target
                )
            self._closed = True
            self._cond.notify_all()
        # no send can start now (the thread has stopped, or been abandoned mid-send)
        result = self.transport.close()
        with self._cond:
            if result.outcome is not Outcome.OK:  # not rate-limited: this is the last word
                self.write_errors += 1
                log.error(
                    "closing %s failed: %s (points written before may not be stored)",
                    self.target,
                    result.detail,
                )
            not_written = self.dropped
        # The one line that says how much is missing: the warnings before it are once a
        # minute, and counted a full disk's 14 s of lost points as 4 (issue 12).
        if not_written:
            log.error(
                "%s closed: %d points not written (%d written, %d rejected as invalid)",
                self,
                not_written,
                self.written,
                self.rejected,
            )
        return not_written

    # --- inline: no buffer, no thread ---------------------------------------------------

    def _write_through(self, lines: list[str]) -> None:
        """Hand ``lines`` to the transport now (lock held); flush it if the interval passed."""
        result = self._attempt(lines)
        if result.outcome is Outcome.OK:
            now = self._clock()
            if now - self._last_flush >= self.flush_interval_s:
                self._last_flush = now
                result = self.transport.flush()
        if result.outcome is Outcome.OK:
            self.written += len(lines)
        elif result.outcome is Outcome.RETRY:
            self._lost(len(lines), result)  # no buffer to retry from
        else:
            self.dropped += len(lines)
            self._rejected(len(lines), result)

    def _flush_through(self) -> bool:
        if self._closing:
            return True
        result = self.transport.flush()
        if result.outcome is not Outcome.OK:
            self._lost(0, result)
            return False
        self._last_flush = self._clock()
        return True

    def _lost(self, count: int, result: Result) -> None:
        """A failed write whose ``count`` points are gone (or a failed flush or close: 0)."""
        self.write_errors += 1
        self.dropped += count
        total = self._logs.tally("errors", self._clock(), count)
        if total is not None:
            log.warning(
                "cannot write to %s: %s (%d points dropped in the last %.0f s)",
                self.target,
                result.detail,
                total,
                self._logs.interval_s,
            )

    # --- writer thread ----------------------------------------------------------------

    def _attempt(self, lines: list[str]) -> Result:
        try:
            return self.transport.send(lines)
        except Exception as exc:  # a transport's bug must not end the writer thread
            return Result(Outcome.RETRY, f"{type(exc).__name__}: {str(exc)[:300]}")

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
            result = self._attempt(lines)
            with self._cond:
                self._settle(start, lines, result)
                self._cond.notify_all()

    def _settle(self, start: int, lines: list[str], result: Result) -> None:
        """What the outcome of sending ``lines`` (numbered from ``start``) means (lock held)."""
        outcome = result.outcome
        if outcome is Outcome.TOO_LARGE and len(lines) == 1:
            outcome = Outcome.REJECTED  # one point too large: it never fits
        if outcome is Outcome.OK or outcome is Outcome.REJECTED:
            end = start + len(lines)
            # lines the overflow dropped while the batch was in flight are gone from the deque
            gone = max(0, min(self._head, end) - start)
            keep = max(0, end - self._head)
            for _ in range(keep):
                self._buffer.popleft()
            self._head += keep
            if self._failing_since is not None:
                log.info(
                    "writing to %s again after %.0f s of errors; %d points still buffered,"
                    " %d dropped so far",
                    self.target,
                    self._clock() - self._failing_since,
                    len(self._buffer),
                    self.dropped,
                )
                self._failing_since = None
            if outcome is Outcome.OK:
                self.written += len(lines)
                self.dropped -= gone  # counted as dropped, but they made it
            else:
                self.dropped += keep
                self._rejected(len(lines), result)
            self._backoff.reset()
            self._retry_at = 0.0
            self._oldest_at = self._clock() if self._buffer else None
            if self._send_limit < self.batch_size and outcome is Outcome.OK:
                self._send_limit = min(self.batch_size, self._send_limit * 2)
        elif outcome is Outcome.TOO_LARGE:
            self._send_limit = max(1, len(lines) // 2)
            log.warning("%s: batch of %d points too large; halving it", self.target, len(lines))
        else:
            self.write_errors += 1
            delay_s = self._backoff.next_delay_s()
            if result.retry_after_s is not None:
                delay_s = max(delay_s, min(result.retry_after_s, self._backoff.max_s))
            self._retry_at = self._clock() + delay_s
            if self._failing_since is None:
                self._failing_since = self._clock()
            total = self._logs.tally("errors", self._clock())
            if total is not None:
                log.warning(
                    "cannot write to %s (%d failed attempts in the last %.0f s): %s;"
                    " %d points buffered, retrying",
                    self.target,
                    total,
                    self._logs.interval_s,
                    result.detail,
                    len(self._buffer),
                )

    def _rejected(self, count: int, result: Result) -> None:
        """``count`` points refused as invalid (already counted in ``dropped``)."""
        self.rejected += count
        self.write_errors += 1
        total = self._logs.tally("rejected", self._clock(), count)
        if total is not None:
            log.error(
                "%s rejected %d points as invalid in the last %.0f s (dropped): %s",
                self.target,
                total,
                self._logs.interval_s,
                result.detail,
            )
