"""The planning walk-through (docs/PLANNER.md) runs exactly as written, and the docs' mixes name
workloads the shipped profiles have (issue: the documented flow could not be pasted)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planner.mix import parse_mix
from tests.support.paths import REPO

MARKER = (
    "<!-- run as written, from the repository's root, by "
    + Path(__file__).relative_to(REPO).as_posix()
)
SHIPPED_PROFILES = ("tests/data/profiles/telemetry.lp", "tests/data/profiles/train.csv")


def documented_block() -> str:
    text = (REPO / "docs" / "PLANNER.md").read_text(encoding="utf-8")
    at = text.index(MARKER)  # the doc says which block this test runs
    match = re.compile(r"```sh\n(.*?)```", re.S).search(text, at)
    assert match is not None and text[at : match.start()].count("\n") == 1, "block after marker"
    return match.group(1)


def workloads_of_shipped_profiles() -> set[str]:
    from planner.profiles import read_profiles

    frame = read_profiles([REPO / p for p in SHIPPED_PROFILES], workload="untagged")
    return set(frame["workload"].unique())


def test_the_documented_planning_block_runs_as_written(tmp_path: Path):
    block = documented_block()
    assert "powerplan size" in block and "powerplan report" in block
    for top in {line.split("/")[0] for line in re.findall(r"(?<= )[\w.-]+/[\w./-]+", block)}:
        if (REPO / top).exists() and not (tmp_path / top).exists():
            (tmp_path / top).symlink_to(REPO / top)  # the block's paths, read-only from here
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("COLUMNS", None)
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "throughput lost, by cause" in run.stdout
    assert (tmp_path / "sized.toml").is_file()
    assert (tmp_path / "review" / "report.md").is_file()

    from powerd.topology import load_budgets

    sized = load_budgets(tmp_path / "sized.toml")
    assert sized.n_gpus == load_budgets(REPO / "powerd/data/budgets/demo.toml").n_gpus


def toml_mixes(path: Path) -> list[str]:
    blocks = re.findall(r"```toml\n(.*?)```", path.read_text(encoding="utf-8"), re.S)
    return [b for b in blocks if "[[jobs]]" in b]


@pytest.mark.parametrize("doc", ["docs/PLANNER.md", "examples/planning/mix.toml"])
def test_documented_mixes_name_workloads_the_shipped_profiles_have(doc: str):
    path = REPO / doc
    mixes = [path.read_text(encoding="utf-8")] if path.suffix == ".toml" else toml_mixes(path)
    assert mixes, f"no mix in {doc}"
    have = workloads_of_shipped_profiles()
    for text in mixes:
        named = {job.workload for job in parse_mix(text).jobs}
        assert named <= have, f"{doc}: {sorted(named - have)} not in {sorted(have)}"
