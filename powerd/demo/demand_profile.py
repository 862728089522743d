"""The simulated GPUs' demand as a power profile: the truth a capped recording hides.

``powerd demo --record-demand FILE`` writes, for every sample of the demo's sampler
(``DemoOptions.sample_s``) and every GPU while its job runs (phases other than idle
and shutdown), what the GPU would draw at its maximum cap under its clock lock
(``SimulatedGpu.demand_w``, without the reading's noise), as a CSV that
``powerplan profiles`` and ``powerplan size`` read: time_s (seconds since the jobs'
clock started), node, gpu, workload (the job), phase, power_w (the demand), cap_w and
cap_max_w (both the GPU's maximum cap: uncapped). Planning from it and from the
recorded telemetry of the same run measures what capping hides (docs/PLANNER.md,
"Capped samples").
"""

from __future__ import annotations

import csv
from pathlib import Path

from powerd.demo.summary import RunRecord
from powerd.gpu.models import gpu_model
from powerd.topology import Topology
from powerd.vocabulary import PHASES

HEADER = ("time_s", "node", "gpu", "workload", "phase", "power_w", "cap_w", "cap_max_w")
NOT_RUNNING = ("idle", "shutdown")


def write_demand_profile(topology: Topology, trace: RunRecord, path: Path) -> int:
    """Write the demand profile of a finished run to ``path``; the number of rows."""
    if trace.gpu_demand_w is None:
        raise ValueError("the run kept no demand (RunRecord.gpu_demand_w)")
    gpus = []  # (column, node, index on the node, job name, max cap)
    for node in topology.servers:
        cap_max_w = gpu_model(topology.server(node).model).cap_max_w
        for index, column in enumerate(topology.server_gpus(node)):
            job = int(trace.gpu_job[column])
            if job >= 0:
                gpus.append((column, node, index, trace.jobs[job].name, cap_max_w))
    rows = 0
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(HEADER)
        for k, t in enumerate(trace.t):
            for column, node, index, job_name, cap_max_w in gpus:
                phase = PHASES[int(trace.gpu_phase[k, column])]
                if phase in NOT_RUNNING:
                    continue
                demand_w = float(trace.gpu_demand_w[k, column])
                writer.writerow(
                    (
                        f"{t:.3f}",
                        node,
                        index,
                        job_name,
                        phase,
                        f"{demand_w:.3f}",
                        cap_max_w,
                        cap_max_w,
                    )
                )
                rows += 1
    return rows
