"""The controller's two broker connections (control: paho on asyncio; telemetry: the
receive-only stream) against real Mosquitto: passwords, the shipped ACL, TLS, a subscription
the broker refuses, and a broker restart."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from powerd.gpu.simulated import open_simulated
from powerd.jobhook import PhaseReporter
from powerd.mqtt.url import PASSWORD_ENV, parse_broker_url
from powerd.topology import parse_budgets
from tests.support.agent_harness import NODE, running_agent
from tests.support.brokers import Mosquitto
from tests.support.controller_harness import (
    SERVERS,
    WAIT_S,
    controller_config,
    running_cluster,
    running_controller,
    until,
)
from tests.support.secure_brokers import (
    make_certs,
    shipped_acl_config,
    tls_broker,
)

CONTROLLER_PASSWORD = "ctl-Secret-17"
AGENT_PASSWORD = "n0de-Secret-42"
JOB_PASSWORD = "j0b-Secret-5"

# one rack, one node: the agent harness's node, whose login the ACL ties to its topics
ONE_NODE = f"""
version = 1
[site]
name = "lab"
limit_w = 4000
budget_w = 3000
[models.H100]
failsafe_cap_w = 500
[[rows]]
name = "r1"
limit_w = 4000
budget_w = 3000
[[rows.racks]]
name = "r1-k1"
limit_w = 4000
budget_w = 1500
[[rows.racks.nodes]]
name = "{NODE}"
gpus = 4
model = "H100"
"""


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    return make_certs(tmp_path_factory.mktemp("certs"), client_cn="powerd-controller")


def secured_tls_broker(tmp_path: Path, certs: dict[str, Path]) -> Mosquitto:
    """TLS with client certificates, passwords, and the ACL powerd ships."""
    users = {
        NODE: AGENT_PASSWORD,
        "powerd-controller": CONTROLLER_PASSWORD,
        "powerd-jobs": "j",
        "alice": JOB_PASSWORD,
        "bob": JOB_PASSWORD,
    }
    broker = tls_broker(tmp_path, certs, require_client_cert=True)
    broker.allow_anonymous = False
    broker.extra_config = shipped_acl_config(tmp_path, users)
    return broker


async def test_controller_over_tls_with_password_and_the_shipped_acl(
    tmp_path, certs, monkeypatch, caplog
):
    """Both connections log in (TLS, client certificate, password): the controller hears
    the agent's telemetry on one and commands it on the other, and leaks no secret; a job
    announced through its owner's login is that owner's, whatever another job login tries."""
    caplog.set_level(logging.DEBUG)
    broker = secured_tls_broker(tmp_path, certs)
    broker.start()
    tls = {
        "ca_file": str(certs["ca_crt"]),
        "cert_file": str(certs["client_crt"]),
        "key_file": str(certs["client_key"]),
    }
    ctl_password = tmp_path / "ctl-password"
    ctl_password.write_text(CONTROLLER_PASSWORD + "\n")
    ctl_broker = replace(
        parse_broker_url(broker.url),
        username="powerd-controller",
        password_file=str(ctl_password),
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
        **tls,
    )
    monkeypatch.setenv(PASSWORD_ENV, AGENT_PASSWORD)
    agent_broker = replace(ctl_broker, username=NODE, password_file=None)
    topology = parse_budgets(ONE_NODE)
    config = replace(controller_config(broker, cluster="test"), broker=ctl_broker)
    try:
        async with (
            running_agent(
                broker, open_simulated("4xH100", phase="compute"), broker=agent_broker
            ) as agent,
            running_controller(broker, topology, config) as ctl,
        ):
            await ctl.wait_for(
                lambda: (
                    any(c.result.counters.acks_received for c in ctl.cycles)
                    and ctl.cycles[-1].result.counters.stale_nodes == 0
                )
            )
            await until(lambda: agent.core.mode == "controlled", what="agent follows the leader")
            # the job hook too: alice's job, announced through her own login
            job_password = tmp_path / "job-password"
            job_password.write_text(JOB_PASSWORD + "\n")
            url = broker.url.replace("://", "://alice@")
            job_tls = replace(ctl_broker, username=None, password_file=str(job_password))
            alice = PhaseReporter(
                url, "job-a", [NODE], priority="low", cluster="test", settings=job_tls
            )
            alice.startup()
            await until(lambda: "job-a" in ctl.core.jobs, what="alice's job is known")
            # bob, another job login: the broker lets him write only under his own name, and
            # the controller lets nobody but alice change her job
            as_alice = PhaseReporter(
                url.replace("alice@", "bob@"),
                "job-a",
                cluster="test",
                settings=job_tls,
                owner="alice",
            )
            as_alice.set_phase("shutdown")  # refused by the broker's ACL: never delivered
            await asyncio.to_thread(as_alice.close, 5.0)
            rejected = ctl.core.rejected_total
            as_bob = PhaseReporter(
                url.replace("alice@", "bob@"), "job-a", [NODE], priority="high", cluster="test",
                settings=job_tls,
            )  # fmt: skip
            as_bob.startup()  # delivered on bob's topic, refused by the controller
            await until(lambda: ctl.core.rejected_total > rejected, what="bob refused")
            job = ctl.core.jobs["job-a"]
            owned = (job.owner, job.priority, job.phase)
            await asyncio.to_thread(as_bob.close, 5.0)
            await asyncio.to_thread(alice.close, 5.0)
    finally:
        broker.stop()
    assert owned == ("alice", "low", "startup")
    assert ctl.service.inbox.received > 0  # telemetry over the TLS stream
    assert CONTROLLER_PASSWORD not in caplog.text and AGENT_PASSWORD not in caplog.text


async def test_a_login_that_may_not_read_telemetry_is_told(tmp_path, certs, monkeypatch, caplog):
    """The jobs login may only publish phases. Mosquitto 2.0 grants the subscriptions and
    delivers nothing: the controller says so, and counts every node stale (at its
    failsafe power) meanwhile, commanding none."""
    broker = secured_tls_broker(tmp_path, certs)
    broker.start()
    password = tmp_path / "pw"
    password.write_text("j")
    settings = replace(
        parse_broker_url(broker.url),
        username="powerd-jobs",
        password_file=str(password),
        ca_file=str(certs["ca_crt"]),
        cert_file=str(certs["client_crt"]),
        key_file=str(certs["client_key"]),
    )
    topology = parse_budgets(ONE_NODE)
    config = replace(controller_config(broker, cluster="test"), broker=settings)
    monkeypatch.setenv(PASSWORD_ENV, AGENT_PASSWORD)  # the agent's own login works
    try:
        async with (
            running_agent(broker, broker=replace(settings, username=NODE, password_file=None)),
            running_controller(broker, topology, config) as ctl,
        ):
            await until(lambda: "no telemetry for" in caplog.text, what="the warning")
            await ctl.wait_cycles(2)
    finally:
        broker.stop()
    assert "may this login read powerd/v1/test/nodes/+/telemetry" in caplog.text
    assert ctl.service.inbox.received == 0
    assert all(c.result.counters.stale_nodes == 1 for c in ctl.cycles)
    assert not any(c.result.commands for c in ctl.cycles)


async def test_controller_comes_back_after_a_broker_restart(mosquitto):
    """Both connections reconnect on their own; the controller leads again (a new epoch)
    and hears every node again."""
    async with running_cluster(mosquitto) as cluster:
        ctl = cluster.controller
        epoch = ctl.core.epoch
        mosquitto.restart()
        restarted_at = time.monotonic()
        await until(lambda: not ctl.service.connected.is_set(), what="the loss is noticed")
        await asyncio.wait_for(ctl.service.telemetry_up.wait(), WAIT_S)
        await ctl.wait_for(
            lambda: (
                ctl.core.epoch > epoch
                and ctl.service.leading.is_set()
                and bool(np.all(ctl.core.last_seen > restarted_at))  # every node heard again
                and ctl.cycles[-1].result.counters.stale_nodes == 0
            ),
            timeout_s=3 * WAIT_S,
        )
        assert len(ctl.core.last_seen) == len(SERVERS)
