"""planner.rhythm and `powerplan whatif --synchronised --smoothing`: a synchronous job's
profile, and two of them replayed through grid smoothing on the demo site."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from planner.cli import main
from planner.mix import parse_mix, place
from planner.rhythm import Rhythm, rhythm_profile, rhythm_series
from planner.sizing import WorkloadTrace
from planner.whatif import WhatifSettings, grid_table, replay
from policies.grid import least_ramp_floor
from policies.tree import PHASE_CODES
from powerd.gpu.models import GPU_MODELS
from powerd.topology import load_budgets, parse_budgets
from tests.support.paths import REPO

DEMO = REPO / "powerd" / "data" / "budgets" / "demo.toml"
MIX = '[[jobs]]\nworkload = "sync"\nshare = 0.95\ncount = 2\n'
SHORT = Rhythm(
    gpu="H100", idle_s=5, startup_s=5, run_s=120, comm_s=0.5, checkpoint_s=10, tail_s=30, step_s=0.5
)


def test_the_schedule_covers_the_profile_in_order_without_gaps():
    phases = SHORT.phases()
    assert phases[0] == (0.0, 5.0, "idle") and phases[-1][2] == "shutdown"
    assert phases[-1][1] == pytest.approx(SHORT.duration_s)
    for (_, end, _), (start, _, _) in itertools.pairwise(phases):
        assert start == pytest.approx(end)
    waits = [p for p in phases if p[2] == "communication"]
    assert waits and all(e - s == pytest.approx(0.5) for s, e, _ in waits)
    checkpoints = [p for p in phases if p[2] == "checkpoint"]
    assert [e - s for s, e, _ in checkpoints] == [pytest.approx(10.0)]
    assert checkpoints[0][0] == pytest.approx(5 + 5 + 60)  # mid-run, by the run's clock


def test_each_step_draws_the_mean_of_its_phases():
    h100 = GPU_MODELS["H100"]
    rhythm = Rhythm(
        gpu="H100",
        compute_w=600.0,
        idle_s=1,
        startup_s=1,
        run_s=10,
        period_s=10,
        comm_s=0.25,
        checkpoints=0,
        tail_s=1,
        step_s=0.5,
    )
    power, phase = rhythm_series(rhythm)
    idle, comm = h100.idle_power_w, h100.idle_power_w + 0.2 * (600.0 - h100.idle_power_w)
    assert power[0] == idle and phase[0] == "idle"
    assert power[5] == 600.0 and phase[5] == "compute"
    # 11.5-12 s: 0.25 s computing then 0.25 s waiting; the phase that fills most wins a tie
    assert power[23] == pytest.approx((600.0 + comm) / 2)
    # energy is kept: the series integrates to the schedule's energy
    loads = {"idle": 0.0, "startup": 0.05, "compute": 1.0, "communication": 0.2, "shutdown": 0.0}
    energy = sum((e - s) * (idle + loads[p] * (600.0 - idle)) for s, e, p in rhythm.phases())
    assert power.sum() * 0.5 == pytest.approx(energy)


def test_the_profile_is_a_profile_table_the_readers_take(tmp_path: Path):
    table = rhythm_profile(SHORT, "sync", gpus=4)
    assert len(table) == 4 * len(rhythm_series(SHORT)[0])
    path = tmp_path / "sync.csv"
    result = CliRunner().invoke(
        main,
        [
            "rhythm",
            str(path),
            "--gpu",
            "H100",
            "--run-s",
            "120",
            "--gpus",
            "4",
            "--workload",
            "sync",
        ],
    )
    assert result.exit_code == 0, result.output
    read = pd.read_csv(path)
    assert set(read["phase"]) >= {
        "idle",
        "startup",
        "compute",
        "communication",
        "checkpoint",
        "shutdown",
    }
    bad = CliRunner().invoke(main, ["rhythm", str(tmp_path / "x.csv"), "--comm-s", "20"])
    assert bad.exit_code != 0 and "shorter than period_s" in bad.output
    unknown = CliRunner().invoke(main, ["rhythm", str(tmp_path / "x.csv"), "--gpu", "Z9"])
    assert unknown.exit_code != 0 and "known:" in unknown.output


def sync_trace() -> dict[str, WorkloadTrace]:
    power, phase = rhythm_series(SHORT)
    codes = np.array([PHASE_CODES[p] for p in phase], dtype=np.int8)
    return {"sync": WorkloadTrace("sync", power, codes, SHORT.step_s, 8)}


def replay_sync(smoothing: bool, text: str | None = None):
    top = load_budgets(DEMO) if text is None else parse_budgets(text, source="demo.toml")
    placement = place(top, parse_mix(MIX))
    settings = WhatifSettings(duration_s=SHORT.duration_s, synchronised=True, smoothing=smoothing)
    return replay(top, placement, sync_trace(), settings)


def test_two_synchronised_jobs_break_the_ramp_and_smoothing_keeps_it():
    raw, smooth = replay_sync(False), replay_sync(True)
    g_raw, g_smooth = raw.info["grid"], smooth.info["grid"]
    assert g_raw["s_outside_ramp_up"] > 0 and g_raw["s_outside_ramp_down"] > 0
    assert g_smooth["s_outside_ramp_up"] == 0 and g_smooth["s_outside_ramp_down"] == 0
    assert g_smooth["ramp_up_max_w_per_s"] <= 0.9 * 20_000 + 1e-6
    assert g_smooth["ramp_down_max_w_per_s"] <= 0.9 * 20_000 + 1e-6
    # a recomputation from the site series the replay kept
    site = smooth.site_power_w
    assert np.max(np.abs(site[2:] - site[:-2])) == pytest.approx(
        max(g_smooth["ramp_up_max_w_per_s"], g_smooth["ramp_down_max_w_per_s"])
    )
    # no limit of the tree is crossed either way
    assert smooth.levels["s_above_limit_max"].max() == 0


def test_the_energy_smoothing_burns_is_what_it_drew_above_demand():
    raw, smooth = replay_sync(False), replay_sync(True)
    g = smooth.info["grid"]
    assert g["floor_source"] == "burnt by smoothing"
    burnt_j = g["floor_energy_kwh"] * 3.6e6
    by_phase = smooth.info["smoothing"]["floor_energy_share_by_phase"]
    assert sum(by_phase.values()) == pytest.approx(g["floor_energy_share_of_jobs"])
    assert by_phase["communication"] > 0 and by_phase["shutdown"] > 0
    # held power is drawn: the smoothed site used at least the burnt energy more than the
    # raw replay (the ramp-up also held some below demand, which draws less)
    extra_j = (smooth.site_power_w.sum() - raw.site_power_w.sum()) * SHORT.step_s
    assert burnt_j > 0 and extra_j < burnt_j
    assert g["floor_energy_share_of_jobs"] < 0.5
    # the ramp-up held the jobs below their demand at the start: a throughput cost
    assert (smooth.jobs["ramp_held_share"] > 0).all()
    assert (raw.jobs["ramp_held_share"] == 0).all()


def test_smoothing_needs_a_grid_spec_and_the_command_says_so(tmp_path: Path):
    text = DEMO.read_text("utf-8")
    no_grid = text[: text.index("[site.grid]")] + text[text.index("[models.H100]") :]
    with pytest.raises(ValueError, match=r"\[site.grid\]"):
        replay_sync(True, no_grid)
    budgets = tmp_path / "b.toml"
    budgets.write_text(no_grid, "utf-8")
    profile, mix = tmp_path / "sync.csv", tmp_path / "mix.toml"
    rhythm_profile(SHORT, "sync").to_csv(profile, index=False)
    mix.write_text(MIX, "utf-8")
    args = ["whatif", str(budgets), str(profile), "--mix", str(mix), "--step-s", "0.5"]
    result = CliRunner().invoke(main, [*args, "--smoothing"])
    assert result.exit_code != 0 and "smoothing needs a grid spec" in result.output
    budgets.write_text(text, "utf-8")
    ok = CliRunner().invoke(
        main, [*args, "--duration-s", "170", "--synchronised", "--smoothing", "--format", "json"]
    )
    assert ok.exit_code == 0, ok.output
    info = json.loads(ok.output)
    assert info["synchronised"] is True and info["grid"]["breaches"] == []


def test_the_least_floor_is_measured_on_the_draw_with_no_floor_held():
    """Without smoothing the site's own series is the draw; with it, the draw less what was
    burnt and plus what the ramp-up held back. Either way the least floor meeting the grid's
    ramps is policies.grid's on that series."""
    raw, smooth = replay_sync(False), replay_sync(True)
    spec = load_budgets(DEMO).grid
    assert spec is not None
    least = least_ramp_floor(
        raw.site_power_w,
        SHORT.step_s,
        spec.window_s,
        spec.ramp_up_w_per_s,
        spec.ramp_down_w_per_s,
    )
    want_j = float((least - raw.site_power_w).sum()) * SHORT.step_s
    g_raw, g_smooth = raw.info["grid"], smooth.info["grid"]
    assert want_j > 0 and g_raw["floor_least_kwh"] == pytest.approx(want_j / 3.6e6)
    # under smoothing the bound is on the draw without it: not the smoothed series, whose
    # own least floor is nothing (it already meets the ramps)
    assert 0 < g_smooth["floor_least_kwh"] < g_raw["floor_least_kwh"]
    table = grid_table(g_smooth, 1e5)
    assert "energy the least floor within the ramp limits burns" in set(table["what"])


def test_the_least_ready_floor_is_above_the_least_floor_and_reported():
    """A floor that cannot know when a communication wait ends holds every wait within one
    window's rise of where the job would resume: no less than the least floor, which may
    let a wait down when it knows the resumption is far enough ahead."""
    for run in (replay_sync(False), replay_sync(True)):
        g = run.info["grid"]
        assert g["floor_ready_kwh"] >= g["floor_least_kwh"] * (1 - 1e-9)
        assert g["floor_ready_share_of_jobs"] >= g["floor_least_share_of_jobs"] * (1 - 1e-9)
        what = set(grid_table(g, 1e5)["what"])
        assert "energy the least floor that cannot know when waits end burns" in what
