"""The coordinator's configuration and command line: the shipped example, and clear refusals."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from powerd.configfile import ConfigError
from powerd.coordinator.config import CoordinatorConfig, load_coordinator_config
from powerd.signing import generate_key_files
from powerd.topology import parse_budgets
from powerd.topology.scope import Scope
from tests.support.tree_sites import three_rows


def example_text() -> str:
    return resources.files("powerd.data").joinpath("coordinator.example.toml").read_text()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "coordinator.toml"
    path.write_text(text)
    return path


def test_shipped_example_loads_with_the_defaults_it_shows(tmp_path: Path):
    generate_key_files(tmp_path / "coordinator")
    generate_key_files(tmp_path / "controller")
    config = load_coordinator_config(write(tmp_path, example_text()))
    assert config.signing_key == str(tmp_path / "coordinator.key")
    assert config.controller_keys == (str(tmp_path / "controller.pub"),)
    defaults = CoordinatorConfig()
    for key, value in tomllib.loads(example_text())["coordinator"].items():
        assert getattr(defaults, key) == value, f"coordinator.{key}"
    assert config.broker.tls and config.broker.username == "powerd-coordinator"


def test_default_scopes_are_one_leaf_per_row():
    scopes = CoordinatorConfig().parsed_scopes(parse_budgets(three_rows()))
    assert scopes == [Scope("r1", ("r1",)), Scope("r2", ("r2",)), Scope("r3", ("r3",))]
    given = CoordinatorConfig(scopes=("r1", "rest:r2,r3")).parsed_scopes(
        parse_budgets(three_rows())
    )
    assert given == [Scope("r1", ("r1",)), Scope("rest", ("r2", "r3"))]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[coordinator]\nperiod_s = 5\ngrant_ttl_s = 8\n", "at least two periods"),
        (
            "[coordinator]\nperiod_s = 5\ngrant_ttl_s = 12\ntakeover_after_s = 8\n",
            "must be under grant_ttl_s",
        ),
        ('[coordinator]\nscopes = ["a:"]\n', "names no rows"),
        ('[coordinator]\nscopes = "row1"\n', "must be a list"),
        ("[coordinator]\nperod_s = 5\n", "perod_s"),
        ('[coordinator]\nname = "a b"\n', "coordinator name"),
    ],
)
def test_bad_settings_are_refused_with_the_key(tmp_path: Path, text: str, message: str):
    with pytest.raises(ConfigError, match=message):
        load_coordinator_config(write(tmp_path, text))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "powerd", "coordinator", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def keys(tmp_path: Path) -> list[str]:
    key, _ = generate_key_files(tmp_path / "coordinator")
    _, leaf_pub = generate_key_files(tmp_path / "leaf")
    return ["--signing-key", str(key), "--trust", str(leaf_pub)]


def test_cli_refuses_rows_whose_file_budgets_exceed_the_site(tmp_path: Path):
    result = run_cli("--budgets", "powerd/data/budgets/demo.toml", *keys(tmp_path))
    assert result.returncode != 0
    assert "the rows' budget_w sum to 200.0 kW, above the 180.0 kW" in result.stderr


def test_cli_refuses_scopes_that_miss_a_row_and_missing_keys(tmp_path: Path):
    budgets = tmp_path / "site.toml"
    budgets.write_text(three_rows())
    given = keys(tmp_path)
    missed = run_cli("--budgets", str(budgets), *given, "--scope", "r1")
    assert missed.returncode != 0 and "rows in no scope: r2, r3" in missed.stderr
    keyless = run_cli("--budgets", str(budgets))
    assert keyless.returncode != 0 and "signing_key" in keyless.stderr
    trustless = run_cli("--budgets", str(budgets), *given[:2])  # no leaf key
    assert trustless.returncode != 0
    assert "needs the leaf controllers' public keys" in trustless.stderr
