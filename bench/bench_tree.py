"""A tree of controllers: the coordinator's cycle, a leaf's CPU per message, the whole site.

Three measurements (``--parts``, all by default):

``coordinator``
    In process, no broker. A budgets file of ``--leaves`` rows (each one rack
    of ``--nodes-per-leaf`` 4-GPU nodes; the rows' budgets sum within the site's
    leaf pool, ``powerd.topology.scope.leaf_pool_w``), a ``CoordinatorCore`` with
    one scope per row, fed one realistic ``Summary`` per leaf (load, priority mix,
    capped rows with held watts, a few silent leaves). Timed over ``--reps``:
    ``period`` (``core.period()``: the allocation and the grant structs),
    ``period_sign`` (that, then ``encode`` and ``Signer.sign`` of every grant:
    what ``CoordinatorService._grant`` does before handing them to paho) and
    ``ingest`` (one summary from every leaf: topic parse, ``Verifier.decode``,
    scope check, ``on_summary``: ``CoordinatorService._on_message``'s work; the
    leaves send one a cycle, so this is the inbound cost per *second*).
    Startup: loading the file and building the core (it scopes every leaf).
    ``--leaves`` may list several sizes (``100,1000``). ``--startup-shape``
    also times loading and building the core for a 1 GW-shaped file (100 rows ×
    70 racks × 18 nodes = 126,000 nodes).

``leaf``
    As ``bench.bench_scale`` (its functions: the controller's config, processes,
    decision points and summary), over one row: a fresh Mosquitto, ``powerd
    controller --scope row01`` on the shipped 150 MW site (1,296 nodes), ``powerd
    fleet --scope row01`` (that row only), and the bare subscriber (every node's
    telemetry: only row01's is sent). CPU per telemetry message, controller vs bare.

``site``
    The site as a tree, on this machine: one Mosquitto, one leaf controller per
    row (``--scope rowNN``), one ``powerd coordinator`` (``--period-s``), one
    fleet per row (``--scope rowNN``, ``--fleet-connections`` telemetry and
    ``--fleet-control-connections`` control connections, pushes every
    ``--push-every-s`` per fleet after the warm-up) and a monitor in this process
    (paho) on the scopes' summaries and grants. ``--site-rows`` lists the runs
    (``16,8``: the whole site, then the site cut to 8 rows). Per leaf, as
    bench_scale's summary: stale nodes (its decision points), heartbeat gaps,
    epochs and reactions (its fleet), commands, CPU; overall: maxima, reaction
    percentiles over every push, each process's CPU share, the coordinator's
    periods as seen on the broker (grant intervals, the spread of one period's
    grants, leaves heard) and the summaries' stale_nodes.

Every part's figures move with whatever else runs on the machine: the leaf and
site runs report the whole machine's busy cores (``/proc/stat``) beside their
own processes' (``machine_cores``), and ``--wait-quiet-s`` waits, before each
part, for the machine to be idle.

    python -m bench.bench_tree [--parts coordinator,leaf,site] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from msgspec.structs import replace

from bench.bench_scale import (
    CLUSTER,
    Scenario,
    controller_config,
    decisions,
    spawn,
    summarise,
    wait_for_line,
)
from bench.common import CLK_TCK, cpu_s, machine, mem_mb, report, run_dir
from powerd.coordinator.core import CoordinatorCore
from powerd.fleet.app import fleet_argv
from powerd.fleet.sites import SITE_FILE, cut_site
from powerd.gpu.models import GPU_MODELS
from powerd.protocol import ProtocolError, Summary, Topics, encode
from powerd.signing import Signer, Verifier, generate_key_files
from powerd.topology import load_budgets
from powerd.topology.scope import Scope, leaf_pool_w, rows_budget_w, rows_within_site
from powerd.vocabulary import PROTOCOL_VERSION
from tests.support.brokers import TEST_PASSWORD, TEST_USER, Mosquitto

# --- 1. the coordinator, in process -------------------------------------------------------

GPUS_PER_NODE = 4
MODEL = GPU_MODELS["GB200"]
NODE_OVERHEAD_W = 1000.0
RACK_OVERHEAD_PER_NODE_W = 600.0  # switches, ~11 % of a node's planned IT power
SITE_OVERHEAD_FRACTION = 0.2  # cooling and conversion, of the rows' budgets
SILENT_SHARE = 0.01  # leaves with no summary (a leaf down, a standby not yet leading)
CAPPING_SHARE = 0.1  # leaves whose rows are capping (held watts)


def tree_budgets(rows: int, racks_per_row: int, nodes_per_rack: int) -> str:
    """A budgets file of ``rows`` rows, each ``racks_per_row`` racks of ``nodes_per_rack``
    4 × GB200 nodes, planned as the 150 MW site's racks are (per node: 5,556 W budget,
    6,111 W breaker share, 600 W of switches), the site's overhead a fifth of the rows'
    budgets and its budget exactly what the leaf pool needs (``leaf_pool_w``)."""
    rack_budget = nodes_per_rack * 5556.0
    rack_limit = nodes_per_rack * 6111.0
    row_budget, row_limit = racks_per_row * rack_budget, racks_per_row * rack_limit
    rows_w = rows * row_budget
    overhead = SITE_OVERHEAD_FRACTION * rows_w
    site_budget = math.ceil(rows_w + overhead / 0.98 + 1.0)
    site_limit = math.ceil(site_budget * 1.03)
    return f"""# bench.bench_tree: {rows} rows x {racks_per_row} racks x {nodes_per_rack} nodes
version = 1

[defaults]
cap_threshold = 0.98
cap_target = 0.95
uncap_threshold = 0.90

[site]
name = "tree-bench"
limit_kw = {site_limit / 1e3:.3f}
budget_kw = {site_budget / 1e3:.3f}
overhead_kw = {overhead / 1e3:.3f}
ramp_kw_per_s = {max(rows_w * 0.035 / 1e3, 1.0):.3f}

[models.GB200]
failsafe_cap_w = 960

[rows]
count = {rows}
name = "row{{i:04d}}"
limit_kw = {row_limit / 1e3:.3f}
budget_kw = {row_budget / 1e3:.3f}

[rows.racks]
count = {racks_per_row}
name = "{{row}}-k{{i:02d}}"
limit_kw = {rack_limit / 1e3:.3f}
budget_kw = {rack_budget / 1e3:.3f}
overhead_w = {nodes_per_rack * RACK_OVERHEAD_PER_NODE_W:.0f}

[rows.racks.nodes]
count = {nodes_per_rack}
name = "{{rack}}-n{{i:02d}}"
gpus = {GPUS_PER_NODE}
model = "GB200"
limit_w = 6500
budget_w = 6000
overhead_w = {NODE_OVERHEAD_W:.0f}
"""


def realistic_summaries(
    core: CoordinatorCore, nodes_per_leaf: int, rng: np.random.Generator, ts: float, seq: int
) -> list[Summary | None]:
    """One summary per leaf as a leaf controller would report it (None: a silent leaf).

    Per leaf: a load (GPUs at 35-100 % of their range above the minimum cap), a
    priority mix (Dirichlet over high/normal/low), 1 % of GPUs not commandable
    (offline, at their failsafe power); a tenth of the leaves capping, whose held
    GPUs could draw 20-60 % of their gap to the maximum more.
    """
    n = len(core.specs)
    gpus = nodes_per_leaf * GPUS_PER_NODE
    span = MODEL.cap_max_w - MODEL.cap_min_w
    overhead = nodes_per_leaf * (NODE_OVERHEAD_W + RACK_OVERHEAD_PER_NODE_W)
    silent = rng.random(n) < SILENT_SHARE
    out: list[Summary | None] = []
    for k, spec in enumerate(core.specs):
        if silent[k]:
            out.append(None)
            continue
        load = rng.uniform(0.35, 1.0)
        mix = rng.dirichlet([2.0, 3.0, 1.5])
        offline = 0.01 * gpus
        live = gpus - offline
        above = live * load * span  # commandable GPUs' power above their minimum caps
        capping = rng.random() < CAPPING_SHARE
        cap = MODEL.cap_min_w + (0.8 if capping else 1.0) * span
        held = live * (MODEL.cap_max_w - cap) * rng.uniform(0.2, 0.6) if capping else 0.0
        fixed = overhead + offline * 960.0 + live * MODEL.cap_min_w
        measured = fixed + above
        out.append(
            Summary(
                v=PROTOCOL_VERSION,
                scope=spec.scope.name,
                controller=f"leaf-{spec.scope.name}",
                epoch=1,
                seq=seq,
                ts=ts,
                measured_w=measured,
                predicted_w=measured * rng.uniform(0.98, 1.03),
                cap_sum_w=overhead + offline * 960.0 + live * cap,
                fixed_w=fixed,
                demand_w=[float(above * m) for m in mix],
                held_w=[float(held * m) for m in mix],
                budget_w=spec.file_budget_w,
                file_budget_w=spec.file_budget_w,
                limit_w=spec.limit_w,
                ramp_w_per_s=None,
                nodes=nodes_per_leaf,
                stale_nodes=int(rng.random() < 0.02),
            )
        )
    return out


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    a = np.array(seconds) * 1e3
    return {
        "p50": round(float(np.percentile(a, 50)), 3),
        "p99": round(float(np.percentile(a, 99)), 3),
        "max": round(float(a.max()), 3),
        "mean": round(float(a.mean()), 3),
        "count": len(a),
    }


def coordinator_run(leaves: int, nodes_per_leaf: int, reps: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="bench-tree-coord-") as tmp:
        path = Path(tmp) / "tree.toml"
        path.write_text(tree_budgets(leaves, 1, nodes_per_leaf))
        t0 = time.perf_counter()
        topology = load_budgets(path)
        load_s = time.perf_counter() - t0
    problem = rows_within_site(topology)
    assert problem is None, problem
    scopes = [Scope(row, (row,)) for row in topology.rows]
    ts = time.time()
    clock = {"wall": ts}
    t0 = time.perf_counter()
    core = CoordinatorCore(topology, scopes, "bench", 15.0, wall=lambda: clock["wall"])
    build_s = time.perf_counter() - t0
    core.new_epoch(1)
    leaf_signer, coord_signer = Signer.generate(), Signer.generate()
    verifier = Verifier([leaf_signer.trusted()])  # the service's summaries_from: leaves' keys
    topics = Topics(CLUSTER)

    # one round of summaries, then grants taken: the steady state the timing runs in
    first = realistic_summaries(core, nodes_per_leaf, rng, ts, seq=1)
    for s in first:
        if s is not None:
            core.on_summary(s)
    granted = {g.scope: g for g in core.period().grants}
    summaries = [
        None
        if s is None
        else replace(
            s, seq=2, budget_w=granted[s.scope].budget_w, grant_epoch=1,
            grant_seq=granted[s.scope].seq,
        )
        for s in first
    ]  # fmt: skip
    for s in summaries:
        if s is not None:
            core.on_summary(s)

    def period() -> None:
        core.period()

    def period_sign() -> None:
        p = core.period()
        grant_topic, sign = topics.grant, coord_signer.sign
        for grant in p.grants:
            topic = grant_topic(grant.scope)
            sign(topic, encode(grant))

    period_s = timed(period, reps)
    sign_s = timed(period_sign, reps)
    allocate_cpu = [p.cycle_s for p in [core.period() for _ in range(min(reps, 50))]]

    # inbound: one signed summary per leaf and round, each round newer (seq) than the last
    ingest_reps = max(1, min(reps, 30))
    rounds = []
    for r in range(ingest_reps):
        payloads = []
        for s in summaries:
            if s is None:
                continue
            topic = topics.summary(s.scope)
            body = encode(replace(s, seq=3 + r))
            payloads.append((topic, leaf_signer.sign(topic, body)))
        rounds.append(payloads)
    taken = [0]

    def ingest(payloads: list[tuple[str, bytes]]) -> None:
        for topic, payload in payloads:  # CoordinatorService._on_message, summary branch
            _kind, name = topics.parse(topic)
            summary = verifier.decode(Summary, topic, payload)
            if summary.scope != name:
                raise ProtocolError("wrong scope")
            taken[0] += core.on_summary(summary)

    ingest_s = []
    for payloads in rounds:
        t0 = time.perf_counter()
        ingest(payloads)
        ingest_s.append(time.perf_counter() - t0)
    heard = sum(s is not None for s in summaries)
    assert taken[0] == heard * ingest_reps, (taken[0], heard, ingest_reps)
    last = core.period()
    sample = encode(last.grants[0])
    return {
        "leaves": leaves,
        "leaves_heard": heard,
        "nodes_per_leaf": nodes_per_leaf,
        "tree_nodes": topology.n_nodes,
        "pool_kw": round(leaf_pool_w(topology) / 1e3, 1),
        "rows_budget_kw": round(rows_budget_w(topology) / 1e3, 1),
        "startup_s": {"load_budgets": round(load_s, 3), "build_core": round(build_s, 3)},
        "period_ms": percentiles_ms(period_s),
        "period_cpu_ms_core_reported": percentiles_ms(allocate_cpu),
        "period_encode_sign_ms": percentiles_ms(sign_s),
        "ingest_all_summaries_ms": percentiles_ms(ingest_s),
        "ingest_us_per_summary": round(float(np.median(ingest_s)) / heard * 1e6, 1),
        "sign_us_per_grant": round(
            (float(np.median(sign_s)) - float(np.median(period_s))) / leaves * 1e6, 1
        ),
        "grant_bytes_signed": len(coord_signer.sign(topics.grant(last.grants[0].scope), sample)),
        "reserved_kw_last": round(last.allocation.reserved_w / 1e3, 1),
        "granted_kw_last": round(float(last.allocation.budget_w.sum()) / 1e3, 1),
    }


def timed(fn: Any, reps: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def startup_shape(rows: int, racks: int, nodes: int) -> dict[str, Any]:
    """Loading a site of this shape and building a coordinator over one leaf per row."""
    with tempfile.TemporaryDirectory(prefix="bench-tree-shape-") as tmp:
        path = Path(tmp) / "shape.toml"
        path.write_text(tree_budgets(rows, racks, nodes))
        t0 = time.perf_counter()
        topology = load_budgets(path)
        load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    core = CoordinatorCore(topology, [Scope(r, (r,)) for r in topology.rows], "bench", 15.0)
    build_s = time.perf_counter() - t0
    return {
        "rows": rows,
        "nodes": len(topology.servers),
        "gpus": topology.n_gpus,
        "tree_nodes": topology.n_nodes,
        "load_budgets_s": round(load_s, 2),
        "build_core_s": round(build_s, 2),
        "leaves": len(core.specs),
    }


# --- processes -----------------------------------------------------------------------------


def leaf_config(broker: Mosquitto, out: Path, grid_smoothing: bool = False) -> Path:
    """The leaves' config (one file, each leaf its --name, --scope, --record): signing with
    ``out/leaf.key``, taking grants signed by the coordinator's ``out/coord.pub``
    (``trust.coordinator_keys``); ``grid_smoothing``: each leaf asks its GB200s for their
    share of the whole site's [site.grid]."""
    path = out / "leaf.toml"
    path.write_text(
        f'[controller]\ncluster = "{CLUSTER}"\n'
        + ("grid_smoothing = true\n" if grid_smoothing else "")
        + f'[broker]\nurl = "{broker.url}"\n'
        "[recorder]\nfine_every_s = 10\n"
        f'[trust]\nsigning_key = "{out / "leaf.key"}"\n'
        f'coordinator_keys = ["{out / "coord.pub"}"]\n'
    )
    return path


class Monitor:
    """A paho subscriber on the scopes' summaries and grants, in a thread of this process:
    what the coordinator and the leaves tell each other, with arrival times."""

    def __init__(self, port: int) -> None:
        import paho.mqtt.client as mqtt

        self.messages: list[tuple[float, str, str, dict]] = []  # (wall, kind, scope, body)
        self._lock = threading.Lock()
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-tree-monitor")
        client.username_pw_set(TEST_USER, TEST_PASSWORD)
        client.on_message = self._on_message
        client.connect("127.0.0.1", port, 30)
        prefix = f"powerd/v1/{CLUSTER}/scopes"
        client.subscribe([(f"{prefix}/+/summary", 0), (f"{prefix}/+/grant", 0)])
        client.loop_start()
        self.client = client

    def _on_message(self, _c: Any, _u: Any, message: Any) -> None:
        parts = message.topic.split("/")
        try:
            body = json.loads(message.payload)
        except ValueError:
            return
        with self._lock:
            self.messages.append((time.time(), parts[-1], parts[-2], body))

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()

    def window(self, start: float, end: float) -> list[tuple[float, str, str, dict]]:
        with self._lock:
            return [m for m in self.messages if start <= m[0] <= end]


def machine_cpu() -> dict[str, float]:
    """The machine's CPU time so far by kind (seconds, all CPUs), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    return {n: int(v) / CLK_TCK for n, v in zip(names, fields, strict=False)}


def busy_cores(sample_s: float) -> float:
    """Cores the machine kept busy (anyone's work) over the next ``sample_s`` seconds."""
    a = machine_cpu()
    time.sleep(sample_s)
    b = machine_cpu()
    return sum(b[k] - a[k] for k in a if k not in ("idle", "iowait")) / sample_s


def wait_quiet(max_wait_s: float, below_cores: float = 0.25, sample_s: float = 5.0) -> dict:
    """Wait (up to ``max_wait_s``) until the machine is quiet: other work (tests, builds) on
    a 2-CPU machine moves every number here. What was seen is reported with the results."""
    started = time.monotonic()
    busy = busy_cores(sample_s)
    while busy > below_cores and time.monotonic() - started < max_wait_s:
        busy = busy_cores(sample_s)
    return {"busy_cores_before": round(busy, 3), "waited_s": round(time.monotonic() - started)}


def stop_all(procs: dict[str, subprocess.Popen]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- 2. one leaf, one row ------------------------------------------------------------------


def leaf_run(racks_per_row: int, warmup_s: float, window_s: float, push_every_s: float) -> dict:
    """bench_scale's run over one row, the controller a leaf (``--scope row01``)."""
    scope = "row01"
    with tempfile.TemporaryDirectory(prefix="bench-tree-leaf-") as tmp:
        out = Path(tmp)
        budgets = out / "site.toml"
        budgets.write_text(cut_site(racks_per_row=racks_per_row))
        broker = Mosquitto(out, extra_config="max_queued_messages 5000\n")
        broker.start()
        procs: dict[str, subprocess.Popen] = {}
        try:
            ctl_log = out / "controller.log"
            config = controller_config(broker, out, None)
            procs["controller"] = spawn(
                ["-m", "powerd", "controller", "--config", str(config), "--budgets",
                 str(budgets), "--scope", scope],
                ctl_log,
            )  # fmt: skip
            wait_for_line(ctl_log, "leads with epoch", 60)
            fleet_json, bare_json = out / "fleet.json", out / "bare.json"
            duration_s = warmup_s + window_s + 2.0
            procs["fleet"] = spawn(
                fleet_argv(
                    budgets, broker.url, CLUSTER, fleet_json,
                    trust=out / "controller.pub", scope=scope, period_s=1.0,
                    duration_s=duration_s, warmup_s=warmup_s, push_every_s=push_every_s,
                    start="running",
                ),
                out / "fleet.log",
            )  # fmt: skip
            procs["bare"] = spawn(
                ["-m", "bench.bare_subscriber", "--port", str(broker.port), "--cluster",
                 CLUSTER, "--warmup-s", str(warmup_s), "--seconds", str(window_s),
                 "--json", str(bare_json), "--username", TEST_USER],
                out / "bare.log",
            )  # fmt: skip
            time.sleep(warmup_s)
            pids = {"controller": procs["controller"].pid, "fleet": procs["fleet"].pid}
            if broker._proc:
                pids["mosquitto"] = broker._proc.pid
            cpu0, host0 = {k: cpu_s(p) for k, p in pids.items()}, machine_cpu()
            wall0, mono0 = time.time(), time.monotonic()
            time.sleep(window_s)
            cpu1, host1 = {k: cpu_s(p) for k, p in pids.items()}, machine_cpu()
            wall1, elapsed = time.time(), time.monotonic() - mono0
            busy = sum(host1[k] - host0[k] for k in host0 if k not in ("idle", "iowait"))
            rss_mb, peak_mb = mem_mb(procs["controller"].pid)
            procs["fleet"].wait(timeout=duration_s + 60)
            procs["bare"].wait(timeout=60)
            stop_all({"controller": procs["controller"]})
            fleet = json.loads(fleet_json.read_text())
            bare = json.loads(bare_json.read_text())
            points = decisions(out / "controller.lp", wall0, wall1)
            log_tail = ctl_log.read_text(errors="replace")[-3000:]
        finally:
            stop_all(procs)
            broker.stop()
    s = Scenario(f"leaf {scope}: {fleet['summary']['nodes']} nodes", rows=1)
    result = summarise(s, fleet, bare, points, cpu0, cpu1, elapsed, rss_mb, peak_mb, log_tail)
    result["scope"] = scope
    ours = sum(cpu1[k] - cpu0[k] for k in cpu0) / elapsed + bare["cpu_s"] / bare["seconds"]
    result["machine_cores"] = {
        "busy": round(busy / elapsed, 3),
        "not_ours": round(busy / elapsed - ours, 3),
    }
    return result


# --- 3. the site as a tree -----------------------------------------------------------------


def site_run(
    rows: int,
    racks_per_row: int,
    warmup_s: float,
    window_s: float,
    push_every_s: float,
    period_s: float,
    connections: int,
    control_connections: int,
    grid_smoothing: bool = False,
    keep: Path | None = None,
) -> dict:
    """The site as ``rows`` leaves, a coordinator and a fleet per leaf; its files (logs,
    the leaves' records, the fleets' reports) in a temporary directory, or under ``keep``."""
    scopes = [f"row{k:02d}" for k in range(1, rows + 1)]
    name = f"site{rows}" + ("-grid" if grid_smoothing else "")
    with run_dir(name, keep, temp_prefix="bench-tree-") as out:
        budgets = out / "site.toml"
        budgets.write_text(cut_site(rows=rows, racks_per_row=racks_per_row))
        generate_key_files(out / "leaf")
        generate_key_files(out / "coord")
        broker = Mosquitto(out, extra_config="max_queued_messages 5000\n")
        broker.start()
        procs: dict[str, subprocess.Popen] = {}
        monitor: Monitor | None = None
        marks: dict[str, float] = {"start": time.time()}
        try:
            config = leaf_config(broker, out, grid_smoothing)
            for scope in scopes:  # all at once: each waits its epoch discovery beside the rest
                procs[f"leaf-{scope}"] = spawn(
                    ["-m", "powerd", "controller", "--config", str(config), "--budgets",
                     str(budgets), "--scope", scope, "--name", f"leaf-{scope}",
                     "--record", str(out / f"leaf-{scope}.lp")],
                    out / f"leaf-{scope}.log",
                )  # fmt: skip
            for scope in scopes:
                wait_for_line(out / f"leaf-{scope}.log", "leads with epoch", 180)
            marks["leaves_leading"] = time.time()
            coord_log = out / "coordinator.log"
            procs["coordinator"] = spawn(
                ["-m", "powerd", "coordinator", "--budgets", str(budgets), "--broker",
                 broker.url, "--cluster", CLUSTER, "--name", "coord", "--period-s",
                 str(period_s), "--signing-key", str(out / "coord.key"), "--trust",
                 str(out / "leaf.pub")],
                coord_log,
            )  # fmt: skip
            wait_for_line(coord_log, "leads with epoch", 120)
            marks["coordinator_leading"] = time.time()
            monitor = Monitor(broker.port)
            duration_s = warmup_s + window_s + 5.0
            for k, scope in enumerate(scopes):
                procs[f"fleet-{scope}"] = spawn(
                    fleet_argv(
                        budgets, broker.url, CLUSTER, out / f"fleet-{scope}.json",
                        trust=out / "leaf.pub", scope=scope, period_s=1.0,
                        duration_s=duration_s, warmup_s=warmup_s, push_every_s=push_every_s,
                        start="running", connections=connections,
                        control_connections=control_connections, seed=k + 1,
                    ),
                    out / f"fleet-{scope}.log",
                )  # fmt: skip
            marks["fleets_started"] = time.time()
            time.sleep(warmup_s)
            pids = {k: p.pid for k, p in procs.items()}
            if broker._proc:
                pids["mosquitto"] = broker._proc.pid
            pids["bench (monitor)"] = os.getpid()
            cpu0, host0 = {k: cpu_s(p) for k, p in pids.items()}, machine_cpu()
            wall0, mono0 = time.time(), time.monotonic()
            time.sleep(window_s)
            cpu1, host1 = {k: cpu_s(p) for k, p in pids.items()}, machine_cpu()
            wall1, elapsed = time.time(), time.monotonic() - mono0
            host = {k: round((host1[k] - host0[k]) / elapsed, 3) for k in host0}
            mem = {k: mem_mb(p.pid) for k, p in procs.items() if p.poll() is None}
            for scope in scopes:
                procs[f"fleet-{scope}"].wait(timeout=duration_s + 120)
            stop_all({k: p for k, p in procs.items() if not k.startswith("fleet-")})
            fleets = {s: json.loads((out / f"fleet-{s}.json").read_text()) for s in scopes}
            points = {s: decisions(out / f"leaf-{s}.lp", wall0, wall1) for s in scopes}
            tails = {s: (out / f"leaf-{s}.log").read_text(errors="replace")[-2000:] for s in scopes}
            coord_text = coord_log.read_text(errors="replace")
            seen = monitor.window(wall0, wall1)
        finally:
            if monitor is not None:
                monitor.close()
            stop_all(procs)
            broker.stop()
    return site_summary(
        rows, racks_per_row, scopes, fleets, points, tails, coord_text, seen,
        cpu0, cpu1, host, elapsed, mem, marks, wall0, wall1, period_s, push_every_s,
        grid_smoothing,
    )  # fmt: skip


def fleets_smoothing(fleets: dict[str, dict]) -> dict:
    """The fleets' GPUs under grid smoothing: how fast each fleet's summed draw moved (their
    sum bounds the site's, since each fleet keeps its own rounds), and when every GPU of
    every fleet first held its profile (seconds since the fleets started: each fleet counts
    from its own start, a few ms apart)."""
    ramps = [f["summary"]["gpu_power_w_per_s"] for f in fleets.values()]
    held = [f["summary"]["smoothing"] for f in fleets.values()]

    def worst(key: str) -> float | None:
        values = [h.get(key) for h in held]
        return None if not values or None in values else max(values)

    return {
        "gpu_power_w_per_s": {
            "up_max_sum_of_fleets": round(sum(r["up_max"] or 0.0 for r in ramps), 1),
            "down_max_sum_of_fleets": round(sum(r["down_max"] or 0.0 for r in ramps), 1),
            "up_max_worst_fleet": max((r["up_max"] or 0.0 for r in ramps), default=None),
        },
        "smoothing": {
            "gpus": sum(h["gpus"] for h in held),
            "on_at_end": sum(h["on_at_end"] for h in held),
            "p50_s_worst_fleet": worst("p50_s"),
            "all_s_worst_fleet": worst("all_s"),
        },
    }


def site_summary(
    rows: int,
    racks_per_row: int,
    scopes: list[str],
    fleets: dict[str, dict],
    points: dict[str, list[dict]],
    tails: dict[str, str],
    coord_text: str,
    seen: list[tuple[float, str, str, dict]],
    cpu0: dict[str, float],
    cpu1: dict[str, float],
    host: dict[str, float],
    elapsed: float,
    mem: dict[str, tuple[float, float]],
    marks: dict[str, float],
    wall0: float,
    wall1: float,
    period_s: float,
    push_every_s: float,
    grid_smoothing: bool = False,
) -> dict:
    share = {k: round((cpu1[k] - cpu0[k]) / elapsed, 3) for k in cpu0}
    leaves = []
    for scope in scopes:
        name = f"leaf-{scope}"
        leaf_cpu0 = {"controller": cpu0[name], "fleet": cpu0[f"fleet-{scope}"]}
        leaf_cpu1 = {"controller": cpu1[name], "fleet": cpu1[f"fleet-{scope}"]}
        rss, peak = mem.get(name, (math.nan, math.nan))
        r = summarise(
            Scenario(scope, rows=1), fleets[scope], None, points[scope], leaf_cpu0, leaf_cpu1,
            elapsed, rss, peak, tails[scope],
        )  # fmt: skip
        r["scope"] = scope
        for key in ("bare_us_per_message", "ratio_to_bare", "ingest_share", "scenario"):
            r.pop(key, None)
        leaves.append(r)

    pushes = [p["back_s"] for f in fleets.values() for p in f["pushes"] if p["back_s"] is not None]
    visible = [
        p["back_from_visible_s"]
        for f in fleets.values()
        for p in f["pushes"]
        if p["back_from_visible_s"] is not None
    ]

    def pct(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"p50": None, "p99": None, "max": None, "count": 0}
        a = np.array(values)
        return {
            "p50": round(float(np.percentile(a, 50)), 3),
            "p99": round(float(np.percentile(a, 99)), 3),
            "max": round(float(a.max()), 3),
            "count": len(a),
        }

    # the broker's view: summaries' stale_nodes and grants in force; grants' periods
    summaries = [m for m in seen if m[1] == "summary"]
    grants = [m for m in seen if m[1] == "grant"]
    by_seq: dict[int, list[float]] = defaultdict(list)
    for wall, _, _, body in grants:
        by_seq[int(body.get("seq", -1))].append(wall)
    firsts = sorted(min(v) for v in by_seq.values())
    spreads = [max(v) - min(v) for v in by_seq.values() if len(v) == len(scopes)]
    heard = re.findall(
        r"^(\S+ \S+) INFO powerd.coordinator: period (\d+): site ([\d.]+) kW measured, "
        r"(\d+) leaves heard, (\d+) silent",
        coord_text,
        re.M,
    )
    in_window = []
    for stamp, _seq, kw, n_heard, n_silent in heard:
        try:
            at = dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        if wall0 <= at <= wall1:
            in_window.append((float(kw), int(n_heard), int(n_silent)))

    roles = {
        "leaf controllers": sum(v for k, v in share.items() if k.startswith("leaf-")),
        "fleets": sum(v for k, v in share.items() if k.startswith("fleet-")),
        "coordinator": share.get("coordinator", 0.0),
        "mosquitto": share.get("mosquitto", 0.0),
        "bench (monitor)": share.get("bench (monitor)", 0.0),
    }
    busy = sum(v for k, v in host.items() if k not in ("idle", "iowait"))
    received = sum(r["telemetry_received_per_s"] for r in leaves)
    leaf_cpu = roles["leaf controllers"]
    return {
        "rows": rows,
        "racks_per_row": racks_per_row,
        "nodes": sum(r["nodes"] for r in leaves),
        "window_s": round(elapsed, 1),
        "coordinator_period_s": period_s,
        "push_every_s_per_fleet": push_every_s,
        "startup_s": {
            "leaves_leading": round(marks["leaves_leading"] - marks["start"], 1),
            "coordinator_leading": round(marks["coordinator_leading"] - marks["start"], 1),
        },
        "telemetry_offered_per_s": sum(r["telemetry_offered_per_s"] for r in leaves),
        "telemetry_received_per_s": received,
        "leaf_us_per_message_mean": round(leaf_cpu / max(received, 1) * 1e6, 1),
        "stale_nodes_max": max((r["stale_nodes_max"] or 0) for r in leaves),
        "stale_nodes_max_from_summaries": max(
            (int(b.get("stale_nodes", 0)) for _, _, _, b in summaries), default=None
        ),
        "heartbeat_gap_max_s": max((r["heartbeat_gap_s"]["max"] or 0) for r in leaves),
        "epochs_per_scope_max": max(len(r["fleet_epochs"]) for r in leaves),
        "reaction_s": pct(pushes),
        "reaction_from_visible_s": pct(visible),
        "pushes": sum(r["pushes"] for r in leaves),
        "commands": sum(r["commands"] for r in leaves),
        "resends": sum(r["resends"] for r in leaves),
        "telemetry_dropped": sum(r["telemetry_dropped"] for r in leaves),
        "telemetry_lost": sum(r["telemetry_lost"] for r in leaves),
        "cycle_s_max": max(r["cycle_s_max"] for r in leaves),
        "fleet_failsafe_entries": sum(r["fleet_failsafe_entries"] for r in leaves),
        "cpu_cores_by_role": {k: round(v, 3) for k, v in roles.items()},
        "cpu_cores_total": round(sum(roles.values()), 3),
        # the whole machine (all CPUs, /proc/stat), cores: what no process is charged with
        # (softirq: the loopback traffic) shows here
        "machine_cores": {
            "cpus": os.cpu_count(),
            "busy": round(busy, 3),
            "not_ours": round(busy - sum(roles.values()), 3),  # other processes, kernel
            **{k: v for k, v in host.items() if k in ("user", "system", "softirq", "idle")},
        },
        "cpu_share_of_one_core": share,
        "rss_mb": {k: round(v[0], 1) for k, v in mem.items()},
        "grid_smoothing": grid_smoothing,
        **fleets_smoothing(fleets),
        "coordinator": {
            "periods_in_window": len(firsts),
            "grant_interval_s": pct(list(np.diff(firsts))) if len(firsts) > 1 else pct([]),
            "grants_spread_s": pct(spreads),
            "leaves_heard_min": min((h for _, h, _ in in_window), default=None),
            "leaves_silent_max": max((s for _, _, s in in_window), default=None),
            "site_measured_kw_last": in_window[-1][0] if in_window else None,
        },
        "summaries_per_s": round(len(summaries) / max(elapsed, 1e-9), 1),
        "summaries_with_grant_share": round(
            sum(b.get("grant_seq") is not None for _, _, _, b in summaries)
            / max(len(summaries), 1),
            3,
        ),
        "leaves": leaves,
    }


# --- main ----------------------------------------------------------------------------------


def head_commit() -> str | None:
    """The checked-out commit (other edits may sit on top of it, uncommitted)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="coordinator,leaf,site")
    parser.add_argument("--leaves", default="100,1000", help="coordinator sizes (leaves)")
    parser.add_argument("--nodes-per-leaf", type=int, default=4)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--startup-shape", default="100,70,18", help="rows,racks,nodes; '' none")
    parser.add_argument("--racks-per-row", type=int, default=72, help="cut the site's rows")
    parser.add_argument("--leaf-warmup-s", type=float, default=15.0)
    parser.add_argument("--leaf-window-s", type=float, default=40.0)
    parser.add_argument("--site-rows", default="16", help="site runs: rows of the 150 MW site")
    parser.add_argument("--site-warmup-s", type=float, default=30.0)
    parser.add_argument("--site-window-s", type=float, default=60.0)
    parser.add_argument("--push-every-s", type=float, default=2.0, help="per fleet")
    parser.add_argument("--period-s", type=float, default=5.0, help="the coordinator's")
    parser.add_argument("--fleet-connections", type=int, default=1)
    parser.add_argument("--fleet-control-connections", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--grid-smoothing",
        action="store_true",
        help="site runs: every leaf with grid_smoothing (its GB200s asked for their share)",
    )
    parser.add_argument(
        "--keep-dir",
        type=Path,
        help="site runs: keep each run's files (logs, records, fleet reports) under this",
    )
    parser.add_argument(
        "--wait-quiet-s",
        type=float,
        default=0.0,
        help="before each part, wait up to this long for the machine to be idle (shared hosts)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - {"coordinator", "leaf", "site"}
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    result: dict[str, Any] = {
        "benchmark": "tree",
        "machine": machine(),
        "command": "python -m bench.bench_tree " + " ".join(sys.argv[1:]),
        "budgets": SITE_FILE,
        "date": dt.date.today().isoformat(),
        "commit": head_commit(),
    }
    quiet = (lambda: wait_quiet(args.wait_quiet_s)) if args.wait_quiet_s > 0 else (lambda: None)
    if "coordinator" in parts:
        runs = []
        for n in ints(args.leaves):
            print(f"coordinator: {n} leaves ...", file=sys.stderr, flush=True)
            seen = quiet()
            runs.append(coordinator_run(n, args.nodes_per_leaf, args.reps, args.seed))
            runs[-1]["quiet"] = seen
        result["coordinator"] = runs
        if args.startup_shape:
            rows, racks, nodes = ints(args.startup_shape)
            print(f"coordinator startup: {rows}x{racks}x{nodes} ...", file=sys.stderr, flush=True)
            result["coordinator_startup_shape"] = startup_shape(rows, racks, nodes)
    if "leaf" in parts:
        print("leaf: row01 ...", file=sys.stderr, flush=True)
        seen = quiet()
        result["leaf"] = leaf_run(
            args.racks_per_row, args.leaf_warmup_s, args.leaf_window_s, args.push_every_s
        )
        result["leaf"]["quiet"] = seen
    if "site" in parts:
        result["site"] = []
        for rows in ints(args.site_rows):
            print(f"site: {rows} rows as a tree ...", file=sys.stderr, flush=True)
            seen = quiet()
            result["site"].append(
                site_run(
                    rows, args.racks_per_row, args.site_warmup_s, args.site_window_s,
                    args.push_every_s, args.period_s, args.fleet_connections,
                    args.fleet_control_connections, args.grid_smoothing, args.keep_dir,
                )
            )  # fmt: skip
            result["site"][-1]["quiet"] = seen
    report(result, args.json)


if __name__ == "__main__":
    main()
