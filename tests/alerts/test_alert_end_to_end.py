"""The shipped alert rules end to end: a real Prometheus scrapes two real agents (simulated
GPUs) and a real controller over a real Mosquitto, the controller is killed, and the
no-leader and failsafe alerts reach a real Alertmanager.

The rules are the shipped file with every ``for:`` cut to 1 s and evaluated every second
(``alert_rules.shortened``): the expressions are the ones a site runs, only the waits are
shorter. The agents fall to failsafe 2 s after the last heartbeat (``--failsafe-after-s``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.alerts.alert_rules import RULES, load_rules, metrics_in, shortened
from tests.support.brokers import Mosquitto
from tests.support.controller_harness import CLUSTER, controller_toml, spawn_controller
from tests.support.keys import key_files
from tests.support.monitoring import Alertmanager, Prometheus, poll
from tests.support.servers import free_port, running

NODES = ("k1-n1", "k1-n2")
BUDGETS = f"""
version = 1

[site]
name = "lab"
limit_w = 12500
budget_w = 9000

[models.H100]
failsafe_cap_w = 500.0

[[rows]]
name = "r1"
limit_w = 12500
budget_w = 9000

[[rows.racks]]
name = "k1"
limit_w = 6200
budget_w = 4000
{
    "".join(
        f'''
[[rows.racks.nodes]]
name = "{node}"
gpus = 2
model = "H100"
'''
        for node in NODES
    )
}"""
WAIT_S = 30.0  # any one wait: processes starting on a loaded 2-core machine


def spawn_agent(broker: Mosquitto, node: str, trust: Path, metrics_port: int, log: Path):
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "powerd",
                "agent",
                "--simulate",
                "2xH100",
                "--broker",
                broker.url,
                "--cluster",
                CLUSTER,
                "--node",
                node,
                "--period-s",
                "0.2",
                "--failsafe-after-s",
                "2",
                "--trust",
                str(trust),
                "--metrics-listen",
                f"127.0.0.1:{metrics_port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def stopped(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def prometheus_config(agents: list[int], controller: int, alertmanager: int) -> dict[str, Any]:
    def job(name: str, ports: list[int]) -> dict[str, Any]:
        return {
            "job_name": name,
            "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}],
        }

    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": ["powerd-alerts.yml"],
        "alerting": {
            "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager}"]}]}]
        },
        "scrape_configs": [
            job("powerd-agent", agents),
            job("powerd-controller", [controller]),
        ],
    }


def named(alerts: list[dict[str, Any]], name: str, after_s: float = 0.0) -> list[dict]:
    """Alertmanager's alerts called ``name`` that started after ``after_s`` (Unix time)."""

    def started_s(alert: dict[str, Any]) -> float:
        whole, _, frac = alert["startsAt"].removesuffix("Z").partition(".")
        stamp = datetime.fromisoformat(whole).replace(tzinfo=UTC)
        return stamp.timestamp() + float(f"0.{frac or 0}")

    return [a for a in alerts if a["labels"]["alertname"] == name and started_s(a) >= after_s]


def logs_of(where: Path) -> str:
    """The tail of every process's log in ``where``: what a failure shows."""
    return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(where.glob("*.log")))


def firing(prometheus: Prometheus, *names: str) -> list[dict[str, Any]]:
    return [
        a
        for a in prometheus.alerts()
        if a["labels"]["alertname"] in names and a["state"] == "firing"
    ]


def test_killed_controller_reaches_alertmanager(mosquitto: Mosquitto, tmp_path: Path) -> None:
    _, trust = key_files(tmp_path)
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(BUDGETS)
    config = tmp_path / "controller.toml"
    config.write_text(controller_toml(mosquitto, "ctl-a"))
    agent_ports = [free_port() for _ in NODES]
    controller_port = free_port()
    with ExitStack() as stack:
        controller = spawn_controller(
            [
                "--config",
                str(config),
                "--budgets",
                str(budgets),
                "--metrics-listen",
                f"127.0.0.1:{controller_port}",
            ],
            tmp_path / "controller.log",
        )
        stack.callback(stopped, controller)
        for node, port in zip(NODES, agent_ports, strict=True):
            agent = spawn_agent(mosquitto, node, trust, port, tmp_path / f"{node}.log")
            stack.callback(stopped, agent)
        alertmanager = stack.enter_context(running(Alertmanager(tmp_path)))
        prometheus = Prometheus(
            tmp_path,
            prometheus_config(agent_ports, controller_port, alertmanager.port),
            {"powerd-alerts.yml": shortened(RULES)},
        )
        stack.enter_context(running(prometheus))
        # healthy: the controller leads, both agents follow it, no alert of the two fires
        try:
            poll(
                lambda: prometheus.query('powerd_agent_mode{mode="controlled"} == 1'),
                lambda got: len(got) == len(NODES),
                WAIT_S,
                "both agents controlled, as Prometheus scraped them",
            )
            poll(
                lambda: firing(prometheus, "PowerdNoLeader", "PowerdNodesFailsafe"),
                lambda got: not got,
                WAIT_S,
                "no alert while the controller leads",
            )
        except AssertionError as e:
            raise AssertionError(f"{e}\n{logs_of(tmp_path)}") from None
        leader = prometheus.query("powerd_controller_leader")
        assert [s["value"][1] for s in leader] == ["1"]
        assert leader[0]["metric"]["scope"] == "site"
        # every agent and controller metric a rule names is one the daemons serve
        served = {
            s["metric"]["__name__"]
            for s in prometheus.query('{__name__=~"powerd_(agent|controller)_.+"}')
        }
        named_by_rules = set().union(*(metrics_in(r.expr) for r in load_rules()))
        wanted = {
            n for n in named_by_rules if n.startswith(("powerd_agent_", "powerd_controller_"))
        }
        assert wanted - served == set(), "named by the rules, served by no daemon"

        killed_s = time.time()
        controller.send_signal(signal.SIGKILL)
        controller.wait(10)

        try:
            got = poll(
                alertmanager.alerts,
                lambda got: (
                    bool(named(got, "PowerdNoLeader", killed_s))
                    and bool(named(got, "PowerdNodesFailsafe", killed_s))
                ),
                WAIT_S,
                "PowerdNoLeader and PowerdNodesFailsafe in Alertmanager",
            )
        except AssertionError as e:
            raise AssertionError(f"{e}\n{logs_of(tmp_path)}") from None
    (no_leader,) = named(got, "PowerdNoLeader", killed_s)
    assert no_leader["labels"]["scope"] == "site"
    assert no_leader["labels"]["severity"] == "critical"
    assert no_leader["annotations"]["runbook_url"] == "docs/ALERTS.md#powerdnoleader"
    (failsafe,) = named(got, "PowerdNodesFailsafe", killed_s)
    # counted from the agents' own metrics: the controller that counts them is dead
    assert failsafe["annotations"]["summary"] == "2 powerd nodes in failsafe"
