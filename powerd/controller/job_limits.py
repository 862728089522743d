"""Bounds on what job announcements may cost a controller (docs/CONTROLLER.md, "Jobs").

Anyone with a login may publish on a job's phase topic, as often as they like, with
any job name. So a controller takes at most so many announcements a second per owner
(the login of ``jobs/{owner}/{job}/phase``; the unowned topic is one owner), per job
and in all, before it decodes one; it keeps at most so many jobs per owner (and never
more than the site has nodes: a job holds its nodes alone); and it forgets a job that
has announced nothing for ``expiry_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

from powerd.ratelimit import KeyedBuckets

# Buckets kept per kind (owners, jobs): a sender making up names costs no more memory.
MAX_BUCKETS = 4096
UNOWNED = ""  # the owner key of the unowned topic (jobs/{job}/phase): no login names it


@dataclass(frozen=True)
class JobLimits:
    # announcements taken a second (bursts of twice as many): per owner, per job, in all
    owner_announcements_per_s: float = 20.0
    job_announcements_per_s: float = 5.0
    all_announcements_per_s: float = 500.0
    # a job that has announced nothing for this long is forgotten (its nodes compute at
    # normal priority, phases inferred no more); well above announced_live_s
    expiry_s: float = 86400.0
    # jobs kept per owner; beyond, a new job is refused (in all: the site's node count)
    max_jobs_per_owner: int = 4096


class AnnouncementGate:
    """Whether one more announcement may be looked at now (``JobLimits``'s rates)."""

    def __init__(self, limits: JobLimits) -> None:
        def buckets(rate_per_s: float, keys: int) -> KeyedBuckets:
            return KeyedBuckets(rate_per_s, max(1.0, 2 * rate_per_s), keys)

        self._owners = buckets(limits.owner_announcements_per_s, MAX_BUCKETS)
        self._jobs = buckets(limits.job_announcements_per_s, MAX_BUCKETS)
        self._all = buckets(limits.all_announcements_per_s, 1)

    def refusal(self, owner: str | None, job: str, now_s: float) -> str | None:
        """Why this announcement is dropped unread (a rate passed), or None."""
        key = UNOWNED if owner is None else owner
        # the flooding owner's bucket first: its flood takes nothing from the others'
        if not self._owners.take(key, now_s):
            return f"over the rate of {'the unowned topic' if owner is None else owner}"
        if not self._jobs.take(f"{key}/{job}", now_s):
            return f"over the rate of job {job}"
        if not self._all.take("", now_s):
            return "over the rate of all announcements"
        return None
