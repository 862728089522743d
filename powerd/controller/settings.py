"""What a controller core is configured with: its timings, limits and policies."""

from __future__ import annotations

from dataclasses import dataclass, field

from policies import PolicySettings
from policies.turns import MAX_RAISES_PER_S
from powerd.clock_skew import DEFAULT_MAX_CLOCK_SKEW_S
from powerd.controller.job_limits import JobLimits
from powerd.protocol import GpuSmoothing
from powerd.vocabulary import PRIORITIES


@dataclass(frozen=True)
class ControllerSettings:
    cycle_s: float = 1.0
    # The window the site's ramp is measured over ([site.grid] window_s; 1 s without one):
    # the raises of the cycles within any such window add up to at most its ramp × window
    # (powerd.controller.ramp_window).
    ramp_window_s: float = 1.0
    stale_after_s: float = 5.0
    ack_timeout_s: float = 3.0
    command_ttl_s: float = 30.0
    # The agents' failsafe_after_s: a silent agent may hold its last caps this long
    # before it falls back to its failsafe caps on its own.
    agent_failsafe_after_s: float = 10.0
    # Infer phases from power for jobs that announce themselves but never their waits.
    infer_phases: bool = True
    infer_window_s: float = 30.0
    # commands that only hand watts back, per cycle (cuts, clock changes, resends: all)
    max_raises_per_cycle: int = round(MAX_RAISES_PER_S)  # at the default 1 s cycle
    policy: PolicySettings = field(default_factory=PolicySettings)
    # A node sending telemetry faster than twice its reported rate (status period_s), or,
    # before it reported one, faster than this (Hz; agents' fastest period is 0.05 s), is
    # not believed: two senders share its login, or its agent is broken.
    telemetry_max_hz: float = 20.0
    # The site's agents' telemetry period (their agent.period_s, the fastest of them): a
    # node is judged against this, however fast its status says it sends; None: against
    # its status (at most telemetry_max_hz).
    telemetry_period_s: float | None = None
    # A node's clock more than this off the controller's (either way) is logged and counted
    # (nodes_skewed): its agent would refuse our heartbeats as from the future.
    max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S
    # What job announcements may cost (announcement rates, jobs kept, their expiry).
    jobs: JobLimits = field(default_factory=JobLimits)
    # Jobs (issue 12): the highest priority each owner may announce (owners not listed:
    # default_job_priority_max; "high" allows any), and whether jobs announced on the
    # unowned topic (jobs/{job}/phase, no login bound to them) are taken at all.
    job_priority_max: dict[str, str] = field(default_factory=dict)
    default_job_priority_max: str = "high"
    accept_unowned_jobs: bool = True
    # A leaf of a tree of controllers (a scope of the budgets file): jobs may name nodes of
    # other scopes, which are not ours to warn about.
    scoped: bool = False
    # Grid power smoothing (issue 14): the profile every GPU that reports hardware smoothing
    # is asked to hold (powerd.controller.smoothing); None: smoothing is left as it is.
    smoothing: GpuSmoothing | None = None
    # Clock policies (issue 16): the GPUs of a job whose announcements are live are granted
    # its comm clock in their commands (``CommClock``), and their agents lock and unlock them
    # on the job's own announcements, at once; the controller's own comm locks are for the
    # rest. Live: the job announced something within ``announced_live_s``; after that its
    # phases are inferred from power again, and the controller locks its clocks itself.
    agent_comm_clock: bool = True
    announced_live_s: float = 120.0

    def job_priority_allowed(self, owner: str | None, priority: str) -> bool:
        allowed = self.job_priority_max.get(owner or "", self.default_job_priority_max)
        return PRIORITIES.index(priority) >= PRIORITIES.index(allowed)
