"""`powerd demo`: a node agent on simulated GPUs, on one machine, with no servers.

An embedded broker (amqtt), one agent on simulated H100s running a synthetic
training rhythm (compute, exposed communication), and a scripted operator that
speaks the protocol to it: a controller heartbeat, a cap, a clock lock during
communication, then silence, so the agent falls back to its failsafe caps on
its own. The view is the agent's own telemetry, as any subscriber sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiomqtt
from rich.console import Console
from rich.live import Live
from rich.table import Table

from powerd.agent.config import AgentConfig, FailsafeConfig
from powerd.agent.daemon import AgentDaemon
from powerd.embedded_broker import EmbeddedBroker
from powerd.gpu.simulated import SimulatedGpu, open_simulated
from powerd.mqtt_url import parse_broker_url
from powerd.protocol import (
    Ack,
    Command,
    GpuCommand,
    Heartbeat,
    Telemetry,
    Topics,
    decode,
    encode,
)

DEMO_NODE = "demo-n01"
DEMO_CLUSTER = "demo"


@dataclass
class DemoResult:
    samples: int = 0
    acks: list[Ack] = field(default_factory=list)
    modes_seen: list[str] = field(default_factory=list)
    max_power_over_cap_w: float = 0.0
    energy_j: float = 0.0

    @property
    def ok(self) -> bool:
        """The run showed what it should: applied commands, failsafe, nothing above a cap."""
        return (
            self.samples > 0
            and any(a.result == "applied" for a in self.acks)
            and "controlled" in self.modes_seen
            and self.modes_seen[-1] == "failsafe"
            and self.max_power_over_cap_w <= 0.0
        )


@dataclass(frozen=True)
class Step:
    at_s: float
    label: str
    action: Callable[[], object]


async def run_demo(
    duration_s: float = 24.0,
    spec: str = "4xH100",
    console: Console | None = None,
    live_view: bool = True,
) -> DemoResult:
    """Run the scripted demo; return what the telemetry showed."""
    console = console or Console()
    result = DemoResult()
    events: list[str] = _EventLog(console if not live_view else None)
    scale = duration_s / 24.0  # the script is written for 24 s
    async with EmbeddedBroker() as broker:
        gpus = open_simulated(spec)
        config = AgentConfig(
            node=DEMO_NODE,
            cluster=DEMO_CLUSTER,
            period_s=0.5,
            failsafe_after_s=max(1.0, 3.0 * scale),
            broker=parse_broker_url(broker.url),
            failsafe=FailsafeConfig(fraction=0.8),
        )
        topics = Topics(DEMO_CLUSTER)
        daemon = AgentDaemon(config, gpus)
        stop = asyncio.Event()
        agent_task = asyncio.create_task(daemon.run(stop))
        latest: dict[str, Telemetry] = {}

        async with aiomqtt.Client("127.0.0.1", broker.port) as client:
            await client.subscribe(f"{topics.prefix}/nodes/+/#", qos=1)
            await asyncio.wait_for(daemon.connected.wait(), 10)
            operator = _Operator(client, topics, gpus, events)
            reader = asyncio.create_task(_read(client, topics, latest, result, events))
            rhythm = asyncio.create_task(_training_rhythm(gpus, scale))
            steps = operator.script(scale)
            start = time.monotonic()
            view = Live(console=console, auto_refresh=False) if live_view else None
            with view or contextlib.nullcontext():
                while (elapsed := time.monotonic() - start) < duration_s:
                    while steps and steps[0].at_s <= elapsed:
                        step = steps.pop(0)
                        events.append(f"{elapsed:5.1f}s  {step.label}")
                        await _maybe_await(step.action())
                    await operator.beat_if_alive()
                    if view is not None and DEMO_NODE in latest:
                        view.update(_render(latest[DEMO_NODE], events, elapsed), refresh=True)
                    await asyncio.sleep(0.25)
            for task in (reader, rhythm):
                task.cancel()
            await asyncio.gather(reader, rhythm, return_exceptions=True)
        stop.set()
        await agent_task
        result.energy_j = sum(g.energy_j() or 0.0 for g in gpus)
    return result


class _EventLog(list):
    """The demo's event lines; printed as they come when there is no live view."""

    def __init__(self, console: Console | None) -> None:
        super().__init__()
        self._console = console

    def append(self, line: str) -> None:
        super().append(line)
        if self._console is not None:
            self._console.print(line, highlight=False)


class _Operator:
    """Scripted protocol messages standing in for a controller."""

    def __init__(
        self, client: aiomqtt.Client, topics: Topics, gpus: list[SimulatedGpu], events: list[str]
    ) -> None:
        self.client = client
        self.topics = topics
        self.gpus = gpus
        self.events = events
        self.alive = False
        self.seq = itertools.count(1)

    def script(self, scale: float) -> list[Step]:
        n = len(self.gpus)
        return [
            Step(2 * scale, "controller up: heartbeats start (epoch 1)", self.start),
            Step(
                5 * scale,
                "controller caps every GPU at 450 W",
                lambda: self.command([GpuCommand(index=i, cap_w=450.0) for i in range(n)]),
            ),
            Step(
                9 * scale,
                "controller asks GPU 0 for 9999 W (clamped to its max)",
                lambda: self.command([GpuCommand(index=0, cap_w=9999.0)]),
            ),
            Step(
                12 * scale,
                "communication phase: SM clocks locked at 1100 MHz",
                lambda: self.command(
                    [GpuCommand(index=i, max_sm_clock_mhz=1100) for i in range(n)]
                ),
            ),
            Step(
                15 * scale,
                "compute again: clock locks removed",
                lambda: self.command(
                    [GpuCommand(index=i, max_sm_clock_mhz=None) for i in range(n)]
                ),
            ),
            Step(17 * scale, "controller dies: heartbeats stop", self.die),
        ]

    async def start(self) -> None:
        self.alive = True
        await self.beat_if_alive()

    def die(self) -> None:
        self.alive = False

    async def beat_if_alive(self) -> None:
        if self.alive:
            beat = Heartbeat(v=1, epoch=1, ts=time.time(), controller="demo-ctl", state="leader")
            await self.client.publish(self.topics.heartbeat, encode(beat), qos=1, retain=True)

    async def command(self, gpus: list[GpuCommand]) -> None:
        cmd = Command(v=1, epoch=1, seq=next(self.seq), ts=time.time(), ttl_s=30.0, gpus=gpus)
        await self.client.publish(self.topics.command(DEMO_NODE), encode(cmd), qos=1)


async def _read(
    client: aiomqtt.Client,
    topics: Topics,
    latest: dict[str, Telemetry],
    result: DemoResult,
    events: list[str],
) -> None:
    async for message in client.messages:
        kind, node = topics.parse(message.topic.value)
        payload = message.payload if isinstance(message.payload, bytes) else b""
        if kind == "telemetry" and node:
            sample = decode(Telemetry, payload, node)
            latest[node] = sample
            result.samples += 1
            if not result.modes_seen or result.modes_seen[-1] != sample.mode:
                result.modes_seen.append(sample.mode)
                events.append(f"        agent telemetry says mode: {sample.mode}")
            for g in sample.gpus:
                result.max_power_over_cap_w = max(result.max_power_over_cap_w, g.power_w - g.cap_w)
        elif kind == "ack" and node:
            ack = decode(Ack, payload, node)
            result.acks.append(ack)
            clamped = [g.index for g in ack.gpus if g.clamped]
            events.append(
                f"        ack {ack.seq}: {ack.result}"
                + (f", clamped on GPU {clamped}" if clamped else "")
            )


async def _training_rhythm(gpus: list[SimulatedGpu], scale: float) -> None:
    """Synchronous training: every GPU computes, then waits on a collective, together."""
    compute_s, comm_s = 2.0 * scale, 0.8 * scale
    while True:
        for gpu in gpus:
            gpu.set_phase("compute")
        await asyncio.sleep(compute_s)
        for gpu in gpus:
            gpu.set_phase("communication")
        await asyncio.sleep(comm_s)


async def _maybe_await(value: object) -> None:
    if asyncio.iscoroutine(value):
        await value


def _render(sample: Telemetry, events: list[str], elapsed_s: float) -> Table:
    table = Table(
        title=f"powerd demo · node {sample.node} · mode [bold]{sample.mode}[/] · "
        f"{elapsed_s:4.1f} s",
        caption="\n".join(events[-8:]),
        caption_justify="left",
    )
    for column in ("GPU", "power W", "cap W", "range W", "SM MHz", "lock MHz", "util %", "°C"):
        table.add_column(column, justify="right")
    for g in sample.gpus:
        table.add_row(
            str(g.index),
            f"{g.power_w:.0f}",
            f"{g.cap_w:.0f}",
            f"{g.cap_min_w:.0f}-{g.cap_max_w:.0f}",
            str(g.sm_clock_mhz),
            "-" if g.max_sm_clock_mhz is None else str(g.max_sm_clock_mhz),
            f"{g.util_pct:.0f}",
            f"{g.temp_c:.0f}",
        )
    total_w = sum(g.power_w for g in sample.gpus)
    table.add_row("all", f"{total_w:.0f}", f"{sum(g.cap_w for g in sample.gpus):.0f}", *[""] * 5)
    return table
