"""The controller's /metrics at site scale: what one cycle's update and one scrape cost.

Loads a budgets file (default: the shipped 150 MW site, 20,736 nodes, ~23,000 tree
nodes), builds a real ``ControllerService`` (never connected) with its metrics feed,
gives its core node modes and arrival times as telemetry would, runs one control cycle,
then times, as medians over ``--repeats``:

- ``update_s``: the cycle listener's work (``ControllerFeed.on_cycle``: node counts by
  mode, the site/row/rack arrays copied), on the control loop, once a cycle;
- ``scrape_s``: one ``/metrics`` body built from it (``generate_latest``), in the
  server's thread, once a scrape;
- ``cycle_s``: the control cycle itself, for scale.

    python -m bench.bench_metrics [--budgets FILE] [--repeats 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from importlib import resources
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from bench.common import machine, report
from powerd.controller.config import ControllerConfig
from powerd.controller.core import ControllerCore
from powerd.controller.metrics_feed import ControllerFeed
from powerd.controller.service import ControllerService
from powerd.signing import Signer
from powerd.topology import load_budgets


def run(budgets: Path, repeats: int) -> dict[str, object]:
    topology = load_budgets(budgets)
    config = ControllerConfig(name="bench", cluster="bench")
    clock = [1000.0]
    core = ControllerCore(topology.tree, config.settings(), monotonic=lambda: clock[0])
    service = ControllerService(
        config, core, signer=Signer.generate(), topology=topology, monotonic=lambda: clock[0]
    )
    views, n = core.views, topology.tree.n_servers
    rng = np.random.default_rng(1)
    views.mode[:] = rng.choice(["controlled", "failsafe", "local"], n, p=[0.98, 0.015, 0.005])
    views.last_seen[:] = clock[0] - rng.uniform(0.0, 8.0, n)  # some stale
    started = time.perf_counter()
    result = core.cycle()
    cycle_s = time.perf_counter() - started
    feed = ControllerFeed(service)
    service.lead.leadership.leading = True  # what a scrape of the leader shows
    registry = CollectorRegistry(auto_describe=False)
    registry.register(feed.metrics)
    updates, scrapes, size = [], [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        feed.on_cycle(result)
        updates.append(time.perf_counter() - started)
        started = time.perf_counter()
        size = len(generate_latest(registry))
        scrapes.append(time.perf_counter() - started)
    return {
        "budgets": str(budgets),
        "nodes": n,
        "levels": int(np.count_nonzero(topology.tree.level < 3)),
        "cycle_s": round(cycle_s, 4),
        "update_s": round(statistics.median(updates), 6),
        "scrape_s": round(statistics.median(scrapes), 4),
        "scrape_bytes": size,
        "machine": machine(),
    }


def main() -> None:
    default = resources.files("powerd.data").joinpath("budgets/site-150mw.toml")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", type=Path, default=Path(str(default)))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report(run(args.budgets, args.repeats), args.json)


if __name__ == "__main__":
    main()
