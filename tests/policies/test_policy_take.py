"""policies.take on its own: what rules 3 and 3b of the bands take under a node, and from whom."""

from __future__ import annotations

import numpy as np
import pytest

from policies import HIGH, LOW, NORMAL, SERVER
from policies.take import cut
from tests.support.policy_trees import uniform_tree

SERVER_NODE = 3  # site 0, row 1, rack 2, server 3


def take(need_w: float, pred, priority=NORMAL, ctl=True, floor_w: float = 200.0):
    """Cut ``need_w`` under the one server; returns (idx, taken, pred, cap, node_pred)."""
    tree = uniform_tree(1, 1, 1, 4)
    pred = np.array(pred, dtype=float)
    cap = np.full(4, 1200.0)
    node_pred = tree.node_sum(pred)
    need = np.zeros(tree.n_nodes)
    need[SERVER_NODE] = need_w
    idx, taken = cut(
        tree,
        SERVER,
        need,
        pred,
        cap,
        node_pred,
        np.full(4, floor_w),
        np.broadcast_to(np.asarray(priority, dtype=np.int8), (4,)).copy(),
        np.broadcast_to(np.asarray(ctl, dtype=bool), (4,)).copy(),
    )
    return idx, taken, pred, cap, node_pred


def test_the_biggest_come_down_to_one_level_and_their_caps_follow():
    idx, taken, pred, cap, node_pred = take(400.0, [1000.0, 800.0, 600.0, 400.0])
    np.testing.assert_allclose(pred, [700.0, 700.0, 600.0, 400.0])
    np.testing.assert_allclose(cap, [700.0, 700.0, 1200.0, 1200.0])
    assert sorted(idx.tolist()) == [0, 1]
    np.testing.assert_allclose(taken, 400.0)  # the server and every node above it
    np.testing.assert_allclose(node_pred, 2400.0)


def test_a_lower_class_gives_all_it_can_before_a_higher_one_gives_anything():
    prio = [HIGH, HIGH, LOW, LOW]
    idx, _, pred, _, _ = take(300.0, [1000.0, 1000.0, 600.0, 400.0], priority=prio)
    # LOW holds 400 + 200 W above its floors: it alone gives, water-filled to 150 W above
    np.testing.assert_allclose(pred, [1000.0, 1000.0, 350.0, 350.0])
    assert sorted(idx.tolist()) == [2, 3]
    idx, _, pred, _, _ = take(700.0, [1000.0, 1000.0, 600.0, 400.0], priority=prio)
    np.testing.assert_allclose(pred, [950.0, 950.0, 200.0, 200.0])


def test_never_below_a_floor_nor_from_a_gpu_not_controlled():
    ctl = [True, True, True, False]
    idx, taken, pred, _, _ = take(5000.0, [1000.0, 800.0, 600.0, 1000.0], ctl=ctl)
    np.testing.assert_allclose(pred, [200.0, 200.0, 200.0, 1000.0])
    assert taken[SERVER_NODE] == pytest.approx(800.0 + 600.0 + 400.0)
    assert 3 not in idx.tolist()


def test_a_rounding_need_cuts_nobody():
    idx, taken, pred, _, _ = take(1e-9, [1000.0, 800.0, 600.0, 400.0])
    assert len(idx) == 0 and not taken.any()
    np.testing.assert_allclose(pred, [1000.0, 800.0, 600.0, 400.0])
