"""Oversubscription on top of safety by caps (policies.allocation, "Oversubscription").

A level the plan oversubscribes may hold caps summing beyond its limit by its allowance,
less as its draw comes within that of its band (``limit - rise_margin``), none in it; in
its band its caps are cut back within its limit at once, whatever the site's ramp.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import PolicySettings, decide
from policies.allocation import allowance_w, band_w, caps_in_force_fit, node_draw_w
from policies.tree import PHASE_CODES, Tree
from powerd.topology import BudgetError, load_budgets, parse_budgets
from tests.support.policy_trees import make_state, random_tree_and_state

CAPS = PolicySettings(safety_by_caps=True)
COMPUTE, COMM = PHASE_CODES["compute"], PHASE_CODES["communication"]
RACK_K1 = 2  # tiny.toml: site 0, row 1, racks 2 and 3, nodes 4..7
K1 = slice(0, 8)  # rack r1-k1's 8 H100 (200-700 W)
OVER_W, MARGIN_W = 800.0, 600.0
LIMIT_W = 6300.0  # r1-k1: 2,300 W of overheads, 4,000 W of caps = 8 x 500 W failsafe caps


def tiny_oversubscribed() -> Tree:
    tree = load_budgets("powerd/data/budgets/tiny.toml").tree
    limit = np.array(tree.limit_w, dtype=float)
    limit[RACK_K1] = LIMIT_W
    over, margin = np.zeros(tree.n_nodes), np.zeros(tree.n_nodes)
    over[RACK_K1], margin[RACK_K1] = OVER_W, MARGIN_W
    return dataclasses.replace(tree, limit_w=limit, oversubscription_w=over, rise_margin_w=margin)


def k1_state(tree: Tree, power_w: list[float], cap_w: list[float], phase: list[int]):
    state = make_state(tree, 480.0, 500.0)  # rack r1-k2: at its caps, asking
    state.power_w[K1], state.cap_w[K1], state.phase[K1] = power_w, cap_w, phase
    return state


def test_below_its_band_a_rack_holds_caps_beyond_its_limit_by_its_allowance():
    tree = tiny_oversubscribed()
    # 4 GPUs computing at their 500 W caps, 4 in a short communication drawing 200 W:
    # 2,000 + 800 + 2,300 = 5,100 W drawn, 600 W under the band (6,300 - 600)
    state = k1_state(tree, [500.0] * 4 + [200.0] * 4, [500.0] * 8, [COMPUTE] * 4 + [COMM] * 4)
    assert allowance_w(tree, node_draw_w(tree, state.power_w))[RACK_K1] == pytest.approx(600.0)
    d = decide(tree, state, 1.0, CAPS)
    # the computing GPUs take the allowance: 4,000 + 600 W of caps, 650 W each
    np.testing.assert_allclose(d.cap_w[:4], 650.0)
    np.testing.assert_allclose(d.cap_w[4:8], 500.0)
    assert d.cap_w[K1].sum() == pytest.approx(4600.0)
    assert not caps_in_force_fit(tree, d.cap_w)[RACK_K1]  # beyond what the caps guarantee
    assert caps_in_force_fit(tree, d.cap_w, 1e-6, node_draw_w(tree, state.power_w)).all()


def test_the_allowance_shrinks_as_the_draw_nears_the_band():
    tree = tiny_oversubscribed()
    band = band_w(tree)[RACK_K1]
    assert band == pytest.approx(LIMIT_W - MARGIN_W)
    drawn = np.zeros(tree.n_nodes)
    for under_w, allowed_w in ((2000.0, OVER_W), (600.0, 600.0), (100.0, 100.0), (-50.0, 0.0)):
        drawn[RACK_K1] = band - under_w
        assert allowance_w(tree, drawn)[RACK_K1] == pytest.approx(allowed_w)
    # a level its caps guarantee has none, whatever it draws
    assert allowance_w(tree, np.zeros(tree.n_nodes))[[0, 1, 3]].tolist() == [0.0, 0.0, 0.0]


def test_in_its_band_a_rack_is_cut_within_its_limit_at_once():
    tree = tiny_oversubscribed()
    # the 4 waiting GPUs resumed: 4 x 650 + 4 x 500 + 2,300 = 6,900 W, in the band (> 5,700)
    state = k1_state(tree, [650.0] * 4 + [500.0] * 4, [650.0] * 4 + [500.0] * 4, [COMPUTE] * 8)
    slow = dataclasses.replace(CAPS, uncap_min_step_w=5.0)
    d = decide(tree, state, 1.0, slow)
    assert d.cap_w[K1].sum() <= 4000.0 + 1e-6  # within the limit the caps guarantee
    np.testing.assert_allclose(d.cap_w[:4], 500.0)  # back to one share: each its 500 W
    assert not d.levelled[:8].any()  # not in turn with the raises: at once


def test_a_band_cut_is_not_paced_by_the_sites_ramp():
    tree = tiny_oversubscribed()
    ramp = np.array(tree.ramp_w_per_s, dtype=float)
    ramp[0] = 10.0  # the site may fall 10 W in a second
    tree = dataclasses.replace(tree, ramp_w_per_s=ramp)
    state = k1_state(tree, [650.0] * 4 + [500.0] * 4, [650.0] * 4 + [500.0] * 4, [COMPUTE] * 8)
    d = decide(tree, state, 1.0, CAPS)
    assert d.cap_w[K1].sum() <= 4000.0 + 1e-6


seeds = st.integers(0, 2**32 - 1)


@settings(max_examples=150, deadline=None)
@given(seed=seeds)
def test_caps_stay_within_limit_and_allowance_whichever_command_lands_first(seed):
    rng = np.random.default_rng(seed)
    tree, state, dt_s = random_tree_and_state(rng)
    cap = np.clip(state.cap_w, tree.cap_min_w, tree.cap_max_w)
    state.cap_w = cap
    power = np.clip(np.nan_to_num(np.asarray(state.power_w, dtype=float), nan=0.0), 0.0, cap)
    state.power_w = power
    in_force = tree.node_sum(cap) + tree.overhead_below_w
    drawn = tree.node_sum(power) + tree.overhead_below_w
    limit = in_force * rng.uniform(0.85, 1.3, tree.n_nodes)
    margin = rng.uniform(0.0, 0.3, tree.n_nodes) * np.maximum(limit - drawn, 0.0)
    over = np.where(rng.random(tree.n_nodes) < 0.5, rng.uniform(0.0, 0.2) * limit, 0.0)
    over = np.where(margin > 0, over, 0.0)
    # the caps in force fit each node's limit plus its allowance at this draw
    allowed = np.clip(limit - margin - drawn, 0.0, over)
    limit = np.maximum(limit, in_force - allowed)
    tree = dataclasses.replace(tree, limit_w=limit, oversubscription_w=over, rise_margin_w=margin)
    assert caps_in_force_fit(tree, cap, 1e-6, drawn).all()
    d = decide(tree, state, dt_s, CAPS)
    assert caps_in_force_fit(tree, np.maximum(cap, d.cap_w), 1e-6, drawn).all()


# --- the budgets file ---------------------------------------------------------------------

RACK = """
version = 1
[site]
name = "s"
limit_kw = 20
budget_kw = 18
[[rows]]
name = "r"
limit_kw = 20
budget_kw = 18
{row}
[[rows.racks]]
name = "k"
limit_kw = 8
budget_kw = 7
[[rows.racks.nodes]]
name = "n"
gpus = 4
model = "H100"
{node}
"""


def test_a_file_says_which_levels_are_oversubscribed():
    top = parse_budgets(RACK.format(row="oversubscription_kw = 2\nrise_margin_kw = 1.5", node=""))
    np.testing.assert_allclose(top.tree.oversubscription_w[:2], [0.0, 2000.0])
    np.testing.assert_allclose(top.tree.rise_margin_w[:2], [0.0, 1500.0])
    assert top.tree.oversubscribed.tolist() == [False, True, False, False]


@pytest.mark.parametrize(
    ("row", "node", "says"),
    [
        ("oversubscription_kw = 2", "", "needs rise_margin_w"),
        ("rise_margin_kw = 1", "", "without oversubscription_w"),
        ("oversubscription_kw = 2\nrise_margin_kw = 20", "", "leaves no band"),
        ("", "oversubscription_w = 10\nrise_margin_w = 5", "not nodes"),
    ],
)
def test_a_file_with_an_oversubscription_it_cannot_keep_is_refused(row, node, says):
    with pytest.raises(BudgetError, match=says):
        parse_budgets(RACK.format(row=row, node=node))
