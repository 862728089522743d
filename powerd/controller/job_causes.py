"""Why a job's GPUs are held below what they would draw: the controller's record, per job.

Every cycle, per GPU, the cause of its cap (``policies.causes.cap_causes``, the planner's
and the demo's own rule) and, for ``capping``, the level whose budget cut it
(``policies.causes.cap_levels``) are carried on from the decision; the GPUs held now (the
rule is ``policies.causes.seen_causes``: at their caps below their max limit, or clock
locked while their job works) are then counted per job, cause and level, with the watts
held back (``held_back_w``). ``Records`` writes them as ``job_held`` points. Numpy over
the GPUs, once a cycle (bench/RESULTS.md: ~3 ms at 20,736 nodes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from policies import ClusterState, Decision, PolicySettings, Tree
from policies.causes import (
    CAPPING,
    CAUSES,
    GRANT,
    LEVEL_TAGS,
    NO_LEVEL,
    NOT_HELD,
    SITE_LIMIT,
    binding_levels,
    cap_levels,
    carry_causes,
    held_back_w,
    initial_carried,
    initial_levels,
    seen_causes,
)
from policies.tree import SITE
from powerd.controller.jobs import JobRegistry

NO_JOB = "no job"  # the job tag of GPUs no job is announced on
_LEVEL_SLOTS = len(LEVEL_TAGS) + 1  # NO_LEVEL is slot 0


@dataclass(frozen=True)
class JobHeld:
    """GPUs of one job held by one cause (and, for ``capping``, one level) this cycle."""

    job: str
    cause: str
    level: str | None  # None: a cause other than capping, or no level known
    gpus: int
    held_w: float  # watts held back: max limit less cap (less draw for a clock lock)
    job_gpus: int  # the job's GPUs in this controller's tree


def root_level(site_limit_w: float | None, tree: Tree) -> int:
    """What the root's level reads (``binding_levels``' ``root``): ``site limit`` while an
    operator's limit is in force, ``grant`` while the root's caps have a bound besides its
    limit and none is (a leaf's root budget from its coordinator), else the root's level."""
    if site_limit_w is not None:
        return SITE_LIMIT
    if math.isfinite(tree.root_caps_limit_w):
        return GRANT
    return SITE


def job_index(registry: JobRegistry) -> tuple[list[str], np.ndarray]:
    """The jobs' names and, per server, the index of its job in them (-1: none); a later
    job over an earlier one, as ``JobRegistry.server_arrays``."""
    out = np.full(registry.tree.n_servers, -1, dtype=np.intp)
    for k, job in enumerate(registry.jobs.values()):
        out[registry.servers_of(job)] = k
    return list(registry.jobs), out


class JobCauses:
    """The causes each GPU's cap carries, and what held each job's GPUs at the last cycle."""

    def __init__(self, n_gpus: int) -> None:
        self.held: list[JobHeld] = []
        self.carried, self.levels = initial_carried(n_gpus), initial_levels(n_gpus)

    @property
    def causes(self) -> np.ndarray:
        """Per GPU, the rule that last lowered its cap (``policies.causes.carry_causes``)."""
        return self.carried.cause

    def step(
        self,
        tree: Tree,
        state: ClusterState,
        decision: Decision,
        settings: PolicySettings,
        jobs: tuple[list[str], np.ndarray],
        *,
        locked: np.ndarray | None = None,
        root: int = SITE,
    ) -> list[JobHeld]:
        """One cycle: what held each job's GPUs on ``state`` (the caps in force and the draw
        the decision was taken on), charged to the causes carried so far; then the causes
        and levels carried on through ``decision``. ``jobs``: the job names and, per server,
        the index of its job in them (-1: none); ``locked``: per GPU, an SM clock lock in
        force; ``root``: ``root_level``."""
        if len(self.causes) != tree.n_gpus:  # a reloaded budgets file: start afresh
            self.carried, self.levels = initial_carried(tree.n_gpus), initial_levels(tree.n_gpus)
        cause = seen_causes(tree, state, self.causes, settings, locked)
        level = np.where(cause == CAPPING, self.levels, NO_LEVEL)
        self.held = _by_job(tree, state, cause, level, jobs)
        carried = carry_causes(self.carried, state.cap_w, decision, state.phase)
        bound = binding_levels(tree, decision, root)
        self.levels = cap_levels(
            self.levels, self.causes, carried.cause, state.cap_w, decision, bound
        )
        self.carried = carried
        return self.held


def _by_job(
    tree: Tree,
    state: ClusterState,
    cause: np.ndarray,
    level: np.ndarray,
    jobs: tuple[list[str], np.ndarray],
) -> list[JobHeld]:
    """Held GPUs and watts summed per (job, cause, level), one bincount each."""
    names, job_of_server = jobs
    job = job_of_server[tree.gpu_server_ordinal] + 1  # 0: no job
    n_jobs = len(names) + 1
    job_gpus = np.bincount(job, minlength=n_jobs)
    held = cause != NOT_HELD
    if not held.any():
        return []
    slots = len(CAUSES) * _LEVEL_SLOTS
    key = job[held] * slots + cause[held].astype(np.intp) * _LEVEL_SLOTS + level[held] + 1
    watts = held_back_w(tree, state, cause)[held]
    gpus = np.bincount(key, minlength=n_jobs * slots)
    held_w = np.bincount(key, weights=watts, minlength=n_jobs * slots)
    out = []
    for k in np.flatnonzero(gpus).tolist():
        j, rest = divmod(k, slots)
        c, lv = divmod(rest, _LEVEL_SLOTS)
        out.append(
            JobHeld(
                job=NO_JOB if j == 0 else names[j - 1],
                cause=CAUSES[c],
                level=None if lv == 0 else LEVEL_TAGS[lv - 1],
                gpus=int(gpus[k]),
                held_w=float(held_w[k]),
                job_gpus=int(job_gpus[j]),
            )
        )
    return out
