"""The shipped unit file passes `systemd-analyze verify` with ExecStart pointing at this install."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from powerd.systemd import render_agent_unit, render_controller_unit, render_coordinator_unit


def test_agent_unit_verifies(tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze missing: `make test` installs the systemd package")
    unit = tmp_path / "powerd-agent.service"
    unit.write_text(render_agent_unit(sys.executable, "/etc/powerd/agent.toml"))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    text = unit.read_text()
    for line in (
        "Type=notify",
        "WatchdogSec=",
        "Restart=on-failure",
        "NoNewPrivileges=yes",
        "DeviceAllow=char-nvidia-frontend rw",
        "ProtectSystem=strict",
    ):
        assert line in text
    assert "\nPrivateDevices=" not in text  # it would hide /dev/nvidia*: NVML writes need them


def test_broken_unit_fails_verification(tmp_path: Path):
    """The check can fail: a unit whose ExecStart does not exist is refused."""
    unit = tmp_path / "powerd-agent.service"
    unit.write_text(render_agent_unit("/nonexistent/powerd", "/etc/powerd/agent.toml"))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True)
    assert result.returncode != 0


def test_controller_unit_verifies(tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze missing: `make test` installs the systemd package")
    unit = tmp_path / "powerd-controller.service"
    unit.write_text(
        render_controller_unit(sys.executable, "/etc/x/c.toml", "/etc/x/b.toml", "/etc/x/k.key")
    )
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    text = unit.read_text()
    assert (
        f"ExecStart={sys.executable} controller --config /etc/x/c.toml --budgets /etc/x/b.toml"
        " --signing-key ${CREDENTIALS_DIRECTORY}/signing-key" in text
    )
    # the root-only key reaches the dynamic user as a credential of this service alone
    assert "LoadCredential=signing-key:/etc/x/k.key" in text
    assert "ExecReload=/bin/kill -HUP $MAINPID" in text  # `systemctl reload`: SIGHUP
    for line in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "DynamicUser=yes"):
        assert line in text


def test_controller_unit_is_printed_by_the_cli():
    from click.testing import CliRunner

    from powerd.cli import main

    result = CliRunner().invoke(main, ["unit", "controller", "--exec", "/opt/p/bin/powerd"])
    assert result.exit_code == 0, result.output
    assert (
        "ExecStart=/opt/p/bin/powerd controller --config /etc/powerd/controller.toml"
        in result.output
    )


def verify(unit: Path) -> str:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze missing: `make test` installs the systemd package")
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return unit.read_text()


def test_leaf_controller_template_verifies_as_an_instance(tmp_path: Path):
    unit = tmp_path / "powerd-controller@row01.service"  # what `enable ...@row01` instantiates
    unit.write_text(
        render_controller_unit(
            sys.executable, "/etc/x/c.toml", "/etc/x/b.toml", "/etc/x/k.key", scoped=True
        )
    )
    text = verify(unit)
    assert (
        f"ExecStart={sys.executable} controller --config /etc/x/c.toml --budgets /etc/x/b.toml"
        " --scope %I --signing-key ${CREDENTIALS_DIRECTORY}/signing-key" in text
    )
    assert "LoadCredential=signing-key:/etc/x/k.key" in text


def test_coordinator_unit_verifies_and_is_printed_by_the_cli(tmp_path: Path):
    from click.testing import CliRunner

    from powerd.cli import main

    unit = tmp_path / "powerd-coordinator.service"
    unit.write_text(
        render_coordinator_unit(sys.executable, "/etc/x/o.toml", "/etc/x/b.toml", "/etc/x/o.key")
    )
    text = verify(unit)
    assert f"ExecStart={sys.executable} coordinator --config /etc/x/o.toml" in text
    assert "LoadCredential=signing-key:/etc/x/o.key" in text
    for line in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "DynamicUser=yes"):
        assert line in text
    result = CliRunner().invoke(main, ["unit", "coordinator", "--exec", "/opt/p/bin/powerd"])
    assert result.exit_code == 0, result.output
    assert "ExecStart=/opt/p/bin/powerd coordinator --config /etc/powerd/coordinator.toml" in (
        result.output
    )
    scoped = CliRunner().invoke(main, ["unit", "controller", "--scoped", "--exec", "/x/powerd"])
    assert scoped.exit_code == 0 and "--scope %I" in scoped.output
