"""``powerd unit`` refuses an ExecStart its own hardening hides (ProtectHome, PrivateTmp)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from powerd.cli import main


@pytest.mark.parametrize("role", ["agent", "controller", "coordinator"])
@pytest.mark.parametrize("where", ["/home/alice/venv/bin/powerd", "/tmp/x/bin/powerd"])
def test_an_install_the_unit_cannot_reach_is_refused_with_what_to_do(role: str, where: str) -> None:
    result = CliRunner().invoke(main, ["unit", role, "--exec", where])
    assert result.exit_code != 0
    assert "ProtectHome" in result.output and "/opt" in result.output, result.output
    forced = CliRunner().invoke(main, ["unit", role, "--exec", where, "--allow-hidden-path"])
    assert forced.exit_code == 0 and f"ExecStart={where} {role}" in forced.output


def test_a_script_whose_interpreter_is_under_home_is_refused(tmp_path: Path) -> None:
    """/usr/local/bin/powerd linked to a venv in /home runs that venv's python: hidden too."""
    script = tmp_path / "powerd"
    script.write_text("#!/home/alice/venv/bin/python\nimport powerd\n")
    result = CliRunner().invoke(main, ["unit", "agent", "--exec", str(script)])
    assert result.exit_code != 0 and "/home/alice/venv/bin/python" in result.output


def test_an_install_under_opt_is_printed() -> None:
    result = CliRunner().invoke(main, ["unit", "agent", "--exec", "/opt/powerd/bin/powerd"])
    assert result.exit_code == 0
    assert "ExecStart=/opt/powerd/bin/powerd agent --config /etc/powerd/agent.toml" in result.output
