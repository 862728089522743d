"""``attach_ddp`` in a real two-process DDP job (torchrun, gloo, CPU): a plain training loop
with no phase call, against a real Mosquitto, real agents and a real controller, which
records every phase it takes in (a line-protocol file).

Rank 1's batch comes late once (``STRAGGLE_S``): rank 0 waits in that step's all-reduce,
which the hook announces as ``communication``; the other steps' all-reduces are short and
announce nothing. Run as a module, this file is the training script torchrun starts.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

from powerd.jobhook import ENV_BROKER, ENV_CLUSTER, ENV_JOB, ENV_NODES, ENV_PRIORITY
from powerd.line_protocol import iter_lines
from powerd.recorder import open_recorder
from tests.support.controller_harness import CLUSTER, NODES, running_cluster
from tests.support.paths import REPO

JOB = "ddp-job"
JOB_NODES = list(NODES["r1-k2"])  # r1-k2-n1, r1-k2-n2
STEPS = 30
SLOW_STEP = 15
STRAGGLE_S = 2.5  # rank 1's late batch: rank 0 waits this long in the all-reduce
RUN_S = 90.0  # the whole torchrun, a deadline only (it takes about 10 s)


def train() -> None:
    """The job: torchrun's environment, a small DDP model in several buckets, a plain loop."""
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from powerd.jobhook import attach_ddp

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    net = torch.nn.Sequential(
        *(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(4)),
        torch.nn.Linear(64, 1),
    )
    model = DistributedDataParallel(net, bucket_cap_mb=0.02)  # a layer a bucket
    attach_ddp(model)  # startup now, shutdown at exit
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        batch = torch.randn(32, 64)
        if rank == 1 and step == SLOW_STEP:
            time.sleep(STRAGGLE_S)  # the workload: this rank's data loader is slow once
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    # without it one rank may tear gloo down while the other still talks to it: seen here
    # as SIGABRT at exit ("terminate called without an active exception") with plain DDP
    dist.barrier()
    dist.destroy_process_group()


def phase_events(path: Path) -> list[dict[str, object]]:
    """The ``phase_event`` points the controller recorded, tags and fields, in order."""
    if not path.exists():
        return []
    return [
        {**p.tags, **p.fields}
        for p in iter_lines(path.read_text())
        if p.measurement == "phase_event"
    ]


async def test_a_ddp_jobs_phases_reach_the_controller_from_rank_0_without_phase_calls(
    mosquitto, tmp_path
):
    records = tmp_path / "controller.lp"
    env = {
        **os.environ,
        ENV_BROKER: mosquitto.url,
        ENV_JOB: JOB,
        ENV_CLUSTER: CLUSTER,
        ENV_NODES: "r1-k2-n[1-2]",
        ENV_PRIORITY: "high",
        "OMP_NUM_THREADS": "1",
    }
    recorder = open_recorder(str(records))
    async with running_cluster(mosquitto, phase="compute", recorder=recorder) as cluster:
        ctl = cluster.controller
        job = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "torch.distributed.run", "--standalone"],
            *["--nproc-per-node", "2", "-m", "tests.jobhook.test_torch_ddp"],
            cwd=REPO,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(job.communicate(), RUN_S)
        assert job.returncode == 0, output.decode(errors="replace")[-4000:]
        # every message was acknowledged by the broker before the job exited (the
        # reporter's flush); the controller records each as it takes it in
        await ctl.wait_for(lambda: [e["phase"] for e in phase_events(records)][-1:] == ["shutdown"])
        limited = sum(c.result.counters.phases_rate_limited for c in ctl.cycles)

    events = phase_events(records)
    phases = " ".join(str(e["phase"]) for e in events)
    # one startup and one shutdown: rank 0 alone spoke for the job; the slow step's wait
    # announced (a short all-reduce by chance on a loaded machine may add another pair)
    assert re.fullmatch(r"startup compute( communication compute)+ shutdown", phases), phases
    assert {e["job"] for e in events} == {JOB}
    assert {e["priority"] for e in events} == {"high"}
    assert events[0]["nodes"] == len(JOB_NODES)
    assert limited == 0  # the controller's announcement rates were never passed
    # the controller put the job on the nodes POWERD_NODES names, and only there, and
    # held them in communication while rank 0 waited
    gpus = [p.tags for p in iter_lines(records.read_text()) if p.measurement == "gpu"]
    assert {g["node"] for g in gpus if g.get("job") == JOB} == set(JOB_NODES)
    waited = {g["node"] for g in gpus if g.get("job") == JOB and g["phase"] == "communication"}
    assert waited == set(JOB_NODES)


if __name__ == "__main__":
    train()
