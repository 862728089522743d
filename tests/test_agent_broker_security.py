"""Against a Mosquitto with passwords, the shipped topic ACL, and TLS (with client certificates)."""

from __future__ import annotations

import asyncio
import logging
import ssl
import subprocess
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest

from powerd.agent.daemon import AgentDaemon
from powerd.gpu.simulated import open_simulated
from powerd.mqtt_url import PASSWORD_ENV
from powerd.protocol import GpuCommand
from tests.agent_harness import (
    FAILSAFE_CAP_W,
    NODE,
    TOPICS,
    agent_config,
    become_controlled,
    command,
    running_agent,
    send,
    telemetry,
)
from tests.brokers import Mosquitto, MqttProbe

AGENT_PASSWORD = "n0de-Secret-42"
CONTROLLER_PASSWORD = "ctl-Secret-17"


def passwd_file(path: Path, users: dict[str, str]) -> Path:
    path.write_text("")
    for user, password in users.items():
        subprocess.run(["mosquitto_passwd", "-b", str(path), user, password], check=True)
    return path


@pytest.fixture
def secured(tmp_path: Path):
    """Mosquitto with no anonymous access, a password file and powerd's example ACL."""
    acl = tmp_path / "acl"
    acl.write_text(resources.files("powerd.data").joinpath("mosquitto-acl.example").read_text())
    passwords = passwd_file(
        tmp_path / "passwd",
        {NODE: AGENT_PASSWORD, "powerd-controller": CONTROLLER_PASSWORD, "intruder": "x"},
    )
    broker = Mosquitto(
        tmp_path,
        allow_anonymous=False,
        extra_config=f"password_file {passwords}\nacl_file {acl}",
    )
    broker.start()
    yield broker
    broker.stop()


async def test_password_and_acl(secured, monkeypatch, caplog):
    monkeypatch.setenv(PASSWORD_ENV, AGENT_PASSWORD)
    caplog.set_level(logging.DEBUG)
    gpus = open_simulated("2xH100")
    controller = MqttProbe(
        secured.port,
        [f"{TOPICS.prefix}/#"],
        username="powerd-controller",
        password=CONTROLLER_PASSWORD,
    )
    intruder = MqttProbe(secured.port, [], username="intruder", password="x")
    as_node = replace(agent_config(secured).broker, username=NODE)
    async with controller as ctl, intruder as bad, running_agent(secured, gpus, broker=as_node):
        first = telemetry((await ctl.expect(TOPICS.telemetry(NODE))).payload)
        await become_controlled(ctl)
        # the broker drops what the ACL forbids: the intruder cannot command the node
        await bad.publish(TOPICS.heartbeat, b'{"v":1}')
        await bad.publish(TOPICS.command(NODE), command(1, 99, [GpuCommand(index=0, cap_w=200.0)]))
        ack = await send(ctl, command(1, 1, [GpuCommand(index=1, cap_w=333.0)]))
    assert first.node == NODE
    assert ack.result == "applied"
    assert gpus[1].enforced_cap_w() == 333.0
    assert gpus[0].enforced_cap_w() == FAILSAFE_CAP_W  # the intruder's 200 W never arrived
    assert AGENT_PASSWORD not in caplog.text


async def test_wrong_password_keeps_node_safe_and_secret_out_of_logs(secured, monkeypatch, caplog):
    monkeypatch.setenv(PASSWORD_ENV, "wrong-" + AGENT_PASSWORD)
    caplog.set_level(logging.DEBUG)
    gpus = open_simulated("1xH100")
    config = agent_config(secured)
    config = replace(config, broker=replace(config.broker, username=NODE))
    daemon = AgentDaemon(config, gpus)
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    await daemon.wait_for(lambda: daemon.connect_failures >= 2, timeout_s=15)
    stop.set()
    await asyncio.wait_for(task, 10)
    assert daemon.connections == 0
    assert gpus[0].enforced_cap_w() == FAILSAFE_CAP_W
    assert "authoriz" in caplog.text.lower()  # the operator sees why
    assert AGENT_PASSWORD not in caplog.text


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""
    d = tmp_path_factory.mktemp("certs")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=powerd-test-ca",
    )
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, subject in (("server", "/CN=127.0.0.1"), ("client", f"/CN={NODE}")):
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        )
    # a second CA that signed nothing here: trusting it must not be enough
    run(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "other.key",
        "-out",
        "other.crt",
        "-days",
        "2",
        "-subj",
        "/CN=someone-else",
    )
    return {p.stem + p.suffix.replace(".", "_"): p for p in d.iterdir()}


def tls_broker(tmp_path: Path, certs: dict[str, Path], require_client_cert: bool) -> Mosquitto:
    options = (
        f"cafile {certs['ca_crt']}\ncertfile {certs['server_crt']}\nkeyfile {certs['server_key']}\n"
        f"require_certificate {'true' if require_client_cert else 'false'}"
    )
    return Mosquitto(tmp_path, listener_options=options, tls=True)


def tls_probe(broker: Mosquitto, certs: dict[str, Path]) -> MqttProbe:
    context = ssl.create_default_context(cafile=str(certs["ca_crt"]))
    context.load_cert_chain(str(certs["client_crt"]), str(certs["client_key"]))
    return MqttProbe(broker.port, [f"{TOPICS.prefix}/#"], tls_context=context)


def tls_settings(broker: Mosquitto, **files: Path):
    base = agent_config(broker).broker
    return replace(base, **{k: str(v) for k, v in files.items()})


@pytest.mark.parametrize("client_cert", [False, True], ids=["server-cert", "mutual-tls"])
async def test_agent_over_tls(tmp_path, certs, client_cert):
    broker = tls_broker(tmp_path, certs, require_client_cert=client_cert)
    broker.start()
    files = {"ca_file": certs["ca_crt"]}
    if client_cert:
        files |= {"cert_file": certs["client_crt"], "key_file": certs["client_key"]}
    try:
        async with (
            tls_probe(broker, certs) as p,
            running_agent(broker, broker=tls_settings(broker, **files)),
        ):
            got = telemetry((await p.expect(TOPICS.telemetry(NODE))).payload)
            await become_controlled(p)
            ack = await send(p, command(1, 1, [GpuCommand(index=0, cap_w=444.0)]))
    finally:
        broker.stop()
    assert broker.url.startswith("mqtts://")
    assert len(got.gpus) == 4
    assert ack.result == "applied"


@pytest.mark.parametrize(
    "files",
    [
        pytest.param({"ca_file": "other_crt"}, id="untrusted-server"),
        pytest.param({"ca_file": "ca_crt"}, id="no-client-cert"),
    ],
)
async def test_tls_refused_keeps_node_safe(tmp_path, certs, files):
    broker = tls_broker(tmp_path, certs, require_client_cert=True)
    broker.start()
    gpus = open_simulated("1xH100")
    config = replace(
        agent_config(broker),
        broker=tls_settings(broker, **{k: certs[v] for k, v in files.items()}),
    )
    daemon = AgentDaemon(config, gpus)
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    try:
        await daemon.wait_for(lambda: daemon.connect_failures >= 2, timeout_s=15)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        broker.stop()
    assert daemon.connections == 0
    assert gpus[0].enforced_cap_w() == FAILSAFE_CAP_W
