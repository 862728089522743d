"""Bad profile input: the error names the file and the line, and nothing is returned or written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from planner.cli import main
from planner.errors import ProfileError
from planner.profiles import read_profiles

HEADER = "time_s,node,gpu,workload,power_w"


def _csv(*rows: str) -> str:
    return "\n".join([HEADER, *rows]) + "\n"


GOOD = ("0,n,0,w,300", "1,n,0,w,310", "0,n,1,w,305", "1,n,1,w,315")
LP_GOOD = "gpu,cluster=c,gpu=0,job=w,node=n power_w=300.0 1767225600000000000"

# (file name, content, 1-based line the error must name, words the message must hold)
CASES = [
    ("missing.csv", "time_s,node,gpu,workload\n0,n,0,w\n", 1, "missing column(s) power_w"),
    (
        "misnamed.csv",
        "time_s,node,gpu,workload,gpu_power\n0,n,0,w,300\n",
        1,
        "--column power_w=gpu_power",
    ),
    ("order.csv", _csv("0,n,0,w,300", "2,n,0,w,300", "1,n,0,w,300"), 4, "out of order"),
    ("duplicate.csv", _csv("0,n,0,w,300", "0,n,1,w,300", "0,n,0,w,300"), 4, "duplicate"),
    ("nan.csv", _csv("0,n,0,w,300", "1,n,0,w,NaN"), 3, "(empty or NaN)"),
    ("blank.csv", _csv("0,n,0,w,300", "1,n,0,w,"), 3, "(empty or NaN)"),
    ("inf.csv", _csv("0,n,0,w,inf"), 2, "finite"),
    ("negative.csv", _csv("0,n,0,w,300", "1,n,0,w,-3"), 3, "negative"),
    ("mw.csv", _csv("0,n,0,w,300", "0,n,1,w,250000", "1,n,1,w,260000"), 3, "mW"),
    ("kw.csv", _csv("0,n,0,w,0.3", "1,n,0,w,0.31"), 2, "kW"),
    ("empty.csv", "", 1, "empty file"),
    ("header_only.csv", HEADER + "\n", 2, "no data rows"),
    ("text_power.csv", _csv("0,n,0,w,300W"), 2, "not a number"),
    ("text_gpu.csv", _csv("0,n,GPU-ab12,w,300"), 2, "GPU index"),
    ("text_time.csv", _csv("0,n,0,w,300", "yesterday,n,0,w,300"), 3, "not a number"),
    ("iso_time.csv", _csv("2026-01-01T00:00:00Z,n,0,w,300", "soon,n,0,w,300"), 3, "ISO-8601"),
    ("ms_time.csv", _csv("1767225600000,n,0,w,300"), 2, "give seconds"),
    ("fields.csv", _csv("0,n,0,w,300", "1,n,0,w,300,extra"), 3, "6 fields"),
    ("no_node.csv", _csv("0,,0,w,300"), 2, "node is empty"),
    ("no_workload.csv", _csv("0,n,0,,300"), 2, "--workload NAME"),
    ("cap.csv", "time_s,node,gpu,workload,power_w,cap_w\n0,n,0,w,300,-700\n", 2, "negative"),
    ("bad.lp", LP_GOOD + "\ngpu,node=n power_w= 1767225601000000000\n", 2, "line protocol"),
    ("no_ts.lp", LP_GOOD + "\ngpu,cluster=c,gpu=0,job=w,node=n power_w=300.0\n", 2, "timestamp"),
    ("empty.lp", "# nothing\n", 1, "empty file"),
    ("other.lp", "tree,cluster=c,level=site,name=s power_w=1.0 1\n", 1, "only tree"),
    (
        "neg.lp",
        LP_GOOD + "\ngpu,cluster=c,gpu=0,job=w,node=n power_w=-1.0 1767225601000000000\n",
        2,
        "negative",
    ),
    ("unknown.txt", "x", None, "unknown file type"),
]


@pytest.mark.parametrize(("name", "content", "line", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_names_file_and_line(
    tmp_path: Path, name: str, content: str, line: int | None, words: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    result = None
    with pytest.raises(ProfileError) as caught:
        result = read_profiles([path])
    where = str(path) if line is None else f"{path}:{line}:"
    assert str(caught.value).startswith(where) and words in str(caught.value)
    assert caught.value.line == line
    assert result is None

    out = tmp_path / "normalised.parquet"
    run = CliRunner().invoke(main, ["profiles", str(path), "--normalised-out", str(out)])
    assert run.exit_code == 1 and where in run.output
    assert not out.exists() and "workload" not in run.output.split(where)[0]


def test_mapped_column_not_there(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(_csv(*GOOD))
    with pytest.raises(ProfileError, match=rf"^{path}:1: mapped column\(s\) not there: power_w=W"):
        read_profiles([path], columns={"power_w": "W"})


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        read_profiles([tmp_path / "nope.csv"])


def test_one_bad_file_of_several_returns_nothing(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.csv", tmp_path / "bad.csv"
    good.write_text(_csv(*GOOD))
    bad.write_text(_csv("0,n,0,w,300", "1,n,0,w,-1"))
    with pytest.raises(ProfileError, match=rf"^{bad}:3:"):
        read_profiles([good, bad])


def test_same_sample_in_two_files(tmp_path: Path) -> None:
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    first.write_text(_csv(*GOOD))
    second.write_text(_csv("5,n,0,w,300", "1,n,1,w,315"))
    with pytest.raises(ProfileError, match=rf"^{second}:3: .*also in {first}:5"):
        read_profiles([first, second])


def test_parquet_rows_are_named(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {
            "time_s": [0.0, 1.0, 2.0],
            "node": "n",
            "gpu": 0,
            "workload": "w",
            "power_w": [300.0, np.nan, 310.0],
        }
    )
    path = tmp_path / "p.parquet"
    frame.to_parquet(path)
    with pytest.raises(ProfileError, match=rf"^{path}:2: power_w .*empty or NaN"):
        read_profiles([path])
    empty = tmp_path / "e.parquet"
    frame.iloc[:0].to_parquet(empty)
    with pytest.raises(ProfileError, match=rf"^{empty}: empty file"):
        read_profiles([empty])
