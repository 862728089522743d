"""The agent as a process: SIGKILL leaves the last will, SIGTERM stops it cleanly, sd_notify works."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from powerd.protocol import Status, decode
from tests.support.agent_harness import TOPICS, probe
from tests.support.keys import key_files

NODE = "proc-n1"


def start_agent(broker_url: str, tmp_path: Path, env: dict | None = None) -> subprocess.Popen:
    log = (tmp_path / "agent.log").open("wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "powerd.cli",
            "agent",
            "--simulate",
            "2xH100",
            "--broker",
            broker_url,
            "--cluster",
            TOPICS.cluster,
            "--node",
            NODE,
            "--period-s",
            "0.2",
            "--failsafe-after-s",
            "2",
            "--trust",
            str(key_files(tmp_path)[1]),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )


def state_is(state):
    return lambda m: decode(Status, m.payload, NODE).state == state


async def test_sigkill_leaves_the_last_will_offline_status(mosquitto, tmp_path):
    async with probe(mosquitto) as p:
        agent = start_agent(mosquitto.url, tmp_path)
        try:
            await p.expect(TOPICS.status(NODE), state_is("failsafe"), timeout_s=30)
            mark = p.mark()
            agent.send_signal(signal.SIGKILL)
            agent.wait(10)
            got = await p.expect(TOPICS.status(NODE), state_is("offline"), after=mark)
        finally:
            agent.kill()
    assert agent.returncode == -signal.SIGKILL
    assert decode(Status, got.payload, NODE).gpus == 2
    # retained: a newcomer learns the node is offline
    async with probe(mosquitto) as late:
        retained = await late.expect(TOPICS.status(NODE))
    assert retained.retain and decode(Status, retained.payload, NODE).state == "offline"


async def test_sigterm_publishes_offline_and_exits_zero(mosquitto, tmp_path):
    async with probe(mosquitto) as p:
        agent = start_agent(mosquitto.url, tmp_path)
        try:
            await p.expect(TOPICS.status(NODE), state_is("failsafe"), timeout_s=30)
            mark = p.mark()
            agent.send_signal(signal.SIGTERM)
            code = agent.wait(20)
            await p.expect(TOPICS.status(NODE), state_is("offline"), after=mark)
        finally:
            agent.kill()
    assert code == 0
    log = (tmp_path / "agent.log").read_text()
    assert "agent stopped" in log
    assert "Traceback" not in log


def test_sd_notify_ready_and_watchdog(mosquitto, tmp_path):
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(30)
    agent = start_agent(
        mosquitto.url, tmp_path, env={"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "5000000"}
    )
    try:
        first = sock.recv(4096).decode()
        second = sock.recv(4096).decode()
        agent.send_signal(signal.SIGTERM)
        rest = []
        while agent.poll() is None or not rest:
            try:
                rest.append(sock.recv(4096).decode())
            except TimeoutError:
                break
            if "STOPPING=1" in rest[-1]:
                break
        agent.wait(20)
    finally:
        agent.kill()
        sock.close()
    assert first.startswith("READY=1")
    assert "WATCHDOG=1" in [second, *rest]
    assert any("STOPPING=1" in m for m in rest)
