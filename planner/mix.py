"""The workload mix: which jobs run on the site, how big, at which priority, and where.

A mix file (TOML) lists jobs::

    [[jobs]]
    workload = "llama-70b"      # a workload of the profiles
    share = 0.5                 # of the site's GPUs (or: gpus = 16384)
    count = 2                   # two jobs of 25 % each (default 1); share/gpus are the total
    priority = "high"           # low | normal | high (default normal)
    name = "pretrain"           # optional; default: the workload (with -1, -2 .. when count > 1)

Shares and GPU counts together must fit the topology (shares sum ≤ 1); GPUs no
job takes sit idle. :func:`place` puts jobs on whole nodes, in topology order,
one after another, as a scheduler packs a synchronous job: a job spans
consecutive nodes, racks and rows, and shares a rack or a row with another job
only at its edges. That placement is what gives diversity *across* jobs and
none *within* one (docs/PLANNER.md, Method).
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.errors import ProfileError, read_input_text
from policies.tree import SERVER
from powerd.topology import Topology
from powerd.vocabulary import PRIORITIES, Priority

_JOB_KEYS = {"workload", "share", "gpus", "count", "priority", "name"}
# Shares are fractions written by people: allow float noise, not a real overshoot.
_SHARE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Job:
    """One job of the mix, after ``count`` is expanded."""

    name: str
    workload: str
    priority: Priority  # as written; policies.tree.PRIORITY_CODES where arrays need codes
    share: float | None  # of the site's GPUs; exactly one of share and gpus is set
    gpus: int | None


@dataclass(frozen=True)
class Mix:
    source: str
    jobs: tuple[Job, ...]

    @property
    def workloads(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(job.workload for job in self.jobs))


@dataclass(frozen=True)
class Placement:
    """Where each job runs: whole nodes (servers), in topology order."""

    jobs: tuple[Job, ...]
    server_job: np.ndarray  # int32 (n_servers,): index into jobs, -1 for an idle node
    job_gpus: np.ndarray  # int64 (n_jobs,): GPUs each job got
    job_servers: np.ndarray  # int64 (n_jobs, 2): [first, end) server positions of each job

    def gpu_job(self, top: Topology) -> np.ndarray:
        """int32 (n_gpus,): the job of every GPU, -1 idle (GPUs are numbered node by node)."""
        return np.repeat(self.server_job, top.server_gpu_count)


def load_mix(path: str | Path) -> Mix:
    """Read and check a mix file; :class:`ProfileError` names the file and the job at fault."""
    return parse_mix(read_input_text(path, "the mix", "text (TOML)"), str(path))


def parse_mix(text: str, source: str = "<mix>") -> Mix:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(source, f"not valid TOML: {exc}") from None
    unknown = sorted(set(raw) - {"jobs"})
    if unknown:
        raise ProfileError(source, f"unknown key(s) {unknown}; a mix has only [[jobs]] tables")
    entries = raw.get("jobs")
    if not isinstance(entries, list) or not entries:
        raise ProfileError(source, "no jobs: write one [[jobs]] table per job (workload, share)")
    jobs: list[Job] = []
    for number, entry in enumerate(entries, start=1):
        jobs.extend(_entry(source, number, entry))
    names = [job.name for job in jobs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ProfileError(source, f"job name(s) {dup} used twice; give each [[jobs]] a name")
    total_share = sum(job.share or 0.0 for job in jobs)
    if total_share > 1.0 + _SHARE_TOLERANCE:
        raise ProfileError(
            source, f"shares sum to {total_share:.6g}: more than the whole site (at most 1)"
        )
    return Mix(source, tuple(jobs))


def _entry(source: str, number: int, entry: object) -> list[Job]:
    where = f"job {number}"
    if not isinstance(entry, dict):
        raise ProfileError(source, f"{where}: must be a [[jobs]] table")
    unknown = sorted(set(entry) - _JOB_KEYS)
    if unknown:
        raise ProfileError(
            source, f"{where}: unknown key(s) {unknown}; known: {', '.join(sorted(_JOB_KEYS))}"
        )
    workload = entry.get("workload")
    if not isinstance(workload, str) or not workload:
        raise ProfileError(
            source, f"{where}: workload (a workload name of the profiles) is required"
        )
    where = f"job {number} ({workload})"
    count = entry.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ProfileError(source, f"{where}: count = {count!r} must be a whole number ≥ 1")
    if ("share" in entry) == ("gpus" in entry):
        raise ProfileError(source, f"{where}: give exactly one of share (0..1) and gpus")
    share: float | None = None
    gpus: int | None = None
    if "share" in entry:
        value = entry["share"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProfileError(source, f"{where}: share = {value!r} must be a number")
        if not (math.isfinite(value) and 0 < value <= 1):
            hint = f"; a percentage? write {value / 100:g}" if 1 < value <= 100 else ""
            raise ProfileError(source, f"{where}: share = {value} must be in (0, 1]{hint}")
        share = value / count
    else:
        value = entry["gpus"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ProfileError(source, f"{where}: gpus = {value!r} must be a whole number ≥ 1")
        if value % count:
            raise ProfileError(source, f"{where}: gpus = {value} do not split into {count} jobs")
        gpus = value // count
    priority = entry.get("priority", "normal")
    if priority not in PRIORITIES:
        raise ProfileError(
            source, f"{where}: priority = {priority!r}; one of {', '.join(PRIORITIES)}"
        )
    name = entry.get("name", workload)
    if not isinstance(name, str) or not name:
        raise ProfileError(source, f"{where}: name = {name!r} must be a non-empty string")
    return [
        Job(name if count == 1 else f"{name}-{k}", workload, priority, share, gpus)
        for k in range(1, count + 1)
    ]


def check_workloads(mix: Mix, available: Iterable[str], profiles: str = "the profiles") -> None:
    """Every workload the mix names must be in the profiles."""
    have = set(available)
    missing = [w for w in mix.workloads if w not in have]
    if missing:
        listed = ", ".join(sorted(have)[:20]) + (" ..." if len(have) > 20 else "")
        raise ProfileError(
            mix.source,
            f"workload(s) {missing} not in {profiles} (they have: {listed or 'none'})",
        )


def place(top: Topology, mix: Mix) -> Placement:
    """Jobs on whole nodes, in mix order, filling the topology's nodes in file order.

    A job of ``g`` GPUs ends where the running total of the mix's GPUs is
    reached, to the nearest node: a node belongs to the job whose running total
    its midpoint falls under. So rounding never accumulates, shares that sum to
    at most 1 always fit, and each job is one contiguous run of nodes.
    """
    count = np.asarray(top.server_gpu_count, dtype=np.int64)
    total = int(count.sum())
    wanted = np.array(
        [job.gpus if job.gpus is not None else (job.share or 0.0) * total for job in mix.jobs],
        dtype=float,
    )
    if wanted.sum() > total * (1 + _SHARE_TOLERANCE):
        raise ProfileError(
            mix.source,
            f"the mix asks for {wanted.sum():,.0f} GPUs; {top.source} has {total:,}",
        )
    ends = np.cumsum(wanted)
    midpoint = np.cumsum(count) - count / 2.0
    bounds = np.searchsorted(ends, midpoint, side="right")  # job of each node; n_jobs: idle
    server_job = np.where(bounds < len(mix.jobs), bounds, -1).astype(np.int32)
    job_gpus = np.bincount(
        server_job[server_job >= 0], weights=count[server_job >= 0], minlength=len(mix.jobs)
    ).astype(np.int64)
    empty = [job.name for job, g in zip(mix.jobs, job_gpus, strict=True) if g == 0]
    if empty:
        raise ProfileError(
            mix.source,
            f"job(s) {empty} get no node: smaller than half a node of {top.source}",
        )
    jobs = np.arange(len(mix.jobs))
    job_servers = np.stack(
        [np.searchsorted(bounds, jobs, side="left"), np.searchsorted(bounds, jobs, side="right")],
        axis=1,
    )
    return Placement(mix.jobs, server_job, job_gpus, job_servers.astype(np.int64))


def server_ancestors(top: Topology) -> np.ndarray:
    """int64 (4, n_servers): each server's tree index at the site, row, rack and node levels."""
    first = top.level_start[SERVER]
    n = len(top.server_gpu_count)
    out = np.empty((4, n), dtype=np.int64)
    out[SERVER] = np.arange(first, first + n)
    for lvl in (SERVER - 1, SERVER - 2, SERVER - 3):
        out[lvl] = top.parent[out[lvl + 1]]
    return out
