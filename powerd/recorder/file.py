"""A local line-protocol file, rotated at a size: the demo's, a planning laptop's, a
controller's with no InfluxDB. The planner reads it back."""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from powerd.recorder.transport import OK, Outcome, Result, Transport
from powerd.recorder.writer import BufferedWriter

log = logging.getLogger("powerd.recorder")

DEFAULT_FILE_NAME = "telemetry.lp"
DEFAULT_FILE_MAX_BYTES = 1024 * 10**6  # then rotated: telemetry.1.lp, ...
DEFAULT_FILE_KEEP = 4  # rotated files kept: at most ~5 GB on disk with the default size


def _failed(exc: OSError) -> Result:
    return Result(Outcome.RETRY, str(exc))


class FileTransport(Transport):
    """Appends each batch to ``path`` with ``write(2)`` straight to the file: no buffer in
    the process.

    Why no buffer: a batch is ``OK`` only once the file has it. With a buffer in the
    process, lines were ``OK`` when they reached the buffer, and a full disk (ENOSPC,
    EIO, EFBIG) showed only at a later flush, charged to whichever batch triggered it:
    a full disk lost 14 s of points while the counts said 4 (issue 12). Now the batch
    the disk refuses is the one that fails (a ``RETRY`` result). A batch the disk took
    only part of (a short write, then the error) is cut back out of a regular file, so
    the file holds whole lines and the batch is either in it or counted as not
    written. One ``write(2)`` per batch: the controller writes hundreds of lines at a
    time. ``close`` calls ``fsync``, to report the errors that show only at writeback.

    The directory must exist (``FileNotFoundError`` at construction, naming
    it); the file is created if needed and appended to otherwise.

    Rotation bounds the disk it takes: once the file holds ``max_bytes``, it is
    renamed ``<stem>.1<suffix>`` (``telemetry.1.lp``; an older ``.1`` becomes ``.2``
    and so on, the oldest past ``keep`` deleted) and a new file is started. The
    rotated files keep the ``.lp`` suffix, so ``powerplan profiles telemetry*.lp``
    reads them all. ``max_bytes=None``: never.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int | None = DEFAULT_FILE_MAX_BYTES,
        keep: int = DEFAULT_FILE_KEEP,
    ) -> None:
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"recorder file max_bytes must be positive, not {max_bytes}")
        if keep < 0:
            raise ValueError(f"recorder file keep must be >= 0, not {keep}")
        self.path = Path(path)
        self.target = str(self.path)
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
        self._fd: int | None = self._open()
        self._size = os.fstat(self._fd).st_size

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)

    def send(self, lines: list[str]) -> Result:
        if self._fd is None:  # could not be opened again after rotating: try now
            try:
                self._fd = self._open()
            except OSError as exc:
                return _failed(exc)
            self._size = 0
        data = memoryview(("\n".join(lines) + "\n").encode("utf-8"))
        taken = 0
        try:
            while taken < len(data):
                count = os.write(self._fd, data[taken:])
                if count <= 0:
                    raise OSError(errno.EIO, "write(2) wrote nothing")
                taken += count
        except OSError as exc:
            if taken:
                self._cut_back(self._fd, taken)
            return _failed(exc)
        self._size += taken
        if self.max_bytes is not None and self._size >= self.max_bytes:
            self._rotate()  # the batch is in the file whatever rotating does
        return OK

    def _cut_back(self, fd: int, taken: int) -> None:
        """Remove the ``taken`` bytes of a batch that failed half-way: no half line in the
        file, and no line in it that the counts call not written."""
        try:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and info.st_size >= taken:
                os.ftruncate(fd, info.st_size - taken)
                return
        except OSError:
            pass
        log.error("recorder file %s: a partly written line is left in it", self.path)

    def rotated_path(self, number: int) -> Path:
        return self.path.with_name(f"{self.path.stem}.{number}{self.path.suffix}")

    def _rotate(self) -> None:
        """Close the full file, shift the older ones up, start a new one."""
        fd, self._fd = self._fd, None
        try:
            if fd is not None:
                os.close(fd)
        except OSError as exc:
            log.error("recorder file %s: closing it to rotate: %s", self.path, exc)
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
        self.rotations += 1
        log.info("recorder file %s rotated (%d MB)", self.path, (self.max_bytes or 0) // 10**6)
        try:
            self._fd = self._open()
        except OSError as exc:  # the next send tries again, and fails until it can
            log.warning("cannot open %s after rotating: %s", self.path, exc)

    def close(self) -> Result:
        """``fsync`` (a regular file) and close: a write the disk accepted into its cache
        can still fail when written back (EIO, a network file system's ENOSPC); it
        shows only here."""
        fd, self._fd = self._fd, None
        if fd is None:
            return OK
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.fsync(fd)
            return OK
        except OSError as exc:
            return _failed(exc)
        finally:
            os.close(fd)


class FileRecorder(BufferedWriter):
    """Appends line protocol to a local file: an inline ``BufferedWriter`` (no thread, no
    buffer) over a ``FileTransport``, each ``write`` in the file when it returns.

    A write error (disk full) drops the lines, counts and logs it, once a
    minute; it never reaches the caller. ``close`` says how many points were not
    written. ``flush_interval_s`` is accepted for the other recorders' sake: the
    file holds nothing back to flush.
    """

    transport: FileTransport

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
        transport = FileTransport(path, max_bytes=max_bytes, keep=keep)
        self.path = transport.path
        self.max_bytes = max_bytes
        self.keep = keep
        super().__init__(
            transport,
            inline=True,
            flush_interval_s=flush_interval_s,
            log_interval_s=log_interval_s,
            clock=clock,
        )

    @property
    def rotations(self) -> int:
        return self.transport.rotations

    def rotated_path(self, number: int) -> Path:
        return self.transport.rotated_path(number)

    def __repr__(self) -> str:
        return f"FileRecorder({str(self.path)!r})"
