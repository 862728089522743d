"""`powerplan whatif` measures the site's power as the grid sees it: the metrics in
``info["grid"]`` agree with a recomputation, by other means, from the replay's own
site series; without ``[site.grid]`` it says "no grid spec"."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from scipy.signal import get_window

from planner.cli import main
from planner.mix import parse_mix, place
from planner.sizing import WorkloadTrace
from planner.whatif import WhatifSettings, replay
from policies import PolicySettings
from policies.tree import PHASE_CODES
from powerd.topology import load_budgets, parse_budgets
from powerd.topology.grid import NO_GRID_SPEC
from tests.support.paths import REPO

DEMO = REPO / "powerd" / "data" / "budgets" / "demo.toml"
MIX = '[[jobs]]\nworkload = "train"\nshare = 0.9\ncount = 3\n'


def square_wave(seconds: int = 300) -> np.ndarray:
    """The existing whatif tests' job: 12 s compute at 690 W, 8 s communication at 350 W."""
    t = np.arange(seconds)
    return np.where(t % 20 < 12, 690.0, 350.0)


def traces() -> dict[str, WorkloadTrace]:
    power = square_wave()
    phase = np.where(power > 500, PHASE_CODES["compute"], PHASE_CODES["communication"])
    return {"train": WorkloadTrace("train", power, phase.astype(np.int8), 1.0, 4)}


def demo_without_grid() -> str:
    text = DEMO.read_text("utf-8")
    start = text.index("[site.grid]")
    end = text.index("[models.H100]")
    return text[:start] + text[end:]


def replay_demo(
    text: str | None = None, duration_s: float = 600.0, policy: PolicySettings | None = None
):
    top = load_budgets(DEMO) if text is None else parse_budgets(text, source="demo.toml")
    placement = place(top, parse_mix(MIX))
    settings = WhatifSettings(duration_s=duration_s, policy=policy or PolicySettings())
    return top, replay(top, placement, traces(), settings)


# --- an independent recomputation: loops and the two-sided DFT -----------------------------


def ramps_by_loop(p: np.ndarray, w: int, dt: float) -> tuple[list[float], list[float]]:
    rises, falls = [], []
    for t in range(w, len(p)):
        rate = (p[t] - p[t - w]) / (w * dt)
        rises.append(max(rate, 0.0))
        falls.append(max(-rate, 0.0))
    return rises, falls


def share_two_sided(x: np.ndarray, dt: float, lo: float, hi: float, taper: bool = False) -> float:
    x = x - x.mean()
    if taper:  # scipy's periodic Hann
        x = x * get_window("hann", len(x))
    power = np.abs(np.fft.fft(x)) ** 2
    freq = np.abs(np.fft.fftfreq(len(x), dt))
    total = power.sum()  # DC: 0 untapered; tapered, leakage of the slowest swings
    return float(power[(freq >= lo) & (freq <= hi)].sum() / total) if total else 0.0


def test_the_demo_replay_reports_grid_metrics_that_a_recomputation_confirms():
    # the bands, whose caps swing the site out of the oscillation spec in some windows, so
    # that no metric below is checked at zero (under safety by caps it stays within it)
    top, result = replay_demo(policy=PolicySettings(safety_by_caps=False))
    grid = result.info["grid"]
    spec = top.grid
    assert spec is not None
    site = result.site_power_w
    assert site.shape == (600,) and np.all(site > 0)
    assert grid["spec"] == spec.describe()

    rises, falls = ramps_by_loop(site, 1, 1.0)
    assert grid["ramp_window_s"] == 1.0
    assert grid["ramp_up_max_w_per_s"] == pytest.approx(max(rises))
    assert grid["ramp_down_max_w_per_s"] == pytest.approx(max(falls))
    assert grid["ramp_up_p99_w_per_s"] == pytest.approx(np.percentile(rises, 99))
    assert grid["ramp_down_p99_w_per_s"] == pytest.approx(np.percentile(falls, 99))
    assert grid["s_outside_ramp_up"] == sum(r > 20e3 for r in rises)
    assert grid["s_outside_ramp_down"] == sum(f > 20e3 for f in falls)

    # 1 s steps see 0.1-0.5 Hz of the 0.1-20 Hz band, and the report says so
    assert grid["oscillation_band_hz"] == [0.1, 20.0]
    assert grid["oscillation_band_seen_hz"] == [0.1, 0.5]
    assert "up to 0.5 Hz" in grid["oscillation_note"]
    # 60 s windows every 30 s, each tapered; each stands for the 30 s around its middle,
    # the first and the last also for the 15 s before or after
    starts = range(0, 600 - 60 + 1, 30)
    shares = [share_two_sided(site[k : k + 60], 1.0, 0.1, 0.5, taper=True) for k in starts]
    stands_for = [45.0 if k in (0, 540) else 30.0 for k in starts]
    assert grid["oscillation_windows"] == 19
    assert grid["oscillation_share_max"] == pytest.approx(max(shares))
    assert grid["oscillation_share"] == pytest.approx(share_two_sided(site, 1.0, 0.1, 0.5))
    outside = sum(s_for for s, s_for in zip(shares, stands_for, strict=True) if s > 0.2)
    assert grid["s_outside_oscillation"] == pytest.approx(outside) and outside > 0
    p2p = max(site[k : k + 60].max() - site[k : k + 60].min() for k in starts)
    assert grid["peak_to_peak_max_w"] == pytest.approx(p2p)
    # the three jobs swing the site: it moves, and its swings are in the band
    assert grid["ramp_up_max_w_per_s"] > 0 and grid["oscillation_share"] > 0.01
    assert "floor_energy_kwh" not in grid  # the demo's spec has no floor


def test_a_floor_costs_what_lifting_the_series_to_it_costs():
    text = DEMO.read_text("utf-8").replace(
        "oscillation_window_s = 60\n",
        "oscillation_window_s = 60\nfloor_fraction = 0.9\nfloor_window_s = 30\n",
        1,
    )
    _, result = replay_demo(text, duration_s=300)
    grid = result.info["grid"]
    site = result.site_power_w
    floor = [0.9 * site[max(0, t - 29) : t + 1].max() for t in range(len(site))]
    joules = sum(max(f - p, 0.0) for f, p in zip(floor, site, strict=True))
    assert grid["floor_energy_kwh"] == pytest.approx(joules / 3.6e6)
    jobs_j = float((result.jobs["power_w_per_gpu"] * result.jobs["gpus"]).sum()) * 300
    assert grid["floor_energy_share_of_jobs"] == pytest.approx(joules / jobs_j)
    assert 0 < grid["floor_energy_share_of_jobs"] < 0.2


def test_without_a_grid_spec_it_measures_and_says_so():
    _, result = replay_demo(demo_without_grid(), duration_s=120)
    grid = result.info["grid"]
    assert grid["spec"] == NO_GRID_SPEC
    assert not any(key.startswith("s_outside") for key in grid)
    assert grid["ramp_up_max_w_per_s"] > 0  # measured all the same, with the defaults


def write_inputs(tmp_path: Path) -> tuple[Path, Path]:
    t = np.arange(300.0)
    frames = [
        pd.DataFrame(
            {
                "time_s": 1.7e9 + t,
                "node": "p-n0",
                "gpu": g,
                "workload": "train",
                "power_w": square_wave(),
                "phase": np.where(t % 20 < 12, "compute", "communication"),
            }
        )
        for g in range(4)
    ]
    profiles = tmp_path / "p.csv"
    pd.concat(frames).to_csv(profiles, index=False)
    mix = tmp_path / "mix.toml"
    mix.write_text(MIX)
    return profiles, mix


def test_the_command_prints_the_grid_metrics(tmp_path: Path):
    profiles, mix = write_inputs(tmp_path)
    runner = CliRunner()
    args = ["whatif", str(DEMO), str(profiles), "--mix", str(mix), "--duration-s", "120"]
    doc = json.loads(runner.invoke(main, [*args, "--format", "json"]).output)
    grid = doc["grid"]
    assert grid["spec"].startswith("ramp +20 kW/s, -20 kW/s over 1 s")
    for key in ("ramp_up_max_w_per_s", "ramp_down_p99_w_per_s", "oscillation_share_max"):
        assert isinstance(grid[key], float)
    assert grid["oscillation_band_seen_hz"] == [0.1, 0.5]
    assert 0 <= grid["s_outside_ramp_up"] <= 120 and 0 <= grid["s_outside_oscillation"] <= 120
    table = runner.invoke(main, args)
    assert table.exit_code == 0, table.output
    assert "site power vs the grid spec" in table.output
    assert "grid band: 1 s steps see up to 0.5 Hz" in table.output
    bare = tmp_path / "bare.toml"
    bare.write_text(demo_without_grid())
    plain = runner.invoke(main, ["whatif", str(bare), *args[2:]])
    assert plain.exit_code == 0, plain.output
    assert f"grid spec: {NO_GRID_SPEC}" in plain.output


def test_the_grid_table_is_in_the_sites_scale_and_json_keeps_watts():
    """whatif printed '47,656,848 W/s' beside a grid spec in MW/s: the table's power and
    ramps are in the unit of the site's limit (powerd.units.power_unit), its own line's."""
    from planner.whatif import grid_table, site_limit_w

    top, result = replay_demo(duration_s=120.0)
    grid = result.info["grid"]
    assert site_limit_w(result) == top.limit_w[0] == 215_000.0
    table = grid_table(grid, site_limit_w(result)).set_index("what")
    ramp = table.loc["ramp up, max over 1 s"]
    assert ramp["unit"] == "kW/s" and "kW/s" in grid["spec"]
    assert ramp["value"] == pytest.approx(grid["ramp_up_max_w_per_s"] / 1e3)
    assert ramp["limit"] == pytest.approx(20.0)  # ramp_up_kw_per_s = 20
    assert table.loc["peak-to-peak, worst 60 s", "unit"] == "kW"
    assert set(table["unit"]) <= {
        "kW/s",
        "kW",
        "share",
        "kWh",
        "share of jobs' energy",
        "ratio",
        "s",
    }
    lost = table.loc["work lost to the grid (demand not served)"]
    assert lost["unit"] == "kWh" and lost["value"] == grid["lost_work_kwh"]
    big = grid_table(grid, 150e6).set_index("what").loc["ramp up, max over 1 s"]
    assert big["unit"] == "MW/s"
    assert big["value"] == pytest.approx(grid["ramp_up_max_w_per_s"] / 1e6)
    # the CLI's table: no scientific notation, no W/s beside the spec's kW/s
    args = [
        *("whatif", str(DEMO), str(REPO / "tests/data/profiles/telemetry.lp")),
        *(str(REPO / "tests/data/profiles/train.csv"), "--workload", "untagged"),
        *("--mix", str(REPO / "examples/planning/mix.toml"), "--duration-s", "300"),
    ]
    printed = CliRunner().invoke(main, args)
    assert printed.exit_code == 0, printed.output
    assert " W/s " not in printed.stdout and "│ kW/s " in printed.stdout
    assert not re.search(r"\d[eE][+-]?\d", printed.stdout), printed.stdout
    as_json = CliRunner().invoke(main, [*args, "--format", "json"])
    assert "ramp_up_max_w_per_s" in json.loads(as_json.stdout)["grid"]  # watts, as ever


def test_work_the_budgets_withhold_is_not_charged_to_the_grid():
    """The demo's budgets cap its jobs (demand withheld at the site) and no grid rule holds
    anything back (no smoothing, no staged start within the ramp on this mix): the work
    lost to the grid is 0 kWh, not the budgets' cut (it was, while the lost work's demand
    was the jobs' uncapped demand). With smoothing, GPUs held by their ramp lose some."""
    top, result = replay_demo(duration_s=120.0)
    assert result.nodes["withheld_mean_w"].iloc[0] > 1000.0  # the site, first
    grid = result.info["grid"]
    assert grid["lost_work_kwh"] == 0.0
    smoothed = replay(
        top,
        place(top, parse_mix(MIX)),
        traces(),
        WhatifSettings(duration_s=120.0, smoothing=True),
    ).info["grid"]
    assert smoothed["lost_work_kwh"] > 0.0
    # the least any schedule keeping these floors loses: never above what was lost
    assert 0.0 <= smoothed["lost_at_floors_kwh"] <= smoothed["lost_work_kwh"]
