"""Agent cost: CPU time per sample and resident memory, 8 simulated GPUs, real Mosquitto.

Runs ``powerd agent --simulate 8xH100`` as its own process against a
Mosquitto started here, lets it warm up, then reads the process's CPU time
(utime + stime from /proc) and memory (VmRSS, VmHWM) over a measured window,
counting the telemetry samples it published with a subscriber.

Two runs: the target rate (1 Hz, the default period) for the real CPU share,
and a fast rate (20 Hz) whose many samples give a precise CPU time per sample.

    python -m bench.bench_agent [--seconds 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import cpu_s, machine, mem_mb, report
from powerd.mqtt.url import PASSWORD_ENV
from tests.support.brokers import TEST_PASSWORD, Mosquitto, MqttProbe

GPUS = "8xH100"


async def measure(broker: Mosquitto, period_s: float, window_s: float) -> dict:
    node = f"bench-{int(period_s * 1000)}ms"
    topic = f"powerd/v1/bench/nodes/{node}/telemetry"
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "powerd.cli",
            "agent",
            "--simulate",
            GPUS,
            "--broker",
            broker.url,
            "--cluster",
            "bench",
            "--node",
            node,
            "--period-s",
            str(period_s),
            "--local",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, PASSWORD_ENV: TEST_PASSWORD},  # the broker's login (its url names it)
    )
    try:
        async with MqttProbe(broker.port, [topic]) as probe:
            await probe.expect(topic, timeout_s=60)
            await asyncio.sleep(max(3.0, 3 * period_s))  # warm-up: imports done, caches filled
            start_msgs, start_cpu, start_t = probe.mark(), cpu_s(agent.pid), time.monotonic()
            await asyncio.sleep(window_s)
            samples = probe.mark() - start_msgs
            used_cpu, elapsed = cpu_s(agent.pid) - start_cpu, time.monotonic() - start_t
            rss, hwm = mem_mb(agent.pid)
    finally:
        agent.terminate()
        agent.wait(20)
    return {
        "period_s": period_s,
        "window_s": round(elapsed, 2),
        "samples": samples,
        "cpu_s": round(used_cpu, 3),
        "cpu_ms_per_sample": round(1000 * used_cpu / max(samples, 1), 3),
        "cpu_pct_of_one_core": round(100 * used_cpu / elapsed, 3),
        "rss_mb": round(rss, 1),
        "peak_rss_mb": round(hwm, 1),
    }


async def main_async(seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        broker = Mosquitto(Path(tmp))
        broker.start()
        try:
            at_1hz = await measure(broker, 1.0, seconds)
            at_20hz = await measure(broker, 0.05, seconds / 2)
        finally:
            broker.stop()
    return {
        "benchmark": "agent",
        "gpus": GPUS,
        "machine": machine(),
        "command": f"python -m bench.bench_agent --seconds {seconds:g}",
        "at_1hz": at_1hz,
        "at_20hz": at_20hz,
        "targets": {"cpu_pct_of_one_core_at_1hz": 1.0, "rss_mb": 80.0},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window at 1 Hz")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    result = asyncio.run(main_async(args.seconds))
    report(result, args.json)


if __name__ == "__main__":
    main()
