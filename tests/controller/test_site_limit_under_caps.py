"""Demand response under safety by caps, in a closed loop with no I/O: the controller's own
pieces (``SiteLimits.line`` on the caps in force, ``policies.in_force.tree_in_force`` with
the grid's ramp-up, ``policies.decide`` under ``safety_by_caps``) over GPUs that draw
``min(demand, cap)`` at once (a cap holds in hardware within ~0.1 s).

The demo site (256 H100, ``[site.grid]`` 20 kW/s each way over 1 s): half its GPUs compute
at their maximum, half at 55 % of it (they lend). An operator limits the site to 75 % of
its feed for 60 s. The draw must fall and, after expiry, rise no faster than the grid's
ramps, and be under the limit once the line has ended. Held to the line from the measured
power alone (no ``committed_w``), the caps cut the draw by the headroom the lenders keep
over it at once (``bench_scale --site-limit-mw 110 --safety caps``: 2.3 MW/s against
1 MW/s)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from policies import PHASE_CODES, ClusterState, PolicySettings, decide
from policies.allocation import caps_at_draw_w
from policies.in_force import GLIDE_SHARE_OF_RAMP, tree_in_force
from powerd.protocol import SiteLimit
from powerd.site_limits.limits import SiteLimits
from powerd.topology import load_budgets
from tests.support.paths import REPO

STEP_S = 0.5
LIMIT_AT_S, LIMIT_FOR_S, RUN_S = 30.0, 60.0, 150.0
POLICY = dataclasses.replace(PolicySettings(), safety_by_caps=True)


def run(line_on_caps: bool, site_ramp: bool = True) -> tuple[np.ndarray, float, float, float]:
    """The GPUs' draw every step, the grid's ramps down and up, and the limit.
    ``line_on_caps``: the line is held above where the caps in force could be without
    moving any draw (the controller's ``committed_w``); ``site_ramp``: the site's ramp in
    the tree (the grid's ramp-up, which also spreads a cycle's fall), else none."""
    top = load_budgets(REPO / "powerd" / "data" / "budgets" / "demo.toml")
    spec = top.grid
    assert spec is not None
    tree = tree_in_force(top.tree, grid_ramp_up_w_per_s=spec.ramp_up_w_per_s, by_caps=True)
    if not site_ramp:
        tree = dataclasses.replace(tree, ramp_w_per_s=np.full(tree.n_nodes, np.inf))
    n = tree.n_gpus
    cap_max = np.asarray(tree.cap_max_w, dtype=float)
    demand = np.where(np.arange(n) % 2 == 0, cap_max, 0.55 * cap_max)
    limit_w = 0.75 * float(tree.limit_w[0])
    limits = SiteLimits()
    limits.take(SiteLimit(v=1, operator="ops", seq=1, ts=LIMIT_AT_S, limit_w=limit_w,
                          starts_ts=LIMIT_AT_S, expires_ts=LIMIT_AT_S + LIMIT_FOR_S))  # fmt: skip
    cap = np.asarray(tree.failsafe_cap_w, dtype=float).copy()
    overhead_w = float(tree.overhead_below_w[0])
    at_draw_w = None
    drawn_w = []
    for k in range(int(RUN_S / STEP_S)):
        t = k * STEP_S
        drawn = np.minimum(demand, cap)
        drawn_w.append(drawn.sum())
        state = ClusterState(
            power_w=drawn,
            cap_w=cap.copy(),
            priority=np.ones(n, dtype=np.int8),
            floor_w=np.asarray(tree.cap_min_w, dtype=float).copy(),
            phase=np.full(n, PHASE_CODES["compute"], dtype=np.int8),
            controllable=np.ones(n, dtype=bool),
        )
        measured_w = float(drawn.sum()) + overhead_w
        line = limits.line(
            tree, t, measured_w, STEP_S, spec.ramp_down_w_per_s,
            committed_w=at_draw_w if line_on_caps else None, by_caps=True,
        )  # fmt: skip
        now_tree = tree if line is None else tree_in_force(tree, site_line=line, by_caps=True)
        cap = decide(now_tree, state, STEP_S, POLICY).cap_w  # acknowledged by the next step
        at_draw_w = caps_at_draw_w(now_tree, state, POLICY)
    return np.array(drawn_w), spec.ramp_down_w_per_s, spec.ramp_up_w_per_s, limit_w - overhead_w


def per_second(series: np.ndarray) -> np.ndarray:
    w = round(1.0 / STEP_S)
    rate: np.ndarray = series[w:] - series[:-w]
    return rate


def test_the_draw_falls_and_rises_within_the_grid_ramps_and_keeps_the_limit():
    drawn, down, up, limit_gpus_w = run(line_on_caps=True)
    rate = per_second(drawn)
    assert -rate.min() <= GLIDE_SHARE_OF_RAMP * down + 1e-6, (-rate.min(), down)
    assert rate.max() <= GLIDE_SHARE_OF_RAMP * up + 1e-6, (rate.max(), up)
    during = drawn[int(LIMIT_AT_S / STEP_S) : int((LIMIT_AT_S + LIMIT_FOR_S) / STEP_S)]
    assert drawn[int(LIMIT_AT_S / STEP_S) - 1] > limit_gpus_w  # the limit asks for a cut
    assert during[-1] <= limit_gpus_w + 1e-6  # reached before expiry, and kept
    assert drawn[-1] > limit_gpus_w + 0.5 * (drawn[0] - limit_gpus_w)  # and risen again


def test_either_bound_alone_keeps_the_fall_within_the_ramp():
    for line_on_caps, site_ramp in ((True, False), (False, True)):
        drawn, down, _, _ = run(line_on_caps, site_ramp)
        assert -per_second(drawn).min() <= GLIDE_SHARE_OF_RAMP * down + 1e-6


def test_with_neither_the_draw_falls_faster_than_the_ramp():
    drawn, down, _, _ = run(line_on_caps=False, site_ramp=False)
    assert -per_second(drawn).min() > 1.2 * GLIDE_SHARE_OF_RAMP * down


@pytest.mark.parametrize("line_on_caps", [True, False])
def test_the_caps_keep_the_limit_once_the_line_has_ended(line_on_caps):
    drawn, _, _, limit_gpus_w = run(line_on_caps)
    end = int((LIMIT_AT_S + LIMIT_FOR_S) / STEP_S)
    assert drawn[end - 10 : end].max() <= limit_gpus_w + 1e-6
