"""What every GPU of a placed mix demands, step by step: the replay's and the oracle's input.

``DemandSource`` holds each job's power trace and phases (``planner.sizing``'s traces at
the placement's GPUs), each job's offset into its trace, and what its announcements tell
the controller (how long each phase has lasted, how long it lasts); ``speeds`` is the
speed law applied to what the GPUs were given. ``planner.whatif.replay`` and
``planner.oracle`` read the same steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from planner.mix import Placement
from planner.sizing import WorkloadTrace, job_power_traces
from policies import PHASE_CODES
from powerd.gpu.models import GPU_MODELS
from powerd.topology import Topology

# (workload, power / demand in (0, 1]) -> relative speed in (0, 1]
SpeedModel = Callable[[str, np.ndarray], np.ndarray]


class DemandSource:
    """What every GPU of the placed jobs demands at each step (``planner.whatif``'s module
    docstring): its job's trace at the job's offset (drawn from ``rng``, or 0 when
    ``synchronised``), idle GPUs their model's idle power, communication scaled by
    ``comm_power_rel`` (per GPU model; 1 when absent)."""

    def __init__(
        self,
        top: Topology,
        placement: Placement,
        traces: dict[str, WorkloadTrace],
        rng: np.random.Generator,
        synchronised: bool = False,
        comm_power_rel: Mapping[str, float] | None = None,
    ) -> None:
        jobs = placement.jobs
        n_jobs = len(jobs)
        job_traces = job_power_traces(top, placement, traces)
        self.lengths = np.array([len(t) for t in job_traces], dtype=np.int64)
        self.power_table = np.zeros((n_jobs, int(self.lengths.max())))  # a mix has one job
        self.phase_table = np.full(self.power_table.shape, PHASE_CODES["compute"], dtype=np.int8)
        for j, job in enumerate(jobs):
            self.power_table[j, : self.lengths[j]] = job_traces[j]
            self.phase_table[j, : self.lengths[j]] = traces[job.workload].phase
        # per job and step, how long the job has been in that step's phase (s): what its
        # announcements tell the controller (ClusterState.phase_s)
        self.phase_s_table = np.zeros(self.power_table.shape)
        step_s = next(iter(traces.values())).step_s
        for j in range(n_jobs):
            row = self.phase_table[j, : self.lengths[j]]
            since = np.zeros(len(row))
            for k in range(1, len(row)):
                since[k] = since[k - 1] + step_s if row[k] == row[k - 1] else 0.0
            self.phase_s_table[j, : self.lengths[j]] = since
        # ... and how long that phase lasts in the profile: what a job that says how long
        # its phases last announces (PhaseEvent.expected_s, ClusterState.phase_expected_s)
        self.phase_expected_table = np.zeros(self.power_table.shape)
        for j in range(n_jobs):
            row = self.phase_table[j, : self.lengths[j]]
            length = np.zeros(len(row))
            for k in range(len(row) - 1, -1, -1):
                last = k == len(row) - 1 or row[k + 1] != row[k]
                length[k] = step_s if last else length[k + 1] + step_s
            self.phase_expected_table[j, : self.lengths[j]] = (
                self.phase_s_table[j, : self.lengths[j]] + length
            )
        self.offsets = rng.integers(0, self.lengths)  # jobs are not synchronised ...
        if synchronised:  # ... unless asked: every job from its profile's start
            self.offsets = np.zeros(n_jobs, dtype=np.int64)
        self.gpu_job = placement.gpu_job(top)
        self.busy = self.gpu_job >= 0
        self.job_of = np.where(self.busy, self.gpu_job, 0)
        self.idle_w = np.repeat(
            np.array([GPU_MODELS[m].idle_power_w for m in top.server_model]),
            top.server_gpu_count,
        )
        self.comm_rel = np.repeat(
            np.array([(comm_power_rel or {}).get(m, 1.0) for m in top.server_model]),
            top.server_gpu_count,
        )
        self.scale_comm = bool((self.comm_rel != 1.0).any())
        self._all_jobs = np.arange(n_jobs)
        # the busy GPUs, job by job (a job's GPUs are contiguous), and by workload
        self.busy_idx = np.flatnonzero(self.busy)
        self.job_start = np.searchsorted(self.gpu_job[self.busy_idx], np.arange(n_jobs))
        by_workload: dict[str, list[int]] = {}
        for j, job in enumerate(jobs):
            by_workload.setdefault(job.workload, []).append(j)
        self.workload_gpus = {
            w: np.flatnonzero(np.isin(self.gpu_job[self.busy_idx], js))
            for w, js in by_workload.items()
        }

    def speeds(
        self, power_w: np.ndarray, demand_w: np.ndarray, speed: SpeedModel
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per busy GPU its speed at ``power_w`` of its ``demand_w`` (by its workload's
        curve), and per job the speed of its slowest GPU, which sets a synchronous job's
        pace."""
        d = demand_w[self.busy_idx]
        ratio = np.divide(power_w[self.busy_idx], d, out=np.ones_like(d), where=d > 0)
        gpu_speed = np.ones(len(self.busy_idx))
        for w, idx in self.workload_gpus.items():
            gpu_speed[idx] = speed(w, ratio[idx])
        return gpu_speed, np.minimum.reduceat(gpu_speed, self.job_start)

    def phase_s(self, t: int) -> np.ndarray:
        """Step ``t``: per GPU, how long its job has been in its phase (NaN: no job)."""
        col = (t + self.offsets) % self.lengths
        return np.where(self.busy, self.phase_s_table[self._all_jobs, col][self.job_of], np.nan)

    def phase_expected_s(self, t: int) -> np.ndarray:
        """Step ``t``: per GPU, how long its job's phase lasts (NaN: no job)."""
        col = (t + self.offsets) % self.lengths
        table = self.phase_expected_table[self._all_jobs, col]
        return np.where(self.busy, table[self.job_of], np.nan)

    def at(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step ``t``: per job its per-GPU draw and phase code; per GPU its demand and phase."""
        col = (t + self.offsets) % self.lengths
        now_w = self.power_table[self._all_jobs, col]
        now_phase = self.phase_table[self._all_jobs, col]
        demand_w = np.where(self.busy, now_w[self.job_of], self.idle_w)
        phase = np.where(self.busy, now_phase[self.job_of], PHASE_CODES["idle"]).astype(np.int8)
        if self.scale_comm:  # a communication phase at the locked clock
            comm = phase == PHASE_CODES["communication"]
            demand_w = np.where(comm, demand_w * self.comm_rel, demand_w)
        return now_w, now_phase, demand_w, phase
