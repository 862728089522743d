"""What ``powerd.jobhook.attach_ddp`` costs a training step: two gloo ranks on the CPU.

    python -m bench.bench_ddp_hook --json bench/results/ddp_hook.json

Each rank trains a small model of ``--layers`` linear layers, one bucket each
(``bucket_cap_mb`` small), ``--steps`` steps after ``--warmup`` (``torch.distributed``,
gloo, two processes by ``torch.multiprocessing``), in turn with DDP's built-in all-reduce,
with ``allreduce_hook`` registered (what ``attach_ddp`` wraps) and with ``attach_ddp``
publishing to a real Mosquitto started here; ``--rounds`` times each, interleaved.
Reports rank 0's mean step time of each round and the difference per step and per bucket.
Needs PyTorch (``pip install torch==2.13.0``: a CPU build) and mosquitto.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import machine, report
from powerd.jobhook import ENV_BROKER, ENV_CLUSTER, ENV_JOB, ENV_NODES
from powerd.mqtt.url import PASSWORD_ENV
from tests.support.brokers import TEST_PASSWORD, Mosquitto

MODES = ("builtin", "allreduce_hook", "attach_ddp")
WIDTH = 256


def _rank(rank: int, mode: str, args: Any, init: str, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    from powerd.jobhook import attach_ddp

    torch.set_num_threads(1)
    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    torch.manual_seed(rank)
    net = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(args.layers)))
    bucket_mb = WIDTH * (WIDTH + 1) * 4 / 2**20  # a layer a bucket
    model = DistributedDataParallel(net, bucket_cap_mb=bucket_mb)
    phases = None
    if mode == "allreduce_hook":
        model.register_comm_hook(None, allreduce_hook)
    elif mode == "attach_ddp":
        phases = attach_ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    batch = torch.randn(16, WIDTH)
    started = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            dist.barrier()
            started = time.perf_counter()
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    elapsed_s = time.perf_counter() - started
    if phases is not None:
        phases.close(2.0)
    if rank == 0:
        out.write_text(f"{elapsed_s / args.steps}\n")
    dist.barrier()  # neither rank tears gloo down while the other still talks to it
    dist.destroy_process_group()


def one_run(mode: str, args: Any, where: Path) -> float:
    import torch.multiprocessing as mp

    out = where / f"{mode}.txt"
    store = where / f"store-{mode}-{time.monotonic_ns()}"
    mp.spawn(_rank, args=(mode, args, f"file://{store}", out), nprocs=2, join=True)
    return float(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--mode", action="append", choices=MODES, help="Only these (repeat; default: all)."
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    modes = tuple(args.mode or MODES)
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as tmp:
        where = Path(tmp)
        broker = Mosquitto(where)
        broker.start()
        try:
            os.environ.update(
                {
                    ENV_BROKER: broker.url,
                    ENV_CLUSTER: "bench",
                    ENV_JOB: "ddp-bench",
                    ENV_NODES: "n1",
                    PASSWORD_ENV: TEST_PASSWORD,
                }
            )
            step_s: dict[str, list[float]] = {m: [] for m in modes}
            for _ in range(args.rounds):
                for mode in modes:
                    step_s[mode].append(one_run(mode, args, where))
        finally:
            broker.stop()
    mean_ms = {m: 1e3 * statistics.fmean(v) for m, v in step_s.items()}
    both = {"attach_ddp", "allreduce_hook"} <= set(modes)
    hooked_ms = mean_ms["attach_ddp"] - mean_ms["allreduce_hook"] if both else None
    report(
        {
            "machine": machine(),
            "command": " ".join(["python -m bench.bench_ddp_hook", *sys.argv[1:]]),
            "layers_buckets": args.layers,
            "steps": args.steps,
            "step_ms_each_round": {m: [round(1e3 * s, 3) for s in v] for m, v in step_s.items()},
            "step_ms_mean": {m: round(v, 3) for m, v in mean_ms.items()},
            "attach_ddp_over_allreduce_hook_ms_per_step": (
                None if hooked_ms is None else round(hooked_ms, 3)
            ),
            "attach_ddp_over_allreduce_hook_us_per_bucket": (
                None if hooked_ms is None else round(1e3 * hooked_ms / args.layers, 1)
            ),
        },
        args.json,
    )


if __name__ == "__main__":
    main()
