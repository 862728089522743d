"""Controller cost at site scale: the work of one control cycle, without the network.

Loads a budgets file (default: the shipped 150 MW / 82,944-GPU site), feeds the
controller's core one telemetry message per node (encoded protocol payloads,
as they arrive from the broker), then times, per cycle:

- ``ingest``: decoding and taking in every node's telemetry, in the service's
  batches (the ingest loop's work for one telemetry period; receiving it is
  ``bench/bench_scale.py``'s),
- ``cycle``: ``ControllerCore.cycle()``: arrays, ``policies.decide``, commands,
- ``job_causes``: of the cycle, what held each job's GPUs (``powerd.controller.job_causes``),
- ``sign``: encoding and signing every command of the cycle (Ed25519), as the
  service does before publishing them,
- ``records``: building the recorder's ``tree`` and ``decision`` points,
- ``gpu_records``: building the ``gpu`` points of every telemetry message.

Between cycles a tenth of the racks change load (so commands are sent), the
rest stay put. Times are medians over ``--cycles`` after a warm-up: one cycle,
and with ``--fine-every-s`` one recording window more. With ``--smoothing``
every GPU reports a smoothing state (as Blackwell GPUs, or agents with
``software_smoothing``, do: on one sample in ``SMOOTHING_STATE_EVERY_SAMPLES``
when it does not change) and the controller runs with ``grid_smoothing``. With ``--jobs N``
N synchronous jobs split the nodes (announced as a job hook does, a long list as a host
list) and announce their phases: each computes nine cycles and waits one
(``communication``), the jobs out of step, so every cycle builds the policy's per-GPU
priority, phase and phase times from the jobs (``ControllerCore.cluster_state``).

    python -m bench.bench_controller [--budgets FILE] [--cycles 10] [--smoothing] [--jobs N]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import machine, report
from powerd.controller.config import ControllerConfig
from powerd.controller.core import ControllerCore
from powerd.controller.inbox import Waiting
from powerd.controller.job_causes import JobHeld
from powerd.controller.records import Records
from powerd.controller.service import INGEST_BATCH
from powerd.controller.smoothing import grid_smoothing
from powerd.protocol import (
    SMOOTHING_STATE_EVERY_SAMPLES,
    GpuSmoothingState,
    GpuTelemetry,
    Phase,
    PhaseEvent,
    Telemetry,
    Topics,
    encode,
    job_nodes_fields,
)
from powerd.signing import Signer
from powerd.telemetry_schema import JOB_HELD
from powerd.topology import load_budgets

# the bench's wall clock is its monotonic one plus this (telemetry, phases and points on it)
WALL_OFFSET_S = 1.7e9


def telemetry_payloads(
    topology,
    tree,
    power_w: np.ndarray,
    cap_w: np.ndarray,
    seq: int,
    ts: float,
    smoothing: GpuSmoothingState | None = None,
    state_every: int = SMOOTHING_STATE_EVERY_SAMPLES,
) -> list[tuple[str, bytes]]:
    """Every node's telemetry; with ``smoothing``, each node's GPUs carry it on one sample in
    ``state_every`` (agents send an unchanged state every SMOOTHING_STATE_EVERY_SAMPLES),
    nodes staggered."""
    out = []
    for k, name in enumerate(topology.servers):
        state = smoothing if (seq + k) % state_every == 0 else None
        gpus = topology.server_gpus(name)
        out.append(
            (
                name,
                encode(
                    Telemetry(
                        v=1,
                        node=name,
                        ts=ts,
                        seq=seq,
                        mode="controlled",
                        gpus=[
                            GpuTelemetry(
                                index=k,
                                uuid=f"GPU-{name}-{k}",
                                power_w=float(power_w[i]),
                                energy_j=1e9,
                                cap_w=float(cap_w[i]),
                                cap_min_w=float(tree.cap_min_w[i]),
                                cap_max_w=float(tree.cap_max_w[i]),
                                sm_clock_mhz=1800,
                                max_sm_clock_mhz=None,
                                util_pct=95.0,
                                temp_c=60.0,
                                smoothing=state,
                            )
                            for k, i in enumerate(gpus)
                        ],
                    )
                ),
            )
        )
    return out


def run(
    budgets: Path,
    cycles: int,
    seed: int = 1,
    fine_every_s: float = 0.0,
    smoothing: bool = False,
    state_every: int = SMOOTHING_STATE_EVERY_SAMPLES,
    jobs: int = 0,
) -> dict:
    topology = load_budgets(budgets)
    tree = topology.tree
    config = ControllerConfig(name="bench", cluster="bench", grid_smoothing=smoothing)
    settings = config.settings()
    state = None
    if smoothing:
        profile = grid_smoothing(topology)
        settings = dataclasses.replace(settings, smoothing=profile)
        state = GpuSmoothingState(enabled=True, preset=profile.preset, floor_percent=80.0)
    clock = [1000.0]
    core = ControllerCore(
        tree,
        settings,
        monotonic=lambda: clock[0],
        wall=lambda: clock[0] + WALL_OFFSET_S,
    )
    core.new_epoch(1)
    names = list(tree.server_ordinal)
    job_names = [f"job{j}" for j in range(jobs)]
    for j, job in enumerate(job_names):  # each job announced with its share of the nodes
        nodes = names[j * len(names) // jobs : (j + 1) * len(names) // jobs]
        fields = job_nodes_fields(nodes)  # a long list as a host list, as a job hook sends it
        event = PhaseEvent(v=1, job=job, ts=clock[0] + WALL_OFFSET_S, phase="startup", **fields)
        core.on_phase(job, encode(event))
    records = Records("bench", topology, "bench", fine_every_s=fine_every_s)
    held_s = _timed_job_causes(core)
    rng = np.random.default_rng(seed)
    n = tree.n_gpus
    power = rng.uniform(750.0, 950.0, n)
    cap = tree.cap_max_w.astype(float).copy()
    gpu_rack = tree.gpu_ancestor[2]
    racks = np.unique(gpu_rack)
    timings: dict[str, list[float]] = {
        "ingest": [],
        "cycle": [],
        "job_causes": [],
        "sign": [],
        "records": [],
        "gpu_records": [],
    }
    signer, topics = Signer.generate(), Topics("bench")
    commands_sent = []
    # warm-up: one cycle, and with fine_every_s one window, so every GPU's tag prefix is
    # built once (what a running controller has long done) before anything is timed
    warmup = 1 + math.ceil(fine_every_s)
    for c in range(cycles + warmup):
        for j, job in enumerate(job_names):  # nine cycles of compute, one of communication
            phase: Phase = "communication" if (c + j) % 10 == 9 else "compute"
            event = PhaseEvent(v=1, job=job, ts=clock[0] + WALL_OFFSET_S, phase=phase)
            core.on_phase(job, encode(event))
        hot = np.isin(gpu_rack, rng.choice(racks, max(1, len(racks) // 10), replace=False))
        power = np.where(hot, rng.uniform(1100.0, 1200.0, n), power)
        payloads = telemetry_payloads(
            topology,
            tree,
            np.minimum(power, cap),
            cap,
            c,
            clock[0] + WALL_OFFSET_S,
            state,
            state_every,
        )
        t0 = time.perf_counter()
        samples = []
        for first in range(0, len(payloads), INGEST_BATCH):  # as the service takes the inbox
            batch = payloads[first : first + INGEST_BATCH]
            samples += core.ingest(
                [
                    Waiting(core.tree.server_ordinal[name], payload, clock[0], 0)
                    for name, payload in batch
                ]
            )
        t1 = time.perf_counter()
        result = core.cycle()
        t2 = time.perf_counter()
        for node, command in result.commands:
            topic = topics.command(node)
            signer.sign(topic, encode(command))
        t2s = time.perf_counter()
        lines = records.cycle(core, result, clock[0] + WALL_OFFSET_S)
        t3 = time.perf_counter()
        n_gpu_lines = sum(len(records.telemetry(core, s)) for s in samples)
        t4 = time.perf_counter()
        cap = result.decision.cap_w.copy()
        timed = result.state.phase_s if result.state is not None else None
        gpus_timed = int(np.isfinite(timed).sum()) if timed is not None else 0
        clock[0] += 1.0
        for node, _ in result.commands:  # every command acknowledged at once
            core.pending.pop(core.tree.server_ordinal[node], None)
        if c < warmup:
            continue  # warm-up
        timings["ingest"].append(t1 - t0)
        timings["cycle"].append(t2 - t1)
        timings["job_causes"].append(held_s[-1])
        timings["sign"].append(t2s - t2)
        timings["records"].append(t3 - t2s)
        timings["gpu_records"].append(t4 - t3)
        commands_sent.append(len(result.commands))
    return {
        "budgets": str(budgets),
        "gpus": n,
        "nodes": len(topology.servers),
        "tree_nodes": topology.n_nodes,
        "cycles": cycles,
        "fine_every_s": fine_every_s,
        "smoothing": smoothing,
        "states_every": state_every if smoothing else None,
        "jobs": jobs,
        "gpus_in_announced_phases_last_cycle": gpus_timed,
        "median_ms": {k: round(statistics.median(v) * 1e3, 1) for k, v in timings.items()},
        "max_ms": {k: round(max(v) * 1e3, 1) for k, v in timings.items()},
        "tree_points_last_cycle": sum(not line.startswith(JOB_HELD.name + ",") for line in lines),
        "job_held_points_last_cycle": sum(line.startswith(JOB_HELD.name + ",") for line in lines),
        "gpu_points_last_cycle": n_gpu_lines,
        "median_commands_per_cycle": statistics.median(commands_sent),
    }


def _timed_job_causes(core: ControllerCore) -> list[float]:
    """Time ``core.job_causes.step`` within each cycle: the seconds, one a cycle."""
    held_s: list[float] = []
    step = core.job_causes.step

    def timed(*args: Any, **kwargs: Any) -> list[JobHeld]:
        t = time.perf_counter()
        out = step(*args, **kwargs)
        held_s.append(time.perf_counter() - t)
        return out

    core.job_causes.step = timed  # type: ignore[method-assign]
    return held_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = resources.files("powerd.data").joinpath("budgets/site-150mw.toml")
    parser.add_argument("--budgets", type=Path, default=Path(str(default)))
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument(
        "--fine-every-s", type=float, default=0.0, help="recorder.fine_every_s (0: every sample)"
    )
    parser.add_argument(
        "--smoothing",
        action="store_true",
        help="every GPU reports a smoothing state; the controller runs with grid_smoothing",
    )
    parser.add_argument(
        "--states-every",
        type=int,
        default=SMOOTHING_STATE_EVERY_SAMPLES,
        help="with --smoothing: a node's GPUs carry their state on one sample in this many "
        "(1: every sample, as agents did before 2026-11-26)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="this many synchronous jobs split the nodes and announce compute and communication",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if args.jobs < 0:
        parser.error("--jobs must be 0 or more")
    result = run(
        args.budgets,
        args.cycles,
        fine_every_s=args.fine_every_s,
        smoothing=args.smoothing,
        state_every=args.states_every,
        jobs=args.jobs,
    )
    result["machine"] = machine()
    result["command"] = "python -m bench.bench_controller " + " ".join(sys.argv[1:])
    report(result, args.json)


if __name__ == "__main__":
    main()
