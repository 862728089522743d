"""`powerplan whatif`: profiles replayed through policies.decide at given budgets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from planner.cli import main
from planner.mix import parse_mix, place
from planner.sizing import WorkloadTrace
from planner.sweep import load_sweep
from planner.whatif import WhatifSettings, power_law_speed, replay, sweep_speed
from policies import PolicySettings
from policies.tree import PHASE_CODES
from powerd.topology import parse_budgets
from tests.support.paths import REPO

ROOT = REPO
COMPUTE = PHASE_CODES["compute"]
BANDS = PolicySettings(safety_by_caps=False)  # the bands (safety by caps is the default)


def rack(budget_w: float, limit_w: float, failsafe_w: float):
    """One rack of 4 nodes × 4 H100 (16 GPUs), no overheads; site and row far above it."""
    return parse_budgets(
        f"""
[site]
name = "s"
limit_kw = 100
budget_kw = 90
[[rows]]
name = "r1"
limit_kw = 100
budget_kw = 90
[[rows.racks]]
name = "k1"
limit_w = {limit_w}
budget_w = {budget_w}
[rows.racks.nodes]
count = 4
name = "{{rack}}-n{{i}}"
gpus = 4
model = "H100"
[models.H100]
failsafe_cap_w = {failsafe_w}
""",
        source="rack.toml",
    )


def trace(power_w: np.ndarray, name: str = "w") -> WorkloadTrace:
    return WorkloadTrace(
        name, power_w.astype(float), np.full(len(power_w), COMPUTE, np.int8), 1.0, 8
    )


def ramps() -> np.ndarray:
    """300 W for 50 s, a 100 s rise to 650 W, 50 s at 650 W: the rack demand rises 56 W/s."""
    return np.concatenate([np.full(50, 300.0), np.linspace(300, 650, 100), np.full(50, 650.0)])


def nodes(result) -> pd.DataFrame:
    return result.nodes.set_index("name")


@pytest.mark.parametrize("policy", [BANDS, PolicySettings()], ids=["bands", "caps"])
def test_a_tight_budget_caps_and_never_lets_the_rack_above_its_limit(policy):
    top = rack(budget_w=8000, limit_w=9000, failsafe_w=400)  # uncapped the rack reaches 10.4 kW
    placement = place(top, parse_mix('[[jobs]]\nworkload = "w"\nshare = 1.0'))
    settings = WhatifSettings(duration_s=1000, policy=policy)
    result = replay(top, placement, {"w": trace(ramps())}, settings)
    k1 = nodes(result).loc["k1"]
    assert k1["capping_share"] > 0.0
    assert k1["withheld_mean_w"] > 0.0
    if policy.safety_by_caps:  # the caps climb from the failsafe caps to the limit, no higher
        assert k1["peak_w"] == pytest.approx(9000.0)
    else:  # the bands cut the rack, over its capping threshold, to its target
        assert k1["cut_max_w"] > 0.0
    assert k1["s_above_limit"] == 0.0
    assert k1["s_above_limit_uncapped"] > 100.0
    assert k1["peak_w"] <= 9000.0 < k1["peak_demand_w"]
    assert result.jobs.loc[0, "throughput_lost"] > 0.0
    levels = result.levels.set_index("level")
    assert levels.loc["rack", "capping_share_max"] == k1["capping_share"]


def test_a_budget_with_room_never_caps_and_loses_nothing():
    top = rack(budget_w=14_000, limit_w=15_000, failsafe_w=700)
    placement = place(top, parse_mix('[[jobs]]\nworkload = "w"\nshare = 1.0'))
    result = replay(top, placement, {"w": trace(ramps())}, WhatifSettings(duration_s=400))
    assert (result.nodes["capping_share"] == 0).all()
    assert (result.nodes["s_above_budget"] == 0).all()
    assert result.jobs.loc[0, "throughput_lost"] == 0.0
    assert result.info["throughput_lost_site"] == 0.0


def test_low_priority_gives_first_and_a_synchronous_job_pays_for_its_slowest_gpu():
    top = rack(budget_w=8000, limit_w=11_200, failsafe_w=700)
    mix = parse_mix(
        '[[jobs]]\nworkload = "w"\nshare = 0.5\npriority = "low"\n'
        '[[jobs]]\nworkload = "w"\nshare = 0.5\npriority = "high"\nname = "vip"\n'
    )
    flat = {"w": trace(np.full(100, 650.0))}
    # the bands, which cap the rack over its budget, LOW first (under safety by caps every
    # GPU keeps its 700 W failsafe cap: 16 of them fit the rack's limit)
    result = replay(top, place(top, mix), flat, WhatifSettings(duration_s=60, policy=BANDS))
    jobs = result.jobs.set_index("job")
    assert jobs.loc["vip", "throughput_lost"] == 0.0
    assert jobs.loc["w", "throughput_lost"] > 0.0
    speed = power_law_speed(0.28)
    slowest = speed("w", np.array([jobs.loc["w", "power_w_per_gpu"] / 650.0]))[0]
    assert jobs.loc["w", "throughput_lost"] >= 1.0 - slowest - 1e-9
    assert nodes(result).loc["k1", "s_above_limit"] == 0.0


def high_checkpoint_scenario():
    """Half the rack a steady low-priority job ("steady"), half a high-priority one ("vip")
    that checkpoints at 250 W from 40 s to 60 s of every 120 s: (mix, traces)."""
    mix = parse_mix(
        '[[jobs]]\nworkload = "steady"\nshare = 0.5\npriority = "low"\n'
        '[[jobs]]\nworkload = "ckpt"\nshare = 0.5\npriority = "high"\nname = "vip"\n'
    )
    power = np.full(120, 650.0)
    phase = np.full(120, COMPUTE, np.int8)
    power[40:60], phase[40:60] = 250.0, PHASE_CODES["checkpoint"]
    traces = {
        "steady": trace(np.full(120, 650.0), "steady"),
        "ckpt": WorkloadTrace("ckpt", power, phase, 1.0, 8),
    }
    return mix, traces


def test_a_high_job_leaving_a_checkpoint_gets_its_watts_back_from_low():
    """The inversion rule 3b closes, replayed: after each checkpoint the high-priority job
    sits at its staged caps while the low-priority one fills the rack to between its bands.
    (The bands' staged caps and rule 3b.)"""
    top = rack(budget_w=8000, limit_w=11_200, failsafe_w=700)
    mix, traces = high_checkpoint_scenario()
    lost = {}
    for shift in (False, True):
        policy = PolicySettings(safety_by_caps=False, priority_shift=shift)
        settings = WhatifSettings(duration_s=360, policy=policy)
        result = replay(top, place(top, mix), traces, settings)
        lost[shift] = result.jobs.set_index("job")["throughput_lost"]
        assert nodes(result).loc["k1", "s_above_limit"] == 0.0
    assert lost[False]["vip"] > lost[False]["steady"]  # inverted: high pays more than low
    assert lost[True]["vip"] < lost[True]["steady"]  # restored
    assert lost[True]["vip"] < 0.5 * lost[False]["vip"]


def test_speed_from_a_measured_sweep():
    sweep = load_sweep(
        ROOT / "tests" / "data" / "zeus-power-limit" / "summary_power_a40.csv",
        workload_cols=["dataset", "network", "batch_size", "optimizer"],
        cap_col="power_limit",
        time_col="time_per_epoch",
        power_col="average_power",
    )
    speed = sweep_speed(sweep)
    ratio = np.linspace(0.05, 1.0, 50)
    generic = speed("not in the sweep", ratio)
    assert generic[-1] == pytest.approx(1.0)
    assert np.all(np.diff(generic) >= -1e-12) and generic[0] < 0.5
    one = str(sweep["workload"].iloc[0])
    assert speed(one, np.array([1.0]))[0] == pytest.approx(1.0)


def square_wave_frames(seconds: int = 300, gpus: int = 4) -> list[pd.DataFrame]:
    """One synchronous job's GPUs on node p-n0: 12 s compute at 690 W, 8 s communication
    at 350 W, over and over (workload "train")."""
    t = np.arange(float(seconds))
    return [
        pd.DataFrame(
            {
                "time_s": 1.7e9 + t,
                "node": "p-n0",
                "gpu": g,
                "workload": "train",
                "power_w": np.where(t % 20 < 12, 690.0, 350.0),
                "phase": np.where(t % 20 < 12, "compute", "communication"),
            }
        )
        for g in range(gpus)
    ]


def write_inputs(tmp_path: Path) -> tuple[Path, Path]:
    rows = square_wave_frames()
    profiles = tmp_path / "p.csv"
    pd.concat(rows).to_csv(profiles, index=False)
    mix = tmp_path / "mix.toml"
    mix.write_text('[[jobs]]\nworkload = "train"\nshare = 0.9\ncount = 3\n')
    return profiles, mix


def test_whatif_command_replays_a_sized_file(tmp_path: Path):
    profiles, mix = write_inputs(tmp_path)
    sized = tmp_path / "sized.toml"
    demo = ROOT / "powerd" / "data" / "budgets" / "demo.toml"
    runner = CliRunner()
    made = runner.invoke(
        main,
        [
            "size",
            str(demo),
            str(profiles),
            "--mix",
            str(mix),
            "-o",
            str(sized),
            "--samples",
            "2000",
            "--allow-over-limit",  # demo.toml is tight on purpose
        ],
    )
    assert made.exit_code == 0, made.output
    result = runner.invoke(
        main,
        [
            *("whatif", str(sized), str(profiles), "--mix", str(mix)),
            *("--duration-s", "120", "--format", "json"),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["steps"] == 120
    assert {row["level"] for row in doc["levels"]} == {"site", "row", "rack", "node"}
    assert len(doc["jobs"]) == 3 and all(0 <= j["throughput_lost"] < 1 for j in doc["jobs"])
    # a one-cycle jump of the whole job (350 -> 690 W per GPU) can outrun a reactive
    # controller for a cycle, but control never makes it worse than no control
    assert all(n["s_above_limit"] <= n["s_above_limit_uncapped"] for n in doc["nodes"])
    table = runner.invoke(
        main, ["whatif", str(demo), str(profiles), "--mix", str(mix), "--duration-s", "30"]
    )
    assert table.exit_code == 0 and "racks that capped most" in table.output


def test_whatif_safety_picks_the_policy_caps_by_default(tmp_path: Path):
    """``--safety caps`` (the default) fills the demo site's limits with its caps; ``--safety
    bands`` caps it on measured power, down to its capping target: more withheld."""
    profiles, mix = write_inputs(tmp_path)
    demo = ROOT / "powerd" / "data" / "budgets" / "demo.toml"
    site = {}
    for safety in ((), ("--safety", "caps"), ("--safety", "bands")):
        args = ["whatif", str(demo), str(profiles), "--mix", str(mix), "--duration-s", "60"]
        result = CliRunner().invoke(main, [*args, "--format", "json", *safety])
        assert result.exit_code == 0, result.output
        nodes = json.loads(result.output)["nodes"]
        site[safety[1:]] = next(n for n in nodes if n["level"] == "site")
    assert site[()] == site[("caps",)]
    assert site[("bands",)]["cut_max_w"] > 0.0  # the site over its threshold, cut
    assert site[("caps",)]["withheld_mean_w"] < site[("bands",)]["withheld_mean_w"]
    assert site[("caps",)]["s_above_limit"] == site[("bands",)]["s_above_limit"] == 0.0


def test_whatif_names_a_bad_budgets_file(tmp_path: Path):
    profiles, mix = write_inputs(tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text('[site]\nname = "s"\nlimit_w = 100\n')
    result = CliRunner().invoke(main, ["whatif", str(bad), str(profiles), "--mix", str(mix)])
    assert result.exit_code != 0
    assert str(bad) in result.output
