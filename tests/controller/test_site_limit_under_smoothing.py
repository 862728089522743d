"""Demand response under grid smoothing, in a closed loop with no I/O: the controller's own
pieces (``SiteLimits.tree_under``: the site's bands gliding down at the grid's ramp-down,
``decide`` under the grid policy with ``with_cut_fall``) over the
GPUs' smoothed draw (``policies.smoothing.ramp_toward``, the simulators' rule).

The demo site (256 H100, ``[site.grid]`` 20 kW/s each way over 1 s) runs one synchronous
job: compute at 630 W, then a wait of 1.5-3 s at 150 W, every 10 s. An operator limits the
site to 70 % of its capping threshold, the glide starting in compute or just as the job
waits. The GPUs' draw must fall no faster than their share of the grid's ramp-down: when
the glide began as the job waited, the GPUs were cut over the lowered budget while their
draw fell on its own, 35 kW/s against an 18 kW/s share, until rule 3 stopped cutting a
waiting GPU below its draw under a finite ``cut_fall_w_per_s``.

The bands' (``[policy] safety_by_caps = false``): safety by caps, the default, under a site
limit is tests/controller/test_site_limit_under_caps.py's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from policies import PHASE_CODES, ClusterState, PolicySettings, decide
from policies.smoothing import gpu_ramps, grid_policy, ramp_toward, wanted_w, with_cut_fall
from powerd.protocol import SiteLimit
from powerd.site_limits.limits import SiteLimits
from powerd.topology import load_budgets
from tests.support.paths import REPO

STEP_S = 0.5
COMPUTE_W, WAIT_W, PERIOD_S = 630.0, 150.0, 10.0
LIMIT_SHARE, RUN_S = 0.7, 300.0


def largest_fall_w_per_s(wait_s: float, limit_at_s: float, policy_of) -> tuple[float, float, float]:
    """The GPUs' largest 1 s fall over the run, their share of the ramp-down, and the site's
    measured power at the end against the limit."""
    top = load_budgets(REPO / "powerd" / "data" / "budgets" / "demo.toml")
    tree, spec = top.tree, top.grid
    assert spec is not None
    n = tree.n_gpus
    ramps = gpu_ramps(spec.ramp_up_w_per_s, spec.ramp_down_w_per_s, None, n,
                      hysteresis_s=spec.window_s)  # fmt: skip
    policy = policy_of(ramps.down_w_per_s)
    limit_w = LIMIT_SHARE * float(tree.cap_threshold_w[0])
    limits = SiteLimits()
    limits.take(SiteLimit(v=1, operator="ops", seq=1, ts=limit_at_s, limit_w=limit_w,
                          starts_ts=limit_at_s, expires_ts=10 * RUN_S))  # fmt: skip
    cap = np.asarray(tree.failsafe_cap_w, dtype=float).copy()
    drawn, falling = np.full(n, 300.0), np.zeros(n)
    gpus_w, measured = [], 0.0
    for k in range(int(RUN_S / STEP_S)):
        t = k * STEP_S
        waiting = t % PERIOD_S >= PERIOD_S - wait_s
        natural = np.full(n, WAIT_W if waiting else COMPUTE_W)
        want = wanted_w(np.minimum(natural, cap), cap, np.ones(n, dtype=bool), ramps)
        drawn, falling = ramp_toward(drawn, want, cap, ramps, STEP_S, falling)
        gpus_w.append(drawn.sum())
        measured = float(drawn.sum() + tree.overhead_below_w[0])
        now_tree = limits.tree_under(tree, t, measured, STEP_S, spec.ramp_down_w_per_s)
        phase = PHASE_CODES["communication" if waiting else "compute"]
        state = ClusterState(
            power_w=drawn.copy(),
            cap_w=cap.copy(),
            priority=np.ones(n, dtype=np.int8),
            floor_w=np.asarray(tree.cap_min_w, dtype=float).copy(),
            phase=np.full(n, phase, dtype=np.int8),
            controllable=np.ones(n, dtype=bool),
        )
        cap = decide(now_tree, state, STEP_S, policy).cap_w
    series = np.array(gpus_w)
    per_s = round(1.0 / STEP_S)
    fall = series[:-per_s] - series[per_s:]
    return float(fall.max()), ramps.down_w_per_s * n, measured - limit_w


def controller_policy(down_w_per_s: float) -> PolicySettings:
    """What ControllerCore.cycle_policy runs under grid smoothing, with the bands."""
    return with_cut_fall(grid_policy(PolicySettings(safety_by_caps=False)), down_w_per_s)


# the glide starts in compute (120 s), or in the last second of compute or as the job
# begins to wait (the worst times found, 35 kW/s before the fix, with 2 s waits)
@pytest.mark.parametrize(
    ("wait_s", "limit_at_s"),
    [(1.5, 120.0), (2.0, 120.0), (3.0, 120.0), (2.0, 127.5), (2.0, 128.0), (3.0, 126.5)],
)
def test_a_limit_is_reached_with_the_gpus_falling_no_faster_than_their_share(wait_s, limit_at_s):
    fall, share, over_limit = largest_fall_w_per_s(wait_s, limit_at_s, controller_policy)
    assert fall <= share * (1 + 1e-9), (fall, share)
    assert over_limit <= 0.0  # and the limit is reached: the site is under it at the end


def test_cut_at_once_the_glide_breaks_the_share():
    # the same run with every cut at once (no cut_fall_w_per_s): the check above can fail
    def at_once(down_w_per_s: float) -> PolicySettings:
        return dataclasses.replace(controller_policy(down_w_per_s), cut_fall_w_per_s=np.inf)

    # (as the job begins to wait: with the site's target on the glide line, a glide that
    # starts in compute cuts no faster than the line falls, cut at once or not)
    fall, share, _ = largest_fall_w_per_s(2.0, 128.0, at_once)
    assert fall > 1.2 * share
