"""The /metrics endpoints of real processes: agents on simulated GPUs and a controller over
a real Mosquitto, a coordinator; a taken port; off by default."""

from __future__ import annotations

import math
import os
import re
import signal
import socket
from pathlib import Path

from powerd.signing import generate_key_files
from tests.metrics.scraping import scrape_until, spawn, stop, value
from tests.support.brokers import Mosquitto
from tests.support.controller_harness import CLUSTER, budgets_toml, controller_toml
from tests.support.keys import key_files
from tests.support.servers import free_port
from tests.support.tree_sites import three_rows

AGENTS = ("r1-k1-n1", "r1-k2-n1")  # two of the test tree's four nodes: two stay stale
FAILSAFE_W = 0.8 * 700  # the agent's default failsafe cap on an H100 (80 % of 700 W)


def agent_args(broker: Mosquitto, node: str, pub: Path, port: int) -> list[str]:
    return [
        "agent", "--simulate", "4xH100", "--node", node, "--cluster", CLUSTER,
        "--broker", broker.url, "--trust", str(pub), "--period-s", "0.2",
        "--failsafe-after-s", "1", "--metrics-listen", f"127.0.0.1:{port}",
    ]  # fmt: skip


def test_agents_and_controller_expose_their_state(mosquitto: Mosquitto, tmp_path: Path):
    key, pub = key_files(tmp_path)
    budgets, config = tmp_path / "budgets.toml", tmp_path / "controller.toml"
    budgets.write_text(budgets_toml())
    config.write_text(controller_toml(mosquitto, "ctl-a"))
    ports = {node: free_port() for node in AGENTS}
    ctl_port = free_port()
    agents = [spawn(agent_args(mosquitto, n, pub, ports[n]), tmp_path / f"{n}.log") for n in AGENTS]
    controller = None
    try:
        node, port = AGENTS[0], ports[AGENTS[0]]

        def failsafe(s: dict) -> bool:
            # a series not there yet is a KeyError: scrape_until tries again
            value(s, "powerd_agent_gpu_cap_watts", node=node, gpu="3")
            return value(s, "powerd_agent_failsafe", node=node) == 1

        # no controller yet: failsafe, its caps those it applied at start, no heartbeat heard
        first = scrape_until(port, failsafe, "the agent's endpoint")
        assert value(first, "powerd_agent_mode", node=node, mode="failsafe") == 1
        assert value(first, "powerd_agent_mode", node=node, mode="controlled") == 0
        assert math.isnan(value(first, "powerd_agent_heartbeat_age_seconds", node=node))
        caps = [value(first, "powerd_agent_gpu_cap_watts", node=node, gpu=str(g)) for g in range(4)]
        assert caps == [FAILSAFE_W] * 4
        assert value(first, "powerd_agent_gpu_power_watts", node=node, gpu="0") > 0

        controller = spawn(
            ["controller", "--config", str(config), "--budgets", str(budgets), "--no-record",
             "--signing-key", str(key), "--metrics-listen", f"127.0.0.1:{ctl_port}"],
            tmp_path / "controller.log",
        )  # fmt: skip
        labels = {"controller": "ctl-a", "scope": "site"}
        ctl = scrape_until(
            ctl_port,
            lambda s: value(s, "powerd_controller_nodes", **labels, mode="controlled") == 2,
            "the controller leading both agents",
        )
        assert value(ctl, "powerd_controller_leader", **labels) == 1
        assert value(ctl, "powerd_controller_epoch", **labels) >= 1
        assert value(ctl, "powerd_controller_nodes", **labels, mode="stale") == 2
        assert value(ctl, "powerd_controller_nodes_stale", **labels) == 2
        assert value(ctl, "powerd_controller_nodes", **labels, mode="failsafe") == 0
        level = {**labels, "level": "rack", "name": "r1-k1"}
        assert value(ctl, "powerd_controller_level_limit_watts", **level) == 6200
        assert value(ctl, "powerd_controller_level_power_watts", **level) > 0
        site = {**labels, "level": "site", "name": "lab"}
        assert value(ctl, "powerd_controller_level_limit_watts", **site) == 12500
        assert value(ctl, "powerd_controller_levels_over_limit", **labels, level="rack") == 0
        assert math.isnan(value(ctl, "powerd_controller_site_limit_watts", **labels))
        assert value(ctl, "powerd_controller_rejected_signatures_total", **labels) == 0

        led = scrape_until(port, lambda s: not failsafe(s), "the agent following the controller")
        assert value(led, "powerd_agent_mode", node=node, mode="controlled") == 1
        assert value(led, "powerd_agent_heartbeat_age_seconds", node=node) < 1

        controller.send_signal(signal.SIGKILL)  # no step-down: silence
        controller.wait()
        alone = scrape_until(port, failsafe, "failsafe once the controller is gone")
        age = value(alone, "powerd_agent_heartbeat_age_seconds", node=node)
        assert age >= 1  # failsafe_after_s
        later = scrape_until(
            port,
            lambda s: value(s, "powerd_agent_heartbeat_age_seconds", node=node) > age + 0.3,
            "the heartbeat's age growing",
        )
        caps = [value(later, "powerd_agent_gpu_cap_watts", node=node, gpu=str(g)) for g in range(4)]
        assert caps == [FAILSAFE_W] * 4
    finally:
        for process in [*agents, *([controller] if controller else [])]:
            stop(process)


def test_coordinator_exposes_leadership_and_silent_leaves(mosquitto: Mosquitto, tmp_path: Path):
    budgets = tmp_path / "site.toml"
    budgets.write_text(three_rows())
    key, _ = generate_key_files(tmp_path / "coordinator")
    _, leaf_pub = generate_key_files(tmp_path / "leaf")
    port = free_port()
    coordinator = spawn(
        ["coordinator", "--budgets", str(budgets), "--broker", mosquitto.url, "--cluster",
         CLUSTER, "--name", "co-a", "--signing-key", str(key), "--trust", str(leaf_pub),
         "--period-s", "0.5", "--grant-ttl-s", "4", "--takeover-after-s", "2.5",
         "--metrics-listen", f"127.0.0.1:{port}"],
        tmp_path / "coordinator.log",
    )  # fmt: skip
    try:
        series = scrape_until(
            port,
            lambda s: value(s, "powerd_coordinator_leaves_stale", coordinator="co-a") == 3,
            "the coordinator leading, its three leaves silent",
        )
        assert value(series, "powerd_coordinator_leader", coordinator="co-a") == 1
        assert value(series, "powerd_coordinator_epoch", coordinator="co-a") >= 1
        assert math.isnan(value(series, "powerd_coordinator_site_limit_watts", coordinator="co-a"))
        assert value(series, "powerd_coordinator_site_power_watts", coordinator="co-a") >= 0
        assert (
            value(series, "powerd_coordinator_rejected_signatures_total", coordinator="co-a") == 0
        )
    finally:
        stop(coordinator)


def test_a_taken_port_is_logged_and_the_agent_runs_on(tmp_path: Path):
    """Metrics never stop an agent from keeping its node safe: with its port taken it
    says so at ERROR, names the flag, and applies its failsafe caps all the same."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log = tmp_path / "agent.log"
        agent = spawn(
            ["agent", "--local", "--simulate", "1xH100", "--node", "n1", "--broker",
             f"mqtt://127.0.0.1:{free_port()}", "--metrics-listen", f"127.0.0.1:{port}"],
            log,
        )  # fmt: skip
        try:
            scrape_until_logged(log, "failsafe caps applied")
            assert agent.poll() is None
        finally:
            stop(agent)
    text = log.read_text()
    assert f"port {port} is in use" in text and "--metrics-listen" in text
    assert "running without metrics" in text


def _listening_inodes() -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    return inodes


def test_metrics_are_off_by_default(tmp_path: Path):
    """An agent without the flag or key opens no port at all."""
    agent = spawn(
        ["agent", "--local", "--simulate", "1xH100", "--node", "n1", "--broker",
         f"mqtt://127.0.0.1:{free_port()}"],
        tmp_path / "agent.log",
    )  # fmt: skip
    try:
        log = tmp_path / "agent.log"
        scrape_until_logged(log, "failsafe caps applied")
        sockets = {
            m.group(1)
            for fd in os.listdir(f"/proc/{agent.pid}/fd")
            if (m := re.match(r"socket:\[(\d+)\]", _readlink(f"/proc/{agent.pid}/fd/{fd}")))
        }
        assert agent.poll() is None
        assert not sockets & _listening_inodes()
    finally:
        stop(agent)


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def scrape_until_logged(log: Path, text: str, timeout_s: float = 15.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} not logged within {timeout_s} s: {log.read_text()}")
        time.sleep(0.05)
