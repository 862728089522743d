"""What the controller hands the recorder: line-protocol points built from its state.

Placement tags (site, row, rack) of every tree node and server are worked out
once from the topology; the per-cycle work is vectorised sums and one string
per point (``powerd.telemetry_schema`` builds and escapes them).

With ``fine_every_s`` set, each node's ``gpu`` points and its ``tree`` (node
level) point are written once per window of that length, and the windows are
staggered across nodes (each node's offset comes from a hash of its name): a
tenth of the nodes each second at 10 s, never all of them in the same second.
Unstaggered, 82,944 ``gpu`` points built in one burst every 10 s stalled the
150 MW site's controller for ~2 s (bench/RESULTS.md, scale).

Per cycle, ``job_held`` points say what held each job's GPUs, by cause and level
(``powerd.controller.job_causes``).

The ``decision`` point carries two site ramps, each a change since the last
cycle over the cycle's length: of the sum of caps (``site_ramp_w_per_s``) and of
the measured site power (``site_power_ramp_w_per_s``), beside the grid's limits
on the latter (``[site.grid]``): measured over one cycle, not over the grid
spec's ``window_s`` (``policies.grid`` measures that, offline).
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from policies.tree import LEVEL_NAMES, RACK, ROW, SERVER
from powerd.controller.core import ControllerCore, CycleResult
from powerd.protocol import PhaseEvent, Telemetry
from powerd.telemetry_schema import (
    decision_line,
    job_held_line,
    phase_event_from_message,
    telemetry_lines,
    tree_line,
)
from powerd.topology import Topology


def stagger_s(name: str, period_s: float) -> float:
    """A node's offset in [0, period_s): where its fine-recording windows start."""
    return zlib.crc32(name.encode()) / 2**32 * period_s


class Records:
    """Builds the points of one controller; keeps what a rate needs (the previous cap sum
    and site power)."""

    def __init__(
        self, cluster: str, topology: Topology, controller: str, fine_every_s: float = 0.0
    ) -> None:
        """``fine_every_s``: per-GPU and per-server points at most this often (0: all)."""
        self.cluster = cluster
        self.fine_every_s = fine_every_s
        self._gpu_window: dict[str, int] = {}  # the window of each node's last gpu points
        servers = topology.servers
        self._server_offset_s = np.array([stagger_s(n, fine_every_s) for n in servers])
        self._server_window: np.ndarray | None = None
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
        self._gpus_under: np.ndarray | None = None
        self._previous_site_cap_w: float | None = None
        self._previous_site_power_w: float | None = None

    def cycle(self, core: ControllerCore, result: CycleResult, ts: float) -> list[str]:
        """One ``tree`` point per tree node and one ``decision`` point."""
        tree, decision = core.tree, result.decision
        if self._gpus_under is None:
            self._gpus_under = tree.node_sum(np.ones(tree.n_gpus))
            self._overhead_w = tree.overhead_below_w
        gpus_under = np.maximum(self._gpus_under, 1.0)
        capped = decision.cap_w < tree.cap_max_w - 0.5
        capped_share = tree.node_sum(capped.astype(float)) / gpus_under
        cap_sum_w = tree.node_sum(decision.cap_w) + self._overhead_w
        lines: list[str] = []
        power, predicted = decision.node_power_w, decision.node_predicted_w
        first_server = self.topology.level_start[SERVER]
        nodes: list[int] | range = range(self.topology.n_nodes)
        if self.fine_every_s > 0:  # servers come last in the tree's order
            window = np.floor((ts + self._server_offset_s) / self.fine_every_s).astype(np.int64)
            last = window if self._server_window is None else self._server_window
            due = np.flatnonzero(window != last)  # none on the first cycle: no burst
            self._server_window = window
            nodes = [*range(first_server), *(first_server + due).tolist()]
        names = self.topology.names
        for i in nodes:
            name = names[i]
            line = tree_line(
                ts,
                cluster=self.cluster,
                level=self._level_tag[i],
                name=name,
                site=self._placement[i]["site"],
                row=self._placement[i]["row"],
                rack=self._placement[i]["rack"],
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
        site_cap_w, site_power_w = float(cap_sum_w[0]), float(power[0])
        ramp = power_ramp = None
        if core.last_dt_s > 0:
            if self._previous_site_cap_w is not None:
                ramp = (site_cap_w - self._previous_site_cap_w) / core.last_dt_s
            if self._previous_site_power_w is not None:
                power_ramp = (site_power_w - self._previous_site_power_w) / core.last_dt_s
        self._previous_site_cap_w, self._previous_site_power_w = site_cap_w, site_power_w
        grid = self.topology.grid  # each cycle: a reload that sets .topology shows at once
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
            acks_stale=c.acks_stale,
            acks_late=c.acks_late,
            commands_in_flight=c.commands_in_flight,
            stale_nodes=c.stale_nodes,
            failsafe_nodes=c.failsafe_nodes,
            offline_nodes=c.offline_nodes,
            rejected_payloads=core.rejected_total,
            epoch=core.epoch,
            gpus_capped=int(np.sum(capped)),
            site_ramp_w_per_s=ramp,
            site_power_ramp_w_per_s=power_ramp,
            # inf (no limit) is left out, as every non-finite field
            grid_ramp_up_w_per_s=None if grid is None else grid.ramp_up_w_per_s,
            grid_ramp_down_w_per_s=None if grid is None else grid.ramp_down_w_per_s,
            site_limit_w=core.site_limit_w,
            telemetry_received=c.telemetry_received,
            telemetry_dropped=c.telemetry_dropped,
            telemetry_lost=c.telemetry_lost,
            telemetry_waiting=c.telemetry_waiting,
            ingest_s=c.ingest_s,
            raises_deferred=c.raises_deferred,
            uncap_waiting=c.uncap_waiting,
            cut_waiting=c.cut_waiting,
            clock_policy_gpus=c.clock_policy_gpus,
            nodes_drifted=c.nodes_drifted,
            failsafe_over_plan=c.failsafe_over_plan,
            nodes_implausible=c.nodes_implausible,
            inputs_refused=c.inputs_refused,
            clock_alarms=core.clock_alarms,
            peer_skew_s=core.peer_skew_s,
            node_skew_s=core.node_clocks.skew_s,
            nodes_skewed=core.node_clocks.skewed,
        )
        if line is not None:
            lines.append(line)
        lines += self.job_held(core, ts)
        return lines

    def job_held(self, core: ControllerCore, ts: float) -> list[str]:
        """One ``job_held`` point per job, cause and level with a GPU held at the last
        cycle (``powerd.controller.job_causes``)."""
        lines = []
        for held in core.job_causes.held:
            line = job_held_line(
                ts,
                cluster=self.cluster,
                controller=self.controller,
                job=held.job,
                cause=held.cause,
                level=held.level,
                gpus=held.gpus,
                held_w=held.held_w,
                job_gpus=held.job_gpus,
            )
            if line is not None:
                lines.append(line)
        return lines

    def telemetry(self, core: ControllerCore, sample: Telemetry) -> list[str]:
        """``gpu`` points of one telemetry message, tagged with placement, job and phase."""
        if self.fine_every_s > 0:
            period = self.fine_every_s
            window = math.floor((sample.ts + stagger_s(sample.node, period)) / period)
            last = self._gpu_window.get(sample.node)
            self._gpu_window[sample.node] = window
            if window == last or last is None:  # a node's first window starts at its offset
                return []
        placement = self._server_placement.get(sample.node, {})
        job_name = core.job_of(sample.node)
        job = core.jobs.get(job_name) if job_name else None
        return telemetry_lines(
            self.cluster,
            core.with_last_smoothing(sample),
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
