"""The jobs the controller knows of: who announced them, their nodes and their phases.

``JobRegistry`` takes in phase announcements (``on_phase``): it decides who may
change a job (the owner who announced it first), which nodes a job holds (never
another owner's live job's), and how many jobs an owner may keep; it forgets jobs
that shut down, lose their nodes or fall silent, and gives the policy each server's
priority and phase.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from policies import Tree
from policies.rules import WAITING_PHASES
from policies.tree import PHASE_CODES, PRIORITY_CODES
from powerd.controller.counters import CycleCounters, Reject
from powerd.controller.job_limits import AnnouncementGate
from powerd.controller.phase_log import PhaseLog
from powerd.controller.settings import ControllerSettings
from powerd.hostlist import MAX_HOSTS, SiteNames
from powerd.protocol import PhaseEvent, ProtocolError, decode
from powerd.ratelimit import LogOncePer
from powerd.vocabulary import Phase, Priority

log = logging.getLogger("powerd.controller")


@dataclass
class Job:
    name: str
    nodes: list[str]
    priority: Priority
    phase: Phase  # as announced
    since_mono: float
    announces_waits: bool = False  # it has announced communication or checkpoint itself
    owner: str | None = None  # the login whose topic announced it first; None: unowned
    inferred_phase: Phase | None = None  # from power, for jobs that do not announce waits
    # when its phase last changed (a repeat of the same phase keeps it), and how long the
    # wait it left then lasted (0: it left no wait): policies.ClusterState's phase times
    phase_since_mono: float = math.nan
    wait_before_s: float = 0.0
    expected_s: float = math.nan  # how long it said its phase would last (NaN: not said)

    def enter(self, phase: Phase, now: float) -> None:
        """Take ``phase`` as announced at ``now``: a change starts its time, and one out of a
        wait into work remembers how long the wait lasted."""
        if phase == self.phase and not math.isnan(self.phase_since_mono):
            return
        left_wait = self.phase in WAITING_PHASES and phase not in WAITING_PHASES
        self.wait_before_s = now - self.phase_since_mono if left_wait else 0.0
        self.phase, self.phase_since_mono = phase, now

    @property
    def effective_phase(self) -> str:
        return self.inferred_phase or self.phase


@dataclass(frozen=True)
class JobArrays:
    """Per server, what its job says to the policy (``policies.ClusterState``'s job fields)."""

    priority: np.ndarray
    phase: np.ndarray
    phase_s: np.ndarray  # announced phases only
    wait_before_s: np.ndarray
    expected_s: np.ndarray


class JobRegistry:
    def __init__(
        self,
        tree: Tree,
        settings: ControllerSettings,
        monotonic: Callable[[], float],
        log_once: LogOncePer,
        reject: Reject,
    ) -> None:
        self.tree = tree
        self.settings = settings
        self._monotonic = monotonic
        self._log = log_once
        self._reject = reject
        self.phase_log = PhaseLog(log)  # each phase at DEBUG, a summary at INFO
        self.jobs: dict[str, Job] = {}
        self._owner_jobs: collections.Counter[str | None] = collections.Counter()
        self.gate = AnnouncementGate(settings.jobs)
        self._site_names = SiteNames(tree.server_names)  # what a host list expands against
        self._job_server_index: dict[str, tuple[list[str], np.ndarray]] = {}  # servers_of
        self.server_job: list[str | None] = [None] * tree.n_servers  # the job each server runs

    def on_phase(
        self, job_name: str, payload: bytes, owner: str | None, counters: CycleCounters
    ) -> PhaseEvent | None:
        """Take in one phase event; the decoded event, or None if it was refused or ignored.

        ``owner``: the owner level of the topic it came on (``jobs/{owner}/{job}/phase``,
        bound to a login by the broker's ACL), None for the unowned topic. A job belongs
        to whoever announced it first until its shutdown: anyone else's phases for it are
        refused, as is a priority above the owner's allowance (ControllerSettings), a
        node list naming nodes another owner's live job holds, and a new job beyond
        ``JobLimits.max_jobs_per_owner`` or the site's node count. Announcements over
        the rates of ``JobLimits`` are dropped before they are decoded.
        """
        now = self._monotonic()
        why = self.gate.refusal(owner, job_name, now)
        if why is not None:
            counters.phases_rate_limited += 1
            self._log.warning("phase-rate", now, "phase announcement dropped: %s", why)
            return None
        try:
            event = decode(PhaseEvent, payload, job_name)
            job = self.jobs.get(job_name)
            refusal = self._refuse_phase(job, owner, event)
            if refusal is not None:
                raise ProtocolError(refusal)
            named = self._named_servers(job_name, owner, event, counters)
        except ProtocolError as exc:
            self._reject(job_name, exc, key=f"owner-{owner}")  # owners are few, names not
            return None
        is_new = job is None
        if job is None:
            if named is None or not named:
                self._ignore_jobless(job_name, owner, event, named is None)
                return event if named is not None else None
            job = self._new_job(job_name, owner, event, now, counters)
            if job is None:
                return None
        if named is not None:
            self._give_nodes(job, named)
        job.priority, job.since_mono = event.priority, now
        job.enter(event.phase, job.since_mono)
        job.expected_s = math.nan if event.expected_s is None else float(event.expected_s)
        if event.phase in WAITING_PHASES:
            job.announces_waits = True
        job.inferred_phase = None  # an announcement overrides an inference until the next cycle
        self.phase_log.announced(
            now, job_name, event.phase, len(job.nodes), job.priority, new=is_new
        )
        if event.phase == "shutdown" or not job.nodes:
            self._forget_job(job)
        return event

    def _named_servers(
        self, job_name: str, owner: str | None, event: PhaseEvent, counters: CycleCounters
    ) -> list[int] | None:
        """The servers of ours an announcement names (None: it names none), expanded only
        against our node names; ProtocolError for a list longer than a job can be, or one
        naming nodes another owner's live job holds."""
        limit = MAX_HOSTS if self.settings.scoped else len(self._site_names)
        try:
            got = event.node_names_within(self._site_names, limit)
        except ValueError as exc:
            raise ProtocolError(f"job {job_name}: {exc}") from None
        if got is None:
            return None
        names, unknown = got
        if unknown and not self.settings.scoped:
            self._log.warning(
                f"jobnodes-{owner}",
                self._monotonic(),
                "job %s names %d nodes not in the budgets file: ignored",
                job_name,
                unknown,
            )
        ordinal = self.tree.server_ordinal
        servers = [ordinal[n] for n in names]
        held = self._held_by_others(job_name, owner, servers)
        if held is not None:
            counters.job_claims_refused += 1
            raise ProtocolError(f"job {job_name} names nodes of {held}: refused")
        return servers

    def _held_by_others(self, job_name: str, owner: str | None, servers: list[int]) -> str | None:
        """Another owner's live job holding one of ``servers`` (what to say), or None."""
        now = self._monotonic()
        for server in servers:
            holder = self.server_job[server]
            if holder is None or holder == job_name:
                continue
            other = self.jobs.get(holder)
            if other is not None and other.owner != owner and self.announcements_live(other, now):
                who = "the unowned topic" if other.owner is None else f"owner {other.owner}"
                return f"job {holder} of {who} ({self.tree.server_names[server]} first)"
        return None

    def _ignore_jobless(
        self, job_name: str, owner: str | None, event: PhaseEvent, unlisted: bool
    ) -> None:
        """A new job with no node list, or none of ours: not kept (a leaf's jobs of
        other scopes name none of its nodes)."""
        if unlisted:
            self._log.warning(
                f"job-{owner}",
                self._monotonic(),
                "phase %s for unknown job %s without its node list: ignored",
                event.phase,
                job_name,
            )

    def _new_job(
        self,
        job_name: str,
        owner: str | None,
        event: PhaseEvent,
        now: float,
        counters: CycleCounters,
    ) -> Job | None:
        """A new job, kept; None (refused, counted) beyond the bounds on jobs."""
        limits = self.settings.jobs
        why = None
        if self._owner_jobs[owner] >= limits.max_jobs_per_owner:
            who = "the unowned topic" if owner is None else f"owner {owner}"
            why = f"{who} has {limits.max_jobs_per_owner} jobs (jobs.max_per_owner)"
        elif len(self.jobs) >= self.tree.n_servers:
            why = f"{len(self.jobs)} jobs already, one a node"
        if why is not None:
            counters.jobs_refused += 1
            self._log.warning(f"jobs-{owner}", now, "new job %s refused: %s", job_name, why)
            return None
        job = Job(job_name, [], event.priority, event.phase, now, owner=owner)
        self.jobs[job_name] = job
        self._owner_jobs[owner] += 1
        return job

    def _give_nodes(self, job: Job, servers: list[int]) -> None:
        """``servers`` are ``job``'s now, and no other job's: a job they are taken from
        keeps the rest, and one left with none is forgotten."""
        names = self.tree.server_names
        for server in self.job_servers(job):
            if self.server_job[server] == job.name:
                self.server_job[server] = None
        losers: set[str] = set()
        for server in servers:
            holder = self.server_job[server]
            if holder is not None and holder != job.name:
                losers.add(holder)
            self.server_job[server] = job.name
        job.nodes = [names[server] for server in servers]
        for name in losers:
            other = self.jobs.get(name)
            if other is not None:
                other.nodes = [n for n in other.nodes if self.job_of(n) == name]
                if not other.nodes:
                    self._forget_job(other)

    def _forget_job(self, job: Job) -> None:
        if self.jobs.pop(job.name, None) is None:
            return
        self._owner_jobs[job.owner] -= 1
        if not self._owner_jobs[job.owner]:
            del self._owner_jobs[job.owner]
        self._job_server_index.pop(job.name, None)
        for server in self.job_servers(job):
            if self.server_job[server] == job.name:
                self.server_job[server] = None

    def expire(self, now: float, counters: CycleCounters) -> None:
        """Forget the jobs that have announced nothing for ``JobLimits.expiry_s``."""
        self.phase_log.flush(now)
        expiry_s = self.settings.jobs.expiry_s
        for job in [j for j in self.jobs.values() if now - j.since_mono > expiry_s]:
            log.warning("job %s: nothing announced for %.0f s: forgotten", job.name, expiry_s)
            self._forget_job(job)
            counters.jobs_expired += 1

    def job_servers(self, job: Job) -> list[int]:
        return [self.tree.server_ordinal[n] for n in job.nodes]

    def servers_of(self, job: Job) -> np.ndarray:
        """``job_servers`` as an index array, kept until the job's node list is replaced
        (every cycle needs it; a 150 MW job names 10,000 nodes)."""
        cached = self._job_server_index.get(job.name)
        if cached is None or cached[0] is not job.nodes:
            cached = (job.nodes, np.asarray(self.job_servers(job), dtype=np.intp))
            self._job_server_index[job.name] = cached
        return cached[1]

    def announcements_live(self, job: Job, now: float) -> bool:
        """The job announced something within ``announced_live_s``: its announcements, not
        the controller's inference, say what it does (and may move granted clocks)."""
        return now - job.since_mono <= self.settings.announced_live_s

    def _refuse_phase(self, job: Job | None, owner: str | None, event: PhaseEvent) -> str | None:
        """Why this announcement may not change the job, or None."""
        who = "the unowned topic" if owner is None else f"owner {owner}"
        if owner is None and not self.settings.accept_unowned_jobs:
            return f"job {event.job} announced on the unowned topic, which is not accepted"
        if job is not None and job.owner != owner:
            return (
                f"job {event.job} belongs to "
                f"{'the unowned topic' if job.owner is None else 'owner ' + job.owner}; "
                f"{who} may not change it"
            )
        if not self.settings.job_priority_allowed(owner, event.priority):
            return f"{who} may not announce priority {event.priority} (job {event.job})"
        return None

    def job_of(self, node: str) -> str | None:
        server = self.tree.server_ordinal.get(node)
        return None if server is None else self.server_job[server]

    def server_arrays(self, now: float) -> JobArrays:
        """Per server, its job's priority and phase (normal and compute without one), and
        the times of an announced phase: a job's servers at once, a later job over an
        earlier one."""
        n_servers = self.tree.n_servers
        priority = np.full(n_servers, PRIORITY_CODES["normal"], dtype=np.int8)
        phase = np.full(n_servers, PHASE_CODES["compute"], dtype=np.int8)
        phase_s = np.full(n_servers, np.nan)  # announced phases only
        wait_before_s = np.zeros(n_servers)
        expected_s = np.full(n_servers, np.nan)
        for job in self.jobs.values():
            servers = self.servers_of(job)
            priority[servers] = PRIORITY_CODES[job.priority]
            phase[servers] = PHASE_CODES[job.effective_phase]
            phase_s[servers] = now - job.phase_since_mono if job.inferred_phase is None else np.nan
            wait_before_s[servers] = job.wait_before_s
            expected_s[servers] = job.expected_s if job.inferred_phase is None else np.nan
        return JobArrays(priority, phase, phase_s, wait_before_s, expected_s)
