"""`powerplan size` for a tree of controllers: whether the rows' budgets fit the leaf pool
(``sum(row budget_w) <= site budget_w - site overhead_w / site cap_threshold``), and
``--tree``, which scales the rows by one common factor to fit it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from planner.cli import main
from planner.sizing import Sizing, SizingError, fit_rows_to_leaf_pool
from policies.tree import RACK, ROW
from powerd.topology import BudgetError, Topology, load_budgets
from powerd.topology.scope import parse_scope, rows_within_site, scoped
from tests.planner.test_planner_sizing import GOOD_MIX, write_inputs
from tests.support.paths import REPO

DATA = REPO / "powerd" / "data" / "budgets"
SAMPLES = "5000"


# GOOD_MIX puts row1 of demo.toml above its limit at p99.9 (demo.toml is tight on purpose):
# `size` refuses that without --allow-over-limit (tests/planner/test_planner_crosschecks.py);
# here it is beside the point.
ALLOW = "--allow-over-limit"


def run_size(tmp_path: Path, topology: str, out: Path, *flags: str) -> dict:
    profiles, mix = write_inputs(tmp_path, GOOD_MIX)
    result = CliRunner().invoke(
        main,
        [
            *("size", str(DATA / topology), str(profiles), "--mix", str(mix), "-o", str(out)),
            *("--samples", SAMPLES, "--format", "json", ALLOW, *flags),
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # a warning may be on stderr


def level_budgets(top: Topology, level: int) -> dict[str, float]:
    first, end = top.level_start[level], top.level_start[level + 1]
    return {top.names[i]: float(top.budget_w[i]) for i in range(first, end)}


def pool_by_hand(top: Topology) -> float:
    """The bound, written out here rather than taken from powerd.topology.scope."""
    return float(top.budget_w[0]) - float(top.overhead_w[0]) / float(top.cap_threshold[0])


# --- the pure function, on numbers checked by hand ---------------------------------------


def hand_sizing(
    top: Topology, site_w: float, site_overhead_w: float, rows_w: list[float]
) -> Sizing:
    """A Sizing of tree-3rows.toml with these site and row budgets; each row's draws are
    0, 1, ..., 29,999 W with nothing added, so p_capping is easy to count."""
    budget = np.array(top.budget_w, dtype=float)
    overhead = np.array(top.overhead_w, dtype=float)
    budget[0], overhead[0] = site_w, site_overhead_w
    rows = range(top.level_start[ROW], top.level_start[ROW + 1])
    budget[list(rows)] = rows_w
    view = range(top.level_start[RACK + 1])
    table = pd.DataFrame(
        {
            "name": [top.names[i] for i in view],
            "budget_w": budget[list(view)],
            "bound": "quantile",
            "p_capping": 0.0,
            "capping_s_per_day": 0.0,
        }
    )
    draws = np.arange(30_000.0)
    return Sizing(
        np.array(top.limit_w, dtype=float),
        budget,
        overhead,
        {"H100": 450.0},
        table,
        row_samples={i: (draws, 0.0) for i in rows},
    )


def test_rows_are_scaled_by_one_factor_to_the_leaf_pool_by_hand():
    top = load_budgets(DATA / "tree-3rows.toml")  # cap_threshold 0.98 everywhere
    # pool = 60,000 - 980 / 0.98 = 59,000 W; rows 30,000 + 20,000 + 10,000 = 60,000 W
    sizing = hand_sizing(top, 60_000, 980, [30_000, 20_000, 10_000])
    fitted, factor = fit_rows_to_leaf_pool(top, sizing)
    assert factor == pytest.approx(59 / 60, rel=1e-12)
    rows = slice(top.level_start[ROW], top.level_start[ROW + 1])
    # 29,500; 19,666.67 -> 19,666; 9,833.33 -> 9,833: 58,999 W <= 59,000 W
    assert fitted.budget_w[rows].tolist() == [29_500, 19_666, 9_833]
    assert fitted.budget_w[0] == 60_000 and fitted.overhead_w[0] == 980
    racks = slice(top.level_start[RACK], top.level_start[RACK + 1])
    assert np.array_equal(fitted.budget_w[racks], sizing.budget_w[racks])
    assert sizing.budget_w[rows].tolist() == [30_000, 20_000, 10_000]  # the input unchanged
    table = fitted.table.set_index("name")
    # row1 caps above 0.98 * 29,500 = 28,910 W: draws 28,911 .. 29,999, 1,089 of 30,000
    assert table.loc["row1", "p_capping"] == pytest.approx(1_089 / 30_000)
    assert table.loc["row1", "capping_s_per_day"] == pytest.approx(1_089 / 30_000 * 86_400)
    assert table.loc["row1", "budget_w"] == 29_500 and table.loc["row1", "bound"] == "leaf pool"
    assert table.loc["row1-k1", "bound"] == "quantile"
    assert fitted.info["tree"] == {
        "leaf_pool_w": 59_000.0,
        "rows_budget_w_sized": 60_000.0,
        "factor": factor,
        "rows_at_floor": [],
        "rows_budget_w": 58_999.0,
    }


def test_a_row_that_would_fall_below_the_loaders_floor_is_held_there():
    top = load_budgets(DATA / "tree-3rows.toml")
    # pool 59,000 W, rows 1,000 + 30,000 + 29,000 = 60,000 W: at 59/60 row1 would get 983 W,
    # below the 1 kW a row may have; held at 1,000 W, the others share 58,000 / 59,000
    sizing = hand_sizing(top, 60_000, 980, [1_000, 30_000, 29_000])
    fitted, factor = fit_rows_to_leaf_pool(top, sizing)
    assert factor == pytest.approx(58 / 59, rel=1e-12)
    rows = slice(top.level_start[ROW], top.level_start[ROW + 1])
    assert fitted.budget_w[rows].tolist() == [1_000, 29_491, 28_508]  # 29,491.5; 28,508.5
    assert fitted.info["tree"]["rows_at_floor"] == ["row1"]


def test_rows_that_fit_are_left_alone_and_an_impossible_pool_is_refused():
    top = load_budgets(DATA / "tree-3rows.toml")
    sizing = hand_sizing(top, 60_000, 980, [29_000, 20_000, 10_000])  # 59,000 = the pool
    fitted, factor = fit_rows_to_leaf_pool(top, sizing)
    assert factor == 1.0 and np.array_equal(fitted.budget_w, sizing.budget_w)
    # pool 3,000 - 980 / 0.98 = 2,000 W: three rows cannot each keep 1 kW
    with pytest.raises(SizingError, match=r"too little for its 3 rows at the least budget"):
        fit_rows_to_leaf_pool(top, hand_sizing(top, 3_000, 980, [1_000, 1_000, 1_000]))


# --- the command, on the shipped topologies ----------------------------------------------


@pytest.mark.parametrize(
    ("topology", "fits"),
    [
        # demo.toml, seed 0: rows 104,500 + 96,896 = 201,396 W, site 204,250 W, no overhead
        ("demo.toml", True),
        # tree-3rows.toml, seed 0: rows 26,350 + 24,659 + 19,146 = 70,155 W, site 70,006 W
        ("tree-3rows.toml", False),
    ],
)
def test_without_tree_the_output_says_whether_a_leaf_controller_loads_the_file(
    tmp_path: Path, topology: str, fits: bool
):
    out = tmp_path / "budgets.toml"
    doc = run_size(tmp_path, topology, out)
    back = load_budgets(out)
    total = sum(level_budgets(back, ROW).values())
    pool = pool_by_hand(back)
    assert (total <= pool) is fits
    assert doc["tree"] == {
        "rows_budget_w": total,
        "leaf_pool_w": pool,
        "fits": fits,
        "factor": None,
        "rows_at_floor": [],
    }
    sums = (
        f"the rows' budgets sum to {total / 1e3:,.1f} kW, the leaves may hold {pool / 1e3:,.1f} kW"
    )
    assert doc["tree_of_controllers"].startswith(sums)
    # the file does not say whether one controller or a tree runs it: the note says what
    # each would do, not "a leaf controller refuses this file" to a one-controller site
    refused = (
        "one controller for the whole site loads this file; a tree of controllers does not "
        "(its leaves would refuse it: powerplan size --tree sizes the rows within it)"
    )
    assert doc["tree_of_controllers"].endswith(": fits" if fits else refused)
    assert "a leaf controller refuses" not in doc["tree_of_controllers"]
    header = " ".join(line[2:] for line in out.read_text().splitlines() if line.startswith("# "))
    assert f"Tree of controllers: {doc['tree_of_controllers']}." in header
    row = back.rows[0]
    if fits:
        assert scoped(back, parse_scope(row)).budget_w[0] == back.budget_w[back.node_index(row)]
    else:
        with pytest.raises(BudgetError, match="leaves of a tree of controllers"):
            scoped(back, parse_scope(row))
    # the table format prints the same note among its footer lines
    profiles, mix = tmp_path / "profiles.csv", tmp_path / "mix.toml"
    table = CliRunner().invoke(
        main,
        [
            *("size", str(DATA / topology), str(profiles), "--mix", str(mix)),
            *("-o", str(tmp_path / "again.toml"), "--samples", SAMPLES, ALLOW),
        ],
    )
    assert table.exit_code == 0, table.output
    words = " ".join(table.stdout.split())
    assert f"tree_of_controllers: {doc['tree_of_controllers']}" in words


def test_tree_scales_the_rows_into_the_leaf_pool_and_leaves_racks_and_site(tmp_path: Path):
    plain_out, tree_out = tmp_path / "plain.toml", tmp_path / "tree.toml"
    plain = run_size(tmp_path, "tree-3rows.toml", plain_out)
    doc = run_size(tmp_path, "tree-3rows.toml", tree_out, "--tree")
    sized, fitted = load_budgets(plain_out), load_budgets(tree_out)
    assert rows_within_site(sized) is not None  # the case scales: it did not fit as sized
    assert rows_within_site(fitted) is None
    before = level_budgets(sized, ROW)
    pool = pool_by_hand(sized)
    factor = doc["tree"]["factor"]
    assert factor == pytest.approx(pool / sum(before.values()), rel=1e-12) and factor < 1
    after = level_budgets(fitted, ROW)
    assert after == {name: math.floor(b * factor) for name, b in before.items()}
    assert sum(after.values()) <= pool
    assert doc["tree"]["rows_budget_w"] == sum(after.values())
    assert level_budgets(fitted, RACK) == level_budgets(sized, RACK)
    assert fitted.budget_w[0] == sized.budget_w[0] and pool_by_hand(fitted) == pool
    assert np.array_equal(fitted.server_failsafe_cap_w, sized.server_failsafe_cap_w)
    assert doc["failsafe_cap_w"] == plain["failsafe_cap_w"]
    # every row (and two rows together) can be a leaf controller's scope of the written file
    for row in fitted.rows:
        leaf = scoped(fitted, parse_scope(row))
        assert leaf.budget_w[0] == after[row]
    pair = scoped(fitted, parse_scope("pair:row1,row2"))
    assert pair.budget_w[0] == after["row1"] + after["row2"]
    # the table: scaled rows' budgets, bound and (recomputed) capping; the note names the factor
    rows = {n["name"]: n for n in doc["nodes"] if n["level"] == "row"}
    sized_rows = {n["name"]: n for n in plain["nodes"] if n["level"] == "row"}
    for name, node in rows.items():
        assert node["budget_w"] == after[name]
        assert node["bound"] == "leaf pool"
        assert node["p_capping"] >= sized_rows[name]["p_capping"]  # a lower budget caps more
    assert f"scaled by {factor:.6g} (--tree)" in doc["tree_of_controllers"]
    assert ": fits;" in doc["tree_of_controllers"]
    site = [n for n in doc["nodes"] if n["level"] == "site"]
    assert site == [n for n in plain["nodes"] if n["level"] == "site"]


def test_tree_on_rows_that_already_fit_changes_nothing(tmp_path: Path):
    plain_out, tree_out = tmp_path / "plain.toml", tmp_path / "tree.toml"
    run_size(tmp_path, "demo.toml", plain_out)
    doc = run_size(tmp_path, "demo.toml", tree_out, "--tree")
    assert doc["tree"]["factor"] == 1.0 and doc["tree"]["fits"] is True
    assert np.array_equal(load_budgets(plain_out).budget_w, load_budgets(tree_out).budget_w)
    assert "fits as sized (--tree: factor 1, no row scaled)" in doc["tree_of_controllers"]


def test_a_site_overhead_counts_against_the_leaf_pool(tmp_path: Path):
    """demo.toml fits without an overhead (above); cooling at the site takes the pool."""
    out = tmp_path / "budgets.toml"
    doc = run_size(tmp_path, "demo.toml", out, "--cooling-fraction", "0.05")
    back = load_budgets(out)
    assert back.overhead_w[0] > 0
    assert doc["tree"]["leaf_pool_w"] == pool_by_hand(back)
    assert doc["tree"]["leaf_pool_w"] < back.budget_w[0]
    tree = run_size(tmp_path, "demo.toml", out, "--cooling-fraction", "0.05", "--tree")
    assert rows_within_site(load_budgets(out)) is None
    assert tree["tree"]["rows_budget_w"] <= tree["tree"]["leaf_pool_w"]
