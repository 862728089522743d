"""A fake training loop that announces its phases to powerd, without torch.

    python examples/train_loop.py --broker mqtt://127.0.0.1:1883 --job demo-job --steps 20

Watch it with ``mosquitto_sub -v -t 'powerd/v1/+/jobs/+/phase'``. Compute is
``time.sleep``; every few steps there is an all-reduce-like communication
section, an evaluation and a checkpoint. Stop the broker while it runs: the
loop does not slow down, and the summary at the end counts what was dropped.
Only rank 0 publishes (``$RANK``, as torchrun sets it; 0 when unset).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from powerd.jobhook import PhaseReporter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=os.environ.get("POWERD_BROKER", ""))
    parser.add_argument("--job", default=os.environ.get("POWERD_JOB", "demo-job"))
    parser.add_argument("--cluster", default=os.environ.get("POWERD_CLUSTER", "default"))
    parser.add_argument("--priority", default="normal", choices=("high", "normal", "low"))
    parser.add_argument(
        "--nodes", default="", help="comma-separated node names (default: this host)"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-s", type=float, default=0.2, help="compute time per step")
    parser.add_argument("--comm-s", type=float, default=0.05, help="gradient sync per step")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    rank = int(os.environ.get("RANK", "0"))
    nodes = [n for n in args.nodes.split(",") if n] or [os.uname().nodename.split(".")[0]]
    reporter = PhaseReporter(
        args.broker or None,
        args.job,
        nodes,
        priority=args.priority,
        cluster=args.cluster,
        enabled=(rank == 0),
    )

    started = time.monotonic()
    reporter.startup()
    time.sleep(0.1)  # "loading the model"
    reporter.set_phase("compute")
    for step in range(1, args.steps + 1):
        time.sleep(args.step_s)  # forward and backward
        with reporter.phase("communication", expected_s=args.comm_s):
            time.sleep(args.comm_s)  # the all-reduce of the gradients
        if step % args.eval_every == 0:
            with reporter.phase("eval", expected_s=0.3):
                time.sleep(0.3)
        if step % args.checkpoint_every == 0:
            with reporter.phase("checkpoint", expected_s=0.5):
                time.sleep(0.5)
        logging.info("step %d/%d (phase %s)", step, args.steps, reporter.current_phase)
    reporter.shutdown()  # announces shutdown, flushes for up to 2 s, disconnects

    stats = reporter.stats()
    logging.info(
        "done in %.1f s: %d phase events acknowledged by the broker, %d dropped",
        time.monotonic() - started,
        stats.sent,
        stats.dropped,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
