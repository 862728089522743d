"""Bad cap sweeps: the error names the file and the 1-based line, and nothing is returned or written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from planner.cli import main
from planner.errors import ProfileError
from planner.sweep import load_sweep

HEADER = "dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power"
GOOD = [
    "cifar100,shufflenetv2,1024,adadelta,100,27.13,106.9",  # line 2
    "cifar100,shufflenetv2,1024,adadelta,150,11.09,141.6",  # line 3
    "imagenet,resnet50,256,adadelta,100,9000.5,99.1",  # line 4
    "imagenet,resnet50,256,adadelta,150,6000.2,147.3",  # line 5
]
COLS: dict[str, Any] = dict(
    workload_cols=["dataset", "network", "batch_size", "optimizer"],
    cap_col="power_limit",
    time_col="time_per_epoch",
    power_col="average_power",
)


def _write(tmp_path: Path, lines: list[str], name: str = "sweep_x.csv") -> Path:
    path = tmp_path / name
    path.write_text("".join(f"{ln}\n" for ln in lines))
    return path


def _replace(line: int, field: str, value: str) -> list[str]:
    """GOOD with one field of one (1-based file) line replaced."""
    rows = [HEADER, *GOOD]
    cells = rows[line - 1].split(",")
    cells[HEADER.split(",").index(field)] = value
    rows[line - 1] = ",".join(cells)
    return rows


CASES: dict[str, tuple[list[str], int, str]] = {
    "missing column": (
        [HEADER.replace(",average_power", ""), *(r.rsplit(",", 1)[0] for r in GOOD)],
        1,
        "missing column(s) average_power",
    ),
    "misnamed column": ([HEADER.replace("power_limit", "powerlimit"), *GOOD], 1, "power_limit"),
    "NaN power": (_replace(3, "average_power", "NaN"), 3, "NaN"),
    "empty power": (_replace(4, "average_power", ""), 4, "empty"),
    "negative power": (_replace(5, "average_power", "-3.5"), 5, "negative"),
    "zero power": (_replace(2, "average_power", "0"), 2, "above 0 W"),
    "power in mW": (_replace(3, "average_power", "141609.9"), 3, "mW"),
    "power in kW": (_replace(4, "average_power", "0.0991"), 4, "kW"),
    "cap in mW": (_replace(2, "power_limit", "100000"), 2, "mW"),
    "cap in kW": (_replace(5, "power_limit", "1.2"), 5, "kW"),
    "text time": (_replace(5, "time_per_epoch", "fast"), 5, "not a number"),
    "zero time": (_replace(2, "time_per_epoch", "0"), 2, "above 0"),
    "duplicate workload and cap": (
        [HEADER, *GOOD, "cifar100,shufflenetv2,1024,adadelta,150,11.2,140.0"],
        6,
        "first on line 3",
    ),
    "single cap": ([HEADER, *GOOD, "squad,bert,8,adamw,125,50.0,120.0"], 6, "single cap"),
    "short row": ([HEADER, *GOOD[:2], "cifar100,shufflenetv2,1024", *GOOD[2:]], 4, "fields"),
    "empty file": ([], 1, "empty file"),
    "header only": ([HEADER], 2, "no data rows"),
    "empty workload": (_replace(2, "network", ""), 2, "network is empty"),
}


def test_the_good_sweep_loads(tmp_path: Path) -> None:
    df = load_sweep(_write(tmp_path, [HEADER, *GOOD]), **COLS)
    assert list(df["workload"].unique()) == [
        "cifar100/shufflenetv2/1024/adadelta",
        "imagenet/resnet50/256/adadelta",
    ]
    assert set(df["gpu"]) == {"x"}
    assert df["throughput"].iloc[0] == pytest.approx(1 / 27.13)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_bad_sweep_names_file_and_line(tmp_path: Path, kind: str) -> None:
    lines, line, words = CASES[kind]
    path = _write(tmp_path, lines)
    with pytest.raises(ProfileError) as caught:
        load_sweep(path, **COLS)
    assert str(caught.value).startswith(f"{path}:{line}: "), str(caught.value)
    assert words in str(caught.value)
    assert caught.value.line == line


@pytest.mark.parametrize("kind", ["NaN power", "duplicate workload and cap", "single cap"])
def test_cli_reports_and_writes_nothing(tmp_path: Path, kind: str) -> None:
    lines, line, words = CASES[kind]
    good = _write(tmp_path, [HEADER, *GOOD], "sweep_good.csv")
    bad = _write(tmp_path, lines, "sweep_bad.csv")
    png = tmp_path / "caps.png"
    result = CliRunner().invoke(
        main, ["caps", str(good), str(bad), "--overhead-w", "150", "--plot", str(png)]
    )
    assert result.exit_code == 1
    assert f"{bad}:{line}: " in result.output and words in result.output
    assert not png.exists()
    assert result.stdout == ""  # no table: the error is on stderr alone


def test_bom_and_blank_lines_keep_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "sweep_bom.csv"
    path.write_text(
        "\ufeff" + HEADER + "\n\n" + GOOD[0] + "\n" + GOOD[1].replace("141.6", "nan") + "\n"
    )
    with pytest.raises(ProfileError, match=rf"{path.name}:4: "):
        load_sweep(path, **COLS)
