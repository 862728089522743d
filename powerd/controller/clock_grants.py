"""Clock policies granted in commands (issue 16): which job's announcements a GPU follows.

The GPUs of a job whose announcements are live are granted its comm clock in their
commands (``CommClock``), and their agents lock and unlock them on the job's own
announcements. ``ClockGrants`` remembers, per server and per GPU, what the last
command granted and whether the agent took it; ``policies`` says what this cycle's
commands grant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from policies import Tree
from powerd.controller.jobs import JobRegistry
from powerd.controller.settings import ControllerSettings


@dataclass(frozen=True)
class ClockPolicies:
    """One cycle's clock policies. ``job``: per server, the (job, owner) whose announcements
    its GPUs follow, as its ``ClockGrants.key`` (-1: none). Per GPU: ``granted`` (the command
    carries the policy), ``clock_mhz`` (its clock; NaN: none), ``changed`` (granted, ended
    or moved since the last command: that command says the controller's own clock),
    ``follows`` (in force, and the job's phase is announced, not inferred, in an
    announcement received after the agent acked the policy, so the agent heard it too:
    the controller leaves the clock alone)."""

    job: np.ndarray
    granted: np.ndarray
    clock_mhz: np.ndarray
    changed: np.ndarray
    follows: np.ndarray


def same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise equal, NaN equal to NaN (no lock, no policy)."""
    equal: np.ndarray = (np.isnan(a) & np.isnan(b)) | (a == b)
    return equal


class ClockGrants:
    def __init__(self, tree: Tree, settings: ControllerSettings) -> None:
        self.tree = tree
        self.settings = settings
        n_gpus, n_servers = tree.n_gpus, tree.n_servers
        # Per server the (job, owner) and per GPU the clock of the policy the last command
        # carried (NaN: none); the seq of that command; the GPU's agent did not take one (an
        # older agent: its clock is locked by the controller, under this epoch).
        self.job = np.full(n_servers, -1, dtype=np.int64)  # a ``key`` index
        self._keys: dict[tuple[str, str | None], int] = {}  # (job, owner) -> index
        self.key_list: list[tuple[str, str | None]] = []
        self.sent_mhz = np.full(n_gpus, np.nan)
        self.sent_seq = np.full(n_gpus, -1, dtype=np.int64)
        self.refused = np.zeros(n_gpus, dtype=bool)
        # when each server's agent acknowledged its policy (monotonic; inf: not yet). Agents
        # subscribe to the job's topic before they ack: an announcement received after this
        # reached the agent too, one received before may not have.
        self.acked = np.full(n_servers, math.inf)

    def policies(self, now: float, registry: JobRegistry) -> ClockPolicies:
        """The clock policies the commands of this cycle carry (``ClockPolicies``)."""
        n_servers, ordinal = self.tree.n_servers, self.tree.gpu_server_ordinal
        job_of = np.full(n_servers, -1, dtype=np.int64)
        # its phase is announced (not inferred), since its agent listens (acked the policy)
        announced = np.zeros(n_servers, dtype=bool)
        settings = self.settings
        if settings.agent_comm_clock and settings.policy.comm_clock_lock:
            for job in registry.jobs.values():
                if registry.announcements_live(job, now):
                    servers = registry.job_servers(job)
                    job_of[servers] = self.key(job.name, job.owner)
                    heard = job.since_mono > self.acked[servers]
                    announced[servers] = heard & (job.inferred_phase is None)
        clock_mhz = np.asarray(self.tree.comm_clock_mhz, dtype=float)
        granted = (job_of >= 0)[ordinal] & np.isfinite(clock_mhz) & ~self.refused
        clock_mhz = np.where(granted, clock_mhz, np.nan)
        moved_job = (job_of != self.job)[ordinal]
        changed = ~same(clock_mhz, self.sent_mhz) | (moved_job & granted)
        follows = granted & ~changed & announced[ordinal]
        return ClockPolicies(job_of, granted, clock_mhz, changed, follows)

    def key(self, job: str, owner: str | None) -> int:
        """A small integer for (job, owner), the same every time: policies compared as arrays."""
        found = self._keys.get((job, owner))
        if found is None:
            found = self._keys[(job, owner)] = len(self.key_list)
            self.key_list.append((job, owner))
        return found

    def sent(self, server: int, gpus: range, policies: ClockPolicies) -> None:
        """A command to ``server`` (its GPUs ``gpus``) carried this cycle's ``policies``."""
        if self.job[server] != policies.job[server]:
            self.acked[server] = math.inf  # the new one is not acked yet
        self.job[server] = policies.job[server]
        self.sent_mhz[gpus.start : gpus.stop] = policies.clock_mhz[gpus.start : gpus.stop]

    def forget(self, server: int, gpus: range) -> None:
        """What ``server`` (its GPUs ``gpus``) was granted is unknown (its command forgotten)."""
        self.job[server] = -1
        self.acked[server] = math.inf
        self.sent_mhz[gpus.start : gpus.stop] = np.nan
        self.sent_seq[gpus.start : gpus.stop] = -1

    def reset(self) -> None:
        """A new epoch: nothing granted, and agents are asked again."""
        self.job[:] = -1
        self.sent_mhz[:] = np.nan
        self.sent_seq[:] = -1
        self.refused[:] = False
        self.acked[:] = math.inf
