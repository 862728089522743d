"""A tree of controllers against one controller, replayed on the same demand (planner.sharded).

The site: ``powerd/data/budgets/tree-3rows.toml``, every GPU wanting its maximum,
row1's GPUs in a high-priority job, row2's normal, row3's low. Its rows' file
budgets (22 kW) are the leaves' safe fallback; the coordinator grants rows up to
their breakers. The one controller gets the same freedom: its rows' budgets at
their 30 kW breakers, so only the site's band takes watts across rows (with the
file's 22 kW rows it would cap every row alike and never look at priorities).

The comparison is the bands' (``BANDS``: the site's band, the racks' bands); under safety
by caps, the default, one controller runs the site to its limit while the coordinator's
pool is its leaves' budgets, and the checks here are its limits (``caps_replays``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from planner.sharded import Replay, replay_single, replay_tree
from policies import PolicySettings
from policies.tree import HIGH, LOW, NORMAL, ROW, SITE
from powerd.topology import parse_budgets
from powerd.topology.scope import parse_scope

TEXT = Path("powerd/data/budgets/tree-3rows.toml").read_text()
TREE_SITE = parse_budgets(TEXT)
ONE_SITE = parse_budgets(TEXT.replace("budget_kw = 22", "budget_kw = 30"))
STEPS, SETTLED = 80, 20  # the last SETTLED steps are the steady state
BANDS = PolicySettings(safety_by_caps=False)


def trace() -> tuple[np.ndarray, np.ndarray]:
    n = TREE_SITE.n_gpus
    demand = np.tile(TREE_SITE.tree.cap_max_w.astype(float), (STEPS, 1))
    row = TREE_SITE.tree.gpu_ancestor[ROW]
    rows = TREE_SITE.tree.level_nodes[ROW]
    priority = np.select([row == rows[0], row == rows[1]], [HIGH, NORMAL], LOW).astype(np.int8)
    assert len(priority) == n
    return demand, priority


def withheld_by_class(replay: Replay, demand: np.ndarray, priority: np.ndarray) -> list[float]:
    short = (demand - replay.power_w)[-SETTLED:].mean(axis=0)
    return [float(short[priority == p].sum()) for p in (HIGH, NORMAL, LOW)]


def replayed(policy: PolicySettings) -> tuple[Replay, Replay, np.ndarray, np.ndarray]:
    demand, priority = trace()
    one = replay_single(ONE_SITE, demand, priority, policy=policy)
    scopes = [parse_scope(r) for r in TREE_SITE.rows]
    tree = replay_tree(TREE_SITE, scopes, demand, priority, period_steps=5, policy=policy)
    return one, tree, demand, priority


@pytest.fixture(scope="module")
def replays() -> tuple[Replay, Replay, np.ndarray, np.ndarray]:
    return replayed(BANDS)


@pytest.fixture(scope="module")
def caps_replays() -> tuple[Replay, Replay, np.ndarray, np.ndarray]:
    return replayed(PolicySettings())


def test_no_node_ever_above_its_limit_in_either(replays):
    one, tree, _, _ = replays
    limit = TREE_SITE.tree.limit_w
    assert np.all(one.node_power_w <= limit + 1e-6)
    assert np.all(tree.node_power_w <= limit + 1e-6)


def test_under_safety_by_caps_no_node_is_ever_above_its_limit_nor_its_caps(caps_replays):
    """The leaves' caps stay within the budgets in force from the first step (their file
    budgets, until a grant): three rows filling their 30 kW breakers would take the site
    6.6 kW over its 75 kW limit before the coordinator's first period."""
    one, tree, _, _ = caps_replays
    site = TREE_SITE.tree
    for replay in (one, tree):
        assert np.all(replay.node_power_w <= site.limit_w + 1e-6)
        caps = np.array([site.node_sum(c) for c in replay.cap_w]) + site.overhead_below_w
        assert np.all(caps <= site.limit_w + 1e-6)


def test_both_bring_the_site_within_its_threshold(replays):
    one, tree, _, _ = replays
    threshold = TREE_SITE.tree.cap_threshold_w[SITE]
    assert threshold == ONE_SITE.tree.cap_threshold_w[SITE]
    assert one.node_power_w[-SETTLED:, SITE].max() <= threshold + 1e-6
    assert tree.node_power_w[-SETTLED:, SITE].max() <= threshold + 1e-6
    # and neither leaves much of the site unused: within 5 % of each other
    assert tree.node_power_w[-1, SITE] == pytest.approx(one.node_power_w[-1, SITE], rel=0.05)


def test_both_cut_low_first_then_normal_and_high_only_where_its_racks_must(replays):
    one, tree, demand, priority = replays
    one_short = withheld_by_class(one, demand, priority)
    tree_short = withheld_by_class(tree, demand, priority)
    for short in (one_short, tree_short):
        assert short[0] <= short[1] + 1e-6 <= short[2] + 2e-6
    # high- and normal-priority GPUs lose only what their own racks' bands take (racks are
    # oversubscribed: 13.6 kW at full power, capping above 11.76 kW), the same in both
    assert tree_short[:2] == pytest.approx(one_short[:2], rel=0.01)
    # the low row carries the site's cut, in both; the tree takes no more from it than one
    # controller does (10.1 kW in both, measured 2026-11-25)
    for short in (one_short, tree_short):
        assert short[2] - short[1] > 2_000.0
    assert tree_short[2] <= one_short[2] * 1.01


def test_the_leaves_budgets_in_force_never_exceed_the_pool(replays):
    _, tree, _, _ = replays
    assert tree.budget_w is not None
    assert np.all(tree.budget_w.sum(axis=1) <= 66_000.0 + 1e-6)
    low, high = tree.budget_w[-1, 2], tree.budget_w[-1, 0]
    assert low < high


@pytest.mark.parametrize("policy", [BANDS, PolicySettings()], ids=["bands", "caps"])
def test_the_sum_of_caps_under_the_site_rises_within_its_ramp_in_both(policy):
    # the site's ramp cut to 1 kW/s, so that it binds as the GPUs climb from their
    # failsafe caps (450 W): the leaves' ramp shares sum to it, as one controller's
    slow = "ramp_kw_per_s = 1\n"
    tree_site = parse_budgets(TEXT.replace("ramp_kw_per_s = 30\n", slow))
    one_site = parse_budgets(
        TEXT.replace("budget_kw = 22", "budget_kw = 30").replace("ramp_kw_per_s = 30\n", slow)
    )
    assert tree_site.tree.ramp_w_per_s[SITE] == 1000.0
    demand, priority = trace()
    one = replay_single(one_site, demand, priority, policy=policy)
    scopes = [parse_scope(r) for r in tree_site.rows]
    tree = replay_tree(tree_site, scopes, demand, priority, period_steps=5, policy=policy)
    for replay in (one, tree):
        rise = np.diff(replay.cap_w.sum(axis=1))
        assert rise.max() <= 1000.0 + 1e-6
        assert rise.max() > 500.0  # it did rise, at the ramp's pace
