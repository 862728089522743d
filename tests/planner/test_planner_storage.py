"""`powerplan whatif --storage-kj-per-rack`: rack energy storage dispatched over the replayed
site power. The report agrees with the replay's own series and jobs' energy, the grid draw
keeps the spec, and the options refuse what the model cannot answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main
from planner.whatif_storage import StorageSizing, storage_report
from policies import PolicySettings, grid
from policies.storage import Storage, dispatch
from tests.planner.test_planner_whatif_grid import (
    DEMO,
    demo_without_grid,
    replay_demo,
    write_inputs,
)

DEMO_RACKS = 8  # 2 rows × 4 racks
RAMP_W_PER_S = 5e3  # the demo's [site.grid] at 5 kW/s both ways, not 20: its jobs break it


def demo_at_5_kw_per_s() -> str:
    text = DEMO.read_text("utf-8")
    for way in ("up", "down"):
        text = text.replace(f"ramp_{way}_kw_per_s = 20", f"ramp_{way}_kw_per_s = 5", 1)
    assert text.count("_kw_per_s = 5 ") == 2
    return text


@pytest.fixture(scope="module")
def replayed():
    # the bands, whose caps swing the demo site in the oscillation band all the time: the
    # spec the storage must keep (under safety by caps the site stays within that band)
    bands = PolicySettings(safety_by_caps=False)
    return replay_demo(demo_at_5_kw_per_s(), duration_s=600, policy=bands)


def test_the_report_is_the_dispatch_of_the_replayed_site_series(replayed):
    top, result = replayed
    report = storage_report(top, result, StorageSizing(30.0, 5.0))
    assert report["racks"] == DEMO_RACKS
    assert report["capacity_kwh"] == pytest.approx(30e3 * DEMO_RACKS / grid.J_PER_KWH)
    assert report["power_w"] == pytest.approx(5e3 * DEMO_RACKS)
    # the same dispatch, done here: one pool, 0.9 x the spec's ramp, 20 s horizon
    pool = Storage(30e3 * DEMO_RACKS, 5e3 * DEMO_RACKS, 0.9)
    run = dispatch(result.site_power_w, 1.0, pool, 0.9 * RAMP_W_PER_S, 0.9 * RAMP_W_PER_S, 20.0)
    # the jobs' energy, from the jobs' table (W per GPU x GPUs x seconds)
    jobs_j = float((result.jobs["power_w_per_gpu"] * result.jobs["gpus"]).sum()) * 600
    for key, joules in (
        ("burnt", run.burnt_j),
        ("conversion_loss", run.conversion_loss_j),
        ("held_back", run.held_back_j),
        ("burnt_and_losses", run.burnt_j + run.conversion_loss_j),
    ):
        assert report[f"{key}_kwh"] == pytest.approx(joules / grid.J_PER_KWH)
        assert report[f"{key}_share_of_jobs"] == pytest.approx(joules / jobs_j)
    assert report["conversion_loss_kwh"] > 0  # the store did work
    site = result.info["grid"]
    assert report["least_floor_without_storage_kwh"] == site["floor_least_kwh"]
    assert report["least_floor_without_storage_share_of_jobs"] == site["floor_least_share_of_jobs"]
    assert report["charge_min_share"] == pytest.approx(run.charge_min_j / pool.capacity_j)
    assert 0 <= report["charge_min_share"] <= report["charge_max_share"] <= 1


def test_the_grid_draw_keeps_the_spec_the_site_breaks(replayed):
    """The three jobs swing the demo site faster than 5 kW/s and in the band all the time
    (600 s outside); the grid draw with storage does neither: it moves within 0.9 x the
    ramp limits, and at that pace when the site drops."""
    top, result = replayed
    site = result.info["grid"]
    assert site["s_outside_ramp_up"] > 0 and site["s_outside_ramp_down"] > 0
    assert site["s_outside_oscillation"] == 600
    measured = storage_report(top, result, StorageSizing(30.0, 5.0))["grid"]
    assert measured["s_outside_oscillation"] == 0
    assert measured["s_outside_ramp_up"] == 0 and measured["s_outside_ramp_down"] == 0
    assert measured["ramp_up_max_w_per_s"] <= 0.9 * RAMP_W_PER_S * (1 + 1e-9)
    assert measured["ramp_down_max_w_per_s"] == pytest.approx(0.9 * RAMP_W_PER_S)
    assert measured["spec"] == result.info["grid"]["spec"]
    assert not any(key.startswith("floor") for key in measured)  # the storage's own costs


def test_more_storage_burns_and_holds_back_less(replayed):
    top, result = replayed
    none = storage_report(top, result, StorageSizing(0.0, 0.0))
    some = storage_report(top, result, StorageSizing(300.0, 10.0))
    assert none["burnt_kwh"] > 0 and none["conversion_loss_kwh"] == 0
    assert some["burnt_kwh"] < none["burnt_kwh"]
    assert some["held_back_kwh"] <= none["held_back_kwh"]
    assert none["charge_min_share"] is None  # no capacity, no share of it


def run_whatif(tmp_path: Path, *extra: str, budgets: Path = DEMO):
    profiles, mix = write_inputs(tmp_path)
    args = ["whatif", str(budgets), str(profiles), "--mix", str(mix), "--duration-s", "120"]
    return CliRunner().invoke(main, [*args, *extra])


def test_the_command_reports_the_storage_in_json_and_in_the_table(tmp_path: Path):
    sizing = ["--storage-kj-per-rack", "30", "--storage-kw-per-rack", "5"]
    result = run_whatif(tmp_path, *sizing, "--storage-efficiency", "0.8", "--format", "json")
    assert result.exit_code == 0, result.output
    storage = json.loads(result.output)["storage"]
    assert (storage["kj_per_rack"], storage["kw_per_rack"]) == (30.0, 5.0)
    assert storage["round_trip_efficiency"] == 0.8 and storage["horizon_s"] == 20.0
    assert any("one site-level pool" in line for line in storage["assumptions"])
    assert storage["grid"]["s_outside_ramp_down"] == 0
    table = run_whatif(tmp_path, *sizing, "--storage-horizon-s", "30")
    assert table.exit_code == 0, table.output
    assert "rack energy storage" in table.output
    assert "grid draw with the storage vs the grid spec" in table.output
    assert "energy held back" in table.output and "storage assumptions:" in table.output
    plain = run_whatif(tmp_path, "--format", "json")
    assert "storage" not in json.loads(plain.output)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--storage-kj-per-rack", "30"], "needs --storage-kw-per-rack"),
        (["--storage-kw-per-rack", "5"], "needs --storage-kj-per-rack"),
        (["--storage-efficiency", "0.8"], "need --storage-kj-per-rack"),
        (["--storage-horizon-s", "10"], "need --storage-kj-per-rack"),
        (["--storage-efficiency", "90", "--storage-kj-per-rack", "1"], "write 0.9"),
        (
            ["--storage-kj-per-rack", "30", "--storage-kw-per-rack", "5", "--smoothing"],
            "alternatives in this model",
        ),
    ],
)
def test_storage_options_that_cannot_be_answered_are_refused(tmp_path: Path, extra, says):
    result = run_whatif(tmp_path, *extra)
    assert result.exit_code == 2
    assert says in " ".join(result.output.split())


def test_storage_needs_a_grid_spec_with_a_ramp_limit(tmp_path: Path):
    bare = tmp_path / "bare.toml"
    bare.write_text(demo_without_grid())
    result = run_whatif(
        tmp_path, "--storage-kj-per-rack", "30", "--storage-kw-per-rack", "5", budgets=bare
    )
    assert result.exit_code == 1
    assert "needs a grid spec with a ramp limit" in result.output
