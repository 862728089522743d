"""Reloading the budgets file while the controller runs (SIGHUP), with no I/O here.

What may change at run time: every tree node's numbers (limits, budgets, capping
bands, ramp limits, overheads) and the communication clocks. What may not: the
tree's structure (names, parents, servers, GPUs per server, GPU models) and the
failsafe caps (the agents hold their own, from their configs: a plan that
changes them here would no longer describe what a silent node holds). A file
that changes those is refused with what differs; a restart takes it. The new
file is loaded and checked in full first (``load_budgets``, and ``scoped`` for
a leaf): a file that does not load changes nothing.
"""

from __future__ import annotations

import numpy as np

from powerd.topology import Topology

# (Topology column, what an operator calls it) of the numbers a reload may change
_NODE_NUMBERS = (
    ("limit_w", "limit_w"),
    ("budget_w", "budget_w"),
    ("cap_threshold", "cap_threshold"),
    ("cap_target", "cap_target"),
    ("uncap_threshold", "uncap_threshold"),
    ("ramp_w_per_s", "ramp_w_per_s"),
    ("overhead_w", "overhead_w"),
)


def refusal(running: Topology, new: Topology) -> str | None:
    """Why ``new`` cannot replace ``running`` without a restart; None if it can."""
    if new.names != running.names or not np.array_equal(new.parent, running.parent):
        return "the tree's structure differs (nodes added, removed, renamed or moved)"
    if not np.array_equal(new.server_gpu_count, running.server_gpu_count):
        return "a node's GPU count differs"
    if new.server_model != running.server_model:
        return "a node's GPU model differs"
    if not np.array_equal(new.server_failsafe_cap_w, running.server_failsafe_cap_w):
        return (
            "a failsafe cap differs: the agents hold theirs from their own configs; change "
            "both, then restart the controller"
        )
    return None


def changes(running: Topology, new: Topology, most: int = 5) -> list[str]:
    """What a reload changes, for the log: ``name: key old -> new``, at most ``most`` lines
    and a count of the rest."""
    lines: list[str] = []
    total = 0
    for column, key in _NODE_NUMBERS:
        old, now = getattr(running, column), getattr(new, column)
        differ = np.flatnonzero(~((old == now) | (np.isnan(old) & np.isnan(now))))
        total += len(differ)
        for i in differ[: max(0, most - len(lines))].tolist():
            lines.append(f"{running.names[i]}: {key} {old[i]:g} -> {now[i]:g}")
    if running.comm_clock_mhz != new.comm_clock_mhz:
        total += 1
        if len(lines) < most:
            lines.append(
                f"comm_clock_mhz {dict(running.comm_clock_mhz)} -> {dict(new.comm_clock_mhz)}"
            )
    if total > len(lines):
        lines.append(f"and {total - len(lines)} more")
    return lines
