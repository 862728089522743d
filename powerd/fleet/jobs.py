"""The fleet simulator's training jobs: whole racks each, announcing their phases in turn.

Each announces ``startup`` with its nodes, then alternates ``compute`` and
``communication``, as ``powerd.jobhook`` would. A job's priority is the vocabulary's
``Priority`` word, as on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

from powerd.vocabulary import PRIORITIES, Phase, Priority

COMM_LOAD = 0.35  # a GPU waiting on a collective draws this share of its compute demand
STARTUP_S = 2.0  # a job announces startup, then compute this much later


@dataclass
class Job:
    name: str
    nodes: list[int]  # the fleet's node numbers
    priority: Priority
    phase: Phase = "startup"
    next_at: float = 0.0  # monotonic time of its next phase change (0: not started)

    def advance(self, now: float, compute_s: float, communication_s: float) -> float:
        """Enter the next phase at ``now``; how long it lasts."""
        if self.next_at == 0.0:  # first call: startup, with the node list
            phase: Phase = "startup"
            last_for = STARTUP_S
        elif self.phase in ("startup", "communication"):
            phase, last_for = "compute", compute_s
        else:
            phase, last_for = "communication", communication_s
        self.phase, self.next_at = phase, now + last_for
        return last_for


def priority_of(name: str) -> Priority:
    """A priority word (ValueError for any other)."""
    if name not in PRIORITIES:
        raise ValueError(f"job priority must be one of {', '.join(PRIORITIES)}, not {name!r}")
    return name


def split_into_jobs(
    count: int, node_racks: list[tuple[int, int]], prefix: str, priority: str | None = None
) -> list[Job]:
    """``count`` jobs of whole racks: the nodes of consecutive racks dealt out in turn
    (``node_racks``: ``(node, rack)`` of each node that takes part, in node order).
    Priorities: ``priority`` for every job, or high, normal, low in turn (None)."""
    if count <= 0:
        return []
    by_rack: dict[int, list[int]] = {}
    for node, rack in node_racks:
        by_rack.setdefault(rack, []).append(node)
    racks = list(by_rack.values())
    count = min(count, len(racks))
    return [
        Job(
            name=f"{prefix}-job{k:03d}",
            nodes=[n for rack in racks[k::count] for n in rack],
            priority=priority_of(priority or PRIORITIES[k % len(PRIORITIES)]),
        )
        for k in range(count)
    ]
