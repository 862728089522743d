"""Capped samples are censored (issue 38): planner.censored on cases worked by hand, and
`powerplan profiles` / `powerplan size` warning about them and planning from the estimate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from planner.censored import (
    DATA,
    DRAW,
    FALLBACK,
    CensoredError,
    classify,
    estimate_demand,
    product_limit,
    resolve,
)
from planner.cli import main
from planner.profile_table import COLUMNS
from tests.support.paths import REPO

TOPOLOGY = REPO / "powerd/data/budgets/tree-3rows.toml"  # 96 H100: room for all at 700 W
T0 = 1.7e9


def table(
    power_w: list[float],
    cap_w: list[float],
    cap_max_w: float | None = 700.0,
    workload: str = "w",
    phase: str = "compute",
) -> pd.DataFrame:
    """One GPU's samples, one a second."""
    n = len(power_w)
    frame = pd.DataFrame(
        {
            "time_s": T0 + np.arange(n, dtype=float),
            "node": "n1",
            "gpu": 0,
            "workload": workload,
            "power_w": power_w,
            "cap_w": cap_w,
            "cap_max_w": np.nan if cap_max_w is None else cap_max_w,
            "clock_mhz": np.nan,
            "phase": phase,
            "throughput": np.nan,
        }
    )
    return frame[list(COLUMNS)]


def many(power_w: list[float], cap_w: list[float], n: int) -> pd.DataFrame:
    """``n`` workloads of the same samples: each its own group, one estimate for all."""
    frame = pd.concat([table(power_w, cap_w)] * n, ignore_index=True)
    frame["workload"] = np.repeat([f"w{k:04d}" for k in range(n)], len(power_w))
    return frame


# --- which samples are censored ----------------------------------------------------------


def test_a_sample_within_the_tolerance_below_a_cap_under_the_maximum_is_censored() -> None:
    t = table(
        power_w=[450.0, 449.0, 690.0, 650.0, 600.0, 300.0],
        cap_w=[500.0, 500.0, 700.0, 699.5, np.nan, 500.0],
    )
    c = classify(t)  # 10 %: held when the draw is at least 0.9 x the cap
    assert c.capped.tolist() == [True, True, False, False, False, True]
    # 450 >= 0.9 x 500 (held); 449 is not; at the maximum cap (or within 1 W of it) or with
    # no cap known nothing is censored; 300 W under a 500 W cap is the demand
    assert c.censored.tolist() == [True, False, False, False, False, False]
    assert classify(t, tolerance=0.5).censored.tolist() == [True, True, False, False, False, True]


def test_without_cap_max_the_gpus_highest_cap_stands_for_it() -> None:
    t = table(power_w=[640.0, 490.0, 495.0], cap_w=[700.0, 500.0, 520.0], cap_max_w=None)
    c = classify(t)
    assert c.highest_cap_w.tolist() == [700.0, 700.0, 700.0]
    assert c.censored.tolist() == [False, True, True]
    assert c.inferred.tolist() == [False, True, True]


# --- the estimate, worked by hand ----------------------------------------------------------


def test_product_limit_by_hand() -> None:
    # 100, 300, 500 seen; > 200 and > 400 censored. At risk 5, 3, 1:
    # S = 4/5 after 100, 4/5 x 2/3 after 300, 0 after 500
    values = np.array([300.0, 200.0, 500.0, 100.0, 400.0])
    censored = np.array([False, True, False, False, True])
    times, survival = product_limit(values, censored)
    assert times.tolist() == [100.0, 300.0, 500.0]
    assert survival == pytest.approx([0.8, 0.8 * 2 / 3, 0.0])


def test_a_censored_sample_takes_a_seen_draw_above_it_as_the_product_limit_weighs_them() -> None:
    """Given > 200: 300 with P = (0.8 - 0.5333) / 0.8 = 1/3, 500 with 2/3; given > 400: 500.
    Many workloads of the same five samples, one estimate: the shares come out so."""
    draws = [300.0, 200.0, 500.0, 100.0, 400.0]
    caps = [700.0, 210.0, 700.0, 700.0, 420.0]  # 200 and 400 held just under their caps
    n = 3000
    est = estimate_demand(many(draws, caps, n), seed=0)
    power = est.table["power_w"].to_numpy().reshape(n, 5)
    source = est.source.reshape(n, 5)
    assert (source[:, [0, 2, 3]] == DRAW).all() and (source[:, [1, 4]] == DATA).all()
    assert (power[:, [0, 2, 3]] == [300.0, 500.0, 100.0]).all()  # seen draws are kept
    assert set(power[:, 1]) == {300.0, 500.0}
    assert (power[:, 1] == 300.0).mean() == pytest.approx(1 / 3, abs=0.03)  # sd 0.009
    assert (power[:, 4] == 500.0).all()


def test_mass_above_the_largest_seen_draw_goes_to_the_highest_cap() -> None:
    """100 and 300 seen, > 200 and > 400 censored: S = 3/4 after 100, 3/8 after 300, then
    nothing seen: given > 200, 300 with P 1/2 and the fallback (700 W) with 1/2; given
    > 400, the fallback."""
    draws, caps = [100.0, 200.0, 300.0, 400.0], [700.0, 210.0, 700.0, 420.0]
    n = 3000
    est = estimate_demand(many(draws, caps, n), seed=1)
    power = est.table["power_w"].to_numpy().reshape(n, 4)
    assert set(power[:, 1]) == {300.0, 700.0}
    assert (power[:, 1] == 700.0).mean() == pytest.approx(0.5, abs=0.03)
    assert (power[:, 3] == 700.0).all()
    assert (est.source.reshape(n, 4)[:, 3] == FALLBACK).all()


def test_groups_are_workload_and_phase_and_none_seen_means_the_fallback() -> None:
    """Compute is held throughout; communication's low draws say nothing about compute."""
    compute = table([550.0, 560.0], [580.0, 590.0])
    comm = table([150.0, 160.0], [580.0, 590.0], phase="communication")
    comm["time_s"] += 10
    est = estimate_demand(pd.concat([compute, comm], ignore_index=True), seed=0)
    assert est.table["power_w"].tolist() == [700.0, 700.0, 150.0, 160.0]
    assert est.source.tolist() == [FALLBACK, FALLBACK, DRAW, DRAW]


def test_the_same_table_gives_the_same_estimate() -> None:
    draws, caps = [300.0, 200.0, 500.0, 100.0, 400.0], [700.0, 210.0, 700.0, 700.0, 420.0]
    t = many(draws, caps, 50)
    first = estimate_demand(t, seed=7).table["power_w"]
    assert first.equals(estimate_demand(t, seed=7).table["power_w"])


# --- the modes ------------------------------------------------------------------------------


def test_modes_estimate_refuse_as_is() -> None:
    t = table([640.0, 640.0, 480.0, 480.0], [700.0, 700.0, 500.0, 500.0])
    est = resolve(t, "estimate")
    assert est.table["power_w"].tolist() == [640.0] * 4
    assert len(est.warnings) == 1 and est.warnings[0].startswith("w: 50% of its 4 samples capped")
    assert "2 from uncensored samples of the same phase" in est.warnings[0]
    as_is = resolve(t, "as-is")
    assert as_is.table["power_w"].tolist() == [640.0, 640.0, 480.0, 480.0]
    assert "understates it" in as_is.warnings[0]
    with pytest.raises(CensoredError, match=r"w 2 of 4 \(50%\).*--capped-demand estimate"):
        resolve(t, "refuse")
    shares = est.shares.iloc[0]
    assert (shares["capped_share"], shares["censored_share"], shares["from_data"]) == (0.5, 0.5, 2)


def test_nothing_censored_nothing_said_nothing_changed() -> None:
    t = table([640.0, 300.0], [700.0, 500.0])
    for mode in ("estimate", "refuse", "as-is"):
        resolved = resolve(t, mode)
        assert resolved.warnings == []
        assert resolved.table["power_w"].tolist() == [640.0, 300.0]


# --- the commands ---------------------------------------------------------------------------


def write_profile(path: Path, capped: bool) -> Path:
    """One job on two GPUs for 20 s: GPU 0 at 640 W under its 700 W maximum cap; GPU 1
    (``capped``) held under a 500 W cap at 480 W, else at 640 W too: the truth."""
    frames = []
    for gpu in (0, 1):
        held = capped and gpu == 1
        frame = table([480.0 if held else 640.0] * 20, [500.0 if held else 700.0] * 20, None)
        frame["gpu"] = gpu
        frame["workload"] = "train"
        frame["cap_max_w"] = 700.0
        frames.append(frame)
    pd.concat(frames).to_csv(path, index=False)
    return path


def test_profiles_warns_and_summarises_the_estimated_demand(tmp_path: Path) -> None:
    capped = write_profile(tmp_path / "capped.csv", capped=True)
    result = CliRunner().invoke(main, ["profiles", str(capped), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("warning: train: 50% of its 40 samples capped below")
    row = json.loads(result.stdout)["profiles"][0]
    assert row["mean_w"] == 640.0 and row["censored_share"] == 0.5  # the demand, not 560 W
    as_is = CliRunner().invoke(
        main, ["profiles", str(capped), "--format", "json", "--capped-demand", "as-is"]
    )
    assert json.loads(as_is.stdout)["profiles"][0]["mean_w"] == 560.0
    refused = CliRunner().invoke(main, ["profiles", str(capped), "--capped-demand", "refuse"])
    assert refused.exit_code == 1
    assert "train 20 of 40 (50%)" in refused.stderr and "--capped-demand estimate" in refused.stderr


def test_size_plans_from_the_estimated_demand(tmp_path: Path) -> None:
    """The capped profile estimated sizes exactly as the uncapped truth does; as-is below it."""
    capped = write_profile(tmp_path / "capped.csv", capped=True)
    truth = write_profile(tmp_path / "truth.csv", capped=False)
    mix = tmp_path / "mix.toml"
    mix.write_text('[[jobs]]\nworkload = "train"\nshare = 1.0\n')

    def site_demand_w(profile: Path, *flags: str) -> tuple[float, str, Any]:
        out = tmp_path / f"{profile.stem}{len(flags)}.toml"
        args = ["size", str(TOPOLOGY), str(profile), "--mix", str(mix), "-o", str(out)]
        flags = ("--samples", "1000", "--format", "json", "--allow-over-limit", *flags)
        result = CliRunner().invoke(main, [*args, *flags])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        site = next(n for n in doc["nodes"] if n["level"] == "site")
        return float(site["demand_q_w"]), result.stderr, doc

    truth_w, said, _ = site_demand_w(truth)
    assert "capped" not in said
    estimated_w, said, doc = site_demand_w(capped)
    assert "warning: profiles" in said and "train: 50% of its 40 samples capped" in said
    assert doc["capped_demand"] == "estimate"
    assert doc["capped_samples"][0]["from_data"] == 20
    assert estimated_w == pytest.approx(truth_w)
    as_is_w, said, _ = site_demand_w(capped, "--capped-demand", "as-is")
    assert as_is_w == pytest.approx(truth_w - 96 * 80)  # the job's GPUs short by 80 W each
    assert "understates it" in said
