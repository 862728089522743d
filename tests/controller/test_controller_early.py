"""Early decisions: a tree node crossing its capping threshold between periods asks for a cycle
now; an early cycle hands back no more watts per second than a periodic one."""

from __future__ import annotations

import numpy as np
import pytest

from tests.controller.test_controller_core import BANDS, CAP_MAX_W, FAILSAFE_W, Bench, make_bench


@pytest.fixture
def bench() -> Bench:
    b = make_bench()
    b.report_all(300.0)  # every rack far below its thresholds
    b.apply(b.cycle())
    return b


def test_no_reason_before_the_first_cycle() -> None:
    fresh = make_bench()
    fresh.report_all(650.0)
    assert not fresh.core.crossed_threshold()


def test_a_rack_newly_over_its_threshold_asks_for_a_decision(bench: Bench) -> None:
    assert not bench.core.crossed_threshold()  # nothing changed since the cycle
    bench.report("k1-n1", 650.0)  # k1: 2 x 650 + 2 x 300 + 100 = 2000 W > 1470 W
    assert bench.core.crossed_threshold()
    bench.cycle(advance_s=0.25)  # decided: k1 was over at that cycle
    assert not bench.core.crossed_threshold()


def test_a_rack_over_and_still_rising_asks_again(bench: Bench) -> None:
    bench.report("k1-n1", 650.0)
    bench.cycle(advance_s=0.25)
    bench.report("k1-n2", 330.0)  # +60 W: 4 % of k1's 1500 W budget
    assert bench.core.crossed_threshold()
    bench.cycle(advance_s=0.25)
    bench.report("k1-n2", 335.0)  # +10 W: under 1 % of its budget
    assert not bench.core.crossed_threshold()


def test_an_early_cycle_hands_back_a_share_of_a_full_step() -> None:
    """From the same capped state, a cycle 0.25 s after the last gives back a quarter of
    what a cycle a full period later gives back. (The bands' uncapping step, scaled by the
    cycle's length; safety by caps raises only GPUs held at their caps.)"""
    raised = {}
    for dt in (1.0, 0.25):
        b = make_bench(policy=BANDS)
        b.report_all(300.0, cap_w=FAILSAFE_W)
        b.apply(b.cycle())  # answered: no command in flight
        b.core.cap_w[:] = b.core.commanded_cap_w[:] = FAILSAFE_W  # held low: room everywhere
        b.clock.advance(dt)
        b.report_all(300.0, cap_w=FAILSAFE_W)
        result = b.cycle()
        gpus = b.gpus("k2-n1")
        raised[dt] = float(np.mean(result.decision.cap_w[gpus.start : gpus.stop])) - FAILSAFE_W
    assert raised[1.0] > 0
    assert raised[0.25] == pytest.approx(raised[1.0] / 4, rel=0.01)
    assert raised[1.0] < CAP_MAX_W - FAILSAFE_W
