"""The controller records to a real VictoriaMetrics; the store goes down for a few cycles and
comes back: every point stamped during the outage arrives afterwards, with its own timestamp,
nothing is dropped, and the control loop never waited for the store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from powerd.recorder import open_recorder
from tests.support.controller_harness import CYCLE_S, SERVERS, running_cluster, until
from tests.support.tsdb import Series, VictoriaMetrics

# quick flushes and retries: a test does not wait out a production backoff
FAST = {"flush_interval_s": 0.05, "retry_min_s": 0.05, "retry_max_s": 0.2, "timeout_s": 2}
OUTAGE_CYCLES = 6


@pytest.fixture
def vm(tmp_path: Path) -> Iterator[VictoriaMetrics]:
    server = VictoriaMetrics(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def stamped_between(series: list[Series], start_s: float, end_s: float) -> int:
    """Samples whose timestamps fall inside [start_s, end_s] (wall clock)."""
    lo, hi = start_s * 1000, end_s * 1000
    return sum(1 for s in series for ts in s.timestamps_ms if lo <= ts <= hi)


async def test_points_stamped_during_a_store_outage_arrive_after_it(mosquitto, vm):
    recorder = open_recorder(vm.recorder_url(org="o", bucket="b", **FAST))
    async with running_cluster(mosquitto, phase="compute", recorder=recorder) as cluster:
        ctl = cluster.controller
        await asyncio.to_thread(vm.wait_for_samples, '{__name__="decision_epoch"}', 2)

        await asyncio.to_thread(vm.stop)  # SIGTERM, waits for the exit: the port is closed
        down_from = time.time()
        written = recorder.written
        outage = await ctl.wait_cycles(OUTAGE_CYCLES)
        down_until = time.time()
        assert recorder.buffered > 0
        assert recorder.written == written  # nothing got through while it was down
        assert recorder.write_errors > 0

        await asyncio.to_thread(vm.start)  # same port, same data directory
        await until(lambda: recorder.buffered == 0, what="buffer written out")
        assert recorder.written > written
        await ctl.wait_cycles(2)
    # the service closed the recorder on its way out, flushing what was left
    assert recorder.dropped == 0
    assert recorder.buffered == 0

    # the control loop kept its pace through the outage: write() never waited on the network
    assert max(c.dt_s for c in outage) < 2 * CYCLE_S

    # Every cycle's decision point, before, during and after the outage, arrived exactly once
    # (polled: VictoriaMetrics makes what it accepted searchable a moment later).
    decision = await asyncio.to_thread(
        vm.wait_for,
        '{__name__="decision_cycle_s", cluster="ctltest"}',
        lambda ss: sum(len(s.timestamps_ms) for s in ss) >= len(ctl.cycles),
    )
    assert sum(len(s.timestamps_ms) for s in decision) == len(ctl.cycles)
    # what was stamped while the store was down is there, at its own time
    assert stamped_between(decision, down_from, down_until) >= OUTAGE_CYCLES - 1
    tree = vm.export('{__name__="tree_power_w", cluster="ctltest", level="rack"}')
    assert {s.labels["name"] for s in tree} == {"r1-k1", "r1-k2"}
    assert stamped_between(tree, down_from, down_until) >= 2 * (OUTAGE_CYCLES - 1)
    gpu = vm.export('{__name__="gpu_power_w", cluster="ctltest"}')
    assert {s.labels["node"] for s in gpu} == set(SERVERS)
    # 16 GPUs, 10 samples a second each: most of the outage's samples made it
    seconds = down_until - down_from
    assert stamped_between(gpu, down_from, down_until) >= 16 * 10 * seconds * 0.5
