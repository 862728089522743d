"""What a transport is: one write of a batch of lines, and what became of it.

A transport (InfluxDB 2.x, InfluxDB 1.x, a file) knows how to send lines and
how to read its store's answer; it does not buffer, retry, count or log.
It sorts every answer into an ``Outcome``; ``powerd.recorder.writer.BufferedWriter``
alone decides what each one means for the points (keep, retry, drop, count).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass


class Outcome(enum.Enum):
    """How one write attempt ended, in the store's terms."""

    OK = "ok"  # stored
    RETRY = "retry"  # nothing stored, for a reason that may pass: unreachable, 5xx, 429, ...
    REJECTED = "rejected"  # refused as invalid (400, 422): the same lines can never succeed
    TOO_LARGE = "too_large"  # the batch is over the store's size limit (413): send fewer


@dataclass(frozen=True)
class Result:
    """An ``Outcome`` and what to log about it."""

    outcome: Outcome
    detail: str = ""  # the error, for the log ("HTTP 400: ...", "OSError: ...")
    retry_after_s: float | None = None  # the server's Retry-After, with RETRY


OK = Result(Outcome.OK)


class Transport(ABC):
    """One store: ``send`` a batch of lines, once. Called from one thread at a time."""

    #: what the logs name: the URL, the file's path
    target: str

    @abstractmethod
    def send(self, lines: list[str]) -> Result:
        """Write ``lines`` (one point each, no newline) in one attempt. Never raises for
        anything the store or the network does: that is the ``Result``."""

    def flush(self) -> Result:
        """Push what ``send`` accepted but holds (a file's buffer) to the store."""
        return OK

    def close(self) -> Result:
        """Release the connection or the file; idempotent."""
        return OK
