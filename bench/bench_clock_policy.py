"""Clocks that follow the phase: the demo with the agents' clock policies off and on.

    python -m bench.bench_clock_policy --json bench/results/clock_policy.json

Runs ``powerd demo`` (``--duration-s``, default 20 s, no live view) once per
communication clock and mode, each in this process one after the other: the
controller locks clocks itself a cycle late (``controller.agent_comm_clock``
off) or grants the agents a clock policy and they lock and unlock on the jobs'
announcements (on). The clocks: the budgets file's own (``--budgets``, default
the shipped demo.toml), and each ``--clock-mhz`` given, written into a copy of
it as ``comm_clock_mhz``. Reports per run the GPU-seconds locked while
computing and outside communication (booked exactly at every phase change and
lock; the 0.1 s samples beside them), the share of communication locked, the
GPUs' energy in communication, and the throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import machine, report
from powerd.demo import runner

DEMO = Path(runner.__file__).resolve().parent.parent / "data" / "budgets" / "demo.toml"


def with_clock(budgets: Path, clock_mhz: float, directory: Path) -> Path:
    """A copy of ``budgets`` whose GPU models lock communication at ``clock_mhz``."""
    text = re.sub(
        r"^comm_(max_slowdown|clock_mhz) = .*$",
        f"comm_clock_mhz = {clock_mhz:g}",
        budgets.read_text(encoding="utf-8"),
        flags=re.M,
    )
    path = directory / f"{budgets.stem}-{clock_mhz:g}mhz.toml"
    path.write_text(text, encoding="utf-8")
    return path


def one_run(budgets: Path, agent_clocks: bool, duration_s: float) -> dict[str, Any]:
    options = runner.DemoOptions(
        duration_s=duration_s, budgets=budgets, agent_comm_clock=agent_clocks
    )
    run = asyncio.run(runner.run_demo(options))
    summary, locks = run.summary, run.summary.clock_locks
    return {
        "comm_clock_mhz": dict(run.topology.comm_clock_mhz),
        "agent_comm_clock": agent_clocks,
        "locked_computing_gpu_s": locks["exact_progress_gpu_s"],
        "locked_outside_communication_gpu_s": locks["exact_outside_communication_gpu_s"],
        "locked_outside_communication_sampled_gpu_s": locks["outside_communication_gpu_s"],
        "communication_locked_share": locks["communication_locked_share"],
        "communication_energy_wh": locks["communication_energy_wh"],
        "throughput_rel": summary.throughput_rel,
        "throughput_lost_to_clock_locks": summary.throughput_lost_by_cause["clock lock"],
        "wall_s": run.wall_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=Path, default=DEMO)
    parser.add_argument("--clock-mhz", type=float, action="append", default=[])
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="powerd-bench-clock-") as tmp:
        files = [args.budgets, *(with_clock(args.budgets, c, Path(tmp)) for c in args.clock_mhz)]
        for budgets in files:
            for agent_clocks in (False, True):
                runs.append(one_run(budgets, agent_clocks, args.duration_s))
    report(
        {
            "command": "python -m bench.bench_clock_policy " + " ".join(sys.argv[1:]),
            "machine": machine(),
            "duration_s": args.duration_s,
            "runs": runs,
        },
        args.json,
    )


if __name__ == "__main__":
    main()
