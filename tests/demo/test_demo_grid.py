"""The demo's summary against the grid spec: the site's power measured by policies.grid on a
handmade trace with a known ramp and a known oscillation, recomputed here independently
(plain loops and an explicit DFT), the breach lines, and no breach without a spec."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from policies import grid as grid_measure
from policies.causes import CAPPING, STAGED
from policies.tree import PHASE_CODES
from powerd.demo.report import print_outcome
from powerd.demo.summary import JobRecord, Summary, regular_series, summarize
from powerd.demo.view import grid_bounds_line, grid_breach_line, grid_rows, print_summary
from powerd.topology.grid import NO_GRID_SPEC, GridSpec
from tests.demo.test_demo_summary import make_trace

DT = 0.1
N = 600  # 60 s
SPEC = GridSpec(
    ramp_up_w_per_s=15.0,
    ramp_down_w_per_s=15.0,
    window_s=1.0,
    oscillation_band_hz=(0.1, 20.0),
    oscillation_max_share=0.2,
    oscillation_window_s=20.0,
)


def site_series() -> np.ndarray:
    """60 s at 0.1 s: a 0.5 Hz ±5 W swing for the first 20 s (its 1 s change is at most
    10 W/s, under the 15 W/s limit), flat for 20 s, then +30 W in a straight line over
    1.5 s from 45 s (20 W/s) and -30 W at once at 52 s."""
    t = np.arange(N) * DT
    p = np.full(N, 60.0)
    p[t < 20] += 5.0 * np.sin(2 * np.pi * 0.5 * t[t < 20])
    rise = (t >= 45) & (t < 46.5)
    p[rise] += 20.0 * (t[rise] - 45)
    p[(t >= 46.5) & (t < 52)] += 30.0
    return p


def grid_trace(site: np.ndarray, grid: GridSpec | None, t: np.ndarray | None = None):
    power = np.column_stack([site, np.full(len(site), 50.0), np.full(len(site), 40.0)])
    t = np.arange(len(site)) * DT if t is None else t
    return make_trace(power, t=t, grid=grid)


# --- independent recomputation ----------------------------------------------------------


def ramps_by_hand(p: np.ndarray, dt: float, window_s: float, up_lim: float, down_lim: float):
    w = round(window_s / dt)
    rates = [(p[i] - p[i - w]) / (w * dt) for i in range(w, len(p))]
    ups = [max(r, 0.0) for r in rates]
    downs = [max(-r, 0.0) for r in rates]
    return {
        "up_max": max(ups),
        "up_p99": float(np.percentile(ups, 99)),
        "down_max": max(downs),
        "down_p99": float(np.percentile(downs, 99)),
        "s_up": sum(u > up_lim for u in ups) * dt,
        "s_down": sum(d > down_lim for d in downs) * dt,
    }


def share_by_hand(x: np.ndarray, dt: float, lo: float, hi: float, taper: bool = False) -> float:
    """Share of the variance in [lo, min(hi, Nyquist)] from an explicit one-sided DFT;
    ``taper``: of the series, mean taken off, times a periodic Hann window."""
    x = np.asarray(x, float) - np.mean(x)
    n = len(x)
    if taper:
        x = x * (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n))
    total = float(np.sum(x**2))
    if total <= 1e-18:
        return 0.0
    inside = 0.0
    for k in range(1, n // 2 + 1):
        f = k / (n * dt)
        if not lo <= f <= min(hi, 1 / (2 * dt)):
            continue
        m = np.arange(n)
        xk = np.sum(x * np.exp(-2j * np.pi * k * m / n))
        both_sides = 1.0 if (n % 2 == 0 and k == n // 2) else 2.0
        inside += both_sides * abs(xk) ** 2 / n
    return inside / total


# --- tests ------------------------------------------------------------------------------


def test_the_site_is_measured_against_the_grid_spec_as_recomputed_by_hand():
    p = site_series()
    g = summarize(grid_trace(p, SPEC)).grid
    assert g["spec"] == SPEC.describe() and g["measured"] and g["step_s"] == pytest.approx(DT)

    want = ramps_by_hand(p, DT, 1.0, 15.0, 15.0)
    assert want["up_max"] == pytest.approx(20.0) and want["down_max"] == pytest.approx(30.0)
    assert g["ramp_window_s"] == pytest.approx(1.0)
    assert g["ramp_up_max_w_per_s"] == pytest.approx(want["up_max"])
    assert g["ramp_up_p99_w_per_s"] == pytest.approx(want["up_p99"])
    assert g["ramp_down_max_w_per_s"] == pytest.approx(want["down_max"])
    assert g["ramp_down_p99_w_per_s"] == pytest.approx(want["down_p99"])
    assert g["s_outside_ramp_up"] == pytest.approx(want["s_up"]) and want["s_up"] > 0
    assert g["s_outside_ramp_down"] == pytest.approx(want["s_down"]) and want["s_down"] > 0
    assert g["ramp_up_limit_w_per_s"] == 15.0 and g["ramp_down_limit_w_per_s"] == 15.0

    # 0.1 s steps see 0.1-5 Hz of the 0.1-20 Hz band; 20 s windows every 10 s, tapered,
    # each standing for the 10 s around its middle (the first and the last 5 s more)
    assert g["oscillation_band_hz"] == [0.1, 20.0]
    assert g["oscillation_band_seen_hz"] == pytest.approx([0.1, 5.0])
    assert "only 0.1-5 Hz" in g["oscillation_note"]
    assert g["oscillation_windows"] == 5 and g["oscillation_window_s"] == pytest.approx(20.0)
    shares = [share_by_hand(p[k : k + 200], DT, 0.1, 20.0, taper=True) for k in range(0, 401, 100)]
    stands_for_s = [15.0, 10.0, 10.0, 10.0, 15.0]
    assert shares[0] == pytest.approx(1.0)  # the swing: all of it at 0.5 Hz
    assert shares[2] == 0.0  # flat
    assert g["oscillation_share"] == pytest.approx(share_by_hand(p, DT, 0.1, 20.0))
    assert g["oscillation_share_max"] == pytest.approx(max(shares))
    outside_s = sum(s_for for s, s_for in zip(shares, stands_for_s, strict=True) if s > 0.2)
    assert g["s_outside_oscillation"] == pytest.approx(outside_s) and outside_s >= 15.0
    assert g["peak_to_peak_max_w"] == pytest.approx(30.0)

    summary = summarize(grid_trace(p, SPEC))
    expected = [
        f"ramp up {want['s_up']:.1f} s",
        f"ramp down {want['s_down']:.1f} s",
        f"oscillation {g['s_outside_oscillation']:.1f} s",
    ]
    assert summary.grid_breaches == g["breaches"] == expected
    assert grid_breach_line(summary) == "outside the grid spec: " + ", ".join(expected)
    assert summary.exit_code == 0  # breaches are not limit violations
    json.dumps(summary.to_dict(), allow_nan=False)  # valid JSON: no NaN, no inf


def test_the_demo_ramp_is_the_shared_one_and_the_sum_of_caps_stays_beside_it():
    p = site_series()
    s = summarize(grid_trace(p, SPEC))
    assert s.peak_site_ramp_up_w_per_s == pytest.approx(s.grid["ramp_up_max_w_per_s"])
    assert s.peak_site_ramp_down_w_per_s == pytest.approx(s.grid["ramp_down_max_w_per_s"])
    rows = dict((label, value) for label, value, _ in grid_rows(s))
    assert "sum of caps +0.0 kW/s" in rows["site ramp (1 s)"]


def test_a_spec_met_leaves_no_breach_but_still_shows_the_seconds():
    flat = np.full(N, 60.0)
    s = summarize(grid_trace(flat, SPEC))
    assert s.grid["breaches"] == [] and grid_breach_line(s) is None
    assert s.grid["s_outside_ramp_up"] == s.grid["s_outside_oscillation"] == 0.0
    rows = {label: (value, style) for label, value, style in grid_rows(s)}
    assert rows["outside the grid spec"] == (
        "ramp up 0.0 s, ramp down 0.0 s, oscillation 0.0 s",
        "green",
    )


def test_without_a_grid_spec_the_summary_says_so_and_shows_no_breach():
    p = site_series()
    s = summarize(grid_trace(p, None))
    g = s.grid
    assert g["spec"] == NO_GRID_SPEC and g["breaches"] == [] and s.grid_breaches == []
    assert not any(k.startswith("s_outside") or k.endswith("_limit_w_per_s") for k in g)
    # still measured, with the defaults (1 s ramps, 0.1-20 Hz per 60 s)
    assert g["ramp_up_max_w_per_s"] == pytest.approx(20.0)
    assert g["oscillation_windows"] == 1
    out = _printed(s)
    assert "no grid spec" in out
    assert "outside the grid spec" not in out


def test_the_terminal_summary_and_the_outcome_flag_every_breach():
    s = summarize(grid_trace(site_series(), SPEC))
    out = _printed(s)
    assert "grid spec" in out and SPEC.describe() in out
    assert "outside the grid spec" in out and "site ramp (1 s)" in out and "p99" in out
    lines = _outcome(s)
    assert f"GRID (warning): {grid_breach_line(s)} ({SPEC.describe()})" in lines


def test_the_verdict_agrees_with_every_check_above_it_and_with_the_exit_code():
    """A grid breach is a warning (the demo exits 1 on a limit only): the last line says
    'ok, with warnings', never a bare 'ok' under a GRID line; a limit violated says failed."""
    within = summarize(grid_trace(np.full(N, 60.0), SPEC))
    assert within.verdict == "ok" and within.warnings == [] and within.exit_code == 0
    assert _outcome(within)[-1].startswith("ok: no rack, row, node or the site went over")

    breached = summarize(grid_trace(site_series(), SPEC))
    assert breached.verdict == "ok, with warnings" and breached.warnings == ["grid spec"]
    assert breached.exit_code == 0 and breached.to_dict()["verdict"] == "ok, with warnings"
    last = _outcome(breached)[-1]
    assert last.startswith("ok, with warnings: no rack, row, node or the site went over")
    assert "broke the grid spec (GRID above)" in last and last.endswith("exit 0")

    over = site_series()
    over[100:110] = 130.0  # above the site's 120 W limit for 1 s, and a breach of the spec
    failed = summarize(grid_trace(over, SPEC))
    assert failed.verdict == "limit violated" and failed.exit_code == 1
    lines = _outcome(failed)
    assert any(line.startswith("LIMIT VIOLATED: site site") for line in lines)
    assert lines[-1] == "failed: a tree node went over a limit (LIMIT VIOLATED above); exit 1"
    assert not any(line.startswith("ok") for line in lines)


def _outcome(summary: Summary) -> list[str]:
    """What print_outcome prints, the summary table included, line by line."""
    buf = io.StringIO()
    run: Any = SimpleNamespace(summary=summary, recorded=None)  # the DemoRun fields it reads
    plot: Any = _Path()
    print_outcome(Console(file=buf, width=300), run, plot, None)
    return [line.rstrip() for line in buf.getvalue().splitlines() if line.strip()]


def test_jittered_samples_are_put_back_on_their_grid():
    t = np.arange(50) * DT + np.random.default_rng(0).uniform(0.0, 0.02, 50)
    t[0] = 0.0
    v = 3.0 * t  # a draw moving steadily between its samples
    series, step = regular_series(t, v)
    assert step == pytest.approx(DT, abs=0.01)
    np.testing.assert_allclose(series, 3.0 * step * np.arange(len(series)))
    # regular samples come back as they are
    series, _ = regular_series(np.arange(5) * 0.1, np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    np.testing.assert_allclose(series, [1, 2, 3, 4, 5])


def test_a_steady_fall_reads_its_own_rate_where_the_sampler_slips():
    """18 kW/s down, sampled every 0.1 s but up to 0.04 s late, a tenth of them 0.04 s
    more: holding the last sample read this as 15.9 to 20.0 kW/s (a 1 s window spanning
    0.9 to 1.1 s of samples); on the interpolated grid every window reads 18 kW/s."""
    rng = np.random.default_rng(3)
    t = 0.1 * np.arange(200) + rng.uniform(0.0, 0.04, 200)
    t[rng.choice(200, 20)] += 0.04
    t.sort()
    site = 200e3 - 18e3 * t
    series, step = regular_series(t, site)
    rate = grid_measure.ramp_rates(series, step, 1.0)
    assert -rate.max() == pytest.approx(18e3, rel=1e-6)
    assert -rate.min() == pytest.approx(18e3, rel=1e-6)


def test_a_trace_too_short_to_measure_says_so():
    s = summarize(grid_trace(np.array([60.0]), SPEC))
    assert s.grid["measured"] is False and s.grid["breaches"] == []
    json.dumps(s.to_dict(), allow_nan=False)


class _Path:
    def resolve(self) -> str:
        return "demo-power.png"


def _printed(summary) -> str:
    buf = io.StringIO()
    print_summary(Console(file=buf, width=300), summary, None)
    return buf.getvalue()


def test_under_smoothing_the_least_floor_is_taken_on_the_draw_without_the_fill():
    """A flat 100 W site whose GPUs filled a 1 s, 30 W dip: the least floor that meets
    15 W/s each way is what policies.grid finds on the dip itself, not on the flat line."""
    from policies.grid import least_ramp_floor

    t = np.arange(N) * DT
    dip = (t >= 20) & (t < 21)
    natural = np.where(dip, 70.0, 100.0)
    fill_w = np.full(N, 100.0) - natural
    fill_j = np.concatenate([[0.0], np.cumsum(fill_w[1:] * DT)])  # the energy since the start
    power = np.column_stack([np.full(N, 100.0), np.full(N, 50.0), np.full(N, 50.0)])
    s = summarize(make_trace(power, t=t, grid=SPEC, gpu_fill_energy_j=fill_j))
    assert s.grid["floor_source"] == "burnt by smoothing"
    assert s.grid["floor_energy_kwh"] == pytest.approx(30.0 * 1.0 / 3.6e6)
    least = least_ramp_floor(natural, DT, 1.0, 15.0, 15.0)
    want_j = float((least - natural).sum()) * DT
    assert want_j > 0 and s.grid["floor_least_kwh"] == pytest.approx(want_j / 3.6e6)
    rows = dict((label, value) for label, value, _ in grid_rows(s))
    assert "the least any floor within the ramp limits burns" in rows["grid floor"]


def test_the_least_ready_floor_holds_each_wait_one_window_under_its_resumption():
    """Two GPUs: one computes at 40 W throughout; the other at 50 W, but waits 3 s (from 20
    s) at 20 W while filling 15 W. Were it to resume, the site (10 W of overhead) would
    draw 100 W; 15 W/s over 1 s windows lets the wait be 15 W under that, so a floor that
    cannot know when the wait ends holds 85 W for all 3 s (45 J over the 70 W it draws);
    the least floor knows the end is 2 s away and lets the middle second down (30 J)."""
    t = np.arange(N) * DT
    wait = (t >= 20) & (t < 23)
    natural = np.column_stack([np.where(wait, 20.0, 50.0), np.full(N, 40.0)])
    fill_w = np.column_stack([np.where(wait, 15.0, 0.0), np.zeros(N)])
    fill_j = np.concatenate([np.zeros((1, 2)), np.cumsum(fill_w[1:] * DT, axis=0)])
    drawn = natural + fill_w
    site = 10.0 + drawn.sum(axis=1)
    power = np.column_stack([site, site, site])
    phase = np.full((N, 2), PHASE_CODES["compute"], dtype=np.int8)
    phase[wait, 0] = PHASE_CODES["communication"]
    s = summarize(
        make_trace(
            power,
            t=t,
            grid=SPEC,
            gpu_phase=phase,
            gpu_fill_energy_j=fill_j.sum(axis=1),
            gpu_power_w=drawn,
            gpu_fill_energy_each_j=fill_j,
        )
    )
    assert s.grid["floor_energy_kwh"] == pytest.approx(45.0 / 3.6e6)  # what the fill burnt
    assert s.grid["floor_ready_kwh"] == pytest.approx(45.0 / 3.6e6)
    assert s.grid["floor_least_kwh"] == pytest.approx(30.0 / 3.6e6)
    rows = dict((label, value) for label, value, _ in grid_rows(s))
    assert "one that cannot know when waits end: 0.000 kWh" in rows["grid floor"]
    # without per-GPU samples there is nothing to be ready for: no such figure
    bare = summarize(make_trace(power, t=t, grid=SPEC, gpu_fill_energy_j=fill_j.sum(axis=1)))
    assert "floor_ready_kwh" not in bare.grid and "floor_least_kwh" in bare.grid


def test_the_summary_gives_the_work_lost_to_the_grid_against_its_bound():
    """1 s samples, rises ≤ 4 W/s over 1 s, 10 W of overhead. One GPU's demand steps from 0
    to 10 W at 2 s; it drew 0, 2 (2 W of it fill), 6, 8 W. The site needed 10, 10, 20,
    20 W and drew 10, 12, 16, 18: 4 + 2 = 6 J of work lost. Holding ``h`` W at 1 s loses
    (6 - h)^+ + (2 - h)^+ J, so at the 2 J burnt the least is 4 J: 1.5x the bound. The
    least causal floor on the draw without the fill (10, 10, 16, 18: a 6 W rise) lifts
    1 s to 12 W: 2 J, as much as was burnt (1.0x)."""
    drawn = np.column_stack([[0.0, 2.0, 6.0, 8.0], np.zeros(4)])
    fill_j = np.column_stack([[0.0, 2.0, 2.0, 2.0], np.zeros(4)])
    demand = np.column_stack([[0.0, 0.0, 10.0, 10.0], np.zeros(4)])
    site = 10.0 + drawn.sum(axis=1)
    spec = GridSpec(ramp_up_w_per_s=4.0, window_s=1.0)
    # the GPU's cap, last lowered by a staged phase (a grid rule), held it at what it drew
    slow = np.column_stack([[1.0, 1.0, 0.8, 0.9], np.ones(4)])
    caps = np.column_stack([[500.0, 500.0, 6.0, 8.0], np.full(4, 500.0)])

    def run(cause: int, staged_from_w: float | None = None):
        from_w = None if staged_from_w is None else np.array([[staged_from_w, np.inf]])
        return summarize(
            make_trace(
                np.column_stack([site, site, site]),
                grid=spec,
                gpu_fill_energy_j=fill_j.sum(axis=1),
                gpu_power_w=drawn,
                gpu_fill_energy_each_j=fill_j,
                gpu_demand_w=demand,
                gpu_throughput=slow,
                gpu_cap_w=caps,
                cycle_t=np.array([0.0]),
                cycle_capping=np.zeros((1, 3), dtype=bool),
                cycle_cut=np.ones((1, 2), dtype=bool),
                cycle_cause=np.array([[cause, cause]], dtype=np.int8),
                cycle_staged_from_w=from_w,
            )
        )

    s = run(STAGED)
    g = json.loads(json.dumps(s.to_dict()))["grid"]  # as --summary-json writes it
    assert g["lost_work_kwh"] == pytest.approx(6.0 / 3.6e6)
    assert g["lost_least_kwh"] == pytest.approx(4.0 / 3.6e6)
    assert g["lost_ratio_to_bound"] == pytest.approx(1.5)
    # at its floors (10, 12, 20, 20 W under the need and the draw): 10, 12, 16, 20 W rising
    # 4 W/s, losing 4 J; so 1.5x that too
    assert g["lost_at_floors_kwh"] == pytest.approx(4.0 / 3.6e6)
    assert g["lost_ratio_at_floors"] == pytest.approx(1.5)
    # held by the budgets (capping), not by the grid: no work lost to the grid
    assert run(CAPPING).grid["lost_work_kwh"] == 0.0
    # staged under a budget's 7 W cap: the stage holds only up to it (1 J at 2 s), the rest
    # is the budget's
    assert run(STAGED, staged_from_w=7.0).grid["lost_work_kwh"] == pytest.approx(1.0 / 3.6e6)
    assert g["floor_ready_kwh"] == pytest.approx(2.0 / 3.6e6)
    assert g["floor_ratio_to_causal"] == pytest.approx(1.0)
    rows = dict((label, value) for label, value, _ in grid_rows(s))
    # one job on every GPU: its fixed share is the whole site's, the same bound
    assert g["floor_shared_kwh"] == pytest.approx(g["floor_ready_kwh"])
    assert rows["grid cost vs bounds"].startswith(
        "floor 1.00x the causal bound, 1.00x the least with each job's fixed share; lost 0.000 kWh"
    )
    assert "1.50x the least at its floors (0.000 kWh)" in rows["grid cost vs bounds"]
    assert rows["grid cost vs bounds"].endswith("0.000 kWh the least at that energy")
    # burning 6 J, no work need be lost: the ratio is infinite, and the line says why
    g["lost_least_kwh"], g["lost_ratio_to_bound"] = 0.0, None
    assert grid_bounds_line(g).endswith("burning as much, none need be lost")
    # no demand recorded: no lost work
    bare = summarize(make_trace(np.column_stack([site, site, site]), grid=spec))
    assert "lost_work_kwh" not in bare.grid


def test_compute_that_waited_to_fill_back_up_is_work_lost_to_the_grid():
    """A job's compute waited from 1 s to 2 s for its GPU to fill back up (software
    smoothing, after a checkpoint): that second its GPU drew 2 W, all of it fill, where
    compute would have drawn 10 W (its demand at 2 s, once it computed). 10 J of work were
    lost to the grid, though no sample of a progress phase ran slow."""
    drawn = np.column_stack([[0.0, 2.0, 10.0, 10.0], np.zeros(4)])
    fill_j = np.column_stack([[0.0, 2.0, 2.0, 2.0], np.zeros(4)])
    demand = np.column_stack([[0.0, 0.0, 10.0, 10.0], np.zeros(4)])
    site = 10.0 + drawn.sum(axis=1)
    job = JobRecord("job", "high", 1, 2, [(0.0, "checkpoint"), (2.0, "compute")], 1.0, [(1.0, 2.0)])
    s = summarize(
        make_trace(
            np.column_stack([site, site, site]),
            grid=GridSpec(ramp_up_w_per_s=4.0, window_s=1.0),
            gpu_fill_energy_j=fill_j.sum(axis=1),
            gpu_power_w=drawn,
            gpu_fill_energy_each_j=fill_j,
            gpu_demand_w=demand,
            jobs=[job],
        )
    )
    assert s.grid["lost_work_kwh"] == pytest.approx(10.0 / 3.6e6)
    # the site needed 10, 20, 20, 20 W (its draw without the fill, 10, 10, 20, 20, and the
    # 10 W compute waited for); the highest series under that rising 4 W/s: 10, 14, 18, 20,
    # losing 6 + 2 = 8 J
    assert s.grid["lost_at_floors_kwh"] == pytest.approx(8.0 / 3.6e6)
