"""Clocks that follow a job's own phase announcements, under a policy the controller granted.

A controller's comm-phase clock lock arrives a cycle after the phase starts and
outlives it by as much. So a signed command may grant a GPU a clock policy
(``CommClock``: a job, its topic's owner, a clock); while the agent holds it, that
job's announcements move the GPU's lock at once: ``communication`` locks it to the
policy's clock (clamped into the device's range, as every lock), any other phase
removes the lock. An announcement is not signed: it can only do what the signed
command granted, and nothing once the grant is gone.

A policy holds as long as the command that carried it (docs/PROTOCOL.md): every
applied command replaces every GPU's policy (a GPU the newest command gives none has
none), and failsafe or a newer controller epoch ends them all. A lock an announcement
made is removed when its policy ends. The command's own ``max_sm_clock_mhz`` applies
when the command does; the job's next announcement takes over from it: of a command
and an announcement, the later one sets the clock.

No I/O and no clock of its own: ``AgentCore`` feeds it, the daemon subscribes to
``topics()``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from msgspec import UNSET

from powerd.agent import rules
from powerd.agent.controls import set_clock_lock
from powerd.gpu import Gpu, GpuError
from powerd.protocol import CommClock, GpuCommand, PhaseEvent, ProtocolError, Topics, decode
from powerd.ratelimit import LogOncePer, TokenBucket

log = logging.getLogger("powerd.agent")

# Announcements acted on, all jobs together: a training loop announces a section every
# second or more (docs/JOBHOOK.md); past this, a flood is dropped, not obeyed.
PHASES_PER_S = 20.0
PHASE_BURST = 40.0


@dataclass
class PhaseClockCounters:
    phases_applied: int = 0  # announcements of a job this node holds a policy for
    phases_ignored: int = 0  # valid, but no GPU here holds a policy for that job (now)
    phases_rejected: int = 0  # malformed, or a name that does not match its topic
    phases_dropped: int = 0  # over PHASES_PER_S: a flood
    locks: int = 0  # GPU clock locks an announcement made
    unlocks: int = 0  # ... and removed (another phase, or the policy ended)
    gpu_errors: int = 0


class PhaseClocks:
    """Per GPU, the clock policy of the newest command, and which locks announcements made."""

    def __init__(
        self, gpus: Mapping[int, Gpu], topics: Topics, monotonic: Callable[[], float]
    ) -> None:
        self._gpus = gpus
        self._topics = topics
        self._monotonic = monotonic
        self.policies: dict[int, CommClock] = {}
        self.phase_locked: set[int] = set()  # GPUs whose lock an announcement made
        self.counters = PhaseClockCounters()
        self._bucket = TokenBucket(PHASES_PER_S, PHASE_BURST, monotonic)
        self._log = LogOncePer(log)

    def topics(self) -> frozenset[str]:
        """The phase topics of the jobs this node holds policies for: what to subscribe to."""
        return frozenset(self._topic(p) for p in self.policies.values())

    def _topic(self, policy: CommClock) -> str:
        return self._topics.phase(policy.job, policy.owner)

    # --- commands ------------------------------------------------------------------

    def after_command(self, entries: Iterable[GpuCommand]) -> dict[int, CommClock]:
        """An applied command's policies replace every GPU's; what each GPU now holds, its
        clock clamped into the device's range (for the ack). Call it after the command's
        own controls are applied: its explicit clock makes the lock the command's."""
        wanted: dict[int, CommClock] = {}
        for entry in entries:
            if entry.index not in self._gpus:
                continue
            if entry.max_sm_clock_mhz is not UNSET:
                self.phase_locked.discard(entry.index)  # the command set this lock
            if entry.comm_clock is not UNSET:
                wanted[entry.index] = entry.comm_clock
        for index in list(self.phase_locked):
            new = wanted.get(index)
            old = self.policies.get(index)
            if not rules.lock_stays(True, _job_of(old), _job_of(new)):
                self._unlock(index, "its clock policy ended")
            elif (
                new is not None and old is not None and new.max_sm_clock_mhz != old.max_sm_clock_mhz
            ):
                self._lock(index, new)
        self.policies = wanted
        return {index: self._held(index, policy) for index, policy in wanted.items()}

    def _held(self, index: int, policy: CommClock) -> CommClock:
        try:
            clock_mhz = self._gpus[index].sm_clock_range().clamp(policy.max_sm_clock_mhz)
        except GpuError:
            return policy
        return CommClock(job=policy.job, owner=policy.owner, max_sm_clock_mhz=float(clock_mhz))

    def clamped(self, index: int) -> bool:
        """Whether the policy GPU ``index`` holds has a clock outside the device's range."""
        policy = self.policies.get(index)
        if policy is None:
            return False
        return self._held(index, policy).max_sm_clock_mhz != round(policy.max_sm_clock_mhz)

    def end_all(self, why: str, release: bool = True) -> None:
        """Every policy ends (failsafe, a newer epoch). ``release``: remove the locks
        announcements made (failsafe has unlocked every GPU already)."""
        if release:
            for index in list(self.phase_locked):
                self._unlock(index, why)
        self.phase_locked.clear()
        if self.policies:
            log.info("clock policies of %d GPU(s) ended: %s", len(self.policies), why)
        self.policies = {}

    # --- announcements -----------------------------------------------------------

    def on_phase(self, topic: str, payload: bytes) -> None:
        """One message on a phase topic: acted on if a GPU here holds a policy for its job;
        dropped past ``PHASES_PER_S``; never raises."""
        now = self._monotonic()
        if not self._bucket.take():
            self.counters.phases_dropped += 1
            self._log.warning(
                "phase-flood", now, "phase announcements over %g/s: dropped", PHASES_PER_S
            )
            return
        try:
            owner, job = self._topics.job_of(topic)
            event = decode(PhaseEvent, payload, job)
        except ProtocolError as exc:
            self.counters.phases_rejected += 1
            self._log.warning(f"phase-{topic}", now, "rejected phase announcement: %s", exc)
            return
        mine = [i for i, p in self.policies.items() if p.job == job and p.owner == owner]
        if not mine:
            self.counters.phases_ignored += 1
            return
        self.counters.phases_applied += 1
        for index in mine:
            if rules.phase_locks(event.phase):
                self._lock(index, self.policies[index])
            else:
                self._unlock(index, f"job {job}: {event.phase}")

    def _lock(self, index: int, policy: CommClock) -> None:
        try:
            set_clock_lock(self._gpus[index], policy.max_sm_clock_mhz)
        except GpuError as exc:
            self._gpu_error(index, "lock", exc)
            return
        if index not in self.phase_locked:
            self.counters.locks += 1
        self.phase_locked.add(index)

    def _unlock(self, index: int, why: str) -> None:
        """Remove GPU ``index``'s lock, whoever made it (a policy's job decides its clock)."""
        self.phase_locked.discard(index)
        try:
            gpu = self._gpus[index]
            if gpu.locked_max_sm_clock_mhz() is None:
                return
            set_clock_lock(gpu, None)
        except GpuError as exc:
            self._gpu_error(index, "unlock", exc)
            return
        self.counters.unlocks += 1
        log.debug("gpu %d: clock unlocked (%s)", index, why)

    def _gpu_error(self, index: int, what: str, exc: GpuError) -> None:
        self.counters.gpu_errors += 1
        self._log.warning(
            f"phase-gpu{index}", self._monotonic(), "gpu %d: clock %s failed: %s", index, what, exc
        )


def _job_of(policy: CommClock | None) -> rules.PolicyJob | None:
    return None if policy is None else (policy.job, policy.owner)


def _clock_of(policy: CommClock | None) -> float | None:
    return None if policy is None else policy.max_sm_clock_mhz
