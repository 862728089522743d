"""decide(): the three bands, priorities, floors, offline GPUs and the levels, on hand-built trees."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from policies import (
    HIGH,
    LOW,
    NORMAL,
    PHASE_CODES,
    RACK,
    ROW,
    SERVER,
    SITE,
    Decision,
    PolicySettings,
    decide,
)
from tests.support.policy_trees import (
    COMPUTE,
    make_state,
    uncapping_everywhere,
    uniform_tree,
    with_bands,
    with_ramp,
)

SERVER0 = 2  # in a 1-row, 1-rack tree: site 0, row 1, rack 2, servers 3...
# The rules tested here are the bands' (policies/capping.py); safety by caps, the default,
# is policies/allocation.py's (tests/policies/test_policy_allocation.py).
BANDS = PolicySettings(safety_by_caps=False)


def one_server(gpus: int = 4, **kw):
    """Site → row → rack → one server; node 3 is the server."""
    return uniform_tree(1, 1, 1, gpus, **kw)


# --- above the capping threshold ---------------------------------------------------------


def test_over_threshold_comes_down_to_target():
    tree = with_bands(one_server(), [3], 3800.0, 3600.0, 3000.0)
    state = make_state(tree, 1000.0)
    d = decide(tree, state, 1.0, BANDS)
    assert d.node_capping[3]
    assert d.node_power_w[3] == pytest.approx(4000.0)
    assert d.node_predicted_w[3] == pytest.approx(3600.0)
    np.testing.assert_allclose(d.cap_w, 900.0)  # equal GPUs give equally
    assert d.node_cut_w[3] == pytest.approx(400.0)
    assert np.all(d.cut_levels == 1 << SERVER)


def test_high_bucket_first_water_fills_the_biggest_consumers():
    tree = with_bands(one_server(), [3], 2500.0, 2400.0, 2000.0)
    state = make_state(tree, [1000.0, 800.0, 600.0, 400.0])
    d = decide(tree, state, 1.0, BANDS)
    # 400 W to take: the two biggest come down to a common level of 700 W
    np.testing.assert_allclose(d.cap_w, [700.0, 700.0, 1200.0, 1200.0])
    assert d.node_predicted_w[3] == pytest.approx(2400.0)
    assert list(d.cut_levels) == [1 << SERVER, 1 << SERVER, 0, 0]


def test_a_cap_the_gpu_has_not_followed_yet_counts_as_taken():
    tree = with_bands(one_server(), [3], 3800.0, 3600.0, 3000.0)
    # measured 1000 W each but one cap already at 600 W: predicted 3600 W, nothing to take
    state = make_state(tree, 1000.0, [600.0, 1200.0, 1200.0, 1200.0])
    d = decide(tree, state, 1.0, BANDS)
    assert d.node_capping[3]
    np.testing.assert_allclose(d.cap_w, [600.0, 1200.0, 1200.0, 1200.0])
    assert d.node_predicted_w[3] == pytest.approx(3600.0)


def test_overhead_counts_towards_the_node():
    tree = with_bands(one_server(overhead_w=0.0), [3], 3800.0, 3600.0, 3000.0)
    overhead = np.zeros(tree.n_nodes)
    overhead[3] = 500.0
    tree = dataclasses.replace(tree, overhead_w=overhead)
    d = decide(tree, make_state(tree, 850.0), 1.0, BANDS)  # 3400 W of GPUs + 500 W
    assert d.node_power_w[3] == pytest.approx(3900.0)
    assert d.node_power_w[0] == pytest.approx(3900.0)  # overhead counted at every ancestor
    np.testing.assert_allclose(d.cap_w, 775.0)
    assert d.node_predicted_w[3] == pytest.approx(3600.0)


# --- between the bands and below them ---------------------------------------------------


def test_between_bands_caps_stay_unless_a_gpu_is_held_at_its_cap():
    """3400 W: between 3000 and 4000 W. GPU 0 draws 850 W under a 900 W cap (held: within
    5 % of its 1000 W range); the others draw well under theirs. Caps stay, but the held
    GPU's rises, never taking the node past its 3800 W target."""
    tree = with_bands(one_server(), slice(None), 4000.0, 3800.0, 3000.0)
    caps = np.array([900.0, 1000.0, 1100.0, 1200.0])
    state = make_state(tree, 850.0, caps)
    stay = decide(tree, state, 1.0, PolicySettings(safety_by_caps=False, uncap_between_bands=False))
    np.testing.assert_array_equal(stay.cap_w, caps)
    assert not stay.node_capping.any() and not stay.cut_levels.any()
    d = decide(tree, state, 1.0, BANDS)
    np.testing.assert_array_equal(d.cap_w[1:], caps[1:])  # not held: nothing to hand back
    assert d.cap_w[0] == pytest.approx(900.0 + 0.2 * 300.0)  # its uncap step
    assert d.node_predicted_w[0] <= 3800.0 + 1e-9
    # at its target the node has no headroom: a held GPU gains nothing
    at_target = make_state(tree, 950.0, np.full(4, 950.0))  # 3800 W
    np.testing.assert_array_equal(decide(tree, at_target, 1.0, BANDS).cap_w, 950.0)


def test_below_uncap_threshold_caps_come_back_gradually():
    tree = uncapping_everywhere(one_server())
    settings = PolicySettings(safety_by_caps=False, uncap_step_fraction=0.2, uncap_min_step_w=0.0)
    state = make_state(tree, 500.0, [700.0, 1000.0, 1200.0, 200.0])
    d = decide(tree, state, 1.0, settings)
    # each gains 20 % of its gap to 1200 W; the uncapped one stays
    np.testing.assert_allclose(d.cap_w, [800.0, 1040.0, 1200.0, 400.0])


def test_no_ramp_limit_stays_none_whatever_rises_on_its_own():
    """Under grid smoothing with a window of a few ulps, idle GPUs' reserve is infinite
    (``policies.rules.may_start_rise_w_per_s``); where no ramp limits the site, the caps
    come back as without one, and nothing computes inf - inf (CI: a RuntimeWarning)."""
    tree = uncapping_everywhere(one_server())
    state = make_state(tree, [500.0, 500.0, 70.0, 70.0], [700.0, 1000.0, 1200.0, 1200.0])
    state.phase = np.array([COMPUTE] * 2 + [PHASE_CODES["idle"]] * 2, dtype=np.int8)
    plain = PolicySettings(safety_by_caps=False, uncap_step_fraction=0.2, uncap_min_step_w=0.0)
    tiny = dataclasses.replace(plain, startup_rise_w_per_s=50.0, wait_rise_after_s=5e-324)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        smoothed = decide(tree, state, 1.0, tiny)
    np.testing.assert_allclose(smoothed.cap_w, decide(tree, state, 1.0, plain).cap_w)
    assert smoothed.cap_w[0] > 700.0


def test_uncapping_min_step_closes_small_gaps():
    tree = uncapping_everywhere(one_server())
    settings = PolicySettings(safety_by_caps=False, uncap_step_fraction=0.1, uncap_min_step_w=5.0)
    d = decide(tree, make_state(tree, 500.0, [1197.0, 1150.0, 1000.0, 1200.0]), 1.0, settings)
    np.testing.assert_allclose(d.cap_w, [1200.0, 1155.0, 1020.0, 1200.0])


def test_uncapping_repeated_reaches_cap_max():
    tree = uncapping_everywhere(one_server())
    state = make_state(tree, 300.0, 300.0)
    for _ in range(60):
        state.cap_w = decide(tree, state, 1.0, BANDS).cap_w
    np.testing.assert_allclose(state.cap_w, 1200.0)


def test_uncapping_is_limited_by_the_ramp():
    tree = with_ramp(uncapping_everywhere(one_server()), [3], 100.0)
    settings = PolicySettings(safety_by_caps=False, uncap_step_fraction=0.5)
    d = decide(tree, make_state(tree, 300.0, 700.0), 2.0, settings)
    # each asks 250 W; the server may rise 100 W/s * 2 s = 200 W in all
    np.testing.assert_allclose(d.cap_w, 750.0)


def test_uncapping_is_limited_by_the_headroom_to_target():
    tree = with_bands(one_server(), slice(None), 5000.0, 3000.0, 4000.0)
    settings = PolicySettings(safety_by_caps=False, uncap_step_fraction=1.0)
    # predicted 4 x 700 = 2800 W: 200 W of headroom to the 3000 W target
    d = decide(tree, make_state(tree, 700.0, 700.0), 1.0, settings)
    np.testing.assert_allclose(d.cap_w, 750.0)
    assert d.node_predicted_w[3] <= 3000.0 + 1e-9


def test_a_node_not_below_its_uncap_threshold_hands_nothing_back():
    tree = uniform_tree(1, 1, 2, 2)  # servers 3 and 4
    tree = uncapping_everywhere(tree)
    tree = with_bands(tree, [2], 1e9, 1e9, 1000.0)  # the rack draws 2000 W: not below 1000 W
    d = decide(tree, make_state(tree, 500.0, 600.0), 1.0, BANDS)
    np.testing.assert_array_equal(d.cap_w, 600.0)


def test_a_limited_server_does_not_waste_its_siblings_share():
    tree = uncapping_everywhere(uniform_tree(1, 1, 2, 2))
    tree = with_ramp(tree, [2], 1000.0)  # rack
    tree = with_ramp(tree, [3], 10.0)  # first server
    settings = PolicySettings(safety_by_caps=False, uncap_step_fraction=1.0)
    state = make_state(tree, 200.0, 400.0)
    d = decide(tree, state, 1.0, settings)
    rise = tree.node_sum(d.cap_w - state.cap_w)
    # the rack's 1000 W is handed out in full, shared in proportion to what each server
    # may pass on (server 3: 10 W, server 4: its 1600 W request)
    assert rise[2] == pytest.approx(1000.0)
    assert rise[3] == pytest.approx(10.0 * 1000.0 / 1610.0)
    assert rise[4] == pytest.approx(1600.0 * 1000.0 / 1610.0)
    assert d.cap_w[0] == pytest.approx(d.cap_w[1])  # GPUs of one server share alike


def test_site_ramp_holds_across_rows():
    tree = uncapping_everywhere(uniform_tree(3, 2, 2, 4))
    tree = with_ramp(tree, [0], 1200.0)  # site
    tree = with_ramp(tree, tree.level == ROW, 600.0)
    settings = PolicySettings(safety_by_caps=False, uncap_step_fraction=1.0)
    state = make_state(tree, 200.0, 200.0)
    d = decide(tree, state, 1.0, settings)
    rise = tree.node_sum(d.cap_w - state.cap_w)
    assert rise[0] == pytest.approx(1200.0)
    assert np.all(rise[tree.level == ROW] <= 600.0 + 1e-9)
    np.testing.assert_allclose(rise[tree.level == ROW], 400.0)  # shared evenly


# --- priorities, floors, offline GPUs ---------------------------------------------------


def test_low_priority_gives_first_then_normal_then_high():
    tree = with_bands(one_server(6), [3], 5500.0, 5000.0, 4000.0)
    prio = [LOW, LOW, NORMAL, NORMAL, HIGH, HIGH]
    state = make_state(tree, 1000.0, priority=prio, floor_w=500.0)
    d = decide(tree, state, 1.0, BANDS)  # 1000 W to take: 1000 W from LOW alone
    np.testing.assert_allclose(d.cap_w, [500.0, 500.0, 1200.0, 1200.0, 1200.0, 1200.0])

    tree = with_bands(tree, [3], 5500.0, 4500.0, 4000.0)  # 1500 W: LOW to floor, 500 from NORMAL
    d = decide(tree, state, 1.0, BANDS)
    np.testing.assert_allclose(d.cap_w, [500.0, 500.0, 750.0, 750.0, 1200.0, 1200.0])

    tree = with_bands(tree, [3], 5500.0, 3500.0, 3000.0)  # 2500 W: HIGH gives the last 500
    d = decide(tree, state, 1.0, BANDS)
    np.testing.assert_allclose(d.cap_w, [500.0, 500.0, 500.0, 500.0, 750.0, 750.0])


def test_high_bucket_first_inside_a_priority_class_only():
    tree = with_bands(one_server(4), [3], 2900.0, 2800.0, 2000.0)
    # the HIGH GPU draws most but LOW can give the 200 W
    state = make_state(tree, [1100.0, 600.0, 700.0, 600.0], priority=[HIGH, LOW, LOW, NORMAL])
    d = decide(tree, state, 1.0, BANDS)
    np.testing.assert_allclose(d.cap_w, [1200.0, 550.0, 550.0, 1200.0])


def test_never_below_floor_even_when_the_target_is_out_of_reach():
    tree = with_bands(one_server(), [3], 2000.0, 1000.0, 500.0)
    floors = np.array([300.0, 500.0, 700.0, 200.0])
    d = decide(tree, make_state(tree, 1000.0, floor_w=floors), 1.0, BANDS)
    np.testing.assert_allclose(d.cap_w, floors)
    assert d.node_predicted_w[3] == pytest.approx(1700.0)  # best it can do


def test_floors_shift_the_cut_to_others():
    tree = with_bands(one_server(), [3], 3900.0, 2420.0, 2000.0)
    d = decide(tree, make_state(tree, 1000.0, floor_w=[950.0, 950.0, 200.0, 200.0]), 1.0, BANDS)
    # 1580 W to take: the two with a 950 W floor can give 50 W each at most; the level
    # comes down to 30 W above each floor
    np.testing.assert_allclose(d.cap_w, [980.0, 980.0, 230.0, 230.0])
    assert d.node_predicted_w[3] == pytest.approx(2420.0)


def test_offline_gpus_are_counted_but_not_cut():
    tree = with_bands(one_server(), [3], 3800.0, 3400.0, 3000.0)
    state = make_state(tree, 1000.0, controllable=[False, True, True, True])
    d = decide(tree, state, 1.0, BANDS)
    assert d.node_power_w[3] == pytest.approx(4000.0)
    assert d.cap_w[0] == 1200.0  # as it was
    np.testing.assert_allclose(d.cap_w[1:], 800.0)  # the others give its share
    assert d.node_predicted_w[3] == pytest.approx(3400.0)
    assert d.cut_levels[0] == 0


def test_offline_gpus_are_not_uncapped():
    tree = uncapping_everywhere(one_server())
    state = make_state(tree, 300.0, 500.0, controllable=[False, True, True, True])
    d = decide(tree, state, 1.0, BANDS)
    assert d.cap_w[0] == 500.0
    assert np.all(d.cap_w[1:] > 500.0)


# --- several levels ----------------------------------------------------------------------


def test_rack_takes_across_its_servers_high_bucket_first():
    tree = uniform_tree(1, 1, 2, 2)  # rack 2; servers 3 (GPUs 0, 1) and 4 (GPUs 2, 3)
    tree = with_bands(tree, [2], 3000.0, 2800.0, 2000.0)
    d = decide(tree, make_state(tree, [1000.0, 600.0, 900.0, 700.0]), 1.0, BANDS)
    # 400 W from the rack: 1000 and 900 come down to 750
    np.testing.assert_allclose(d.cap_w, [750.0, 1200.0, 750.0, 1200.0])
    assert list(d.cut_levels) == [1 << RACK, 0, 1 << RACK, 0]


def test_parent_takes_only_what_the_children_left():
    tree = uniform_tree(1, 1, 2, 2)  # rack 2; servers 3 (GPUs 0, 1) and 4 (GPUs 2, 3)
    tree = with_bands(tree, [3], 1900.0, 1800.0, 1000.0)  # server 3 draws 2000: takes 200
    tree = with_bands(tree, [2], 3900.0, 3800.0, 2000.0)  # rack draws 4000: 200 after server 3
    state = make_state(tree, 1000.0, 1200.0, floor_w=200.0)
    d = decide(tree, state, 1.0, BANDS)
    assert d.node_cut_w[3] == pytest.approx(200.0)
    assert d.node_cut_w[2] == pytest.approx(0.0)  # the server's cut was enough
    np.testing.assert_allclose(d.cap_w, [900.0, 900.0, 1200.0, 1200.0])

    tree = with_bands(tree, [2], 3900.0, 3400.0, 2000.0)  # now the rack needs 400 more
    d = decide(tree, state, 1.0, BANDS)
    assert d.node_cut_w[2] == pytest.approx(400.0)
    # high bucket first: server 4's GPUs (1000 W) come down past the 900 W of server 3's,
    # then all four to 850 W
    np.testing.assert_allclose(d.cap_w, 850.0)
    assert d.node_predicted_w[2] == pytest.approx(3400.0)
    assert list(d.cut_levels) == [(1 << SERVER) | (1 << RACK)] * 2 + [1 << RACK] * 2


def test_every_level_caps_site_last():
    tree = uniform_tree(2, 2, 2, 2)  # 16 GPUs
    tree = with_bands(tree, [0], 15000.0, 12000.0, 10000.0)  # the site needs 4000 W
    tree = with_bands(tree, tree.level == ROW, 7900.0, 7000.0, 5000.0)  # each row needs 1000
    d = decide(tree, make_state(tree, 1000.0), 1.0, BANDS)
    assert d.node_cut_w[0] == pytest.approx(2000.0)
    np.testing.assert_allclose(d.node_cut_w[tree.level == ROW], 1000.0)
    assert d.node_predicted_w[0] == pytest.approx(12000.0)
    np.testing.assert_allclose(d.cap_w, 750.0)
    assert np.all(d.cut_levels == (1 << ROW) | (1 << SITE))


@pytest.mark.parametrize("policy", [BANDS, PolicySettings()], ids=["bands", "caps"])
def test_caps_always_within_range_and_finite_even_from_bad_input(policy):
    tree = with_bands(one_server(), [3], 3000.0, 2500.0, 2000.0)
    state = make_state(tree, [np.nan, -50.0, 5000.0, 800.0], [np.inf, 50.0, 9999.0, np.nan])
    state.floor_w = np.array([np.nan, 100.0, 5000.0, 300.0])
    d = decide(tree, state, 1.0, policy)
    assert np.all(np.isfinite(d.cap_w))
    assert np.all((d.cap_w >= tree.cap_min_w) & (d.cap_w <= tree.cap_max_w))


@pytest.mark.parametrize("policy", [BANDS, PolicySettings()], ids=["bands", "caps"])
def test_input_arrays_are_not_modified(policy):
    tree = with_bands(uniform_tree(1, 2, 2, 2), slice(None), 1000.0, 800.0, 500.0)
    state = make_state(tree, 900.0, 1000.0, priority=LOW)
    before = {
        f.name: getattr(state, f.name).copy()
        for f in dataclasses.fields(state)
        if getattr(state, f.name) is not None
    }
    decide(tree, state, 1.0, policy)
    for name, value in before.items():
        np.testing.assert_array_equal(getattr(state, name), value)


@pytest.mark.parametrize("dt_s", [0.0, -1.0, float("nan")])
def test_bad_dt_is_refused(dt_s):
    tree = one_server()
    with pytest.raises(ValueError, match="dt_s"):
        decide(tree, make_state(tree, 500.0), dt_s)


@pytest.mark.parametrize(
    "field, value",
    [
        ("uncap_step_fraction", 0.0),
        ("uncap_step_fraction", 1.5),
        ("startup_cap_fraction", -0.1),
        ("stage_headroom_fraction", 2.0),
        ("uncap_min_step_w", -1.0),
        ("hold_floor_w_per_gpu", -5.0),
    ],
)
def test_bad_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        PolicySettings(**{field: value})


def test_settings_are_plain_numbers_and_booleans():
    """The controller reads [policy] from TOML: every field must be a number, a bool or None."""
    for f in dataclasses.fields(PolicySettings):
        assert isinstance(getattr(PolicySettings(), f.name), (int, float, bool, type(None))), f.name


def test_server0_constant_matches_the_builder():
    tree = one_server()
    assert tree.level[SERVER0] == RACK and tree.level[3] == SERVER


def test_a_tree_without_gpus_decides_nothing():
    tree = with_bands(uniform_tree(1, 2, 1, 0, overhead_w=100.0), slice(None), 50.0, 40.0, 10.0)
    d = decide(tree, make_state(tree, 0.0), 1.0, BANDS)
    assert d.cap_w.shape == (0,)
    assert d.node_capping.all()  # the overhead alone is over: nothing to cut
    np.testing.assert_allclose(d.node_predicted_w, d.node_power_w)


def test_unknown_power_reads_as_the_failsafe_cap_or_cap_max():
    tree = one_server()
    tree = dataclasses.replace(tree, failsafe_cap_w=np.array([700.0, np.nan, 700.0, 700.0]))
    state = make_state(tree, [np.nan, np.nan, 100.0, 100.0], [np.nan, np.nan, 900.0, 900.0])
    d = decide(tree, state, 1.0, BANDS)
    assert d.node_power_w[3] == pytest.approx(700.0 + 1200.0 + 200.0)
    np.testing.assert_allclose(d.cap_w, [700.0, 1200.0, 900.0, 900.0])


def test_a_decision_can_be_built_with_the_core_fields_only():
    d = Decision(
        cap_w=np.zeros(1),
        max_sm_clock_mhz=np.full(1, np.nan),
        node_power_w=np.zeros(1),
        node_predicted_w=np.zeros(1),
        node_capping=np.zeros(1, dtype=bool),
        floor_hold_energy_j=0.0,
    )
    assert d.node_cut_w.shape == (0,) and d.cut_levels.shape == (0,)
