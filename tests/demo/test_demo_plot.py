"""The demo's PNG: clock locks as a share of each job's GPUs, on a 0-100 % axis."""

from __future__ import annotations

import numpy as np

from powerd.demo.plot import locked_share_pct, trace_figure
from powerd.demo.summary import JobRecord
from tests.demo.test_demo_summary import make_trace

N = 8  # samples


def two_job_trace():
    """Two jobs of four GPUs each (make_trace's tree); job 0 locks GPU by GPU, all four
    by the end; job 1 locks all four at once from sample 4."""
    locked = np.zeros((N, 8), dtype=bool)
    for k in range(4):
        locked[2 * k :, k] = True  # job 0: 1, then 2, 3 and 4 of its GPUs
    locked[4:, 4:] = True
    return make_trace(
        [[90, 80, 70]] * N,
        gpu_job=np.repeat([0, 1], 4),
        gpu_cap_w=np.full((N, 8), 500.0),
        gpu_locked=locked,
        gpu_phase=np.zeros((N, 8), dtype=np.int8),
        gpu_throughput=np.ones((N, 8)),
        cycle_cut=np.zeros((0, 8), dtype=bool),
        jobs=[
            JobRecord("a", "high", 1, 4, [(0.0, "communication")]),
            JobRecord("b", "low", 1, 4, [(0.0, "communication")]),
        ],
    )


def test_the_locked_share_is_a_mean_over_the_jobs_gpus_never_above_100():
    trace = two_job_trace()
    np.testing.assert_allclose(locked_share_pct(trace, 0), [25, 25, 50, 50, 75, 75, 100, 100])
    np.testing.assert_allclose(locked_share_pct(trace, 1), [0, 0, 0, 0, 100, 100, 100, 100])
    # every GPU of both jobs locked: still 100 %, not the 800 % a sum over GPUs would give
    assert locked_share_pct(trace, 0).max() == 100.0
    np.testing.assert_array_equal(locked_share_pct(trace, 2), np.zeros(N))  # no such job


def test_the_lock_panel_runs_from_0_to_100_percent_and_holds_each_jobs_share():
    trace = two_job_trace()
    fig = trace_figure(trace)
    locks = next(ax for ax in fig.axes if "% of GPUs" in ax.get_ylabel())
    assert locks.get_ylim() == (0.0, 100.0)
    assert max(locks.get_yticks()) <= 100
    tops = [float(c.get_paths()[0].vertices[:, 1].max()) for c in locks.collections]
    assert tops == [100.0, 100.0]  # one fill per job, each reaching all its GPUs
    assert [line.get_ydata().max() for line in locks.get_lines()] == [100.0, 100.0]
    # no axis of the figure is a share above 100 %
    for ax in fig.axes:
        if "%" in ax.get_ylabel():
            assert ax.get_ylim()[1] <= 100.0


def test_every_power_panel_leaves_headroom_above_its_limit_line():
    """Power 44-107 W under a 110 W row limit (the demo's row1, in W): matplotlib's margin
    over the power alone ended the axis 0.15 W above the limit, which the frame hid."""
    power = np.array([[50.0, 44.0, 40.0]] * N)
    power[2:6] = [117.0, 107.0, 90.0]
    fig = trace_figure(make_trace(power))
    panels = [ax for ax in fig.axes if ax.get_ylabel() == "kW"]
    assert [ax.get_title(loc="left") for ax in panels] == ["site site", "row row"]
    for ax, limit_kw in zip(panels, (0.120, 0.110), strict=True):
        bottom, top = ax.get_ylim()
        drawn = [float(np.max(line.get_ydata())) for line in ax.get_lines()]
        assert max(drawn) == limit_kw  # the limit is the highest line drawn
        assert top - limit_kw >= 0.05 * (top - bottom), (ax.get_title(loc="left"), top)
        assert bottom < min(float(np.min(line.get_ydata())) for line in ax.get_lines())
