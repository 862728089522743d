"""`--format table`: tables as wide as the terminal, whole headers, readable footers."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from rich.cells import cell_len

from planner.cli import main
from planner.output import PIPE_WIDTH, cell_text, emit
from tests.planner.test_planner_report import DEMO, write_inputs
from tests.support.paths import REPO

TRAIN = REPO / "tests" / "data" / "profiles" / "train.csv"
WIDTHS = (80, 120)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_inputs(tmp_path_factory.mktemp("output-inputs"))


def powerplan(columns: int, *args: str) -> str:
    result = CliRunner().invoke(main, list(args), env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.stdout  # warnings go to stderr, a line each


def too_wide(text: str, width: int) -> list[str]:
    """Lines wider than ``width``, but for one word alone on its line (a long path: it
    is not cut to fit)."""
    return [line for line in text.splitlines() if cell_len(line) > width and len(line.split()) > 1]


def header_cells(text: str) -> set[str]:
    """Every header cell of every rich table in ``text`` (header lines start with ┃)."""
    return {
        cell.strip()
        for line in text.splitlines()
        if line.startswith("┃")
        for cell in line.strip("┃").split("┃")
    }


def footer(text: str) -> str:
    """What follows the last table."""
    return text.rsplit("┘\n", 1)[1]


def wide_frame() -> pd.DataFrame:
    """14 columns, long snake_case headers, a text column with long phrases."""
    rng = np.random.default_rng(0)
    data: dict[str, object] = {"name": ["row1-k1", "row1-k2", "row2-k1"]}
    data["what_it_measures"] = [
        "energy holding the floors and ramp-downs (smoothing, burnt)",
        "ramp down, max over 1 s",
        "oscillation share 0.1-0.5 Hz, worst 60 s",
    ]
    for k in range(12):
        data[f"share_communication_{k}_w"] = rng.uniform(0, 2e5, 3)
    return pd.DataFrame(data)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_wide_table_follows_the_terminal_width_with_every_header_and_value_whole(
    width: int, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("COLUMNS", str(width))
    df = wide_frame()
    out = io.StringIO()
    emit({"nodes": df}, "table", out=out)
    text = out.getvalue()
    assert not too_wide(text, width)
    assert "…" not in text
    assert set(df.columns) <= header_cells(text)
    words = text.split()
    for column in df.columns:
        for value in df[column]:
            for word in cell_text(value).split():  # text wraps between words only
                assert word in words, (column, word)
    assert "nodes: part 1 of" in text  # 14 columns do not fit 120: blocks of whole columns
    # every block repeats the column that names the row
    assert text.count("┃ name ") == text.count("nodes: part")


@pytest.mark.parametrize("width", WIDTHS)
def test_profiles_table_fits_the_terminal_and_keeps_whole_headers(width: int):
    text = powerplan(width, "profiles", str(TRAIN))
    assert not too_wide(text, width)
    doc = json.loads(powerplan(width, "profiles", str(TRAIN), "--format", "json"))
    columns = set(doc["profiles"][0])
    assert {"share_communication", "share_compute"} <= columns
    assert columns <= header_cells(text)
    assert "…" not in text


@pytest.mark.parametrize("width", WIDTHS)
def test_size_and_whatif_fit_the_terminal_and_their_footers_are_text(
    width: int, inputs: tuple[Path, Path], tmp_path: Path
):
    profiles, mix = inputs
    sized = tmp_path / "sized.toml"
    size = powerplan(
        width,
        *("size", str(DEMO), str(profiles), "--mix", str(mix), "-o", str(sized)),
        *("--samples", "2000", "--allow-over-limit"),
    )
    whatif = powerplan(
        width,
        *("whatif", str(DEMO), str(profiles), "--mix", str(mix)),
        *("--duration-s", "30", "--smoothing"),
    )
    for text in (size, whatif):
        assert not too_wide(text, width)
        assert "…" not in text
        lines = footer(text)
        assert "{'" not in lines and "':" not in lines and "['" not in lines
    assert "\nfailsafe_cap_w: H100 564\n" in footer(size)
    assert "\nsynchronised: no\n" in footer(whatif)


def test_cell_text_writes_dicts_and_lists_as_words():
    assert cell_text({"GB200": 1046.0}) == "GB200 1,046"
    assert cell_text({"GB200": 1046.0, "H100": 564.0}) == "GB200 1,046, H100 564"
    assert cell_text(["a.toml", "b.toml"]) == "a.toml, b.toml"
    assert cell_text({"margin": 0.9, "by_phase": {"compute": 0.5, "checkpoint": 0.25}}) == (
        "margin 0.9, by_phase (compute 0.5, checkpoint 0.25)"
    )
    assert cell_text(True) == "yes" and cell_text(np.bool_(False)) == "no"
    assert cell_text({}) == "-"


def test_a_long_footer_value_wraps_between_words_under_its_key(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COLUMNS", "60")
    note = "the rows' budgets sum to 192.5 kW, the leaves may hold 204.2 kW together: fits"
    out = io.StringIO()
    emit({"t": pd.DataFrame({"a": [1]})}, "table", extra={"tree_of_controllers": note}, out=out)
    lines = footer(out.getvalue()).splitlines()
    assert lines[0].startswith("tree_of_controllers: the rows'")
    assert all(cell_len(line) <= 60 for line in lines)
    assert all(line.startswith("    ") for line in lines[1:]) and len(lines) > 1
    assert " ".join(line.strip() for line in lines) == f"tree_of_controllers: {note}"


def test_piped_output_without_columns_is_a_fixed_width():
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    code = "from planner.output import terminal_width; print(terminal_width())"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        check=True,
        text=True,
        cwd=REPO,
    )
    assert int(done.stdout) == PIPE_WIDTH


def test_numbers_in_tables_are_never_in_scientific_notation():
    """whatif printed a lost share as 6.94e-05 and .3g writes 999.7 as 1e+03."""
    assert cell_text(6.94e-05) == "0.0000694" and cell_text(2.2e-05) == "0.000022"
    assert cell_text(-0.000123) == "-0.000123"
    assert cell_text(999.7) == "1,000" and cell_text(999.4) == "999"
    assert cell_text(1e-9) == "<0.000001" and cell_text(-1e-9) == ">-0.000001"
    assert cell_text(0.0) == "0" and cell_text(-0.0) == "0"
    # everything else as before: three significant digits, thousands from 1,000
    for value in (0.0253, 0.699, 0.4, 1.0, 48.442, 120.5, 1234.5, 47_656_848.0):
        old = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
        assert cell_text(value) == old
