"""Each cycle's seconds of the site's ramp: no window of the ramp's length holds the grants
of more than its own seconds, however the cycles bunch (powerd.controller.ramp_window)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import decide
from policies.tree import PHASE_CODES
from powerd.controller.ramp_window import RampWindow
from powerd.protocol import GpuSmoothing
from tests.controller.test_controller_core import BUDGETS, CAP_MAX_W, FAILSAFE_W, NODES, make_bench
from tests.policies.test_policy_allocation import CAPS, one_rack
from tests.support.policy_trees import make_state

# any profile switches grid smoothing on in the core (the window then counts the draw)
SMOOTHING = GpuSmoothing(
    preset=0,
    enabled=True,
    floor_percent=0.0,
    ramp_up_w_per_s=100.0,
    ramp_down_w_per_s=100.0,
    ramp_down_hysteresis_ms=1000.0,
)


def test_cycles_on_time_hand_back_their_own_seconds() -> None:
    window = RampWindow(1.0)
    assert [window.take(0.5 * k, 0.5) for k in range(1, 7)] == [0.5] * 6


def test_a_late_cycle_then_an_early_one_share_one_window() -> None:
    """The demo's start: a cycle 0.64 s late, then two 0.5 and 0.3 s after it. Each by the
    time since the one before: 1.44 s of ramp within 0.8 s; now at most 1 s."""
    window = RampWindow(1.0)
    assert window.take(0.0, 0.5) == 0.5
    assert window.take(0.64, 0.64) == 0.5  # the one 0.64 s before still counts
    assert window.take(1.14, 0.5) == 0.5  # 0.0 has left the window
    assert window.take(1.44, 0.3) == 0.0  # 0.64 and 1.14 have had the window's second
    assert window.take(1.74, 0.3) == pytest.approx(0.3)  # 0.64 has left it


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.01, 1.5), min_size=1, max_size=40), st.floats(0.2, 3.0))
def test_no_window_holds_more_than_its_seconds(gaps: list[float], window_s: float) -> None:
    window = RampWindow(window_s)
    times = np.cumsum(gaps)
    given_s = np.array([window.take(float(t), gap) for t, gap in zip(times, gaps, strict=True)])
    assert np.all(given_s <= np.array(gaps) + 1e-12) and np.all(given_s >= 0)
    for t in times:  # every window (t - w, t] ending at a cycle
        inside = (times > t - window_s) & (times <= t)
        assert given_s[inside].sum() <= window_s + 1e-9


def test_a_cycle_right_after_a_full_window_hands_back_nothing_at_the_site() -> None:
    """Through the core: under a 1 kW/s site ramp, caps held low everywhere, a cycle a
    second after the last hands back 1 kW; one 0.3 s after a cycle given that second and
    the one 0.7 s before it nothing; a second after that, 1 kW again."""
    text = BUDGETS.replace("budget_kw = 18\n", "budget_kw = 18\nramp_kw_per_s = 1\n", 1)
    b = make_bench(text)
    b.report_all(300.0, cap_w=FAILSAFE_W)
    b.apply(b.cycle())
    raised = []
    for advance_s in (1.0, 0.3, 1.0):
        b.core.cap_w[:] = b.core.commanded_cap_w[:] = 200.0  # held low: room everywhere
        b.clock.advance(advance_s)
        b.report_all(200.0, cap_w=200.0)
        result = b.cycle()
        raised.append(float(np.sum(result.decision.cap_w - 200.0)))
        b.apply(result)
    assert raised[0] == pytest.approx(1000.0, rel=0.01)
    assert raised[1] == pytest.approx(0.0, abs=1.0)
    assert raised[2] == pytest.approx(1000.0, rel=0.01)


def test_a_cycle_with_no_seconds_of_ramp_left_raises_nothing_but_still_cuts() -> None:
    """The window bounds raises only. Four GPUs at 500 W caps under a 100 W/s site ramp: a
    cycle whose window is spent raises none; a root limit lowered under the caps (an
    operator's line) is still cut towards at the ramp over the time since the last cycle,
    100 W in 1 s, as with seconds to spare."""
    tree = one_rack(4 * 1200.0)
    ramp = np.full(tree.n_nodes, np.inf)
    ramp[0] = 100.0
    tree = dataclasses.replace(tree, ramp_w_per_s=ramp)
    state = make_state(tree, power_w=500.0, cap_w=500.0, phase=PHASE_CODES["compute"])
    state.ramp_s = 0.0
    assert decide(tree, state, 1.0, CAPS).cap_w.sum() == pytest.approx(2000.0)
    lowered = dataclasses.replace(tree, root_caps_limit_w=1800.0)
    assert decide(lowered, state, 1.0, CAPS).cap_w.sum() == pytest.approx(2000.0 - 100.0)


def test_a_draw_that_rose_on_its_own_leaves_the_cycle_only_what_the_window_has_left() -> None:
    """Under an 18 kW/s ramp: a staged start's compute took its 11.7 kW headroom at once
    between two cycles on time (`powerd demo --smoothing`: those caps and the next cycle's
    9 kW moved the site 20.2 kW within a second). The cycle after it may hand back 18 - 11.7
    = 6.3 kW, 0.35 s of ramp, not its 0.5 s; one that sees 18 kW risen in its window,
    nothing; a window later, the draw steady, all its seconds again. Without the draw, or without a ramp, the grants alone count."""
    window = RampWindow(1.0)
    assert window.take(0.0, 0.5, 106_900.0, 18_000.0) == 0.5
    assert window.take(0.5, 0.5, 118_600.0, 18_000.0) == pytest.approx(0.35)
    # a cycle bunched 0.25 s later sees the window's 18 kW risen: nothing
    assert window.take(0.75, 0.25, 124_900.0, 18_000.0) == 0.0
    assert window.take(1.75, 1.0, 124_900.0, 18_000.0) == 1.0  # steady for a window
    plain = RampWindow(1.0)
    assert plain.take(0.0, 0.5, 100_000.0) == plain.take(0.5, 0.5, 120_000.0) == 0.5
    assert RampWindow(1.0).take(0.5, 0.5, None, 18_000.0) == 0.5


def test_a_draw_that_fell_leaves_the_whole_window() -> None:
    """Only a rise counts: a site falling (a wait, a stop) gets its seconds as before."""
    window = RampWindow(1.0)
    assert [window.take(0.5 * k, 0.5, 200_000.0 - 5_000.0 * k, 18_000.0) for k in range(4)] == [
        0.5
    ] * 4


def ramp_s_after_a_rise(
    rise_w: float, smoothing: GpuSmoothing | None, in_hardware: bool = False
) -> float:
    """Through the core, under a 1 kW/s site ramp over a 2 s window: the seconds of ramp the
    cycle 1 s after the first may hand back when the GPUs' draw rose by ``rise_w`` between
    them. ``in_hardware``: every GPU's smoothing is on in hardware, as telemetry sets it."""
    text = BUDGETS.replace("budget_kw = 18\n", "budget_kw = 18\nramp_kw_per_s = 1\n", 1)
    b = make_bench(text, smoothing=smoothing)
    b.core.ramp_window = RampWindow(2.0)
    assert float(b.core.tree.ramp_w_per_s[0]) == 1000.0
    b.core.views.ramps_in_hardware[:] = in_hardware
    b.report_all(100.0, cap_w=FAILSAFE_W)
    b.apply(b.cycle())
    b.clock.advance(1.0)
    b.report_all(100.0 + rise_w / len(b.core.cap_w), cap_w=FAILSAFE_W)
    state = b.cycle().state
    assert state is not None and state.ramp_s is not None
    return state.ramp_s


def test_the_core_counts_the_draw_it_sees_against_the_ramp_in_force() -> None:
    """Under grid smoothing, cycles 1 s apart: one that sees the GPUs' draw 1.5 kW above the
    last cycle's may hand back what that leaves of the 2 s window, 2 - 1.5 = 0.5 s, not the
    1 s the grants alone leave it; without grid smoothing the grants alone count."""
    assert ramp_s_after_a_rise(1500.0, SMOOTHING) == pytest.approx(0.5)
    assert ramp_s_after_a_rise(1500.0, None) == pytest.approx(1.0)


def test_a_node_falling_silent_is_no_rise_of_the_draw() -> None:
    """A silent node counts at the caps it may hold (625 W a GPU after the first cycle, 300 W
    drawn when last heard: 650 W more for its two GPUs), but what the window sees is the
    draw last reported: under a 0.5 kW/s ramp over 2 s the cycle after it falls silent
    keeps its 1 s (the stand-ins counted as drawn would leave it 0.7 s)."""
    text = BUDGETS.replace("budget_kw = 18\n", "budget_kw = 18\nramp_kw_per_s = 0.5\n", 1)
    b = make_bench(text, stale_after_s=0.5, agent_failsafe_after_s=10.0, smoothing=SMOOTHING)
    b.core.ramp_window = RampWindow(2.0)
    b.report_all(300.0, cap_w=CAP_MAX_W)
    b.apply(b.cycle())
    b.clock.advance(1.0)  # k1-n1 silent 1 s: counted at its caps
    for node in NODES[1:]:
        b.report(node, 300.0, cap_w=CAP_MAX_W)
    result = b.cycle()
    assert result.counters.stale_nodes == 1
    assert result.state is not None and result.state.ramp_s == pytest.approx(1.0)


def test_a_rise_of_gpus_their_own_hardware_ramps_is_not_counted() -> None:
    """GPUs whose own smoothing hardware ramps their draw rise at their share whatever the
    caps: the window counts the others' draw, so the same 1.5 kW rise leaves the cycle its
    whole second."""
    assert ramp_s_after_a_rise(1500.0, SMOOTHING, in_hardware=True) == pytest.approx(1.0)
