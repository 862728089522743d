"""Rules 3b and 3c do not trade watts on a guess (``ClusterState.heard``).

A controller counts a node it does not hear at the caps it may hold. Where that guess
puts a node between its bands, a shift or a levelling made on it is undone as soon as
the node is heard again (below its uncapping threshold, rule 4 hands the watts back),
and the next guess makes it again: found by bench_scale on a machine that lost half the
telemetry, where such moves were three quarters of ~2,000 cuts a second.

The tree: one rack of three 4-GPU servers (200-1200 W): GPUs 0-3, 4-7 and 8-11. Only the
site has bands, 11,000 / 10,800 / 6,500 W (a 4,500 W band: a guess of up to 1,125 W is
trusted, GUESSED_BAND_SHARE); every other node always hands back.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from policies import HIGH, LOW, NORMAL, PolicySettings, decide
from policies.between_bands import GUESSED_BAND_SHARE
from tests.support.policy_trees import make_state, uncapping_everywhere, uniform_tree, with_bands

BANDS = (11_000.0, 10_800.0, 6_500.0)
# rules 3b and 3c are the bands' (policies/capping.py), not safety by caps', the default
BANDS_POLICY = PolicySettings(safety_by_caps=False)
THIRD = slice(8, 12)  # the server that may go unheard


def site_tree():
    return with_bands(uncapping_everywhere(uniform_tree(1, 1, 3, 4)), [0], *BANDS)


def state_with_third(tree, power_w, cap_w, priority, third_w: float, heard: bool | None):
    """The third server counted at ``third_w`` a GPU: measured (``heard`` True; None: no
    mask given), or a stand-in for a server not heard (False: not controllable either)."""
    power_w, cap_w = np.array(power_w, dtype=float), np.array(cap_w, dtype=float)
    power_w[THIRD] = cap_w[THIRD] = third_w
    state = make_state(tree, power_w, cap_w, priority=priority)
    if heard is None:
        return state
    mask = np.ones(tree.n_gpus, dtype=bool)
    mask[THIRD] = heard
    return dataclasses.replace(state, heard=mask, controllable=mask.copy())


# HIGH held at its 450 W staged caps, LOW drawing 1,000 W under 1,200 W caps
HIGH_LOW_POWER = [450.0] * 4 + [1000.0] * 4 + [0.0] * 4
HIGH_LOW_CAP = [450.0] * 4 + [1200.0] * 4 + [0.0] * 4
HIGH_LOW_PRIO = np.array([HIGH] * 4 + [LOW] * 4 + [NORMAL] * 4)


def test_the_guess_is_what_puts_the_site_between_its_bands():
    tree = site_tree()
    heard = state_with_third(tree, HIGH_LOW_POWER, HIGH_LOW_CAP, HIGH_LOW_PRIO, 100.0, True)
    d = decide(tree, heard, 1.0, BANDS_POLICY)
    assert d.node_power_w[0] < BANDS[2]  # 6,200 W heard: below, rule 4 hands back
    assert not d.shifted.any() and np.all(d.cap_w[:4] > 450.0)


def test_no_shift_on_a_server_counted_at_its_caps():
    tree = site_tree()
    # counted at 1,200 W caps: 10,600 W, between the bands on a 4,800 W guess
    guessed = state_with_third(tree, HIGH_LOW_POWER, HIGH_LOW_CAP, HIGH_LOW_PRIO, 1200.0, False)
    d = decide(tree, guessed, 1.0, BANDS_POLICY)
    assert BANDS[2] <= d.node_power_w[0] <= BANDS[0]
    assert not d.shifted.any()
    np.testing.assert_allclose(d.cap_w[4:8], 1200.0)  # LOW keeps its caps
    # the same draw measured is no guess: the shift is made
    measured = state_with_third(tree, HIGH_LOW_POWER, HIGH_LOW_CAP, HIGH_LOW_PRIO, 1200.0, None)
    assert decide(tree, measured, 1.0, BANDS_POLICY).shifted[4:8].any()


def test_a_small_guess_does_not_stop_the_shift():
    tree = site_tree()
    # 200 W a GPU: 800 W guessed, within a quarter of the 4,500 W band; 6,600 W: between
    assert GUESSED_BAND_SHARE * (BANDS[0] - BANDS[2]) >= 4 * 200.0
    guessed = state_with_third(tree, HIGH_LOW_POWER, HIGH_LOW_CAP, HIGH_LOW_PRIO, 200.0, False)
    d = decide(tree, guessed, 1.0, BANDS_POLICY)
    assert BANDS[2] <= d.node_power_w[0] <= BANDS[0]
    assert d.shifted[4:8].all() and np.all(d.cap_w[4:8] < 1200.0)


def test_no_levelling_on_a_guess():
    tree = site_tree()
    # one class held at unequal caps (508 and 342 W): levelled when the site is known to be
    # between its bands, not when a 4,800 W guess puts it there
    power = [508.0] * 4 + [342.0] * 4 + [0.0] * 4
    normal = np.full(12, NORMAL)
    measured = state_with_third(tree, power, power, normal, 1200.0, None)
    assert decide(tree, measured, 1.0, BANDS_POLICY).levelled[:8].all()
    guessed = state_with_third(tree, power, power, normal, 1200.0, False)
    d = decide(tree, guessed, 1.0, BANDS_POLICY)
    assert not d.levelled.any()
    assert np.all(d.cap_w[:8] >= power[:8])  # nobody cut (rule 4 may hand back, up to target)
