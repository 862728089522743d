"""``powerplan clocks`` on the Perseus frequency sweeps, checked against an optimum computed here.

The expected clocks are computed in this file with plain pandas from the raw CSVs (not
through planner.clocks or powerd.gpu.clock_table): per frequency, a pipeline step takes the
time of the slowest stage (forward + backward) and the energy of every stage; the answer is
the frequency with the least energy among those at most the allowed slowdown slower than
the highest frequency, ties to the faster one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner, Result

from planner.cli import main
from powerd.gpu.clock_table import load_clock_table
from tests.support.paths import REPO, TEST_DATA

PERSEUS = TEST_DATA / "perseus-frequency"
FILES = {
    "gpt3-175b": PERSEUS / "gpt3-175b+a100_sxm_bf16.csv",
    "bloom": PERSEUS / "bloom+a100_sxm_bf16.csv",
}
SLOWDOWNS = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5)
SHIPPED = REPO / "powerd" / "data" / "clocks"


def brute_force(path: Path, max_slowdown: float) -> tuple[int, float, float]:
    """(frequency, slowdown, energy saved) of the best frequency, from the raw rows."""
    raw = pd.read_csv(path)
    per_stage = raw.groupby(["frequency", "stage"])[["time", "energy"]].sum()
    step = per_stage.groupby("frequency").agg(time=("time", "max"), energy=("energy", "sum"))
    top = step.loc[step.index.max()]
    allowed = step[step["time"] <= (1 + max_slowdown) * top["time"] + 1e-15]
    least = allowed["energy"].min()
    frequency = int(allowed.index[allowed["energy"] == least].max())
    return (
        frequency,
        step.loc[frequency, "time"] / top["time"] - 1,
        1 - least / top["energy"],
    )


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["clocks", *args])


def cli_json(*args: str) -> dict:
    result = run(*args, "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("workload", list(FILES))
def test_the_recommendation_is_the_brute_force_optimum(workload: str) -> None:
    flags = [a for s in SLOWDOWNS for a in ("--max-slowdown", str(s))]
    rows = cli_json(str(FILES[workload]), *flags)["clocks"]
    assert [r["max_slowdown_pct"] for r in rows] == pytest.approx([100 * s for s in SLOWDOWNS])
    for row, max_slowdown in zip(rows, SLOWDOWNS, strict=True):
        frequency, slowdown, saved = brute_force(FILES[workload], max_slowdown)
        assert (row["workload"], row["gpu"], row["measured"]) == (workload, "A100", True)
        assert row["clock_mhz"] == frequency, max_slowdown
        assert row["slowdown_pct"] == pytest.approx(100 * slowdown)
        assert row["energy_saved_pct"] == pytest.approx(100 * saved)
        assert row["slowdown_pct"] <= 100 * max_slowdown + 1e-9


def test_the_numbers_the_docs_quote() -> None:
    """README and docs/EVALUATION.md quote these (A100, 1 % and 5 %)."""
    rows = cli_json(*map(str, FILES.values()))["clocks"]
    got = {
        (r["workload"], r["max_slowdown_pct"]): (r["clock_mhz"], r["energy_saved_pct"])
        for r in rows
    }
    assert got[("gpt3-175b", 1.0)] == (1365, pytest.approx(2.02, abs=0.01))
    assert got[("gpt3-175b", 5.0)] == (1290, pytest.approx(9.70, abs=0.01))
    assert got[("bloom", 1.0)] == (1350, pytest.approx(5.06, abs=0.01))
    assert got[("bloom", 5.0)] == (1275, pytest.approx(14.61, abs=0.01))


def test_the_shipped_tables_are_what_the_command_writes(tmp_path: Path) -> None:
    out = tmp_path / "clocks"
    result = run(
        *map(str, FILES.values()), "--scale-to", "H100", "--scale-to", "GB200", "-o", str(out)
    )
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(p.name for p in SHIPPED.glob("*.csv"))
    for name in written:
        assert (out / name).read_text() == (SHIPPED / name).read_text(), name


def test_scaled_rows_keep_the_slowdown_and_saving_at_the_models_clock() -> None:
    rows = cli_json(str(FILES["gpt3-175b"]), "--scale-to", "h100", "--max-slowdown", "0.05")[
        "clocks"
    ]
    a100, h100 = rows
    assert (h100["gpu"], h100["measured"]) == ("H100", False)
    assert h100["clock_mhz"] == round(a100["clock_mhz"] * 1980 / 1410) == 1811
    assert h100["energy_saved_pct"] == a100["energy_saved_pct"]


def test_one_table_goes_to_a_csv_file(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    result = run(str(FILES["bloom"]), "-o", str(out))
    assert result.exit_code == 0, result.output
    table = load_clock_table(out)
    assert table.model == "A100" and table.clock_mhz[0] == 855 and table.clock_mhz[-1] == 1410
    assert "bloom+a100_sxm_bf16.csv" in table.source
    two = run(*map(str, FILES.values()), "-o", str(tmp_path / "two.csv"))
    assert two.exit_code != 0 and "2 tables to write; give a directory" in two.output


def test_csv_output_is_the_recommendations() -> None:
    result = run(str(FILES["gpt3-175b"]), "--format", "csv")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("workload,gpu,measured,max_slowdown_pct,clock_mhz")
    assert len(lines) == 3  # 1 % and 5 % by default


GOOD_HEAD = "stage,instruction,frequency,time,energy\n"
GOOD_ROWS = "0,forward,1410,0.05,24\n0,backward,1410,0.1,46\n0,forward,1200,0.06,20\n0,backward,1200,0.12,38\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stage,instruction,freq,time,energy\n", "x+a100.csv:1: missing column(s) frequency"),
        (GOOD_HEAD + GOOD_ROWS.replace("0,forward,1200", "0,fwd,1200"), ":4: instruction 'fwd'"),
        (GOOD_HEAD + GOOD_ROWS.replace("0.06", "fast"), ":4: not a number: frequency '1200'"),
        (GOOD_HEAD + GOOD_ROWS.replace("0.06,20", "0.06,-20"), ":4: time 0.06 s and energy -20 J"),
        (GOOD_HEAD + GOOD_ROWS.replace("0,forward,1200", "0,forward,1.2"), "in GHz? write 1200"),
        (GOOD_HEAD + GOOD_ROWS.replace("0,forward,1200", "0,forward,1200.5"), "not a whole MHz"),
        (
            GOOD_HEAD + GOOD_ROWS + "0,forward,1200,0.06,20\n",
            ":6: stage 0 forward at 1200 MHz is given twice",
        ),
        (
            GOOD_HEAD + GOOD_ROWS + "1,forward,1200,0.06,20\n",
            "missing: stage 1 forward at 1410 MHz",
        ),
        (GOOD_HEAD + GOOD_ROWS + "0,forward\n", ":6: 2 values for 5 columns"),
        (GOOD_HEAD + "0,forward,1410,0.05,24\n0,backward,1410,0.1,46\n", "one frequency only"),
        (GOOD_HEAD, "x+a100.csv: no rows"),
    ],
)
def test_bad_profiles_are_refused_with_file_and_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "x+a100.csv"
    path.write_text(text)
    result = run(str(path))
    assert result.exit_code == 1, result.output
    assert "Error: " in result.output and message in result.output


def test_a_good_small_profile_is_read(tmp_path: Path) -> None:
    path = tmp_path / "x+a100.csv"
    path.write_text(GOOD_HEAD + GOOD_ROWS)
    rows = cli_json(str(path), "--max-slowdown", "0.25")["clocks"]
    assert rows[0]["clock_mhz"] == 1200 and rows[0]["slowdown_pct"] == pytest.approx(20)


def test_the_gpu_comes_from_the_file_name_or_gpu(tmp_path: Path) -> None:
    path = tmp_path / "profile.csv"
    path.write_text(GOOD_HEAD + GOOD_ROWS)
    unnamed = run(str(path))
    assert unnamed.exit_code == 2 and "names no GPU model; give --gpu" in unnamed.output
    rows = cli_json(str(path), "--gpu", "h100")["clocks"]
    assert rows[0]["gpu"] == "H100"
    unknown = run(str(path), "--gpu", "Z80")
    assert unknown.exit_code == 2 and "unknown GPU model 'Z80'" in unknown.output


def test_a_percentage_as_max_slowdown_gets_the_fraction() -> None:
    result = run(str(FILES["bloom"]), "--max-slowdown", "5")
    assert result.exit_code == 2 and "write 0.05" in result.output
