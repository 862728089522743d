"""A local line-protocol file, rotated at a size: the demo's, a planning laptop's, a
controller's with no InfluxDB. The planner reads it back."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from powerd.recorder.transport import OK, Outcome, Result, Transport
from powerd.recorder.writer import BufferedWriter

log = logging.getLogger("powerd.recorder")

DEFAULT_FILE_NAME = "telemetry.lp"
DEFAULT_FILE_MAX_BYTES = 1024 * 10**6  # then rotated: telemetry.1.lp, ...
DEFAULT_FILE_KEEP = 4  # rotated files kept: at most ~5 GB on disk with the default size


def _failed(exc: OSError) -> Result:
    return Result(Outcome.RETRY, str(exc))


class FileTransport(Transport):
    """Appends each batch to ``path`` (through the process's buffer; ``flush`` empties it).

    The directory must exist (``FileNotFoundError`` at construction, naming
    it); the file is created if needed and appended to otherwise. An
    ``OSError`` (disk full) is a ``RETRY`` result.

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
        self._file: IO[str] | None = self._open()
        self._size = self.path.stat().st_size

    def _open(self) -> IO[str]:
        return self.path.open("a", encoding="utf-8", buffering=1 << 16)

    def send(self, lines: list[str]) -> Result:
        if self._file is None:
            return Result(Outcome.RETRY, "not open (it could not be opened again after rotating)")
        try:
            text = "\n".join(lines) + "\n"
            self._file.write(text)
            self._size += len(text)
            if self.max_bytes is not None and self._size >= self.max_bytes:
                self._rotate()
            return OK
        except OSError as exc:
            return _failed(exc)

    def rotated_path(self, number: int) -> Path:
        return self.path.with_name(f"{self.path.stem}.{number}{self.path.suffix}")

    def _rotate(self) -> None:
        """Close the full file, shift the older ones up, start a new one."""
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
        # if this fails, the batch counts as failed, and every later one too
        self._file = self._open()
        self.rotations += 1
        log.info("recorder file %s rotated (%d MB)", self.path, (self.max_bytes or 0) // 10**6)

    def flush(self) -> Result:
        if self._file is None:
            return OK
        try:
            self._file.flush()
            return OK
        except OSError as exc:
            return _failed(exc)

    def close(self) -> Result:
        file, self._file = self._file, None
        if file is None:
            return OK
        try:
            file.close()  # flushes
            return OK
        except OSError as exc:
            return _failed(exc)


class FileRecorder(BufferedWriter):
    """Appends line protocol to a local file, flushed to the OS every ``flush_interval_s``:
    an inline ``BufferedWriter`` (no thread, no buffer) over a ``FileTransport``.

    A write error (disk full) drops the lines, counts and logs it, once a
    minute; it never reaches the caller.
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
