"""`powerplan size`: correlated jobs, diversity across jobs, tails, failsafe caps, the file written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from scipy import stats

from planner.budgets_toml import budgets_toml
from planner.cli import main
from planner.errors import ProfileError
from planner.mix import parse_mix, place
from planner.sizing import (
    SizingError,
    SizingSettings,
    WorkloadTrace,
    failsafe_caps,
    size,
    tail_quantile,
    traces_from_profiles,
)
from planner.terms import NonGpuTerms, load_terms
from policies.tree import PHASE_CODES, RACK
from powerd.agent.config import load_config
from powerd.topology import load_budgets, parse_budgets
from tests.support.paths import REPO

DATA = REPO / "powerd" / "data" / "budgets"


def topology(racks: int, nodes: int, *, rack_limit_w: float = 20_000, node_overhead_w: float = 0):
    """1 row of `racks` racks of `nodes` 4-GPU H100 nodes; no overheads unless asked."""
    return parse_budgets(
        f"""
[site]
name = "s"
limit_kw = 2000
budget_kw = 1800
[[rows]]
name = "r1"
limit_kw = 1000
budget_kw = 900
[rows.racks]
count = {racks}
name = "{{row}}-k{{i}}"
limit_w = {rack_limit_w}
budget_w = {rack_limit_w * 0.9}
[rows.racks.nodes]
count = {nodes}
name = "{{rack}}-n{{i}}"
gpus = 4
model = "H100"
overhead_w = {node_overhead_w}
[models.H100]
failsafe_cap_w = 200
""",
        source="test.toml",
    )


def square_trace(
    high_w: float, low_w: float, duty: float, period: int, steps: int
) -> WorkloadTrace:
    t = np.arange(steps)
    power = np.where((t % period) < duty * period, high_w, low_w).astype(float)
    return WorkloadTrace("w", power, np.full(steps, PHASE_CODES["compute"], np.int8), 1.0, 8)


def demand(sized, name: str) -> float:
    return float(sized.table.set_index("name").loc[name, "demand_q_w"])


def test_a_synchronous_job_is_sized_as_one_load_not_as_independent_gpus():
    top = topology(racks=1, nodes=4)  # one rack of 16 GPUs, all one job
    traces = {"w": square_trace(600.0, 300.0, 0.5, 10, 20_000)}
    placement = place(top, parse_mix('[[jobs]]\nworkload = "w"\nshare = 1.0'))
    sized = size(top, placement, traces)
    rack_w = demand(sized, "r1-k1")
    assert rack_w == pytest.approx(16 * 600.0)  # all 16 GPUs high together
    # if its GPUs were independent, p99.9 of 16 coin flips would be 14 high, 2 low
    high = stats.binom.ppf(0.999, 16, 0.5)
    independent_w = high * 600.0 + (16 - high) * 300.0
    assert rack_w - independent_w >= 500.0
    assert sized.table.set_index("name").loc["r1-k1", "tail_model"] == "empirical"


def test_diversity_across_jobs_lowers_the_row_below_the_sum_of_its_racks():
    top = topology(racks=8, nodes=1)  # 8 racks of one 4-GPU node, one job per rack
    traces = {"w": square_trace(600.0, 300.0, 0.3, 10, 20_000)}
    placement = place(top, parse_mix('[[jobs]]\nworkload = "w"\ngpus = 32\ncount = 8'))
    sized = size(top, placement, traces, settings=SizingSettings(samples=200_000, seed=3))
    racks_w = sum(demand(sized, f"r1-k{k}") for k in range(1, 9))
    row_w = demand(sized, "r1")
    assert racks_w == pytest.approx(8 * 4 * 600.0)
    # 8 independent jobs, each high 30 % of the time: p99.9 has 6 of them high
    assert row_w == pytest.approx(8 * 1200.0 + 6 * 1200.0, rel=0.01)
    table = sized.table.set_index("name")
    assert table.loc["r1", "budget_w"] < sum(table.loc[f"r1-k{k}", "budget_w"] for k in range(1, 9))
    # capping starts only above the quantile: about 0.1 % of the time
    assert table.loc["r1", "p_capping"] <= 0.001 + 1e-9


def test_budget_is_demand_over_the_threshold_and_never_above_the_limit_share():
    top = topology(racks=2, nodes=4, rack_limit_w=9000)  # 16 × 600 W does not fit 9 kW
    traces = {"w": square_trace(600.0, 300.0, 0.5, 10, 20_000)}
    sized = size(top, place(top, parse_mix('[[jobs]]\nworkload = "w"\nshare = 1.0')), traces)
    table = sized.table.set_index("name")
    assert table.loc["r1-k1", "budget_w"] == math.floor(0.95 * 9000)
    assert table.loc["r1-k1", "bound"] == "limit"
    assert table.loc["r1-k1", "p_capping"] == pytest.approx(0.5)  # every high half-period
    assert table.loc["r1-k1", "over_limit_s_per_day"] == pytest.approx(43_200)
    row_demand = table.loc["r1", "demand_q_w"]
    assert table.loc["r1", "budget_w"] == math.ceil(row_demand / 0.98)
    assert table.loc["r1", "bound"] == "quantile"


def test_failsafe_cap_keeps_every_node_within_its_limit_and_is_the_largest_that_does():
    top = topology(racks=2, nodes=4, rack_limit_w=9000, node_overhead_w=100)
    traces = {"w": square_trace(600.0, 300.0, 0.5, 10, 2_000)}
    sized = size(top, place(top, parse_mix('[[jobs]]\nworkload = "w"\nshare = 1.0')), traces)
    cap_w = sized.failsafe_cap_w["H100"]
    assert cap_w == math.floor((9000 - 4 * 100) / 16)  # 537 W: the racks bind
    back = parse_budgets(budgets_toml(top, sized), "out.toml")  # the loader proves it too
    assert np.all(back.failsafe_power_w() <= back.limit_w)
    per_server = back.server_gpu_count * (cap_w + 1)
    assert np.any(back.subtree_sum(per_server, back.overhead_w) > back.limit_w)
    # so every level is guaranteed by the caps in force (safety by caps), and the racks'
    # maximum caps are over their breakers by what the controller may move
    table = sized.table.set_index("name")
    assert (table["guarantee"] == "caps").all() and (table["oversubscription_w"] == 0).all()
    assert table.loc["r1-k1", "max_caps_w"] == pytest.approx(16 * 700 + 4 * 100)
    assert table.loc["r1-k1", "caps_over_limit_w"] == pytest.approx(16 * 700 + 4 * 100 - 9000)


def test_no_failsafe_cap_fits_names_the_node():
    top = topology(racks=1, nodes=4, rack_limit_w=9000)
    overhead = np.asarray(top.overhead_w, dtype=float).copy()
    overhead[top.node_index("r1-k1-n1") :] = 5000.0  # 20 kW of non-GPU power in a 9 kW rack
    with pytest.raises(SizingError, match=r"rack 'r1-k1'.*above its limit 9,000 W"):
        failsafe_caps(top, np.asarray(top.limit_w, dtype=float), overhead)


def test_non_gpu_terms_go_into_the_overheads_and_the_budgets():
    top = topology(racks=1, nodes=4)
    traces = {"w": square_trace(600.0, 300.0, 0.5, 10, 20_000)}
    placement = place(top, parse_mix('[[jobs]]\nworkload = "w"\nshare = 1.0'))
    terms = NonGpuTerms(node_w=250, network_fraction=0.1, cooling_fraction=0.2, summer_rise=0.5)
    sized = size(top, placement, traces, terms)
    t = sized.table.set_index("name")
    nodes_w = 4 * 250.0
    network_w = 0.1 / 0.9 * (9600.0 + nodes_w)  # 10 % of the rack's IT power, itself included
    assert t.loc["r1-k1", "overhead_w"] == pytest.approx(network_w)
    assert t.loc["r1-k1", "demand_q_w"] == pytest.approx(9600.0 + nodes_w + network_w)
    it_w = t.loc["r1", "demand_q_w"]
    assert t.loc["s", "overhead_w"] == pytest.approx(0.2 * it_w * 1.5)
    server = top.node_index("r1-k1-n1")
    assert sized.overhead_w[server] == 250.0


def test_tail_models():
    values = np.arange(100_000, dtype=float)
    q, model = tail_quantile(values, 0.999, len(values), 10)
    assert (model, q) == ("empirical", 99_899.0)
    assert tail_quantile(np.full(50, 7.0), 0.999, 50, 10) == (7.0, "constant")
    flat = np.sort(np.concatenate([np.linspace(0, 1, 900), np.full(100, 2.0)]))
    assert tail_quantile(flat, 0.9999, 1000, 10) == (2.0, "flat")
    # too few points for p99.99 of an exponential: the GPD tail extrapolates close to the truth
    sample = np.sort(np.random.default_rng(0).exponential(1.0, 5000))
    q, model = tail_quantile(sample, 0.9999, len(sample), 10)
    assert model == "gpd"
    assert q == pytest.approx(-math.log(1e-4), rel=0.15)
    assert q > sample[-1] * 0.9


def test_short_profiles_fall_back_to_the_tail_model_and_say_so():
    top = topology(racks=1, nodes=4)
    traces = {"w": square_trace(600.0, 300.0, 0.5, 10, 1_000)}  # 1000 s: 1 point above p99.9
    sized = size(top, place(top, parse_mix('[[jobs]]\nworkload = "w"\nshare = 1.0')), traces)
    row = sized.table.set_index("name").loc["r1-k1"]
    assert row["n_eff"] == 1000 and row["tail_model"] == "flat"
    assert row["demand_q_w"] == pytest.approx(9600.0)


def test_traces_average_each_gpu_then_the_gpus_and_fill_gaps():
    df = pd.DataFrame(
        {
            "time_s": [100.0, 100.5, 101.0, 103.0, 100.0, 101.0, 102.0, 103.0],
            "node": ["a"] * 4 + ["b"] * 4,
            "gpu": [0] * 8,
            "workload": ["w"] * 8,
            "power_w": [100.0, 300.0, 200.0, 400.0, 600.0, 600.0, 600.0, 800.0],
            "phase": ["compute"] * 4 + ["communication"] * 2 + ["compute"] * 2,
        }
    )
    trace = traces_from_profiles(df, 1.0)["w"]
    # step 0: a = mean(100, 300) = 200, b = 600; step 2: only b; step 3: (400 + 800) / 2
    assert trace.power_w.tolist() == [400.0, 400.0, 600.0, 600.0]
    assert trace.gpus == 2 and trace.duration_s == 4.0
    assert trace.phase[3] == PHASE_CODES["compute"]


def test_written_files_load_unchanged(tmp_path: Path):
    for name in ("tiny", "demo", "site-150mw"):
        top = load_budgets(DATA / f"{name}.toml")
        traces = {"w": square_trace(500.0, 250.0, 0.5, 10, 2_000)}
        placement = place(top, parse_mix('[[jobs]]\nworkload = "w"\nshare = 0.75\ncount = 3'))
        sized = size(top, placement, traces, settings=SizingSettings(samples=2_000))
        text = budgets_toml(top, sized, ["a header"])  # checks the round trip itself
        out = tmp_path / f"{name}.toml"
        out.write_text(text)
        back = load_budgets(out)
        assert back.names == top.names
        assert np.array_equal(back.budget_w, sized.budget_w)
        assert np.array_equal(back.limit_w, top.limit_w)
        assert set(np.unique(back.server_failsafe_cap_w)) == set(sized.failsafe_cap_w.values())
        if name == "site-150mw":
            assert text.count("[rows.racks.nodes]") == 1152  # one generator per rack
            assert len(text) < 1_000_000


def test_nodes_without_numbered_names_are_listed():
    top = parse_budgets(
        """
[site]
name = "s"
limit_kw = 20
budget_kw = 18
[[rows]]
name = "r"
limit_kw = 20
budget_kw = 18
[[rows.racks]]
name = "k"
limit_kw = 10
budget_kw = 9
[[rows.racks.nodes]]
name = "alpha"
gpus = 4
model = "H100"
[[rows.racks.nodes]]
name = "beta"
gpus = 4
model = "H100"
"""
    )
    traces = {"w": square_trace(500.0, 250.0, 0.5, 10, 2_000)}
    sized = size(top, place(top, parse_mix('[[jobs]]\nworkload = "w"\nshare = 1.0')), traces)
    text = budgets_toml(top, sized)
    assert text.count("[[rows.racks.nodes]]") == 2 and 'name = "alpha"' in text


# --- the command ---------------------------------------------------------------


def write_inputs(tmp_path: Path, mix: str) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    t = np.arange(600.0)
    frames = []
    for w, (hi, lo) in enumerate(((650.0, 300.0), (550.0, 400.0))):
        base = np.where(t % (7 + w) < 4, hi, lo)
        for g in range(4):
            frames.append(
                pd.DataFrame(
                    {
                        "time_s": 1.7e9 + t,
                        "node": f"w{w}-n0",
                        "gpu": g,
                        "workload": f"train{w}",
                        "power_w": base + rng.normal(0, 5, len(t)),
                    }
                )
            )
    profiles = tmp_path / "profiles.csv"
    pd.concat(frames).to_csv(profiles, index=False)
    mix_path = tmp_path / "mix.toml"
    mix_path.write_text(mix)
    return profiles, mix_path


GOOD_MIX = (
    '[[jobs]]\nworkload = "train0"\nshare = 0.5\n[[jobs]]\nworkload = "train1"\nshare = 0.4\n'
)


def test_size_command_writes_a_file_the_controller_loads(tmp_path: Path):
    profiles, mix = write_inputs(tmp_path, GOOD_MIX)
    out = tmp_path / "budgets.toml"
    result = CliRunner().invoke(
        main,
        [
            *("size", str(DATA / "demo.toml"), str(profiles), "--mix", str(mix)),
            *("-o", str(out), "--samples", "5000", "--format", "json", "--network-fraction", "0.1"),
            "--allow-over-limit",  # demo.toml is tight on purpose: row1 is over at p99.9
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {n["level"] for n in doc["nodes"]} == {"site", "row", "rack"}
    assert doc["samples_per_node"] >= 5000 * 0.9
    assert doc["terms"]["network_fraction"] == "0.1"
    back = load_budgets(out)
    budgets = {n["name"]: n["budget_w"] for n in doc["nodes"]}
    assert back.budget_w[back.node_index("row1-k1")] == budgets["row1-k1"]
    assert back.failsafe_cap_w("row1-k1-n1") == doc["failsafe_cap_w"]["H100"]
    # and the agents' side of it: their [failsafe] section holds the same cap
    agent_toml = tmp_path / "budgets.agent-H100.toml"
    assert doc["agent_configs"] == [str(agent_toml)]
    agent = load_config(agent_toml)
    assert agent.failsafe.cap_w == doc["failsafe_cap_w"]["H100"]
    table = CliRunner().invoke(
        main,
        [
            *("size", str(DATA / "demo.toml"), str(profiles), "--mix", str(mix), "-o", str(out)),
            "--allow-over-limit",
        ],
    )
    assert table.exit_code == 0 and "racks with the most capping" in table.stdout


@pytest.mark.parametrize(
    ("mix", "topology_text", "words"),
    [
        (GOOD_MIX, "[site\n", "not valid TOML"),
        ('[[jobs]]\nworkload = "gpt"\nshare = 0.5\n', None, "workload(s) ['gpt'] not in"),
        (
            '[[jobs]]\nworkload = "train0"\nshare = 0.7\n[[jobs]]\nworkload = "train1"\nshare = 0.4\n',
            None,
            "sum to 1.1",
        ),
        ('[[jobs]]\nworkload = "train0"\ngpus = 9999\n', None, "asks for 9,999 GPUs"),
    ],
)
def test_bad_input_is_named_and_nothing_is_written(
    tmp_path: Path, mix: str, topology_text: str | None, words: str
):
    profiles, mix_path = write_inputs(tmp_path, mix)
    topo = DATA / "demo.toml"
    if topology_text is not None:
        topo = tmp_path / "broken.toml"
        topo.write_text(topology_text)
    out = tmp_path / "budgets.toml"
    out.write_text("the old file\n")
    result = CliRunner().invoke(
        main, ["size", str(topo), str(profiles), "--mix", str(mix_path), "-o", str(out)]
    )
    assert result.exit_code != 0
    assert words in result.output
    assert (str(topo) if topology_text else str(mix_path)) in result.output
    assert out.read_text() == "the old file\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".budgets")] == []


def test_terms_file(tmp_path: Path):
    good = tmp_path / "terms.toml"
    good.write_text("node_w = 800\nnetwork_fraction = 0.11\nsummer_rise = 0.15\n")
    terms = load_terms(good)
    assert (terms.node_w, terms.network_fraction, terms.cooling_fraction) == (800, 0.11, None)
    assert terms.merged(node_w=None, cooling_fraction=0.3).cooling_fraction == 0.3
    for text, words in (
        ("node_watts = 1", "unknown key(s) ['node_watts']"),
        ("network_fraction = 11", "a fraction, not a percentage"),
        ("node_w = -1", "node_w = -1"),
        ("node_w = ", "not valid TOML"),
    ):
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(ProfileError, match=r"bad\.toml: ") as err:
            load_terms(bad)
        assert words in str(err.value)


def test_an_oversubscribed_level_is_guarded_by_its_rise_within_the_reaction():
    top = topology(racks=2, nodes=4, rack_limit_w=9000, node_overhead_w=100)
    # 16 GPUs of one job a rack, 300 W for 5 s then 600 W for 5 s: a rack rises by
    # 16 x 300 = 4,800 W in a step, and within 2 s of 2 of every 10 steps
    traces = {"w": square_trace(600.0, 300.0, 0.5, 10, 2_000)}
    placement = place(top, parse_mix('[[jobs]]\nworkload = "w"\nshare = 1.0'))
    racks = SizingSettings(oversubscribe=(RACK,), reaction_s=2.0)
    table = size(top, placement, traces, settings=racks).table.set_index("name")
    assert table.loc["r1-k1", "guarantee"] == "band"
    assert table.loc["r1-k1", "rise_margin_w"] == pytest.approx(16 * 300)
    # the allowance: every GPU at its maximum cap, overheads in, beyond the limit
    assert table.loc["r1-k1", "oversubscription_w"] == pytest.approx(16 * 700 + 400 - 9000)
    assert table.loc["r1", "guarantee"] == "caps"  # rows not asked for
    # at the median the rise within 2 s is none: a margin of 1 W, the least a band keeps
    median = SizingSettings(oversubscribe=(RACK,), reaction_s=2.0, quantile=0.5)
    assert size(top, placement, traces, settings=median).table.set_index("name").loc[
        "r1-k1", "rise_margin_w"
    ] == pytest.approx(1.0)
    # the file says so and loads back with it
    sized = size(top, placement, traces, settings=racks)
    back = parse_budgets(budgets_toml(top, sized), "out.toml")
    rack = back.names.index("r1-k1")
    assert back.tree.oversubscribed[rack] and not back.tree.oversubscribed[0]
    assert back.tree.rise_margin_w[rack] == pytest.approx(16 * 300)


def test_a_margin_that_leaves_no_band_keeps_the_level_guaranteed_by_caps():
    # the 4,800 W rise within 2 s under a 5 kW rack with 400 W of overheads: a band at
    # 200 W, below what is not a GPU, guards nothing; the caps guarantee the rack
    tight = topology(racks=2, nodes=4, rack_limit_w=5000, node_overhead_w=100)
    traces = {"w": square_trace(600.0, 300.0, 0.5, 10, 2_000)}
    placement = place(tight, parse_mix('[[jobs]]\nworkload = "w"\nshare = 1.0'))
    settings = SizingSettings(oversubscribe=(RACK,), reaction_s=2.0)
    table = size(tight, placement, traces, settings=settings).table.set_index("name")
    assert table.loc["r1-k1", "guarantee"] == "caps"
    assert table.loc["r1-k1", "oversubscription_w"] == 0.0


def test_powerplan_size_refuses_an_unknown_level_to_oversubscribe(tmp_path):
    result = CliRunner().invoke(
        main,
        [
            "size",
            str(DATA / "tiny.toml"),
            str(REPO / "tests/data/profiles/train.csv"),
            "--mix",
            str(REPO / "examples/planning/mix.toml"),
            "-o",
            str(tmp_path / "x.toml"),
            "--oversubscribe",
            "rack,aisle",
        ],
    )
    assert result.exit_code == 2
    assert "aisle: levels are rack, row, site" in result.output
