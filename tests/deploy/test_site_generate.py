"""``powerd site generate``: the files it writes, and a generated 64-node site standing up.

The site test runs what the generator wrote, unedited: Mosquitto with the generated
mosquitto.conf (TLS, the hashed password file, the shipped ACL), a controller and its
standby with their generated configs recording into a real InfluxDB 1.x, and real
`powerd agent` processes (simulated GPUs), one per node, each with its node's generated
config and login; then the operator's generated login and key set a limit, confirmed.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from click.testing import CliRunner

from powerd.cli import main
from powerd.mqtt.url import PASSWORD_ENV
from powerd.protocol import Heartbeat, decode
from powerd.site_config.mosquitto_passwd import hash_password, verify_password
from tests.support.brokers import MqttProbe, find_mosquitto
from tests.support.servers import ServerProcess, free_port, port_open, running
from tests.support.tsdb import InfluxDB1, wait_until

BUDGETS = Path(__file__).with_name("site64.toml")
CLUSTER = "site64"


def generate(out: Path, *extra: str) -> str:
    result = CliRunner().invoke(
        main,
        [
            "site", "generate", "--budgets", str(BUDGETS), "--out", str(out),
            "--cluster", CLUSTER, "--controller", "ctl-a", "--controller", "ctl-b", *extra,
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return result.output


def test_the_password_hashes_are_mosquittos_own(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text("")
    subprocess.run(["mosquitto_passwd", "-b", str(passwd), "n1", "pw-1"], check=True)
    theirs = passwd.read_text().strip().split(":", 1)[1]
    assert theirs.startswith("$7$101$") and hash_password("x").startswith("$7$101$")
    assert verify_password("pw-1", theirs) and not verify_password("pw-2", theirs)


def test_a_second_run_keeps_every_secret_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "site"
    first = generate(out, "--broker-host", "mqtt.example")
    assert "made the site CA" in first and "made 69 MQTT passwords" in first
    secrets = {p.name: p.read_bytes() for p in (out / "secrets").iterdir()}
    node_password = (out / "nodes/row1-k1-n1/mqtt-password").read_bytes()
    second = generate(out, "--broker-host", "mqtt.example")
    assert "kept the site CA" in second and "kept 69 MQTT passwords" in second
    assert "made" not in second
    assert {p.name: p.read_bytes() for p in (out / "secrets").iterdir()} == secrets
    assert (out / "nodes/row1-k1-n1/mqtt-password").read_bytes() == node_password
    assert os.stat(out / "nodes/row1-k1-n1/mqtt-password").st_mode & 0o077 == 0
    assert os.stat(out / "controllers/ctl-a/controller.key").st_mode & 0o077 == 0
    # a host the kept certificate does not name: said, not silently reissued
    third = generate(out, "--broker-host", "mqtt2.example")
    assert "does not name mqtt2.example" in third


class GeneratedBroker(ServerProcess):
    """Mosquitto on the generated mosquitto.conf, as written."""

    name = "mosquitto"
    marker = "broker"

    def __init__(self, workdir: Path, conf: Path, port: int) -> None:
        super().__init__(workdir)
        self.conf, self.port = conf, port

    def command(self) -> list[str]:
        return [find_mosquitto(), "-c", str(self.conf)]

    def ready(self) -> bool:
        return port_open(self.port)


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "powerd", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        proc.terminate()
    for proc in started:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def password(site: Path, login: str) -> str:
    for line in (site / "secrets/mqtt-passwords").read_text().splitlines():
        if line.startswith(f"{login}:"):
            return line.split(":", 1)[1]
    raise KeyError(login)


def tls(site: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(site / "broker/certs/ca.pem"))


def node_publishes(site: Path, port: int, node: str, topics: list[str]) -> int:
    """Connect as ``node`` under TLS, publish to each topic at QoS 1; the CONNACK code."""
    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"check-{node}")
    client.username_pw_set(node, password(site, node))
    client.tls_set_context(tls(site))
    connected: list[int] = []
    client.on_connect = lambda _c, _u, _f, rc, _p: connected.append(rc.value)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        wait_until(lambda: bool(connected), 10.0, f"{node}'s CONNACK")
        if connected[0] == 0:
            for topic in topics:
                client.publish(topic, b"x", qos=1).wait_for_publish(10.0)
    finally:
        client.disconnect()
        client.loop_stop()
    return connected[0]


def operator(site: Path, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    """``powerd ARGS`` with the generated operator login, its CA and the controllers' key."""
    folder = site / "operator"
    env = {**os.environ, "SSL_CERT_FILE": str(folder / "ca.pem"),
           PASSWORD_ENV: (folder / "mqtt-password").read_text().strip()}  # fmt: skip
    url = f"mqtts://powerd-operator@127.0.0.1:{port}"
    trust = ["--trust", str(folder / "controller.pub")]
    return subprocess.run(
        [sys.executable, "-m", "powerd", *args, "--broker", url, "--cluster", CLUSTER, *trust],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip


# ~23 s (17 s run, 6 s stopping 66 processes) on 2 cores: InfluxDB, Mosquitto, two
# controllers and the site's 64 agents started as processes (~0.45 s of CPU each to start).
@pytest.mark.asyncio
async def test_a_generated_site_runs_under_tls_with_per_node_logins(
    tmp_path: Path, processes: list[subprocess.Popen]
) -> None:
    site, port = tmp_path / "site", free_port()
    with running(InfluxDB1(tmp_path)) as influxd:
        influxd.create_database("powerd")
        generate(
            site, "--broker-host", "127.0.0.1", "--broker-port", str(port), "--in-place",
            "--influx-url", f"http://127.0.0.1:{influxd.port}", "--influx-v1",
        )  # fmt: skip
        broker = GeneratedBroker(tmp_path, site / "broker/mosquitto.conf", port)
        with running(broker):
            prefix = f"powerd/v1/{CLUSTER}"
            reader = MqttProbe(
                port,
                [f"{prefix}/controller/heartbeat", f"{prefix}/nodes/+/command",
                 f"{prefix}/nodes/+/telemetry"],
                username="powerd-reader", password=password(site, "powerd-reader"),
                tls_context=tls(site),
            )  # fmt: skip
            async with reader:
                for name in ("ctl-a", "ctl-b"):
                    ctl = site / "controllers" / name
                    args = ["controller", "--config", str(ctl / "controller.toml")]
                    args += ["--budgets", str(ctl / "budgets.toml")]
                    args += ["--metrics-listen", f"127.0.0.1:{free_port()}"]
                    processes.append(spawn(args, tmp_path / f"{name}.log"))
                    if name == "ctl-a":  # the leader first, then its standby
                        await reader.expect(f"{prefix}/controller/heartbeat", timeout_s=20.0)
                # every node's agent, on its own generated config and login
                nodes = [n.name for n in sorted((site / "nodes").iterdir())]
                assert len(nodes) == 64
                for node in nodes:
                    args = ["agent", "--config", str(site / "nodes" / node / "agent.toml")]
                    args += ["--simulate", "4xH100", "--metrics-listen", f"127.0.0.1:{free_port()}"]
                    processes.append(spawn(args, tmp_path / f"{node}.log"))
                # the leader caps every agent: a signed command to each node
                for node in nodes:
                    await reader.expect(f"{prefix}/nodes/{node}/command", timeout_s=60.0)
                # a node's login is kept to its own topics: another node's telemetry, forged
                # with it, never arrives, while its own (sent after it) does
                victim = f"{prefix}/nodes/{nodes[0]}/telemetry"
                for node in nodes[1:4]:
                    own = f"{prefix}/nodes/{node}/telemetry"
                    mark = reader.mark()
                    assert node_publishes(site, port, node, [victim, own]) == 0, node
                    await reader.expect(own, lambda m: m.payload == b"x", after=mark)
                forged_seen = [
                    m for m in reader.messages if m.topic == victim and m.payload == b"x"
                ]
                assert forged_seen == []
                beats = [
                    decode(Heartbeat, m.payload)
                    for m in reader.messages
                    if m.topic.endswith("/controller/heartbeat")
                ]
            ctl_b_log = (tmp_path / "ctl-b.log").read_text()
            assert {(b.controller, b.state) for b in beats} == {("ctl-a", "leader")}
            assert "connected to" in ctl_b_log and "leads with epoch" not in ctl_b_log
            assert all(p.poll() is None for p in processes), "a process died"

            # the operator, as INSTALL.txt says: a limit confirmed, `powerd status` shows it
            limit = operator(site, port, "limit", "set", "--site", "200kW", "--for", "15m",
                             "--key", str(site / "operator/operator.key"))  # fmt: skip
            assert limit.returncode == 0, limit.stdout + limit.stderr
            assert "confirmed" in limit.stdout and "unverified" not in limit.stdout
            status = operator(site, port, "status", "--json")
            assert status.returncode == 0, status.stdout + status.stderr
            [leader] = json.loads(status.stdout)["leaders"]
            assert leader["verified"] and leader["state"]["name"] == "ctl-a"
            assert leader["state"]["limit"]["limit_w"] == 200_000
            assert leader["state"]["limit"]["in_force"]
            assert leader["state"]["nodes"]["controlled"] == len(nodes)

        # the leader's records are in InfluxDB
        def recorded() -> bool:
            q = 'SELECT count("commands_sent") FROM "decision" WHERE "controller" = \'ctl-a\''
            doc = influxd.query(q, database="powerd")
            return bool(doc["results"][0].get("series"))

        wait_until(recorded, 20.0, "the controller's site points in InfluxDB")
