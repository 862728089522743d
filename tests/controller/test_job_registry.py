"""JobRegistry on its own: announcements in, jobs, their nodes and per-server arrays out."""

from __future__ import annotations

from policies import PHASE_CODES, PRIORITY_CODES
from powerd.controller.counters import CycleCounters
from powerd.controller.job_limits import JobLimits
from powerd.controller.jobs import JobRegistry
from tests.controller.controller_parts import Parts, parts
from tests.controller.test_controller_core import phase_payload


def registry_of(p: Parts) -> JobRegistry:
    return JobRegistry(p.tree, p.settings, p.clock, p.log_once, p.reject)


def test_a_job_holds_the_nodes_it_names_and_gives_the_policy_its_phase() -> None:
    p = parts()
    jobs = registry_of(p)
    counters = CycleCounters()
    assert jobs.on_phase("llm", phase_payload("llm", "startup", ["k1-n1"], "high"), "a", counters)
    p.clock.advance(2.0)
    jobs.on_phase("llm", phase_payload("llm", "communication", priority="high"), "a", counters)
    assert jobs.job_of("k1-n1") == "llm" and jobs.job_of("k1-n2") is None
    arrays = jobs.server_arrays(p.clock.t + 3.0)
    assert arrays.priority[0] == PRIORITY_CODES["high"]
    assert arrays.phase[0] == PHASE_CODES["communication"] and arrays.phase_s[0] == 3.0
    assert (
        arrays.priority[1] == PRIORITY_CODES["normal"] and arrays.phase[1] == PHASE_CODES["compute"]
    )


def test_another_owner_may_neither_change_a_job_nor_take_its_nodes() -> None:
    p = parts()
    jobs = registry_of(p)
    counters = CycleCounters()
    jobs.on_phase("llm", phase_payload("llm", "startup", ["k1-n1"]), "a", counters)
    assert jobs.on_phase("llm", phase_payload("llm", "compute"), "b", counters) is None
    assert (
        jobs.on_phase("other", phase_payload("other", "startup", ["k1-n1"]), "b", counters) is None
    )
    assert counters.job_claims_refused == 1
    assert [key for _, key in p.rejected] == ["owner-b", "owner-b"]
    assert jobs.job_of("k1-n1") == "llm"


def test_a_later_job_of_the_same_owner_takes_nodes_and_an_empty_job_is_forgotten() -> None:
    p = parts()
    jobs = registry_of(p)
    counters = CycleCounters()
    jobs.on_phase("one", phase_payload("one", "startup", ["k2-n1"]), "a", counters)
    jobs.on_phase("two", phase_payload("two", "startup", ["k2-n1", "k2-n2"]), "a", counters)
    assert set(jobs.jobs) == {"two"} and jobs.jobs["two"].nodes == ["k2-n1", "k2-n2"]
    jobs.on_phase("two", phase_payload("two", "shutdown"), "a", counters)
    assert jobs.jobs == {} and jobs.server_job == [None] * p.tree.n_servers


def test_silent_jobs_expire_and_owners_are_bounded() -> None:
    p = parts(jobs=JobLimits(max_jobs_per_owner=1))
    jobs = registry_of(p)
    counters = CycleCounters()
    jobs.on_phase("one", phase_payload("one", "startup", ["k3-n1"]), "a", counters)
    assert jobs.on_phase("two", phase_payload("two", "startup", ["k2-n2"]), "a", counters) is None
    assert counters.jobs_refused == 1
    jobs.expire(p.clock.t + p.settings.jobs.expiry_s + 1, counters)
    assert jobs.jobs == {} and counters.jobs_expired == 1
