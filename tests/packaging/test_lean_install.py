"""A GPU node installs the agent, not the planner: with every extra made unimportable, the
agent, the controller (file recorder), `powerd gpus` and `powerd fleet` run, and the commands
that need an extra say which one instead of a traceback.

Every Python started here gets a ``sitecustomize`` that refuses to import the extras'
modules (pandas, scipy, pyarrow, matplotlib, amqtt, rich, influxdb_client): what a
``pip install powerd`` without extras has. ``make test`` also installs the core alone
at its minimum pins in a fresh venv (tests/support/lean_install.py).
"""

from __future__ import annotations

import os
import pkgutil
import signal
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

import powerd
from powerd.extras import EXTRAS
from tests.support.brokers import MqttProbe
from tests.support.keys import key_files

BLOCKED = sorted({module for modules in EXTRAS.values() for module in modules})
BLOCKER = f"""
import importlib.abc, sys
class _NoExtras(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{{name}} is not installed (lean install test)")
        return None
sys.meta_path.insert(0, _NoExtras())
"""
TINY = Path(str(resources.files("powerd.data").joinpath("budgets/tiny.toml")))
# modules a node, a controller host or a scale test imports; the rest are the extras' users
CORE_PACKAGES = ("agent", "controller", "fleet", "gpu")
NOT_CORE = {
    "powerd.gpu.calibrate",
    "powerd.mqtt.embedded_broker",
}  # planner data stack, demo broker


@pytest.fixture
def lean_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "no-extras"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def run(args: list[str], env: dict[str, str], timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout_s
    )


def test_the_blocker_blocks(lean_env) -> None:
    result = run(["-c", "import pandas"], lean_env)
    assert result.returncode != 0 and "lean install test" in result.stderr


def test_core_modules_import_no_extra(lean_env) -> None:
    names = ["powerd.protocol", "powerd.cli", "powerd.mqtt.link", "powerd.mqtt.stream"]
    for package in CORE_PACKAGES:
        path = Path(powerd.__file__).parent / package
        names += [f"powerd.{package}.{m.name}" for m in pkgutil.iter_modules([str(path)])]
    names = [n for n in names if n not in NOT_CORE]
    code = f"import importlib\nfor n in {names!r}: importlib.import_module(n)"
    result = run(["-c", code], lean_env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(names) > 25


async def test_agent_controller_gpus_and_fleet_run_without_extras(lean_env, mosquitto, tmp_path):
    gpus = run(["-m", "powerd", "gpus", "--simulate", "2xH100"], lean_env)
    assert gpus.returncode == 0, gpus.stderr
    assert "H100" in gpus.stdout and gpus.stdout.count("simulated") == 2
    key_path, pub_path = key_files(tmp_path)

    async with MqttProbe(mosquitto.port, ["powerd/v1/lean/#"]) as probe:
        log = (tmp_path / "controller.log").open("wb")
        controller = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "powerd",
                "controller",
                "--budgets",
                str(TINY),
                "--broker",
                mosquitto.url,
                "--cluster",
                "lean",
                "--record",
                str(tmp_path / "t.lp"),
                "--signing-key",
                str(key_path),
            ],
            env=lean_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "powerd",
                "agent",
                "--simulate",
                "4xH100",
                "--broker",
                mosquitto.url,
                "--cluster",
                "lean",
                "--node",
                "r1-k1-n1",
                "--period-s",
                "0.2",
                "--trust",
                str(pub_path),
            ],
            env=lean_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            await probe.expect("powerd/v1/lean/controller/heartbeat", timeout_s=30)
            await probe.expect("powerd/v1/lean/nodes/r1-k1-n1/telemetry", timeout_s=30)
            await probe.expect("powerd/v1/lean/nodes/r1-k1-n1/ack", timeout_s=30)  # commanded
            fleet = run(
                [
                    "-m",
                    "powerd",
                    "fleet",
                    "--budgets",
                    str(TINY),
                    "--broker",
                    mosquitto.url,
                    "--cluster",
                    "lean-fleet",
                    "--duration-s",
                    "2",
                    "--period-s",
                    "0.5",
                    "--trust",
                    str(pub_path),
                ],
                lean_env,
            )
            assert fleet.returncode == 0, fleet.stderr[-2000:]
            assert '"telemetry_sent"' in fleet.stdout
        finally:
            for proc in (agent, controller):
                proc.send_signal(signal.SIGTERM)
            codes = [agent.wait(20), controller.wait(20)]
            log.close()
    assert codes == [0, 0], (tmp_path / "controller.log").read_text()[-2000:]


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        pytest.param(["-m", "powerd", "demo", "--duration-s", "10"], "demo", id="demo"),
        pytest.param(["-c", "from planner.entry import main; main()"], "planner", id="powerplan"),
        pytest.param(
            [
                "-m",
                "powerd",
                "controller",
                "--budgets",
                str(TINY),
                "--broker",
                "mqtt://127.0.0.1:1",
                "--record",
                "influx+http://127.0.0.1:1?org=o&bucket=b",
            ],
            "recorder",
            id="influx-recorder",
        ),
    ],
)
def test_what_needs_an_extra_says_which(
    lean_env, args: list[str], extra: str, tmp_path: Path
) -> None:
    if "controller" in args:
        args = [*args, "--signing-key", str(key_files(tmp_path)[0])]
    result = run(args, lean_env)
    assert result.returncode != 0
    assert f"pip install 'powerd[{extra}]'" in result.stderr
    assert "Traceback" not in result.stderr
