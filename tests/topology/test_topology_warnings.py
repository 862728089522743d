"""Budgets files that load but are out of proportion: ``checks.budget_warnings`` (issue 15).

A limit far above what the GPUs under a node can draw (a unit slip: limit_kw = 215000 for
256 GPUs) and a budget below what they draw at their lowest cap load, and say so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from powerd.topology import load_budgets, parse_budgets
from powerd.topology.checks import (
    BUDGET_UNDER_FLOOR_MIN,
    LIMIT_OVER_DRAW_MAX,
    budget_warnings,
)
from tests.support.paths import REPO

DATA = REPO / "powerd" / "data" / "budgets"
H100_MIN_W, H100_MAX_W = 200.0, 700.0


def small_site(*, site_limit_w: float, rack_budget_w: float = 3_000.0, racks: int = 1) -> str:
    """A site, one row, ``racks`` racks of one 4-GPU H100 node with a 1 kW overhead:
    a rack draws 3,800 W at most and 1,800 W with every GPU at its lowest cap."""
    return f"""
[site]
name = "s"
limit_w = {site_limit_w}
budget_w = {min(site_limit_w, 2_000_000)}
[[rows]]
name = "r"
limit_w = {4_000 * racks}
budget_w = {rack_budget_w * racks}
[rows.racks]
count = {racks}
name = "k{{i}}"
limit_w = 4000
budget_w = {rack_budget_w}
[rows.racks.nodes]
count = 1
name = "{{rack}}-n{{i}}"
gpus = 4
model = "H100"
overhead_w = 1000
[models.H100]
failsafe_cap_w = 700
"""


def slipped_demo_file(tmp_path: Path) -> Path:
    slipped = tmp_path / "slipped.toml"
    text = (DATA / "demo.toml").read_text()
    slipped.write_text(text.replace("limit_kw = 215 ", "limit_kw = 215000 ", 1))
    return slipped


@pytest.mark.parametrize("name", ["tiny", "demo", "tree-3rows", "site-150mw"])
def test_the_shipped_examples_are_in_proportion(name: str):
    assert budget_warnings(load_budgets(DATA / f"{name}.toml")) == []


def test_a_site_limit_in_the_wrong_unit_loads_and_is_named(tmp_path: Path):
    """The issue's case: demo.toml's limit_kw = 215 written as 215000 (840 kW a GPU)."""
    slipped = slipped_demo_file(tmp_path)
    top = load_budgets(slipped)  # not refused: a warning
    assert top.limit_w[0] == 215e6
    [warning] = budget_warnings(top)
    # 256 × 700 W + 64 nodes × 1000 W + 8 racks × 800 W = 249,600 W
    assert warning.startswith(f"{slipped}: site 'demo': limit_w = 215,000,000 W is 861 ×")
    assert "(249,600 W: 256 GPUs at their maximum cap, overheads in)" in warning
    assert f"more than {LIMIT_OVER_DRAW_MAX:g} × is out of proportion" in warning
    assert "a unit slip? 1/1,000 of it, 215 kW, would be 0.86 ×" in warning


def test_a_limit_warns_just_above_its_bound_and_not_at_it():
    most_w = 2 * (4 * H100_MAX_W + 1000)  # two racks under the site
    at = parse_budgets(small_site(site_limit_w=LIMIT_OVER_DRAW_MAX * most_w, racks=2))
    assert budget_warnings(at) == []
    above = parse_budgets(small_site(site_limit_w=LIMIT_OVER_DRAW_MAX * most_w + 1, racks=2))
    [warning] = budget_warnings(above)
    assert "site 's': limit_w = 76,001 W is 10 × what everything under it" in warning


def test_a_budget_below_the_gpus_lowest_caps_warns_once_per_level_with_a_count():
    floor_w = 4 * H100_MIN_W + 1000  # 1,800 W
    assert (
        budget_warnings(parse_budgets(small_site(site_limit_w=20_000, rack_budget_w=floor_w))) == []
    )
    low = parse_budgets(
        small_site(site_limit_w=20_000, rack_budget_w=BUDGET_UNDER_FLOOR_MIN * floor_w - 1, racks=3)
    )
    warnings = budget_warnings(low)
    assert [w.split(": ")[1] for w in warnings] == ["row 'r'", "rack 'k1'"]
    rack = warnings[1]
    assert "budget_w = 1,799 W is below what its 4 GPUs draw at their lowest cap" in rack
    assert "(1,800 W)" in rack and rack.endswith("; 2 more racks too")


def test_the_controller_logs_the_warnings_of_the_file_it_loads(tmp_path: Path, caplog):
    """The daemons load files too: the controller's load (start and SIGHUP) logs them."""
    from powerd.controller.app import load_for
    from powerd.controller.config import ControllerConfig

    slipped = slipped_demo_file(tmp_path)
    with caplog.at_level("WARNING", logger="powerd.controller"):
        load_for(ControllerConfig(), slipped)
    [record] = [r for r in caplog.records if r.name == "powerd.controller"]
    assert record.getMessage().startswith(f"budgets: {slipped}: site 'demo': limit_w")


def test_the_demo_warns_about_a_budgets_file_it_is_given_before_it_starts(tmp_path: Path):
    from click.testing import CliRunner

    from powerd.cli import main

    slipped = slipped_demo_file(tmp_path)
    # the duration is refused after the file is read: nothing starts, the warning is out
    result = CliRunner().invoke(main, ["demo", "--budgets", str(slipped), "--duration-s", "1"])
    assert result.exit_code == 2 and "--duration-s" in result.output
    assert f"warning: budgets: {slipped}: site 'demo': limit_w" in result.stderr


def test_the_fleet_simulator_logs_the_warnings_of_the_file_it_loads(tmp_path: Path, caplog):
    from powerd.fleet.app import run_fleet

    slipped = slipped_demo_file(tmp_path)
    with caplog.at_level("WARNING", logger="powerd.fleet"), pytest.raises(ValueError):
        run_fleet(slipped, "mqtt://127.0.0.1:1", "default")  # no key to trust: stops there
    [record] = [r for r in caplog.records if r.name == "powerd.fleet"]
    assert record.getMessage().startswith(f"budgets: {slipped}: site 'demo': limit_w")
