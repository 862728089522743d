"""A controller process given one key in two roles refuses to start (issue 34, item 6).

Its own `.pub` as `trust.operator_keys` would let the controller's key (any controller
holding it) sign operator site limits; its own `.pub` as a leaf's coordinator key would
let it sign its own grants. Against a real Mosquitto: the process exits 1 with one
line on stderr naming both roles and both files, and never sends a heartbeat.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from powerd.signing import generate_key_files, load_trusted_key
from tests.support.controller_harness import TOPICS, budgets_toml, controller_argv, probe

# A refusal comes before any connection: seconds (Python's start) on a loaded 2-core
# machine. A controller that starts instead leads within this and runs on.
EXIT_WITHIN_S = 30.0


def trust_args(case: str, config: Path, pub: Path) -> list[str]:
    """The controller's extra arguments for ``case``; its config file written."""
    if case == "operator":
        config.write_text(f'[trust]\noperator_keys = ["{pub.name}"]\n')
        return []
    config.write_text("")
    return ["--scope", "r1", "--coordinator-key", str(pub)]


@pytest.mark.parametrize(
    ("case", "entry", "role"),
    [
        ("operator", "trust.operator_keys", "operator"),
        ("leaf", "trust.coordinator_keys", "coordinator"),
    ],
)
async def test_a_controller_given_its_own_pub_in_another_role_refuses_to_start(
    mosquitto, tmp_path: Path, case: str, entry: str, role: str
) -> None:
    key, pub = generate_key_files(tmp_path / "controller")
    config, budgets = tmp_path / "controller.toml", tmp_path / "budgets.toml"
    budgets.write_text(budgets_toml())
    args = [
        "--config", str(config), "--budgets", str(budgets), "--broker", mosquitto.url,
        "--cluster", TOPICS.cluster, "--name", "ctl-keys", "--cycle-s", "0.2",
        "--signing-key", str(key), *trust_args(case, config, pub),
    ]  # fmt: skip
    async with probe(mosquitto) as p:
        proc = subprocess.Popen(
            controller_argv(args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            _, stderr = await asyncio.to_thread(proc.communicate, None, EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            beats = sum("heartbeat" in m.topic for m in p.messages)
            pytest.fail(
                f"still running {EXIT_WITHIN_S:.0f} s after it started with its own key in "
                f"{entry}; {beats} heartbeats sent"
            )
        heartbeats = [m.topic for m in p.messages if m.topic.endswith("/heartbeat")]
    assert proc.returncode == 1, stderr
    key_id = load_trusted_key(pub).key_id
    assert stderr.strip() == (
        f"Error: {config}: one key (id {key_id}) in two roles: trust.signing_key ({key}, "
        f"the controller role) and {entry} ({pub}, the {role} role); whoever holds its "
        "private key could sign as both: give each role its own pair (`powerd keys generate`)"
    )
    assert heartbeats == []  # it never led, not for a moment
