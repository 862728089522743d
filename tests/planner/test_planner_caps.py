"""``powerplan caps`` on the measured Zeus sweeps, checked against an optimum computed here.

The expected caps are computed in this file with plain pandas from the raw
CSVs (not through planner.caps): for each workload, the measured cap with the
highest throughput per provisioned watt, ``(1 / time_per_epoch) / (cap + overhead)``,
ties to the higher cap.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from planner.caps import recommend
from planner.cli import main
from planner.sweep import load_sweep
from tests.support.paths import TEST_DATA

ZEUS = TEST_DATA / "zeus-power-limit"
GPUS = ("a40", "p100", "v100")
KEY = ["dataset", "network", "batch_size", "optimizer"]
FILES = [str(ZEUS / f"summary_power_{g}.csv") for g in GPUS]


def _raw(gpu: str) -> pd.DataFrame:
    df = pd.read_csv(ZEUS / f"summary_power_{gpu}.csv")
    df["workload"] = df[KEY].astype(str).agg("/".join, axis=1)
    df["thr"] = 1.0 / df["time_per_epoch"]
    return df


def _expected(gpu: str, overhead_w: float) -> dict[str, tuple[float, float, float]]:
    """workload -> (best cap, its throughput per MW, gain % over the max cap), by brute force."""
    out = {}
    for workload, g in _raw(gpu).groupby("workload"):
        per_mw = {
            float(c): t * 1e6 / (c + overhead_w)
            for c, t in zip(g["power_limit"], g["thr"], strict=True)
        }
        best = max(per_mw.values())
        cap = max(c for c, v in per_mw.items() if v == best)
        out[str(workload)] = (cap, best, 100 * (best / per_mw[max(per_mw)] - 1))
    return out


def _cli_json(*args: str) -> dict:
    result = CliRunner().invoke(main, ["caps", *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def cli_docs() -> dict[float, dict]:
    return {oh: _cli_json(*FILES, "--overhead-w", str(oh)) for oh in (0.0, 150.0)}


@pytest.mark.parametrize("overhead_w", [0.0, 150.0])
def test_cli_picks_the_measured_cap_with_most_throughput_per_provisioned_watt(
    cli_docs: dict[float, dict], overhead_w: float
) -> None:
    rows = cli_docs[overhead_w]["caps"]
    for gpu in GPUS:
        expected = _expected(gpu, overhead_w)
        got = {r["workload"]: r for r in rows if r["gpu"] == gpu}
        lowest = _raw(gpu).groupby("workload")["power_limit"].min()
        assert set(got) == set(expected), gpu
        for workload, (cap, per_mw, gain) in expected.items():
            row = got[workload]
            assert row["cap_w"] == cap, (gpu, workload)
            assert row["thr_per_mw"] == pytest.approx(per_mw, rel=1e-12)
            assert row["gain_pct"] == pytest.approx(gain, rel=1e-9, abs=1e-9)
            assert row["gpus_per_mw"] == pytest.approx(1e6 / (cap + overhead_w))
            assert row["at_min_cap"] == (cap == lowest[workload])
    assert cli_docs[overhead_w]["overhead_w"] == overhead_w


def test_overhead_moves_caps_up_and_shrinks_gains(cli_docs: dict[float, dict]) -> None:
    """A fixed per-GPU overhead makes each extra GPU dearer, so caps rise, gains fall."""
    zero = {(r["gpu"], r["workload"]): r for r in cli_docs[0.0]["caps"]}
    for r in cli_docs[150.0]["caps"]:
        z = zero[(r["gpu"], r["workload"])]
        assert r["cap_w"] >= z["cap_w"]
        assert r["gain_pct"] <= z["gain_pct"] + 1e-9
        assert r["gain_pct"] >= 0


def test_equal_weight_mix_matches_brute_force(cli_docs: dict[float, dict]) -> None:
    for overhead_w, doc in cli_docs.items():
        mix = {r["gpu"]: r for r in doc["mix"]}
        assert set(mix) == set(GPUS)
        for gpu in GPUS:
            raw = _raw(gpu)
            at_max = raw.loc[raw.groupby("workload")["power_limit"].idxmax()]
            raw["rel"] = raw["thr"] / raw["workload"].map(at_max.set_index("workload")["thr"])
            n = raw["workload"].nunique()
            per_cap = raw.groupby("power_limit").agg(k=("workload", "nunique"), rel=("rel", "sum"))
            per_cap = per_cap[per_cap["k"] == n]
            score = per_cap["rel"] / n * 1e6 / (per_cap.index + overhead_w)
            assert mix[gpu]["cap_w"] == float(score.idxmax())
            assert mix[gpu]["thr_per_mw"] == pytest.approx(score.max())
            assert mix[gpu]["max_cap_w"] == float(per_cap.index.max())
            assert mix[gpu]["workloads"] == n


def test_weighted_mix_on_v100() -> None:
    heavy = "imagenet/resnet50/256/adadelta"
    light = "cifar100/shufflenetv2/1024/adadelta"
    doc = _cli_json(FILES[2], "--overhead-w", "150", "--mix", f"{heavy}=3,{light}=1")
    (row,) = doc["mix"]
    raw = _raw("v100").set_index(["workload", "power_limit"])["thr"]
    best = None
    for cap in (100, 125, 150, 175, 200, 225, 250):
        speed = (
            0.75 * raw[(heavy, cap)] / raw[(heavy, 250)]
            + 0.25 * raw[(light, cap)] / raw[(light, 250)]
        )
        value = speed * 1e6 / (cap + 150)
        if best is None or value >= best[1]:
            best = (cap, value, speed)
    assert best is not None
    assert row["cap_w"] == best[0]
    assert row["thr_per_mw"] == pytest.approx(best[1])
    assert row["speed_vs_max"] == pytest.approx(best[2])
    assert row["weight_covered"] == 1.0 and row["workloads"] == 2


def test_mix_from_file_and_partial_coverage(tmp_path: Path) -> None:
    squad, senti = "squad/bert_base_uncased/32/adamw", "sentiment140/bert_base_uncased/128/adamw"
    mix = tmp_path / "mix.txt"
    mix.write_text(f"# shares of GPUs\nworkload,weight\n{squad},2\nnot/a/real/workload=1\n")
    runner = CliRunner()
    bad = runner.invoke(main, ["caps", *FILES, "--overhead-w", "0", "--mix", str(mix)])
    assert bad.exit_code == 2 and "not/a/real/workload" in bad.output

    mix.write_text(f"{squad}=2  # on A40 and V100, not P100\n{senti}=1\n")
    result = runner.invoke(
        main, ["caps", *FILES, "--overhead-w", "0", "--mix", str(mix), "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    assert "p100: no mix workload" in result.stderr
    rows = {r["gpu"]: r for r in json.loads(result.stdout)["mix"]}
    assert set(rows) == {"a40", "v100"}
    assert rows["a40"]["workloads"] == 2 and rows["a40"]["weight_covered"] == 1.0
    assert rows["a40"]["cap_w"] in (100, 150, 200, 250, 300)  # sentiment140's caps on the A40

    one = _cli_json(*FILES, "--overhead-w", "0", "--mix", f"{squad}=1")
    caps = {r["gpu"]: r["cap_w"] for r in one["caps"] if r["workload"] == squad}
    assert {r["gpu"]: r["cap_w"] for r in one["mix"]} == caps  # a one-workload mix is that workload


def test_mix_from_a_size_toml(tmp_path: Path) -> None:
    heavy = "imagenet/resnet50/256/adadelta"
    light = "cifar100/shufflenetv2/1024/adadelta"
    toml = tmp_path / "mix.toml"
    toml.write_text(
        f'[[jobs]]\nworkload = "{heavy}"\nshare = 0.5\ncount = 2\n\n'
        f'[[jobs]]\nworkload = "{heavy}"\nshare = 0.25\n\n'
        f'[[jobs]]\nworkload = "{light}"\nshare = 0.25\n'
    )
    from_toml = _cli_json(FILES[2], "--overhead-w", "150", "--mix", str(toml))["mix"]
    inline = _cli_json(FILES[2], "--overhead-w", "150", "--mix", f"{heavy}=3,{light}=1")["mix"]
    assert from_toml == inline


def test_meta_gb200_figures() -> None:
    """docs/DOMAIN.md: 1200 -> 1000 W cost ~5% speed, gave ~9% cluster throughput; implies ~360 W overhead."""
    sweep = pd.DataFrame(
        {"gpu": "gb200", "workload": "llm", "cap_w": [1000.0, 1200.0], "throughput": [0.95, 1.0]}
    ).assign(avg_power_w=np.nan)
    zero = recommend(sweep, 0.0).per_workload.iloc[0]
    assert zero["cap_w"] == 1000 and zero["gain_pct"] == pytest.approx(14.0)
    meta = recommend(sweep, 357.0).per_workload.iloc[0]
    assert meta["gain_pct"] == pytest.approx(9.0, abs=0.1)
    # break-even: 0.95 * (1200 + o) = 1000 + o at o = 2800 W; above it the full cap wins
    assert recommend(sweep, 3000.0).per_workload.iloc[0]["cap_w"] == 1200


def test_ties_go_to_the_higher_cap() -> None:
    sweep = pd.DataFrame(
        {"gpu": "g", "workload": "w", "cap_w": [100.0, 200.0, 300.0], "throughput": [1.0, 2.0, 2.0]}
    ).assign(avg_power_w=np.nan)
    assert recommend(sweep, 0.0).per_workload.iloc[0]["cap_w"] == 200


def test_interpolate_finds_an_optimum_between_measured_caps() -> None:
    caps = np.arange(50.0, 401.0, 50.0)
    sweep = pd.DataFrame(
        {"gpu": "g", "workload": "w", "cap_w": caps, "throughput": 1 - np.exp(-caps / 100)}
    ).assign(avg_power_w=caps * 0.9)
    # (1 - e^-x) / (x + 1) peaks where e^-x (x + 2) = 1: x = 1.1462
    assert recommend(sweep, 100.0).per_workload.iloc[0]["cap_w"] == 100
    fine = recommend(sweep, 100.0, interpolate=True).per_workload.iloc[0]
    assert abs(fine["cap_w"] - 114.62) <= 2
    assert fine["avg_power_w"] == pytest.approx(0.9 * fine["cap_w"])


def test_interpolate_is_monotone_through_noise() -> None:
    sweep = pd.DataFrame(
        {
            "gpu": "g",
            "workload": "w",
            "cap_w": [100.0, 150.0, 200.0, 250.0],
            "throughput": [1.0, 1.3, 1.2, 1.4],
        }
    ).assign(avg_power_w=np.nan)
    curve = recommend(sweep, 50.0, interpolate=True, step_w=5).curves
    assert (np.diff(curve["throughput"].to_numpy()) >= -1e-12).all()


def test_loader_keeps_every_row_and_labels_gpus() -> None:
    cols: dict[str, Any] = dict(
        workload_cols=KEY,
        cap_col="power_limit",
        time_col="time_per_epoch",
        power_col="average_power",
    )
    for gpu, path in zip(GPUS, FILES, strict=True):
        df = load_sweep(path, **cols)
        raw = _raw(gpu)
        assert len(df) == len(raw) and set(df["gpu"]) == {gpu}
        assert math.isclose(df["throughput"].sum(), raw["thr"].sum())
        assert list(df.columns) == ["gpu", "workload", "cap_w", "throughput", "avg_power_w"]


def test_cli_throughput_column_csv_and_plot(tmp_path: Path) -> None:
    raw = _raw("p100")
    renamed = tmp_path / "h.csv"
    raw.rename(columns={"power_limit": "cap", "average_power": "watts"}).assign(
        job=raw["workload"]
    )[["job", "cap", "thr", "watts"]].to_csv(renamed, index=False)
    png = tmp_path / "caps.png"
    args = [
        "caps",
        str(renamed),
        "--overhead-w",
        "150",
        "--workload-cols",
        "job",
        "--cap-col",
        "cap",
    ]
    args += [
        "--throughput-col",
        "thr",
        "--power-col",
        "watts",
        "--gpu-label",
        "p100",
        "--plot",
        str(png),
    ]
    result = CliRunner().invoke(main, [*args, "--format", "csv"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(io.StringIO(result.stdout))
    expected = _expected("p100", 150.0)
    assert dict(zip(table["workload"], table["cap_w"], strict=True)) == {
        k: v[0] for k, v in expected.items()
    }
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_rejects_bad_options() -> None:
    runner = CliRunner()
    both = runner.invoke(
        main, ["caps", FILES[0], "--overhead-w", "0", "--time-col", "a", "--throughput-col", "b"]
    )
    assert both.exit_code == 2
    negative = runner.invoke(main, ["caps", FILES[0], "--overhead-w", "-5"])
    assert negative.exit_code == 2
    labels = runner.invoke(main, ["caps", *FILES, "--overhead-w", "0", "--gpu-label", "x"])
    assert labels.exit_code == 2


def test_the_table_gives_the_answer_first_and_each_workload_behind_a_flag() -> None:
    """The A40 sweep printed ~230 lines of per-workload rows before the answer (the mix
    row, one cap per GPU model); now its first line is the answer."""
    a40 = str(ZEUS / "summary_power_a40.csv")
    short = CliRunner().invoke(main, ["caps", a40, "--overhead-w", "150"])
    assert short.exit_code == 0, short.output
    lines = short.stdout.splitlines()
    mix = _cli_json(a40, "--overhead-w", "150")["mix"][0]
    assert lines[0] == (
        f"a40: best cap {mix['cap_w']:g} W of {mix['max_cap_w']:g} W, "
        f"{mix['gain_pct']:+.1f} % throughput per MW over the maximum cap (each GPU at "
        f"{mix['speed_vs_max']:.3f} of its speed) for 53 workloads"
    )
    assert lines[0].startswith("a40: best cap 200 W of 300 W, +24.1 %")
    assert len(lines) < 40 and "imagenet/resnet50" not in short.stdout
    assert "per workload: 53 workloads' own best caps: --per-workload" in short.stdout
    full = CliRunner().invoke(main, ["caps", a40, "--overhead-w", "150", "--per-workload"])
    assert full.exit_code == 0, full.output
    assert full.stdout.splitlines()[0] == lines[0]
    assert full.stdout.index("mix") < full.stdout.index("imagenet/resnet50/256/adadelta")
    assert "caps, per workload" in full.stdout
