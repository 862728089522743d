"""The core install at its minimum pins, in a fresh venv: what a GPU node gets.

``make test`` runs this after pytest. It creates a virtual environment,
installs this package with every core dependency pinned to the floor
pyproject.toml gives it (``>=X`` becomes ``==X``) and no extra, then checks
that the extras are really absent, that the agent's and the controller's
modules import (``powerd.gpu.nvml`` against the oldest nvidia-ml-py allowed,
which must have the power smoothing bindings: docs/POWER_SMOOTHING.md),
that ``powerd gpus`` runs, and that msgspec at its floor still refuses
non-finite numbers while decoding (the protocol relies on it:
``powerd/protocol/constraints.py``, ``_decoding``).

    python tests/support/lean_install.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import tomllib
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXTRA_MODULES = (
    "pandas",
    "scipy",
    "pyarrow",
    "matplotlib",
    "amqtt",
    "rich",
    "influxdb_client",
    "torch",
)
CHECK = f"""
import importlib, json, sys
for module in {EXTRA_MODULES!r}:
    try:
        importlib.import_module(module)
    except ImportError:
        continue
    sys.exit(f"{{module}} is installed, but it is no core dependency")
for module in ("powerd.agent.daemon", "powerd.gpu.nvml", "powerd.controller.service",
               "powerd.fleet.runner", "powerd.mqtt.stream", "powerd.jobhook", "powerd.signing"):
    importlib.import_module(module)
from powerd.gpu import nvml
if not nvml._HAS_SMOOTHING_BINDINGS:
    sys.exit("nvidia-ml-py at its floor has no power smoothing bindings: raise the floor")
import msgspec
from powerd.protocol import ProtocolError, Telemetry, decode
for number in (b"1e999", b"-1e999", b"1" + b"0" * 400):
    try:
        msgspec.json.decode(number, type=float)
    except msgspec.ValidationError:
        continue
    sys.exit(f"msgspec {{msgspec.__version__}} decodes {{number[:12]!r}}: the protocol needs it refused")
from powerd.protocol import Topics, encode, Heartbeat
from powerd.signing import Signer, Verifier
signer = Signer.generate()
body = encode(Heartbeat(v=1, epoch=1, ts=1.0, controller="c", state="leader"))
assert Verifier([signer.trusted()]).open("t", signer.sign("t", body))  # Ed25519 at the floor
from powerd.metrics.agent import AgentCollector
from powerd.metrics.readings import AgentReading, GpuReading
from powerd.metrics.server import serve
import powerd.metrics.controller, powerd.metrics.coordinator, urllib.request
reading = AgentReading("n1", "controlled", None, (GpuReading(0, 1.0, 2.0),), {{}}, 0, 0)
server = serve(AgentCollector(lambda: reading), "127.0.0.1:" + str(sys.argv[1]), "agent")
body = urllib.request.urlopen(server.url, timeout=5).read().decode()
assert 'powerd_agent_gpu_cap_watts{{gpu="0",node="n1"}} 2.0' in body, body  # /metrics at the floor
server.close()
from importlib.metadata import version
print(json.dumps({{name: version(name) for name in
    ("aiomqtt", "msgspec", "nvidia-ml-py", "click", "numpy", "paho-mqtt", "cryptography",
     "prometheus-client")}}))
"""


def _free_port() -> int:
    """A port for the check's /metrics endpoint."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def minimum_pins() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = []
    for requirement in project["dependencies"]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([^,;\s]+).*", requirement)
        if match is None:
            raise SystemExit(f"pyproject.toml: {requirement!r} has no >= floor to test")
        pins.append(f"{match[1]}=={match[2]}")
    return pins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", type=Path, help="build the venv here and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="powerd-lean-") as tmp:
        where = args.keep or Path(tmp) / "venv"
        venv.create(where, with_pip=True, clear=True)
        python = str(where / "bin" / "python")
        pins = minimum_pins()
        print(f"lean install: {' '.join(pins)}", flush=True)
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(REPO), *pins],
            check=True,
        )
        # run from elsewhere: the repository's own powerd/ must not shadow the install
        subprocess.run([python, "-c", CHECK, str(_free_port())], check=True, cwd=tmp)
        gpus = subprocess.run(
            [str(where / "bin" / "powerd"), "gpus", "--simulate", "2xH100"],
            check=True,
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        if gpus.stdout.count("simulated") != 2:
            raise SystemExit(f"powerd gpus printed:\n{gpus.stdout}{gpus.stderr}")
    print("lean install: ok (core only, minimum pins)")


if __name__ == "__main__":
    main()
