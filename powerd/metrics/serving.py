"""A daemon's ``/metrics`` for the length of a block, if configured: one shape for the
agent, the controller and the coordinator. Imports nothing of prometheus_client: a daemon
without ``[metrics] listen`` never loads it (~60 ms at start)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol


class Endpoint(Protocol):
    def close(self) -> None: ...


@contextmanager
def serving(listen: str | None, start: Callable[[str], Endpoint | None]) -> Iterator[None]:
    """``start(listen)`` (None: metrics off) before the block, the endpoint closed after it;
    ``start`` returns None when it could not bind (it logs why; the daemon runs on)."""
    endpoint = None if listen is None else start(listen)
    try:
        yield
    finally:
        if endpoint is not None:
            endpoint.close()
