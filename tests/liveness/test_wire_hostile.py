"""One login's hostile input against a real controller, a real Mosquitto (open: no
``max_packet_size``, no ACL, so the controller's own bounds are what holds) and the fleet
simulator (``powerd fleet``, a process of its own: it measures the controller's heartbeat
gaps as agents see them). Issue 34, items 1, 2 and 5: a retained 2 MB message on a node's
telemetry topic, host lists naming 100,000 hosts at 20 a second, 300 retained phase
messages before a start, 100,000 fake job ids, a job naming another owner's nodes."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from powerd.controller.job_limits import MAX_BUCKETS
from powerd.fleet.app import fleet_argv
from powerd.protocol import PROTOCOL_VERSION, GpuTelemetry, Status, Telemetry, Topics, encode
from powerd.ratelimit import MAX_LOG_KEYS
from powerd.topology import Topology, parse_budgets
from tests.support.brokers import TEST_PASSWORD, TEST_USER, Mosquitto
from tests.support.controller_harness import (
    CLUSTER,
    WAIT_S,
    RunningController,
    controller_config,
    running_controller,
    until,
)
from tests.support.fleet_sites import small_site
from tests.support.keys import key_files

# heartbeat gaps and a start's time are measured: run apart from the other tests (pyproject.toml, markers)
pytestmark = pytest.mark.realtime

TOPICS = Topics(CLUSTER)
FAILSAFE_AFTER_S = 1.5  # the simulated agents' (the harness's agents' too)
FLEET_PERIOD_S = 0.25  # well inside the harness controller's stale_after_s (1 s)
FLOOD_HOSTLIST = "zz[000001-100000]"  # 117 bytes as a payload; 100,000 names


def site(tmp_path: Path) -> tuple[Path, Topology]:
    budgets = tmp_path / "site.toml"
    budgets.write_text(small_site(racks=2))  # 36 GB200 nodes, 144 GPUs
    return budgets, parse_budgets(budgets.read_text())


def paho_publisher(broker: Mosquitto) -> mqtt.Client:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.username_pw_set(TEST_USER, TEST_PASSWORD)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    return client


def phase(job: str, **fields: object) -> bytes:
    doc = {"v": PROTOCOL_VERSION, "job": job, "ts": time.time(), "phase": "compute", **fields}
    return json.dumps(doc).encode()


@contextlib.contextmanager
def publishing(broker: Mosquitto, every_s: float, messages: Iterator[tuple[str, bytes]]):
    """A thread of its own publishing ``messages`` every ``every_s`` (the test's event loop
    runs the controller: a flood must not wait for it)."""
    client = paho_publisher(broker)
    stop = threading.Event()
    sent = [0]

    def run() -> None:
        for topic, payload in messages:
            if stop.wait(every_s):
                return
            client.publish(topic, payload, qos=0)
            sent[0] += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        stop.set()
        thread.join(5)
        client.loop_stop()
        client.disconnect()


FAKE_JOBS = """
import json, sys, time
import paho.mqtt.client as mqtt
port, user, password, prefix, count = sys.argv[1:6]
nodes = sys.argv[6:]
client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
client.username_pw_set(user, password)
client.connect("127.0.0.1", int(port))
client.loop_start()
for k in range(int(count)):
    doc = {"v": 1, "job": f"fake{k}", "ts": time.time(), "phase": "compute",
           "nodes": [nodes[k % len(nodes)]]}
    info = client.publish(f"{prefix}/jobs/mallory/fake{k}/phase", json.dumps(doc), qos=0)
    if k % 1000 == 999:
        time.sleep(0.01)  # paho's queue drains; the broker takes them as fast as it can
client.loop_stop()
client.disconnect()
"""


async def flood_of_fake_jobs(broker: Mosquitto, nodes: list[str], count: int) -> None:
    """``count`` announcements of distinct jobs from one login (mallory), each naming one
    of ``nodes``, from a process of its own, as fast as the broker takes them."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        FAKE_JOBS,
        *(str(broker.port), TEST_USER, TEST_PASSWORD, TOPICS.prefix, str(count), *nodes),
        stderr=subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()


@contextlib.asynccontextmanager
async def fleet(
    broker: Mosquitto, budgets: Path, out: Path, duration_s: float, *args: str
) -> AsyncIterator[asyncio.Task[dict]]:
    """``powerd fleet`` running for ``duration_s``; the task gives its JSON report."""
    report = out / "fleet.json"
    argv = fleet_argv(
        budgets,
        broker.url,
        CLUSTER,
        report,
        start="running",
        failsafe_after_s=FAILSAFE_AFTER_S,
        trust=key_files(out)[1],
        duration_s=duration_s,
        warmup_s=1,
        period_s=FLEET_PERIOD_S,
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, *args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )

    async def finished() -> dict:
        _, err = await asyncio.wait_for(proc.communicate(), duration_s + 60)
        assert proc.returncode == 0, err.decode()
        return json.loads(report.read_text())

    task = asyncio.create_task(finished())
    try:
        yield task
    finally:
        if not task.done():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(BaseException):
                await task


def fresh(ctl: RunningController) -> bool:
    return bool(ctl.cycles) and ctl.cycles[-1].result.counters.stale_nodes == 0


def between(ctl: RunningController, start: float, end: float) -> list:
    """The counters of the cycles between ``start`` and ``end`` (monotonic): while the
    fleet ran (its nodes go stale once it has stopped)."""
    return [c.result.counters for c in ctl.cycles if start < c.mono < end]


async def test_a_retained_2_mb_telemetry_message_blinds_nobody(mosquitto, tmp_path):
    """A node login's one retained 2 MB message on its own telemetry topic: skipped as it
    streams past, never a reconnect (the broker would send it again on each subscribe);
    every honest node stays fresh, commands and heartbeats go on."""
    budgets, topology = site(tmp_path)
    victim = topology.servers[0]
    publisher = paho_publisher(mosquitto)
    try:
        info = publisher.publish(TOPICS.telemetry(victim), b"h" * 2_000_000, qos=1, retain=True)
        info.wait_for_publish(10)
    finally:
        publisher.loop_stop()
        publisher.disconnect()
    async with (
        running_controller(mosquitto, topology, controller_config(mosquitto)) as ctl,
        fleet(mosquitto, budgets, tmp_path, 6) as report,
    ):
        await ctl.wait_for(lambda: fresh(ctl), timeout_s=WAIT_S)
        fresh_from = time.monotonic()
        summary = (await report)["summary"]
        counters = between(ctl, fresh_from, time.monotonic() - 2.0)
        sessions = ctl.service.telemetry_stats.sessions
    assert ctl.service.telemetry.oversized == 1  # skipped once: the session never ended
    assert sessions == 1
    assert sum(c.result.counters.telemetry_oversized for c in ctl.cycles) == 1
    assert counters and all(c.stale_nodes == 0 for c in counters)
    assert summary["reporting_nodes"] == len(topology.servers)
    assert summary["failsafe_entries"] == 0 and len(summary["epochs"]) == 1
    assert summary["heartbeat_gap_s"]["max"] < FAILSAFE_AFTER_S
    assert sum(summary["acks"].values()) > 0  # it kept commanding


async def test_host_lists_of_100000_hosts_at_20_a_second_stall_nothing(mosquitto, tmp_path):
    """Phase announcements whose host lists name 100,000 hosts (one a stranger's prefix,
    one the site's own), 20 a second: each is refused before a name is made (more names
    than the site has nodes); heartbeats go on within the agents' failsafe time, one
    leader, every node fresh."""
    budgets, topology = site(tmp_path)
    own_prefix = topology.servers[0][:-2]  # "row01-k01-n": the site's names start so
    lists = [FLOOD_HOSTLIST, f"{own_prefix}[000001-100000]"]
    flood = (
        (TOPICS.phase(f"flood{k}", owner="mallory"), phase(f"flood{k}", hostlist=lists[k % 2]))
        for k in range(10**9)
    )
    async with running_controller(mosquitto, topology, controller_config(mosquitto)) as ctl:
        epoch = ctl.core.epoch
        async with fleet(mosquitto, budgets, tmp_path, 8) as report:
            await ctl.wait_for(lambda: fresh(ctl), timeout_s=WAIT_S)
            start = time.monotonic()
            with publishing(mosquitto, 1 / 20, flood) as sent:
                summary = (await report)["summary"]
            counters = between(ctl, start, time.monotonic() - 2.0)
        assert ctl.core.epoch == epoch and ctl.service.leading.is_set()
    assert sent[0] >= 20 * 5  # the flood ran
    assert ctl.core.rejected_total >= sent[0] / 2 and not ctl.core.jobs
    assert summary["failsafe_entries"] == 0 and summary["epochs"] == [epoch]
    assert summary["heartbeat_gap_s"]["max"] < FAILSAFE_AFTER_S
    assert counters and all(c.stale_nodes == 0 for c in counters)


async def test_300_retained_phase_messages_do_not_slow_a_start(mosquitto, tmp_path):
    """300 retained phase messages (100,000-host lists, and jobs naming the site's nodes)
    left on the broker: a starting controller drops them unread, counted, and leads in
    its usual time; no job comes of them."""
    _, topology = site(tmp_path)
    publisher = paho_publisher(mosquitto)
    try:
        for k in range(300):
            fields = (
                {"hostlist": FLOOD_HOSTLIST} if k % 2 else {"nodes": [topology.servers[k % 36]]}
            )
            info = publisher.publish(
                TOPICS.phase(f"old{k}", owner="mallory"),
                phase(f"old{k}", **fields),
                qos=1,
                retain=True,
            )
        info.wait_for_publish(10)
    finally:
        publisher.loop_stop()
        publisher.disconnect()
    started = time.monotonic()
    async with running_controller(mosquitto, topology, controller_config(mosquitto)) as ctl:
        led_s = time.monotonic() - started
        await ctl.wait_cycles(2)
        retained = ctl.service.control.retained_refused
        dropped = sum(c.result.counters.phases_retained for c in ctl.cycles)
    assert led_s < 3.0  # epoch discovery (0.3 s) and a cycle, not 300 host lists
    assert retained == 300 and dropped == 300
    assert not ctl.core.jobs


async def test_100000_fake_job_ids_cost_bounded_memory(mosquitto, tmp_path):
    """100,000 distinct job ids from one login, as fast as the broker takes them, each
    naming one of the site's nodes: announcements over the owner's rate are dropped
    unread, a job holds its nodes alone (so at most one job a node is kept), buckets and
    log keys are bounded; the controller keeps leading and every node stays fresh."""
    budgets, topology = site(tmp_path)
    async with running_controller(mosquitto, topology, controller_config(mosquitto)) as ctl:
        epoch = ctl.core.epoch
        async with fleet(mosquitto, budgets, tmp_path, 8) as report:
            await ctl.wait_for(lambda: fresh(ctl), timeout_s=WAIT_S)
            start = time.monotonic()
            await flood_of_fake_jobs(mosquitto, list(topology.servers), 100_000)
            await ctl.wait_cycles(4)
            summary = (await report)["summary"]
            counters = between(ctl, start, time.monotonic() - 2.0)
        core = ctl.core
        assert core.epoch == epoch and ctl.service.leading.is_set()
    limited = sum(c.result.counters.phases_rate_limited for c in ctl.cycles)
    # 20 a second (bursts of 40) taken, the rest dropped unread (some the broker dropped)
    assert limited >= 1000
    assert len(core.jobs) <= len(topology.servers)
    assert max(c.jobs_live for c in counters) <= len(topology.servers)
    assert len(core._gate._jobs) <= MAX_BUCKETS and len(core._log._last) <= MAX_LOG_KEYS
    assert summary["failsafe_entries"] == 0 and summary["epochs"] == [epoch]
    assert summary["heartbeat_gap_s"]["max"] < FAILSAFE_AFTER_S
    assert counters and all(c.stale_nodes == 0 for c in counters)


async def test_a_job_naming_another_owners_nodes_is_refused(mosquitto, tmp_path):
    """Mallory announces a job naming alice's live job's nodes (and one more): refused,
    counted; alice's job keeps its nodes, and mallory's shutdown changes nothing."""
    _, topology = site(tmp_path)
    alice_nodes = list(topology.servers[:4])
    async with running_controller(mosquitto, topology, controller_config(mosquitto)) as ctl:
        publisher = paho_publisher(mosquitto)
        try:
            publisher.publish(
                TOPICS.phase("train", owner="alice"), phase("train", nodes=alice_nodes), qos=1
            )
            await until(lambda: "train" in ctl.core.jobs, WAIT_S, "alice's job taken")
            grab = [*alice_nodes[:2], topology.servers[10]]
            publisher.publish(
                TOPICS.phase("grab", owner="mallory"), phase("grab", nodes=grab), qos=1
            )
            publisher.publish(
                TOPICS.phase("grab", owner="mallory"), phase("grab", phase="shutdown"), qos=1
            )
            await ctl.wait_for(
                lambda: sum(c.result.counters.job_claims_refused for c in ctl.cycles) >= 1
            )
            await ctl.wait_cycles(2)
        finally:
            publisher.loop_stop()
            publisher.disconnect()
        core = ctl.core
        assert "grab" not in core.jobs
        assert core.jobs["train"].nodes == alice_nodes and core.jobs["train"].owner == "alice"
        assert [core.job_of(n) for n in alice_nodes] == ["train"] * 4


def lies(topology: Topology, node: str) -> Iterator[tuple[str, bytes]]:
    """A node login's status declaring a 0.05 s period, then its telemetry at 50 W a GPU
    (far below what it draws), seq restarting every 16 samples (no "seq went back")."""
    status = Status(
        v=PROTOCOL_VERSION,
        node=node,
        state="online",
        ts=time.time(),
        gpus=4,
        agent_version="x",
        period_s=0.05,
    )
    yield TOPICS.status(node), encode(status)
    server = topology.server(node)
    tree = topology.tree
    first = int(tree.gpu_start[tree.server_ordinal[node]])
    for seq in itertools.count():
        gpus = [
            GpuTelemetry(
                index=i,
                uuid=f"GPU-{i}",
                power_w=50.0,
                energy_j=None,
                cap_w=float(tree.cap_max_w[first + i]),
                cap_min_w=float(tree.cap_min_w[first + i]),
                cap_max_w=float(tree.cap_max_w[first + i]),
                sm_clock_mhz=1000,
                max_sm_clock_mhz=None,
                util_pct=10,
                temp_c=40.0,
            )
            for i in range(server.gpus)
        ]
        sample = Telemetry(
            v=PROTOCOL_VERSION,
            node=node,
            ts=time.time(),
            seq=seq % 16,
            mode="controlled",
            gpus=gpus,
        )
        yield TOPICS.telemetry(node), encode(sample)


async def test_a_node_lying_about_its_period_is_flagged_and_its_lies_not_counted(
    mosquitto, tmp_path
):
    """The site's agents send every 0.5 s (``controller.telemetry_period_s``). A node login
    declares 0.05 s in its status and sends 50 W samples at 10 Hz beside its agent's: it
    is flagged implausible (judged against the site's period, not its own word), counted
    at its caps (never at the lie), and its samples beyond the rate are not decoded."""
    budgets, topology = site(tmp_path)
    liar = topology.servers[0]
    config = controller_config(mosquitto, cycle_s=1.0, stale_after_s=2.0, telemetry_period_s=0.5)
    async with (
        running_controller(mosquitto, topology, config) as ctl,
        fleet(mosquitto, budgets, tmp_path, 9, "--period-s=0.5") as report,
    ):
        await ctl.wait_for(lambda: fresh(ctl), timeout_s=WAIT_S)
        with publishing(mosquitto, 0.1, lies(topology, liar)):
            await ctl.wait_cycles(2)
            lying_from = time.monotonic()
            await ctl.wait_cycles(4)
            during = [c for c in ctl.cycles if c.mono > lying_from]
            server = ctl.core.tree.server_ordinal[liar]
            flagged = bool(ctl.core.implausible[server])
            declared_s = float(ctl.core.period_s[server])
        summary = (await report)["summary"]
    gpus = ctl.gpus_of([liar])
    failsafe_w = float(topology.tree.failsafe_cap_w[gpus].min())
    assert declared_s == 0.05 and flagged  # its status was taken; its word was not
    assert during and all(c.result.counters.nodes_implausible >= 1 for c in during)
    assert all(c.result.state.power_w[gpus].min() >= failsafe_w for c in during)
    assert sum(c.result.counters.telemetry_over_rate for c in during) > 0
    assert all(c.result.counters.stale_nodes == 0 for c in during)
    assert summary["failsafe_entries"] == 0
