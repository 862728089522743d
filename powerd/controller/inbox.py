"""The newest telemetry payload of every node, waiting to be decoded: the controller's inbox.

Receiving a message costs the controller little (the MQTT client's packet
parsing and one slot write here); decoding and validating it costs more. So
the two are split: every message received is put in its node's slot, and the
control loop takes waiting slots out in the order they first filled, decodes
them and feeds the core, as its time budget allows (``ingest_share``,
docs/CONTROLLER.md). A payload that arrives while its node's slot is still
full replaces the older one: the controller always decides on the newest
sample it has of each node, the memory held is one payload per node whatever
the offered load, and what was replaced is counted as dropped. A slot keeps
its place in the queue when it is refilled, so under overload every node is
decoded in turn and none waits for ever.

The arrival time of a waiting payload counts as the node being heard
(``waiting_arrivals``): a node is stale because it went quiet, not because the
controller has not got round to decoding what it sent.

No I/O and no clock of its own: the receiving side passes the arrival time.
One thread uses it (the controller's event loop).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np


class Waiting(NamedTuple):
    """One node's newest payload, taken out of the inbox to be decoded."""

    server: int  # index of the node in the budgets file's order
    payload: bytes
    arrived: float  # monotonic time the payload was received
    replaced: int  # payloads of this node replaced in the slot before this one was taken


class TelemetryInbox:
    def __init__(self, topics_by_server: Iterable[str]) -> None:
        """``topics_by_server``: each node's telemetry topic, in server order."""
        self._server_of_topic = {topic: i for i, topic in enumerate(topics_by_server)}
        n = len(self._server_of_topic)
        self._payload: list[bytes | None] = [None] * n
        self._arrived = [0.0] * n
        self._replaced = [0] * n
        self._per_node = [0] * n  # payloads received per node since the last count_per_node()
        self._queue: deque[int] = deque()  # servers with a payload, oldest first
        # cumulative counters
        self.received = 0  # payloads put in a slot
        self.replaced = 0  # payloads replaced by a newer one before they were taken
        self.unknown = 0  # messages on the telemetry topic of a node not in the budgets file

    def __len__(self) -> int:
        """Nodes with a payload waiting."""
        return len(self._queue)

    def put(self, topic: str, payload: bytes, arrived: float) -> int | None:
        """File a message; the node's server index, or None for a topic of no known node."""
        server = self._server_of_topic.get(topic)
        if server is None:
            self.unknown += 1
            return None
        self.received += 1
        self._per_node[server] += 1
        if self._payload[server] is None:
            self._queue.append(server)
        else:
            self._replaced[server] += 1
            self.replaced += 1
        self._payload[server] = payload
        self._arrived[server] = arrived
        return server

    def take(self, limit: int) -> list[Waiting]:
        """Up to ``limit`` waiting payloads, the longest-waiting nodes first."""
        out: list[Waiting] = []
        queue, payloads = self._queue, self._payload
        for _ in range(min(limit, len(queue))):
            server = queue.popleft()
            payload = payloads[server]
            assert payload is not None
            payloads[server] = None
            out.append(Waiting(server, payload, self._arrived[server], self._replaced[server]))
            self._replaced[server] = 0
        return out

    def count_per_node(self) -> np.ndarray:
        """Payloads received per node since the last call (a node sending faster than its
        period shows here, whatever the slot kept of it)."""
        counts = np.array(self._per_node, dtype=np.int64)
        self._per_node = [0] * len(self._per_node)
        return counts

    def waiting_arrivals(self) -> tuple[np.ndarray, np.ndarray]:
        """Servers with a payload still waiting, and when each was received."""
        servers = np.fromiter(self._queue, dtype=np.int64, count=len(self._queue))
        arrived = np.array(self._arrived, dtype=float)[servers]
        return servers, arrived
