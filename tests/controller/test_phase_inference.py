"""PowerHistory on its own: the ring of per-GPU power, and what it leaves out."""

from __future__ import annotations

import numpy as np

from powerd.controller.node_views import NodeViews
from powerd.controller.phase_inference import PowerHistory, gpus_on
from tests.controller.controller_parts import parts


def test_gpus_on_lists_each_servers_run_of_gpus_in_order() -> None:
    tree = parts().tree
    assert list(gpus_on(tree, np.array([4, 1]))) == [8, 9, 2, 3]
    assert list(gpus_on(tree, np.array([], dtype=np.intp))) == []


def test_the_ring_leaves_out_silent_gpus_and_gpus_held_by_their_caps() -> None:
    p = parts(infer_window_s=3.0, cycle_s=1.0)
    views = NodeViews(p.tree, p.settings, p.clock, p.log_once, p.reject)
    history = PowerHistory(p.tree.n_gpus, p.settings)
    views.power_w[:] = 300.0
    views.cap_w[:] = 700.0
    views.cap_w[0] = 310.0  # capped, drawing its cap: says nothing of its phase
    heard = np.full(p.tree.n_servers, p.clock.t)
    heard[4] = -np.inf  # k3-n1: silent
    history.remember(p.clock.t, heard, views)
    column = history._history_w[:, 0]
    assert np.isnan(column[0]) and column[1] == 300.0
    assert np.isnan(column[8:10]).all()
    for _ in range(3):  # a ring of three columns
        history.remember(p.clock.t, heard, views)
    assert history._history_w.shape == (p.tree.n_gpus, 3) and history._history_next == 1


def test_no_history_is_kept_without_inference() -> None:
    p = parts(infer_phases=False)
    assert PowerHistory(p.tree.n_gpus, p.settings)._history_w.shape == (p.tree.n_gpus, 0)
