"""A small cluster in one process: real agents on simulated GPUs, a real controller, real Mosquitto.

``running_cluster(broker)`` starts one ``AgentDaemon`` per server of
a small budgets file (``budgets_toml()``: 1 row, 2 racks, 2 nodes per rack, 4
simulated H100 per node) and an in-process ``ControllerService`` with short
timings, and waits until the controller leads. Every control cycle is logged
(``RunningController.cycles``: the ``CycleResult`` with its wall and monotonic
time, the ``dt_s`` the policy used and the epoch) so tests can assert on what
the controller saw and decided, cycle by cycle.

The numbers of the tree (per rack: 8 GPUs, 500 W of overhead):

| rack | watts |
| --- | --- |
| every GPU idle (70 W) | 1,060 |
| every GPU at its 500 W failsafe cap in compute (477 W) | 4,316 |
| every GPU uncapped (700 W) in compute (638 W) | 5,604 |
| budget / cap threshold / cap target / uncap threshold | 4,000 / 3,920 / 3,800 / 3,600 |
| limit; failsafe power (8 x 500 + 500) | 6,200; 4,500 |

So under the bands (``BANDS``: ``[policy] safety_by_caps = false``) a rack in
compute must be capped (whatever its caps). The limits leave room for every GPU
at its 700 W maximum cap (6,100 W a rack): uncapping never lifts the sum of caps
under a node above its limit (policies/capping.py), so with tighter limits the
GPUs could not be handed back their maximum. Rows and the site have room for
both racks at their budgets. Under safety by caps, the default, no rack here is
ever capped below its GPUs' maximum: its limit holds them all.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from policies import PolicySettings
from powerd.agent.config import FailsafeConfig
from powerd.agent.daemon import AgentDaemon
from powerd.controller.app import build_service
from powerd.controller.config import ControllerConfig, validate
from powerd.controller.core import CycleResult
from powerd.controller.service import ControllerService
from powerd.gpu.simulated import SimulatedGpu, open_simulated
from powerd.mqtt.url import parse_broker_url
from powerd.protocol import Ack, Heartbeat, Telemetry, Topics, decode
from powerd.recorder import Recorder
from powerd.topology import Topology, parse_budgets
from tests.support.agent_harness import agent_config
from tests.support.brokers import Mosquitto, MqttProbe
from tests.support.keys import SIGNER, VERIFIER, key_files

CLUSTER = "ctltest"
TOPICS = Topics(CLUSTER)

RACKS = ("r1-k1", "r1-k2")
NODES = {rack: (f"{rack}-n1", f"{rack}-n2") for rack in RACKS}
SERVERS = tuple(n for rack in RACKS for n in NODES[rack])
GPUS_PER_NODE = 4
FAILSAFE_CAP_W = 500.0
CAP_MIN_W, CAP_MAX_W = 200.0, 700.0
COMM_CLOCK_MHZ = 1100

# timings (seconds): a cycle every 0.25 s, agents sample every 0.1 s
CYCLE_S = 0.25
HEARTBEAT_S = 0.2
TAKEOVER_AFTER_S = 1.0
EPOCH_DISCOVERY_S = 0.3
AGENT_PERIOD_S = 0.1
AGENT_FAILSAFE_AFTER_S = 1.5
WAIT_S = 10.0  # deadline of any single wait: generous for a loaded 2-core CI machine


def budgets_toml(site_ramp_w_per_s: float = 100_000.0) -> str:
    """The test tree (see the module docstring); ``site_ramp_w_per_s`` limits the site's rise."""
    racks = []
    for rack in RACKS:
        nodes = "".join(
            f"""
[[rows.racks.nodes]]
name = "{node}"
gpus = {GPUS_PER_NODE}
model = "H100"
overhead_w = 200
"""
            for node in NODES[rack]
        )
        racks.append(
            f"""
[[rows.racks]]
name = "{rack}"
limit_w = 6200
budget_w = 4000
overhead_w = 100
{nodes}"""
        )
    return f"""
version = 1

[site]
name = "lab"
limit_w = 12500
budget_w = 9000
ramp_w_per_s = {site_ramp_w_per_s}

[models.H100]
failsafe_cap_w = {FAILSAFE_CAP_W}
comm_clock_mhz = {COMM_CLOCK_MHZ}

[[rows]]
name = "r1"
limit_w = 12500
budget_w = 9000
{"".join(racks)}"""


def controller_config(broker: Mosquitto, name: str = "ctl-a", **overrides: Any) -> ControllerConfig:
    """Short timings; ``policy`` and anything else of ``ControllerConfig`` may be overridden."""
    config = ControllerConfig(
        name=name,
        cluster=CLUSTER,
        cycle_s=CYCLE_S,
        heartbeat_s=HEARTBEAT_S,
        stale_after_s=1.0,
        ack_timeout_s=1.0,
        command_ttl_s=10.0,
        takeover_after_s=TAKEOVER_AFTER_S,
        epoch_discovery_s=EPOCH_DISCOVERY_S,
        broker=replace(parse_broker_url(broker.url), reconnect_min_s=0.05, reconnect_max_s=0.5),
    )
    config = replace(config, **overrides)
    validate(config, "test")
    return config


# The bands of policies/capping.py, not safety by caps (the default): for the tests that
# watch this tree's racks capped below their budgets, which only the bands do.
BANDS = PolicySettings(safety_by_caps=False)


BANDS_TOML = "\n[policy]\nsafety_by_caps = false\n"  # BANDS, in a config file


def fast_uncap() -> PolicySettings:
    """The bands (``BANDS``) with caps handed back in one step (only ramp limits slow them):
    quick steady states."""
    return PolicySettings(safety_by_caps=False, uncap_step_fraction=1.0)


def controller_toml(broker: Mosquitto, name: str) -> str:
    """The same settings as ``controller_config`` as a config file, for ``powerd controller``."""
    return f"""
[controller]
name = "{name}"
cluster = "{CLUSTER}"
cycle_s = {CYCLE_S}
heartbeat_s = {HEARTBEAT_S}
stale_after_s = 1.0
ack_timeout_s = 1.0
command_ttl_s = 10.0
takeover_after_s = {TAKEOVER_AFTER_S}
epoch_discovery_s = {EPOCH_DISCOVERY_S}

[broker]
url = "{broker.url}"
reconnect_min_s = 0.05
reconnect_max_s = 0.5
"""


async def until(predicate: Callable[[], bool], timeout_s: float = WAIT_S, what: str = "") -> None:
    """Poll a cheap in-process condition that no event announces (a standby's state)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what or predicate}")
        await asyncio.sleep(0.01)


# --- the controller ---------------------------------------------------------------------


@dataclass
class Cycle:
    """One control cycle as the test saw it."""

    mono: float  # time.monotonic() right after the cycle
    wall: float  # time.time() right after the cycle
    dt_s: float  # the dt the policy was given
    epoch: int
    result: CycleResult

    @property
    def decision(self):
        return self.result.decision


class RunningController:
    """An in-process ``ControllerService`` running as a task, with every cycle logged."""

    def __init__(self, service: ControllerService, topology: Topology) -> None:
        self.service = service
        self.topology = topology
        self.core = service.core
        self.cycles: list[Cycle] = []
        self.stop_event = asyncio.Event()
        self.task: asyncio.Task | None = None
        service.cycle_listeners.append(self._log_cycle)

    def _log_cycle(self, result: CycleResult) -> None:
        self.cycles.append(
            Cycle(time.monotonic(), time.time(), self.core.last_dt_s, self.core.epoch, result)
        )

    def start(self) -> None:
        self.task = asyncio.create_task(self.service.run(self.stop_event))

    async def stop(self) -> None:
        """A clean stop: the service steps down (standby heartbeat) and closes its recorder."""
        self.stop_event.set()
        if self.task is not None:
            try:
                await asyncio.wait_for(self.task, WAIT_S)  # cancels the task on timeout
            except TimeoutError:
                raise AssertionError(f"the controller did not stop within {WAIT_S} s") from None

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
        """Wait until ``predicate()`` holds after a cycle; AssertionError naming it on timeout."""
        try:
            await self.service.wait_for(predicate, timeout_s)
        except TimeoutError:
            raise AssertionError(
                f"controller: condition not met within {timeout_s} s "
                f"({len(self.cycles)} cycles, epoch {self.core.epoch})"
            ) from None

    async def wait_cycles(self, count: int, timeout_s: float = WAIT_S) -> list[Cycle]:
        """Wait for ``count`` more cycles; they are returned."""
        start = len(self.cycles)
        await self.wait_for(lambda: len(self.cycles) >= start + count, timeout_s)
        return self.cycles[start:]

    # --- reading the tree ---

    def node(self, name: str) -> int:
        return self.topology.node_index(name)

    def gpus_of(self, nodes: Iterable[str]) -> np.ndarray:
        """Site-wide GPU indices of some servers."""
        return np.concatenate([np.asarray(self.topology.server_gpus(n)) for n in nodes])


@contextlib.asynccontextmanager
async def running_controller(
    broker: Mosquitto,
    topology: Topology,
    config: ControllerConfig | None = None,
    recorder: Recorder | None = None,
    lead: bool = True,
) -> AsyncIterator[RunningController]:
    """A controller; with ``lead``, returned once it leads. Stopped cleanly on exit."""
    config = config or controller_config(broker)
    service = build_service(config, topology, recorder, signer=SIGNER)
    running = RunningController(service, topology)
    running.start()
    try:
        if lead:
            await asyncio.wait_for(running.service.leading.wait(), WAIT_S)
        yield running
    finally:
        await running.stop()


# --- the agents -------------------------------------------------------------------------


@dataclass
class Agents:
    daemons: dict[str, AgentDaemon] = field(default_factory=dict)
    gpus: dict[str, list[SimulatedGpu]] = field(default_factory=dict)

    def set_phase(self, nodes: Iterable[str], phase: str) -> None:
        """What the GPUs of these servers are doing now (the simulated workload's phase)."""
        for node in nodes:
            for gpu in self.gpus[node]:
                gpu.set_phase(phase)

    def caps(self, nodes: Iterable[str] | None = None) -> list[float]:
        """The caps the (simulated) devices enforce now, server by server, GPU by GPU."""
        return [g.power_limit_w() for n in (nodes or self.gpus) for g in self.gpus[n]]

    def locks(self, nodes: Iterable[str]) -> list[int | None]:
        return [g.locked_max_sm_clock_mhz() for n in nodes for g in self.gpus[n]]

    async def wait_for(
        self, predicate: Callable[[], bool], timeout_s: float = WAIT_S, what: str = ""
    ) -> None:
        """Wait until ``predicate()`` holds after an agent's sample pass."""
        daemon = next(iter(self.daemons.values()))
        try:
            await daemon.wait_for(predicate, timeout_s)
        except TimeoutError:
            raise AssertionError(f"agents: not within {timeout_s} s: {what or predicate}") from None


@contextlib.asynccontextmanager
async def running_agents(
    broker: Mosquitto,
    topology: Topology,
    phase: str = "idle",
    scope_of_row: Callable[[str], str | None] = lambda _row: None,
) -> AsyncIterator[Agents]:
    """One agent per server of ``topology``, its failsafe cap the budgets file's, all connected;
    each follows the leaf controllers of ``scope_of_row(its row)`` (None: the site's)."""
    agents = Agents()
    stop = asyncio.Event()
    tasks = []
    for seed, node in enumerate(topology.servers):
        server = topology.server(node)
        gpus = open_simulated(f"{server.gpus}x{server.model}", seed=seed, phase=phase)
        config = agent_config(
            broker,
            node=node,
            cluster=CLUSTER,
            period_s=AGENT_PERIOD_S,
            failsafe_after_s=AGENT_FAILSAFE_AFTER_S,
            failsafe=FailsafeConfig(cap_w=topology.failsafe_cap_w(node)),
            controller_scope=scope_of_row(server.row),
        )
        daemon = AgentDaemon(config, gpus, verifier=VERIFIER)
        agents.daemons[node], agents.gpus[node] = daemon, gpus
        tasks.append(asyncio.create_task(daemon.run(stop)))
    try:
        for daemon in agents.daemons.values():
            await asyncio.wait_for(daemon.connected.wait(), WAIT_S)
        yield agents
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)


# --- all of it --------------------------------------------------------------------------


@dataclass
class Cluster:
    broker: Mosquitto
    topology: Topology
    agents: Agents
    controller: RunningController


@contextlib.asynccontextmanager
async def running_cluster(
    broker: Mosquitto,
    budgets: str | None = None,
    phase: str = "idle",
    recorder: Recorder | None = None,
    **config_overrides: Any,
) -> AsyncIterator[Cluster]:
    """Agents on every server (GPUs in ``phase``), then a leading controller, and its
    first cycle that saw every node's telemetry."""
    topology = parse_budgets(budgets or budgets_toml(), source="<test budgets>")
    async with running_agents(broker, topology, phase) as agents:
        config = controller_config(broker, **config_overrides)
        async with running_controller(broker, topology, config, recorder) as controller:
            await controller.wait_for(
                lambda: (
                    bool(controller.cycles)
                    and controller.cycles[-1].result.counters.stale_nodes == 0
                )
            )
            yield Cluster(broker, topology, agents, controller)


# --- the controller as a process ------------------------------------------------------


def controller_argv(args: list[str]) -> list[str]:
    """``python -m powerd controller ARGS``, signing with the suite's key (files in a temporary
    folder of this run) unless ARGS name a key of their own."""
    if "--signing-key" not in args:
        global _KEY_DIR
        if _KEY_DIR is None:
            _KEY_DIR = Path(tempfile.mkdtemp(prefix="powerd-test-ctl-"))
            atexit.register(shutil.rmtree, _KEY_DIR, True)
            key_files(_KEY_DIR)
        args = [*args, "--signing-key", str(_KEY_DIR / "controller.key")]
    return [sys.executable, "-m", "powerd", "controller", *args]


_KEY_DIR: Path | None = None


def spawn_controller(args: list[str], log_path: Path) -> subprocess.Popen:
    """``python -m powerd controller ARGS`` (``controller_argv``), its output in ``log_path``."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            controller_argv(args),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def run_controller_cli(args: list[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess:
    """``python -m powerd controller ARGS`` to completion (for the ones that must fail)."""
    return subprocess.run(controller_argv(args), capture_output=True, text=True, timeout=timeout_s)


# --- watching the wire ------------------------------------------------------------------


def probe(broker: Mosquitto) -> MqttProbe:
    """Every message of the test cluster."""
    return MqttProbe(broker.port, [f"{TOPICS.prefix}/#"])


def node_of(topic: str) -> str:
    return topic.split("/")[-2]


def telemetry_of(message) -> Telemetry:
    return decode(Telemetry, message.payload, node_of(message.topic))


def ack_of(message) -> Ack:
    return decode(Ack, message.payload, node_of(message.topic))


def heartbeat_of(message) -> Heartbeat:
    return decode(Heartbeat, message.payload)


async def run_powerd(*args: str, timeout_s: float = 60.0) -> tuple[int, str]:
    """``python -m powerd ARGS`` without blocking the event loop (a controller running in
    this process must go on hearing and answering, e.g. confirming ``powerd limit``): its
    exit code and its output (stdout and stderr together)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "powerd", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")
