"""The whole loop on this node's GPUs: a broker, `powerd agent` and `powerd controller`
processes, and a job announcing its phases, each step timed.

    sudo python -m bench.bench_loop --json loop.json          # NVML: a GPU node, as root
    python -m bench.bench_loop --simulate 1xH100 --json loop.json   # anywhere

``bench_nvml`` drives the agent's core in-process; this runs the daemons as an operator
does (docs/HARDWARE.md, "The whole loop on a real GPU"), over MQTT (an embedded broker,
or ``--broker``), with a signed controller. Steps, each timed from the agent's telemetry
and, on real GPUs, from NVML read by this process every 50 ms (the ground truth):

1. the agent alone: its failsafe cap on every GPU before any controller;
2. the controller starts: the first command applied, the agent controlled;
3. under load (real GPUs: a bf16 matmul loop each; simulated ones compute from the
   start) with a node budget below the GPUs' draw and a limit a little above it: the
   seconds over the budget and the limit; under the bands (``--safety bands``) how long
   until the node draws within the budget, under safety by caps (the default) the caps
   hold it within its limit;
4. the job announces ``communication`` (powerd.jobhook): how long until the SM clock is
   locked at the budgets file's communication clock; ``compute``: until it is released;
5. the controller is killed (SIGKILL): how long until the agent holds its failsafe caps
   on its own (``failsafe_after_s``);
6. the agent is stopped (SIGTERM, ``on_exit = restore``): exit status, and every GPU's
   limit and clock as found.

Whatever happens, the processes are killed and (real GPUs) every limit and clock lock is
put back as found through this process's own NVML handle. Exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from bench.common import add_safety_argument, machine, report
from powerd.gpu import Gpu, GpuError
from powerd.gpu.models import gpu_model
from powerd.jobhook import PhaseReporter
from powerd.jobhook.publisher import connect_async
from powerd.mqtt.url import BrokerSettings, parse_broker_url
from powerd.protocol import Ack, ProtocolError, Telemetry, Topics, decode

NODE = "loop-n1"
JOB = "loop-job"
TOPICS = Topics("default")
BUDGET_W_PER_GPU = 500.0  # the rack's budget: below what a loaded GPU draws uncapped
LIMIT_W_PER_GPU = 560.0
FAILSAFE_FRACTION = 0.6  # of the GPU's maximum limit: the agent's failsafe cap
COMM_CLOCK_MHZ = 900  # the communication clock the budgets file names: well below the
# clock a capped GPU runs at under load (~1200 MHz at 500 W on an H200), so the lock shows
NVML_PERIOD_S = 0.05
HEARTBEAT_PERIOD_S = 1.0  # the controller's heartbeat_s default (powerd/controller/config.py)


# --- what the node's GPUs do: NVML read by this process (real GPUs only) --------------------


@dataclass
class NvmlWatch:
    """Every GPU's draw, limit and SM clock every ``NVML_PERIOD_S``, in a thread."""

    gpus: list[Gpu]
    samples: list[tuple[float, list[float], list[float], list[int]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(NVML_PERIOD_S):
            try:
                power = [g.power_w() for g in self.gpus]
                limit = [g.power_limit_w() for g in self.gpus]
                clock = [g.sm_clock_mhz() for g in self.gpus]
            except GpuError:
                continue
            self.samples.append((time.monotonic(), power, limit, clock))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def latest(self) -> tuple[float, list[float], list[float], list[int]] | None:
        return self.samples[-1] if self.samples else None


# --- what the agent says: its telemetry and acks, over MQTT ----------------------------------


class BusWatch:
    """The node's telemetry and acks as they arrive (paho's network thread)."""

    def __init__(self, broker_url: str) -> None:
        self.telemetry: list[tuple[float, Telemetry]] = []
        self.acks: list[tuple[float, Ack]] = []
        self.bad = 0
        settings = parse_broker_url(broker_url, BrokerSettings("localhost", 1883))
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench-loop-watch")
        self._client.on_connect = self._on_connect
        self._client.on_message = self._on_message
        connect_async(self._client, settings)  # the job hook's: login and TLS as the URL says
        self._client.loop_start()

    def _on_connect(self, client: mqtt.Client, *_: Any) -> None:
        client.subscribe([(TOPICS.telemetry(NODE), 0), (TOPICS.ack(NODE), 0)])

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        now = time.monotonic()
        try:
            if msg.topic == TOPICS.telemetry(NODE):
                self.telemetry.append((now, decode(Telemetry, msg.payload)))
            else:
                self.acks.append((now, decode(Ack, msg.payload)))
        except ProtocolError:
            self.bad += 1

    def last(self) -> Telemetry | None:
        return self.telemetry[-1][1] if self.telemetry else None

    def close(self) -> None:
        self._client.loop_stop()
        self._client.disconnect()


# --- the broker, the files, the processes ---------------------------------------------------


class ThreadedBroker:
    """``powerd.mqtt.embedded_broker`` (amqtt) on its own event loop in a thread."""

    def __init__(self) -> None:
        from powerd.mqtt.embedded_broker import EmbeddedBroker

        self._broker = EmbeddedBroker()
        self.url = self._broker.url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._broker.__aenter__(), self._loop).result(30)

    def close(self) -> None:
        done = asyncio.run_coroutine_threadsafe(
            self._broker.__aexit__(None, None, None), self._loop
        )
        done.result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def open_broker(url: str | None) -> tuple[ThreadedBroker | None, str]:
    """``url``, a running broker; else an embedded one, started for the run (close it)."""
    broker = ThreadedBroker() if url is None else None
    return broker, url or (broker.url if broker else "")


def generate_keys(prefix: Path) -> None:
    """The controller role's key pair, as an operator makes it: PREFIX.key, PREFIX.pub."""
    subprocess.run(
        [sys.executable, "-m", "powerd", "keys", "generate", str(prefix)],
        check=True,
        capture_output=True,
    )


def budgets_toml(model: str, gpus: int, failsafe_cap_w: float) -> str:
    """One node whose own budget is below what its GPUs draw under load (the site, row and
    rack have room: a 1-GPU rack of 500 W is not a plausible rack)."""
    budget_w, limit_w = gpus * BUDGET_W_PER_GPU, gpus * LIMIT_W_PER_GPU
    # room above the node, in proportion (a site is at least 1 kW; 10 x what it can draw is
    # a unit slip, powerd.topology.checks)
    room_w = max(1000.0, 1.5 * gpus * gpu_model(model).cap_max_w)
    room = f"limit_w = {room_w / 0.9:g}\nbudget_w = {room_w:g}"
    return f"""version = 1
[site]
name = "loop"
{room}
[models.{model}]
failsafe_cap_w = {failsafe_cap_w:g}
comm_clock_mhz = {COMM_CLOCK_MHZ}
[[rows]]
name = "loop-r1"
{room}
[[rows.racks]]
name = "loop-k1"
{room}
[[rows.racks.nodes]]
name = "{NODE}"
gpus = {gpus}
model = "{model}"
limit_w = {limit_w:g}
budget_w = {budget_w:g}
"""


def agent_toml(
    broker_url: str, trust: Path, failsafe_cap_w: float, failsafe_after_s: float, period_s: float
) -> str:
    return f"""[agent]
period_s = {period_s:g}
failsafe_after_s = {failsafe_after_s:g}
on_exit = "restore"
[trust]
controller_keys = ["{trust}"]
[broker]
url = "{broker_url}"
reconnect_max_s = 2
[failsafe]
cap_w = {failsafe_cap_w:g}
"""


@contextmanager
def processes() -> Iterator[Callable[[str, list[str], Path], subprocess.Popen[bytes]]]:
    """Start ``python -m powerd ...`` processes; every one still running is killed at exit."""
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "powerd", *args], stdout=out, stderr=subprocess.STDOUT
            )
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def wait_for(
    what: str, ok: Callable[[], bool], timeout_s: float, *running: subprocess.Popen[bytes]
) -> float:
    """Seconds until ``ok()``; ``TimeoutError`` naming ``what`` after ``timeout_s`` or as
    soon as one of ``running`` has exited."""
    t0 = time.monotonic()
    while not ok():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        if any(proc.poll() is not None for proc in running):
            raise TimeoutError(f"{what}: a process exited first (its log is below)")
        time.sleep(0.02)
    return time.monotonic() - t0


# --- the GPUs: real (NVML and PyTorch) or simulated -----------------------------------------


@dataclass
class Node:
    model: str
    gpus: int
    max_w: float
    nvml: list[Gpu] | None  # this process's own handles on the real GPUs
    found: list[dict[str, Any]]  # each GPU's limit as found


def open_node(simulate: str | None) -> Node:
    if simulate is not None:
        from powerd.gpu.simulated import parse_spec

        count, described = parse_spec(simulate)
        return Node(described.key, count, described.cap_max_w, None, [])
    from powerd.gpu.models import GPU_MODELS
    from powerd.gpu.nvml import open_nvml

    gpus: list[Gpu] = list(open_nvml())
    names = {g.name for g in gpus}
    model = next((m.key for m in GPU_MODELS.values() if m.name in names), None)
    if model is None or len(names) != 1:
        raise SystemExit(f"GPUs {sorted(names)}: not one model powerd/gpu/models.py knows")
    found = [{"power_limit_w": g.power_limit_w()} for g in gpus]
    return Node(model, len(gpus), gpus[0].power_limit_range().max_w, gpus, found)


def put_back(node: Node) -> list[str]:
    """Every real GPU's limit as found and its clock unlocked; the errors, if any."""
    errors = []
    for gpu, found in zip(node.nvml or [], node.found, strict=False):
        for what, undo in (
            ("clock", gpu.unlock_sm_clock),
            ("cap", lambda g=gpu, f=found: g.set_power_limit_w(f["power_limit_w"])),
        ):
            try:
                undo()
            except GpuError as exc:
                errors.append(f"GPU {gpu.index} {what}: {exc}")
    return errors


class Load:
    """A bf16 matmul loop on every real GPU (bench_nvml's); nothing for simulated ones."""

    def __init__(self, node: Node) -> None:
        self.loops: list[Any] = []
        if node.nvml is not None:
            from bench.bench_nvml import MatmulLoad

            self.loops = [MatmulLoad(g.index) for g in node.nvml]

    def start(self) -> None:
        for loop in self.loops:
            loop.start()

    def stop(self) -> None:
        for loop in self.loops:
            loop.stop()


# --- the run --------------------------------------------------------------------------------


def _mode(bus: BusWatch) -> str | None:
    last = bus.last()
    return None if last is None else last.mode


def _caps(bus: BusWatch) -> list[float]:
    last = bus.last()
    return [] if last is None else [g.cap_w for g in last.gpus]


def over_s(series: list[tuple[float, float]], threshold_w: float, t0: float, t1: float) -> float:
    """Seconds within [t0, t1] a sampled series spent above ``threshold_w`` (held between
    samples)."""
    inside = [(t, w) for t, w in series if t0 <= t <= t1]
    total = 0.0
    for (t, w), (t_next, _) in itertools.pairwise(inside):
        if w > threshold_w:
            total += t_next - t
    return round(total, 3)


def run(args: argparse.Namespace) -> dict[str, Any]:
    node = open_node(args.simulate)
    failsafe_w = round(FAILSAFE_FRACTION * node.max_w)
    budget_w, limit_w = node.gpus * BUDGET_W_PER_GPU, node.gpus * LIMIT_W_PER_GPU
    hold_s = 1.0 if args.quick else 5.0
    failsafe_after_s = 2.0 if args.quick else 5.0
    result: dict[str, Any] = {
        "command": "python -m bench.bench_loop " + " ".join(args.argv),
        "machine": machine(),
        "gpus": f"{node.gpus}x{node.model}" + (" (simulated)" if args.simulate else " (NVML)"),
        "budget_w": budget_w,
        "limit_w": limit_w,
        "failsafe_cap_w": failsafe_w,
        "safety": args.safety,
        "comm_clock_mhz": COMM_CLOCK_MHZ,
    }
    steps: dict[str, Any] = {}
    checks: dict[str, bool] = {}
    marks: list[tuple[float, str]] = []

    def mark(what: str) -> float:
        now = time.monotonic()
        marks.append((now, what))
        return now

    result["steps"], result["checks"] = steps, checks
    work = Path(tempfile.mkdtemp(prefix="bench-loop-"))
    broker, url = open_broker(args.broker)
    nvml = NvmlWatch(node.nvml) if node.nvml is not None else None
    load = Load(node)
    bus = BusWatch(url)
    reporter = PhaseReporter(url, JOB, [NODE], flush_timeout_s=2.0)
    try:
        with processes() as start:
            generate_keys(work / "ctl")
            (work / "budgets.toml").write_text(budgets_toml(node.model, node.gpus, failsafe_w))
            by_caps = "true" if args.safety == "caps" else "false"
            (work / "controller.toml").write_text(f"[policy]\nsafety_by_caps = {by_caps}\n")
            (work / "agent.toml").write_text(
                agent_toml(url, work / "ctl.pub", failsafe_w, failsafe_after_s, args.agent_period_s)
            )
            simulate = ["--simulate", args.simulate] if args.simulate else []
            t_agent = mark("agent started")
            agent = start(
                "agent",
                ["agent", "--config", str(work / "agent.toml"), "--node", NODE, *simulate],
                work / "agent.log",
            )
            # 1. the agent alone
            took = wait_for("agent telemetry", lambda: bus.last() is not None, 60, agent)
            steps["1 agent alone"] = {"first_telemetry_s": round(took, 2), "mode": _mode(bus)}
            steps["1 agent alone"]["caps_w"] = _caps(bus)
            if nvml is not None:
                time.sleep(0.2)  # one more NVML read after the telemetry
                latest = nvml.latest()
                steps["1 agent alone"]["nvml_limits_w"] = latest[2] if latest else None
            checks["failsafe caps before any controller"] = all(
                c == failsafe_w for c in _caps(bus)
            ) and _mode(bus) in ("failsafe", "local")

            # 2. the controller
            t_ctl = mark("controller started")
            controller = start(
                "controller",
                [
                    "controller",
                    *("--config", str(work / "controller.toml")),
                    *("--budgets", str(work / "budgets.toml"), "--broker", url),
                    *("--signing-key", str(work / "ctl.key"), "--cycle-s", "0.5", "--no-record"),
                ],
                work / "controller.log",
            )
            took = wait_for("the first applied ack", lambda: bool(bus.acks), 60, agent, controller)
            ack = bus.acks[0][1]
            wait_for("controlled mode", lambda: _mode(bus) == "controlled", 30, agent, controller)
            steps["2 controller starts"] = {
                "first_ack_s": round(took, 2),
                "ack": ack.result,
                "controlled_after_s": round(time.monotonic() - t_ctl, 2),
            }
            checks["the first command applied"] = ack.result == "applied"

            # 3. under load, a budget below the draw
            reporter.startup()
            reporter.set_phase("compute")
            load.start()
            t_load = mark("load started, compute announced")
            time.sleep(hold_s)
            t_end = time.monotonic()
            samples = node_samples(bus, nvml)
            series = [(t, w) for t, w, _ in samples if t_load <= t <= t_end]
            over_cap = [(t, w - cap) for t, w, cap in samples if t_load <= t <= t_end]
            steps["3 under load"] = {
                "held_s": round(t_end - t_load, 2),
                "caps_w": _caps(bus),
                "mean_draw_w_after_1s": mean_between(series, t_load + 1.0, t_end),
                "max_draw_w": round(max(w for _, w in series), 1) if series else None,
                "max_draw_over_caps_w": round(max(d for _, d in over_cap), 1) if over_cap else None,
                "s_draw_over_caps": over_s(over_cap, 0.0, t_load, t_end),
                "s_over_budget": over_s(series, budget_w, t_load, t_end),
                "s_over_limit": over_s(series, limit_w, t_load, t_end),
                "max_1s_mean_draw_w": max_window_mean(series, 1.0),
                "max_telemetry_draw_over_caps_w": max(
                    (
                        g.power_w - g.cap_w
                        for t, tel in list(bus.telemetry)
                        if t_load <= t <= t_end
                        for g in tel.gpus
                    ),
                    default=None,
                ),
            }
            checks["the node's 1 s mean draw within its limit"] = (
                steps["3 under load"]["max_1s_mean_draw_w"] or 0.0
            ) <= limit_w

            # 4. communication: the clock lock, at once on the job's word
            t_comm = mark("communication announced")
            reporter.set_phase("communication", expected_s=hold_s)
            took = wait_for(
                "the clock lock", lambda: _locked(bus) == COMM_CLOCK_MHZ, 30, agent, controller
            )
            time.sleep(hold_s)
            lock_nvml = _nvml_first(
                nvml, t_comm, lambda _, clocks: all(c <= COMM_CLOCK_MHZ for c in clocks)
            )
            t_back = mark("compute announced")
            reporter.set_phase("compute")
            took_back = wait_for(
                "the lock released", lambda: _locked(bus) is None, 30, agent, controller
            )
            steps["4 communication"] = {
                "locked_in_telemetry_after_s": round(took, 2),
                "sm_clock_at_or_below_lock_in_nvml_after_s": lock_nvml,
                "released_in_telemetry_after_s": round(took_back, 2),
                "mean_draw_w_locked": mean_between(
                    [(t, w) for t, w, _ in node_samples(bus, nvml)], t_comm + took, t_back
                ),
                "nvml_sm_mhz_before": _nvml_clocks(nvml, t_comm - 1.0, t_comm),
                "nvml_sm_mhz_locked": _nvml_clocks(nvml, t_comm + took, t_back),
            }
            checks["the communication clock locked and released"] = nvml is None or (
                lock_nvml is not None
            )

            # 5. the controller killed: the agent alone again
            controller.send_signal(signal.SIGKILL)
            t_kill = mark("controller killed")
            took = wait_for(
                "the failsafe caps",
                lambda: _mode(bus) == "failsafe" and all(c == failsafe_w for c in _caps(bus)),
                failsafe_after_s + 30,
                agent,
            )
            nvml_took = _nvml_first(
                nvml, t_kill, lambda limits, _: all(w == failsafe_w for w in limits)
            )
            steps["5 controller killed"] = {
                "failsafe_in_telemetry_after_s": round(took, 2),
                "failsafe_in_nvml_after_s": nvml_took,
                "failsafe_after_s": failsafe_after_s,
            }
            # counted from the last heartbeat heard, up to one heartbeat period (1 s) before
            checks["failsafe caps after the controller's silence"] = (
                failsafe_after_s - HEARTBEAT_PERIOD_S - 0.1 <= took <= failsafe_after_s + 2.0
                and (nvml is None or nvml_took is not None)
            )

            # 6. the agent stopped: limits and clocks as found
            load.stop()
            agent.send_signal(signal.SIGTERM)
            t_term = mark("load stopped, agent sent SIGTERM")
            rc = agent.wait(30)
            steps["6 agent stopped"] = {
                "exit_status": rc,
                "stopped_after_s": round(time.monotonic() - t_term, 2),
            }
            checks["the agent exits 0 on SIGTERM"] = rc == 0
            if node.nvml is not None:
                time.sleep(0.3)  # the enforced limit follows within ~0.1 s (docs/HARDWARE.md)
                limits = [g.power_limit_w() for g in node.nvml]
                steps["6 agent stopped"]["nvml_limits_w"] = limits
                checks["limits restored as found"] = limits == [
                    f["power_limit_w"] for f in node.found
                ]
            result["ran_s"] = round(time.monotonic() - t_agent, 1)
            doubted = (work / "controller.log").read_text(errors="replace").count("implausible")
            result["controller_log_implausible_lines"] = doubted
            checks["the controller believed the node throughout"] = doubted == 0
    except TimeoutError as exc:
        checks[str(exc)] = False
    finally:
        load.stop()
        reporter.close()
        bus.close()
        if nvml is not None:
            nvml.stop()
            if args.trace:
                write_trace(args.trace, nvml, marks)
        result["put_back_errors"] = put_back(node)
        if broker is not None:
            broker.close()
        result["logs_tail"] = {
            name: (work / f"{name}.log").read_text(errors="replace").splitlines()[-5:]
            for name in ("agent", "controller")
            if (work / f"{name}.log").exists()
        }
        if args.keep:
            result["work_dir"] = str(work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return result


def write_trace(path: Path, nvml: NvmlWatch, marks: list[tuple[float, str]]) -> None:
    """The NVML samples as CSV (per GPU: draw, limit, SM clock), the steps as # lines."""
    t0 = marks[0][0] if marks else 0.0
    n = len(nvml.gpus)
    header = ["t_s"] + [f"{k}{i}" for i in range(n) for k in ("power_w_", "limit_w_", "sm_mhz_")]
    rows = [",".join(header)]
    for t, power, limit, clock in nvml.samples:
        cells = [f"{p:.1f},{lim:.0f},{c}" for p, lim, c in zip(power, limit, clock, strict=True)]
        rows.append(f"{t - t0:.3f}," + ",".join(cells))
    rows += [f"# {t - t0:.3f} {what}" for t, what in marks]
    path.write_text("\n".join(rows) + "\n")


def node_samples(bus: BusWatch, nvml: NvmlWatch | None) -> list[tuple[float, float, float]]:
    """(time, the node's GPUs' draw, the sum of their limits in force): NVML's on real GPUs,
    else the agent's telemetry."""
    if nvml is not None:
        return [(t, sum(power), sum(limit)) for t, power, limit, _ in list(nvml.samples)]
    return [
        (t, sum(g.power_w for g in tel.gpus), sum(g.cap_w for g in tel.gpus))
        for t, tel in list(bus.telemetry)
    ]


def max_window_mean(series: list[tuple[float, float]], window_s: float) -> float | None:
    """The highest mean over any ``window_s`` of the series (the whole series' mean when it
    is shorter): what a breaker or a meter averaging over that window sees."""
    if not series:
        return None
    best = None
    for t_end, _ in series:
        if t_end - series[0][0] < window_s:
            continue
        inside = [w for t, w in series if t_end - window_s < t <= t_end]
        mean = sum(inside) / len(inside)
        best = mean if best is None else max(best, mean)
    if best is None:
        best = sum(w for _, w in series) / len(series)
    return round(best, 1)


def mean_between(series: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    inside = [w for t, w in series if t0 <= t <= t1]
    return round(sum(inside) / len(inside), 1) if inside else None


def _locked(bus: BusWatch) -> float | None:
    """The SM clock lock the agent reports on its GPUs (None: none; the first GPU's)."""
    last = bus.last()
    return None if last is None or not last.gpus else last.gpus[0].max_sm_clock_mhz


def _nvml_first(
    nvml: NvmlWatch | None, since: float, ok: Callable[[list[float], list[int]], bool]
) -> float | None:
    """Seconds after ``since`` until the first NVML sample whose (limits, clocks) are ``ok``."""
    if nvml is None:
        return None
    for t, _, limits, clocks in list(nvml.samples):
        if t >= since and ok(limits, clocks):
            return round(t - since, 3)
    return None


def _nvml_clocks(nvml: NvmlWatch | None, t0: float, t1: float) -> list[int] | None:
    """The highest SM clock NVML read on each GPU within [t0, t1]."""
    if nvml is None:
        return None
    inside = [clocks for t, _, _, clocks in list(nvml.samples) if t0 <= t <= t1]
    return [max(column) for column in zip(*inside, strict=True)] if inside else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--simulate", metavar="SPEC", help="simulated GPUs (1xH100), not NVML")
    parser.add_argument("--broker", metavar="URL", help="a running broker (default: embedded)")
    parser.add_argument("--quick", action="store_true", help="1 s holds, failsafe after 2 s")
    parser.add_argument("--keep", action="store_true", help="keep the logs and files")
    add_safety_argument(parser, "The controller's policy.")
    parser.add_argument(
        "--agent-period-s", type=float, default=0.5, help="the agent's telemetry period (0.5)"
    )
    parser.add_argument("--json", type=Path, help="write the result here too")
    parser.add_argument("--trace", type=Path, help="real GPUs: the NVML samples here (CSV)")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    if args.simulate is None and os.geteuid() != 0:
        print("bench_loop: NVML lets only root set limits; run as root or --simulate 1xH100")
        return 1
    result = run(args)
    report(result, args.json)
    return 0 if result["checks"] and all(result["checks"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
