"""What the controller hands the recorder: line-protocol points built from its state.

Placement tags (site, row, rack) of every tree node and server are worked out
once from the topology; the per-cycle work is vectorised sums and one string
per point (``powerd.telemetry_schema`` builds and escapes them).
"""

from __future__ import annotations

import math

import numpy as np

from policies.tree import LEVEL_NAMES, RACK, ROW, SERVER
from powerd.controller.core import ControllerCore, CycleResult
from powerd.protocol import PhaseEvent, Telemetry
from powerd.telemetry_schema import (
    decision_line,
    phase_event_from_message,
    telemetry_lines,
    tree_line,
)
from powerd.topology import Topology

# A period's samples arrive with jitter: one 0.98 s after the last still counts as a period.
FINE_SLACK = 0.9


class Records:
    """Builds the points of one controller; keeps what a rate needs (the previous cap sum)."""

    def __init__(
        self, cluster: str, topology: Topology, controller: str, fine_every_s: float = 0.0
    ) -> None:
        """``fine_every_s``: per-GPU and per-server points at most this often (0: all)."""
        self.cluster = cluster
        self.fine_every_s = fine_every_s
        self._last_gpu_ts: dict[str, float] = {}
        self._last_fine_cycle_ts = -math.inf
        self.controller = controller
        self.topology = topology
        names = topology.names
        self._placement: list[dict[str, str | None]] = [
            {
                "site": names[0],
                "row": by_level_name(topology, i, ROW) if topology.level[i] > ROW else None,
                "rack": by_level_name(topology, i, RACK) if topology.level[i] > RACK else None,
            }
            for i in range(topology.n_nodes)
        ]
        first_server = topology.level_start[SERVER]
        self._server_placement = {
            name: self._placement[first_server + k] for k, name in enumerate(topology.servers)
        }
        self._level_tag = [LEVEL_NAMES[int(lvl)] for lvl in topology.level]
        self._gpus_under = None
        self._previous_site_cap_w: float | None = None

    def cycle(self, core: ControllerCore, result: CycleResult, ts: float) -> list[str]:
        """One ``tree`` point per tree node and one ``decision`` point."""
        tree, decision = core.tree, result.decision
        if self._gpus_under is None:
            self._gpus_under = tree.node_sum(np.ones(tree.n_gpus))
            self._overhead_w = tree.overhead_sum()
        gpus_under = np.maximum(self._gpus_under, 1.0)
        capped = decision.cap_w < tree.cap_max_w - 0.5
        capped_share = tree.node_sum(capped.astype(float)) / gpus_under
        cap_sum_w = tree.node_sum(decision.cap_w) + self._overhead_w
        lines: list[str] = []
        power, predicted = decision.node_power_w, decision.node_predicted_w
        names = self.topology.names
        if ts - self._last_fine_cycle_ts >= FINE_SLACK * self.fine_every_s:
            self._last_fine_cycle_ts = ts
        else:  # servers come last in the tree's order: leave them out this cycle
            names = names[: self.topology.level_start[SERVER]]
        for i, name in enumerate(names):
            line = tree_line(
                ts,
                cluster=self.cluster,
                level=self._level_tag[i],
                name=name,
                **self._placement[i],
                power_w=float(power[i]),
                budget_w=float(tree.budget_w[i]),
                limit_w=float(tree.limit_w[i]),
                cap_threshold_w=float(tree.cap_threshold_w[i]),
                cap_target_w=float(tree.cap_target_w[i]),
                uncap_threshold_w=float(tree.uncap_threshold_w[i]),
                predicted_w=float(predicted[i]),
                cap_sum_w=float(cap_sum_w[i]),
                capped_share=float(capped_share[i]),
                capping=int(bool(decision.node_capping[i])),
            )
            if line is not None:
                lines.append(line)
        site_cap_w = float(cap_sum_w[0])
        ramp = None
        if self._previous_site_cap_w is not None and core.last_dt_s > 0:
            ramp = (site_cap_w - self._previous_site_cap_w) / core.last_dt_s
        self._previous_site_cap_w = site_cap_w
        c = result.counters
        line = decision_line(
            ts,
            cluster=self.cluster,
            controller=self.controller,
            cycle_s=result.cycle_s,
            commands_sent=c.commands_sent,
            resends=c.resends,
            acks_received=c.acks_received,
            acks_missing=c.acks_missing,
            stale_nodes=c.stale_nodes,
            failsafe_nodes=c.failsafe_nodes,
            offline_nodes=c.offline_nodes,
            rejected_payloads=core.rejected_total,
            epoch=core.epoch,
            gpus_capped=int(np.sum(capped)),
            site_ramp_w_per_s=ramp,
        )
        if line is not None:
            lines.append(line)
        return lines

    def telemetry(self, core: ControllerCore, sample: Telemetry) -> list[str]:
        """``gpu`` points of one telemetry message, tagged with placement, job and phase."""
        if self.fine_every_s > 0:
            last = self._last_gpu_ts.get(sample.node, -math.inf)
            if sample.ts - last < FINE_SLACK * self.fine_every_s and sample.ts >= last:
                return []
            self._last_gpu_ts[sample.node] = sample.ts
        placement = self._server_placement.get(sample.node, {})
        job_name = core.job_of(sample.node)
        job = core.jobs.get(job_name) if job_name else None
        return telemetry_lines(
            self.cluster,
            sample,
            **placement,
            job=job_name,
            phase=job.phase if job is not None else None,
        )

    def phase(self, event: PhaseEvent) -> list[str]:
        return [phase_event_from_message(self.cluster, event)]


def by_level_name(topology: Topology, node: int, level: int) -> str | None:
    """The name of ``node``'s ancestor at ``level`` (or the node itself), None if above it."""
    j = node
    while j >= 0:
        if int(topology.level[j]) == level:
            return topology.names[j]
        j = int(topology.parent[j])
    return None
