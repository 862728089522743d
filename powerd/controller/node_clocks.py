"""The nodes' clocks as the controller sees them: each node's skew from its telemetry.

A telemetry sample carries the node's wall-clock ``ts``; the controller knows when it
received it (monotonic) and where its own wall clock stood then. Their difference is
the node's skew plus a few milliseconds of delivery. Nothing in the control loop depends
on it (liveness is by receipt, a node's own timestamps are compared only with each
other), but a node whose clock is off by more than ``max_clock_skew_s`` refuses the
controller's heartbeats as from the future (or its recorded points land at the wrong
time), and the operator needs to know which node, not that "some agent" raised a clock
alarm. Pure: arrays in, numbers out.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class NodeClocks(NamedTuple):
    skew_s: float | None  # the largest in magnitude, signed: this clock minus the node's
    worst: int | None  # whose (server index)
    skewed: int  # nodes more than the bound off, either way


def node_clocks(
    received_mono: np.ndarray,
    sample_ts: np.ndarray,
    heard: np.ndarray,
    wall_minus_mono_s: float,
    max_skew_s: float,
) -> NodeClocks:
    """Per node: when its last sample was received (monotonic), that sample's ``ts`` (its
    wall clock), and whether it counts (``heard``: fresh, its sample decoded);
    ``wall_minus_mono_s``: this host's wall clock minus its monotonic one, now."""
    nodes = np.flatnonzero(heard)
    if not len(nodes):
        return NodeClocks(None, None, 0)
    skew_s = received_mono[nodes] + wall_minus_mono_s - sample_ts[nodes]
    off_s = np.abs(skew_s)
    at = int(np.argmax(off_s))
    return NodeClocks(float(skew_s[at]), int(nodes[at]), int(np.count_nonzero(off_s > max_skew_s)))
