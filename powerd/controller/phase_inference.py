"""Phases inferred from power, for jobs that announce themselves but not their waits.

``PowerHistory`` keeps a ring of each GPU's power, one column a cycle, and infers
the phase of each quiet job (``policies.infer_phases``) from its GPUs' history.
"""

from __future__ import annotations

import numpy as np

from policies import Tree, infer_phases
from policies.turns import CAP_TOLERANCE_W
from powerd.controller.jobs import JobRegistry
from powerd.controller.node_views import NodeViews
from powerd.controller.settings import ControllerSettings
from powerd.vocabulary import PHASES

CAP_BOUND_FRACTION = 0.9  # a capped GPU drawing this share of its cap is held by it
# Announced phases under which a job that never announces its waits has them inferred.
INFERRED_FROM = ("compute", "eval")


def gpus_on(tree: Tree, servers: np.ndarray) -> np.ndarray:
    """The GPU indices of ``servers``, in order (each server's run of GPUs)."""
    first = tree.gpu_start[servers]
    count = tree.gpu_start[servers + 1] - first
    starts = np.cumsum(count) - count
    return np.repeat(first - starts, count) + np.arange(int(count.sum()))


class PowerHistory:
    def __init__(self, n_gpus: int, settings: ControllerSettings) -> None:
        self.settings = settings
        window = max(2, round(settings.infer_window_s / settings.cycle_s))
        if not settings.infer_phases:
            window = 0  # no history kept (20 MB at 83K GPUs and a 30 s window)
        self._history_w = np.full((n_gpus, window), np.nan)  # ring of per-cycle power
        self._history_next = 0

    def remember(self, now: float, heard: np.ndarray, views: NodeViews) -> None:
        """This cycle's power of every GPU heard from, in the ring."""
        tree = views.tree
        fresh = ((now - heard) <= self.settings.stale_after_s) & ~views.offline
        # A capped GPU drawing (nearly) its cap says nothing about its phase: left out (NaN),
        # else a job the controller has just capped would look like a synchronised wait.
        capped = views.cap_w < tree.cap_max_w - CAP_TOLERANCE_W
        cap_bound = capped & (views.power_w >= CAP_BOUND_FRACTION * views.cap_w)
        column = np.where(fresh[tree.gpu_server_ordinal] & ~cap_bound, views.power_w, np.nan)
        self._history_w[:, self._history_next] = column
        self._history_next = (self._history_next + 1) % self._history_w.shape[1]

    def infer(self, now: float, registry: JobRegistry) -> None:
        """Phases from power for jobs that announce themselves but not their waits, or whose
        announcements are no longer live (``announced_live_s``)."""
        quiet = [
            j
            for j in registry.jobs.values()
            if (not j.announces_waits or not registry.announcements_live(j, now))
            and j.phase in INFERRED_FROM
        ]
        if not quiet:
            return
        gpu_ids = [gpus_on(registry.tree, registry.servers_of(job)) for job in quiet]
        sizes = np.array([len(ids) for ids in gpu_ids], dtype=np.intp)
        if not sizes.sum():
            return
        index = np.concatenate(gpu_ids)
        history = np.roll(self._history_w[index], -self._history_next, axis=1)  # oldest first
        codes = infer_phases(
            history,
            np.repeat(np.arange(len(quiet)), sizes),
            sample_period_s=self.settings.cycle_s,
        )
        firsts = np.cumsum(sizes) - sizes  # every GPU of a job has the job's phase
        per_job = {k: int(codes[firsts[k]]) for k in range(len(quiet)) if sizes[k]}
        for k, job in enumerate(quiet):
            code = per_job.get(k)
            inferred = None if code is None else PHASES[code]
            if inferred == "compute":
                inferred = None
            if inferred != job.inferred_phase:
                registry.phase_log.inferred(now, job.name, inferred or f"back to {job.phase}")
            job.inferred_phase = inferred
