"""``powerplan frontier`` (planner/frontier.py): a frontier point checked by hand, the units,
storage's shifted demand, the command's JSON and its plot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from planner.cli import main as powerplan
from planner.frontier import (
    NO_STORAGE,
    SiteFrontier,
    Units,
    demand_frontier,
    marks,
    position,
    shifted_by_storage,
)
from planner.frontier_plot import X_LABEL, Y_LABEL, frontier_figure
from planner.whatif_storage import StorageSizing
from policies.grid import J_PER_KWH
from policies.grid_frontier import lost_work_bound_j
from powerd.topology import load_budgets
from powerd.topology.grid import GridSpec
from tests.support.paths import REPO, TEST_DATA

DEMO = REPO / "powerd" / "data" / "budgets" / "demo.toml"
TINY = REPO / "powerd" / "data" / "budgets" / "tiny.toml"
PROFILES = (TEST_DATA / "profiles" / "train.csv", TEST_DATA / "profiles" / "telemetry.lp")
MIX = REPO / "examples" / "planning" / "mix.toml"
DEMAND_W = np.array([0.0, 0.0, 0.0, 9.0, 9.0, 9.0])  # a 9 W rise, 1 s steps
SPEC = GridSpec(ramp_up_w_per_s=3.0, window_s=1.0)  # 3 W/s up over 1 s, no fall limit


def test_a_frontier_point_by_hand():
    """d = 0 0 0 9 9 9 W, 1 s steps, rises ≤ 3 W a step. Hold the last step before the rise
    at x W; then p[3] ≤ x + 3, p[4] ≤ x + 6 (demand 9 from step 3) and p[1] ≥ x - 3, p[0]
    ≥ x - 6 (the rise to x): lost = (6 - x)+ + (3 - x)+, floor = x + (x - 3)+ + (x - 6)+.
    x = 0: (floor 0, lost 9), the least burn; x = 3: (3, 3); x = 6: (9, 0), the least loss
    (least_ramp_floor: 0 3 6 9 9 9). Between: lost 9 - 2 floor to (3, 3), then 3 - floor/2:
    slopes -2 and -1/2, so floor + lost is least at (3, 3), the knee (6 J), and burning
    6 J the least lost is 3 - 3/2 = 1.5 J."""
    curve, knee = demand_frontier(DEMAND_W, 1.0, SPEC, points=9)
    assert (curve[0].floor_j, curve[0].lost_j) == pytest.approx((9.0, 0.0), abs=1e-9)
    assert (curve[-1].floor_j, curve[-1].lost_j) == pytest.approx((0.0, 9.0), abs=1e-9)
    assert (knee.floor_j, knee.lost_j) == pytest.approx((3.0, 3.0), abs=1e-9)
    f = SiteFrontier(NO_STORAGE, curve, knee, 0.0)
    assert f.lost_bound_j(6.0) == pytest.approx(1.5, abs=1e-9)
    assert f.lost_bound_j(3.0) == pytest.approx(3.0, abs=1e-9)


def test_units_make_a_day_of_a_replay():
    """A day's replay: 1 kWh is 1 kWh a day; 500 W × 1 h not served is 1 GPU-hour at 500 W
    a GPU. Half a day's replay: twice as much a day."""
    day = Units(86_400.0, 500.0)
    assert day.kwh_per_day(J_PER_KWH) == pytest.approx(1.0)
    assert day.gpu_hours_per_day(500.0 * 3600.0) == pytest.approx(1.0)
    half = Units(43_200.0, 500.0)
    assert half.kwh_per_day(J_PER_KWH) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="w_per_gpu"):
        Units(10.0, 0.0)


def test_position_on_the_hand_frontier():
    """A site burning 6 J and losing 3 J sits at twice the least loss at that burn (1.5)."""
    curve, knee = demand_frontier(DEMAND_W, 1.0, SPEC, points=9)
    m = marks(DEMAND_W, 1.0, SPEC, NO_STORAGE, 6.0)  # three schedules and a bound search
    assert (m.least_floor_j, m.knee, m.bound_j) == (
        pytest.approx(curve[0].floor_j),
        knee,
        pytest.approx(lost_work_bound_j(curve, 6.0)),
    )
    where = position(m, 6.0, 3.0, Units(86_400.0, 1 / 3600), meets_spec=True)
    assert where["lost_over_bound"] == pytest.approx(2.0)
    assert where["floor_over_least_loss_floor"] == pytest.approx(6.0 / 9.0)
    assert where["lost_gpu_hours_per_day"] == pytest.approx(3.0)


def test_storage_shifts_the_demand_by_what_it_takes_and_gives():
    """The grid sees the demand plus the storage's net take from the bus: over the series,
    the demand's energy plus the conversion losses and the change of charge (the dispatch's
    energy balance); no storage leaves the demand as it is."""
    top = load_budgets(DEMO)
    t = np.arange(400)
    demand_w = 150e3 + 40e3 * ((t // 10) % 2)  # 40 kW steps every 10 s: over ±20 kW/s
    same = shifted_by_storage(top, demand_w, 1.0, NO_STORAGE)
    assert np.array_equal(same.demand_w, demand_w) and same.conversion_loss_j == 0.0
    from planner.whatif_storage import storage_dispatch

    sizing = StorageSizing(30.0, 5.0)
    run = storage_dispatch(top, demand_w, 1.0, sizing)
    shifted = shifted_by_storage(top, demand_w, 1.0, sizing)
    assert shifted.conversion_loss_j > 0
    expected_j = demand_w.sum() + shifted.conversion_loss_j + run.stored_change_j
    assert shifted.demand_w.sum() == pytest.approx(expected_j, rel=1e-9)
    swing_w = np.abs(np.diff(shifted.demand_w)).max()
    assert swing_w < np.abs(np.diff(demand_w)).max()  # the storage took up some of each step


def run_frontier(tmp_path: Path, *extra: str) -> dict:
    args = [
        "frontier", str(DEMO), *map(str, PROFILES), "--workload", "untagged", "--mix",
        str(MIX), "--duration-s", "120", "--synchronised", "--points", "5", *extra,
        "--format", "json",
    ]  # fmt: skip
    result = CliRunner().invoke(powerplan, args)
    assert result.exit_code == 0, result.output
    doc: dict = json.loads(result.stdout)
    return doc


def test_the_command_prices_each_storage_size(tmp_path: Path):
    """No storage first, then each size: least loss, knee, least burn; each frontier from
    least loss (nothing lost) to least burn (no floor, only conversion losses burnt)."""
    plot = tmp_path / "f.png"
    doc = run_frontier(
        tmp_path, "--storage-kj-per-rack", "30", "--storage-kw-per-rack", "5", "--plot", str(plot)
    )
    answer, curve = doc["answer"], doc["frontier"]
    assert [(r["storage_kj_per_rack"], r["point"]) for r in answer] == [
        (0, "least loss"), (0, "knee"), (0, "least burn"),
        (30, "least loss"), (30, "knee"), (30, "least burn"),
    ]  # fmt: skip
    for kj in (0, 30):  # at least five points a size (every vertex), floor descending
        floors = [r["floor_kwh_per_day"] for r in curve if r["storage_kj_per_rack"] == kj]
        assert len(floors) >= 5 and floors == sorted(floors, reverse=True)
    for size in (answer[:3], answer[3:]):
        least_loss, knee, least_burn = size
        assert least_loss["lost_gpu_hours_per_day"] == pytest.approx(0.0, abs=1e-6)
        assert least_burn["floor_kwh_per_day"] == pytest.approx(0.0, abs=1e-6)
        assert least_loss["burnt_kwh_per_day"] >= knee["burnt_kwh_per_day"] * (1 - 1e-9)
        assert knee["lost_gpu_hours_per_day"] <= least_burn["lost_gpu_hours_per_day"] * (1 + 1e-9)
        for row in size:
            total = row["floor_kwh_per_day"] + row["conversion_loss_kwh_per_day"]
            assert row["burnt_kwh_per_day"] == pytest.approx(total)
    assert answer[0]["conversion_loss_kwh_per_day"] == 0
    assert answer[3]["conversion_loss_kwh_per_day"] > 0
    ratio = answer[2]["lost_gpu_hours_per_day"] / answer[2]["lost_kwh_per_day"]
    assert ratio == pytest.approx(1000 / doc["w_per_gpu"])  # kWh / (kW a GPU) = GPU-hours
    assert doc["duration_s"] == 120 and doc["step_s"] == 1
    assert plot.stat().st_size > 0 and doc["plot"] == str(plot)


def test_the_plot_labels_its_axes():
    curve, knee = demand_frontier(DEMAND_W, 1.0, SPEC, points=5)
    fig = frontier_figure([SiteFrontier(NO_STORAGE, curve, knee, 0.0)], Units(6.0, 1.0))
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == (X_LABEL, Y_LABEL)
    assert "kWh a day" in X_LABEL and "GPU-hours a day" in Y_LABEL
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["no storage"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--storage-kj-per-rack", "30"], "--storage-kj-per-rack needs --storage-kw-per-rack"),
        (["--storage-kw-per-rack", "5"], "--storage-kw-per-rack needs --storage-kj-per-rack"),
    ],
)
def test_storage_needs_both_sizes(args: list[str], message: str):
    result = CliRunner().invoke(
        powerplan, ["frontier", str(DEMO), str(PROFILES[0]), "--mix", str(MIX), *args]
    )
    assert result.exit_code == 2 and message in result.output


def test_a_site_without_a_ramp_limit_is_refused(tmp_path: Path):
    mix = tmp_path / "mix.toml"
    mix.write_text('[[jobs]]\nworkload = "llm-7b"\nshare = 0.5\n')
    result = CliRunner().invoke(
        powerplan, ["frontier", str(TINY), str(PROFILES[0]), "--mix", str(mix)]
    )
    assert result.exit_code == 1
    assert "the frontier needs a grid spec with a ramp limit" in result.output


def test_whatif_says_where_the_site_sits():
    """With smoothing: its burn and loss per day against the frontier at no storage, in the
    JSON and as one line of the table; without a ramp limit, nothing."""
    args = [
        "whatif", str(DEMO), *map(str, PROFILES), "--workload", "untagged", "--mix", str(MIX),
        "--duration-s", "120", "--synchronised", "--smoothing",
    ]  # fmt: skip
    result = CliRunner().invoke(powerplan, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    where = json.loads(result.stdout)["frontier"]
    assert where["storage_kj_per_rack"] == 0 and where["meets_spec"] is True
    assert where["floor_kwh_per_day"] > 0
    assert where["lost_bound_gpu_hours_per_day"] <= where["lost_gpu_hours_per_day"] + 1e-9
    assert where["knee_floor_kwh_per_day"] <= where["least_loss_floor_kwh_per_day"] + 1e-9
    table = CliRunner().invoke(powerplan, args)
    assert table.exit_code == 0, table.output
    text = " ".join(table.output.split())  # the footer's lines wrapped
    assert "on the frontier (powerplan frontier): burns " in text
    assert "the least any schedule within the spec loses at that burn" in text
