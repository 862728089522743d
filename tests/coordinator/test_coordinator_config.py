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


@pytest.mark.parametrize(
    ("trust", "first", "second"),
    [
        # our own key as an operator's: it could sign site limits
        ({"operator_keys": "coordinator.pub"}, "trust.signing_key", "trust.operator_keys"),
        # our own key as a leaf's: it could sign summaries
        ({"controller_keys": "coordinator.pub"}, "trust.signing_key", "trust.controller_keys"),
        # a leaf's key as a coordinator's: a leaf could lead coordinators
        (
            {"coordinator_keys": "leaf.pub", "controller_keys": "leaf.pub"},
            "trust.coordinator_keys",
            "trust.controller_keys",
        ),
        (
            {"controller_keys": "leaf.pub", "operator_keys": "leaf.pub"},
            "trust.controller_keys",
            "trust.operator_keys",
        ),
    ],
)
def test_one_key_in_two_roles_stops_the_coordinator_naming_both(
    tmp_path: Path, trust: dict[str, str], first: str, second: str
):
    key, _ = generate_key_files(tmp_path / "coordinator")
    generate_key_files(tmp_path / "leaf")
    lines = [f'signing_key = "{key.name}"']
    lines += [f'{name} = ["{file}"]' for name, file in trust.items()]
    config = load_coordinator_config(write(tmp_path, "[trust]\n" + "\n".join(lines) + "\n"))
    with pytest.raises(ConfigError) as refused:
        config.heartbeat_verifier(config.signer())  # what the service builds first
    message = str(refused.value)
    assert "two roles" in message and f"{first} (" in message and f"{second} (" in message
    assert str(tmp_path / list(trust.values())[-1]) in message


def test_cli_refuses_its_own_key_as_a_leaf_key(tmp_path: Path):
    key, own_pub = generate_key_files(tmp_path / "coordinator")
    budgets = tmp_path / "site.toml"
    budgets.write_text(three_rows())
    done = run_cli("--budgets", str(budgets), "--signing-key", str(key), "--trust", str(own_pub))
    assert done.returncode == 1
    assert "two roles" in done.stderr and f"trust.controller_keys ({own_pub}" in done.stderr
