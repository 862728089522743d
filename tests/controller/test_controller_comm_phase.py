"""A job's `communication` phase locks its GPUs' SM clock to the model's comm clock; `compute`
releases it. The job speaks through the client library (``powerd.jobhook.PhaseReporter``)."""

from __future__ import annotations

import asyncio

from powerd.jobhook import PhaseReporter
from tests.support.controller_harness import (
    CLUSTER,
    COMM_CLOCK_MHZ,
    NODES,
    SERVERS,
    TOPICS,
    node_of,
    probe,
    running_cluster,
    telemetry_of,
)

JOB_NODES = list(NODES["r1-k2"])
OTHERS = [n for n in SERVERS if n not in JOB_NODES]


def locks_of(message) -> list[int | None]:
    return [g.max_sm_clock_mhz for g in telemetry_of(message).gpus]


async def expect_locks(p, node: str, want: int | None, after: int):
    return await p.expect(
        TOPICS.telemetry(node),
        lambda m: all(lock == want for lock in locks_of(m)),
        after=after,
    )


async def test_communication_locks_the_clock_and_compute_releases_it(mosquitto):
    async with probe(mosquitto) as p, running_cluster(mosquitto, phase="compute") as cluster:
        ctl, agents = cluster.controller, cluster.agents
        reporter = PhaseReporter(
            mosquitto.url, job="llm", nodes=JOB_NODES, priority="high", cluster=CLUSTER
        )
        try:
            reporter.startup()
            reporter.set_phase("compute")
            await ctl.wait_for(lambda: ctl.core.jobs.get("llm") is not None)
            await ctl.wait_for(lambda: ctl.core.jobs["llm"].phase == "compute")

            mark = p.mark()
            reporter.set_phase("communication")
            agents.set_phase(JOB_NODES, "communication")
            locked = [await expect_locks(p, n, COMM_CLOCK_MHZ, mark) for n in JOB_NODES]
            # the devices hold it, and run no faster than it
            assert agents.locks(JOB_NODES) == [COMM_CLOCK_MHZ] * 8
            for m in locked:
                assert all(g.sm_clock_mhz <= COMM_CLOCK_MHZ for g in telemetry_of(m).gpus)
            assert ctl.core.jobs["llm"].phase == "communication"
            # through commands of the current epoch, acknowledged as applied
            acks = [
                m
                for m in p.messages[mark:]
                if m.topic.endswith("/ack") and node_of(m.topic) in JOB_NODES
            ]
            assert acks and all(b'"result":"applied"' in m.payload for m in acks)

            mark = p.mark()
            reporter.set_phase("compute")
            agents.set_phase(JOB_NODES, "compute")
            for n in JOB_NODES:
                await expect_locks(p, n, None, mark)
            assert agents.locks(JOB_NODES) == [None] * 8
            assert reporter.flush(5.0)
        finally:
            await asyncio.to_thread(reporter.close)

    # nodes outside the job were never locked
    for m in p.messages:
        if m.topic.endswith("/telemetry") and node_of(m.topic) in OTHERS:
            assert locks_of(m) == [None] * 4
