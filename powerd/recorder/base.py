"""The recorder interface every caller sees, and its counters."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Self


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
    def close(self, timeout_s: float | None = None) -> int:
        """Flush (for at most ``timeout_s``) and release everything. Idempotent.

        Returns the points not written (``dropped``), which it also logs, at error level."""

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


def clean(lines: Iterable[str | None]) -> list[str]:
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
