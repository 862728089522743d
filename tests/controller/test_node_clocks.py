"""The nodes' clocks as the controller sees them (issue 34: a peer's skew measured, logged,
recorded and shown): each node's skew from its telemetry's ``ts`` on receipt."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from powerd.controller.node_clocks import node_clocks
from tests.controller.test_controller_core import NODES, WALL0, make_bench


def test_the_largest_skew_either_way_is_kept_signed_and_the_ones_past_the_bound_counted():
    received = np.array([10.0, 10.0, 10.0, 10.0])
    # wall - mono = 1000: received at wall 1010; node 1 is 45 s behind, node 2 31 s ahead
    sample_ts = np.array([1010.0, 965.0, 1041.0, 0.0])
    heard = np.array([True, True, True, False])  # node 3 is not live: its clock is no news
    clocks = node_clocks(received, sample_ts, heard, 1000.0, max_skew_s=30.0)
    assert clocks.worst == 1 and clocks.skew_s == pytest.approx(45.0)
    assert clocks.skewed == 2
    nobody = np.zeros(4, dtype=bool)
    assert node_clocks(received, sample_ts, nobody, 1000.0, 30.0) == (None, None, 0)


def test_a_node_whose_clock_is_off_is_recorded_and_named_in_the_log(caplog):
    bench = make_bench(max_clock_skew_s=30.0)
    now_wall = WALL0 + bench.clock.t
    for node in NODES:
        behind_s = 120.0 if node == "k2-n1" else 0.2
        bench.report(node, 300.0, ts=now_wall - behind_s)
    with caplog.at_level(logging.WARNING, logger="powerd.controller"):
        bench.cycle()
    clocks = bench.core.node_clocks
    assert clocks.skewed == 1
    assert clocks.skew_s == pytest.approx(120.0)
    assert bench.topology.tree.server_names[clocks.worst] == "k2-n1"
    assert "k2-n1, by +120.0 s" in caplog.text
    # its clock fixed, the next sample clears it
    bench.report("k2-n1", 300.0, ts=WALL0 + bench.clock.t, seq=2)
    bench.cycle(1.0)
    assert bench.core.node_clocks.skewed == 0
    assert abs(bench.core.node_clocks.skew_s) < 2.0
