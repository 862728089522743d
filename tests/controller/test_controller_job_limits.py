"""What job announcements may cost a controller (powerd.controller.job_limits): rates per
owner and job, jobs kept, expiry, claims on another owner's nodes; host lists expanded
against the site's names only; a node's telemetry rate judged against the site's period."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from powerd.controller.job_limits import JobLimits
from powerd.hostlist import SiteNames, expand_within
from powerd.ratelimit import MAX_LOG_KEYS, KeyedBuckets, LogOncePer
from tests.controller.test_controller_core import WALL0, Bench, make_bench, phase_payload


def announce(bench: Bench, job: str, owner: str | None, nodes=None, phase: str = "compute"):
    return bench.core.on_phase(job, phase_payload(job, phase, nodes), owner)


def test_announcements_over_an_owners_rate_are_dropped_unread() -> None:
    bench = make_bench(jobs=JobLimits(owner_announcements_per_s=2.0, job_announcements_per_s=100))
    taken = [announce(bench, f"j{k}", "mallory", ["k1-n1"]) for k in range(10)]
    assert sum(e is not None for e in taken) == 4  # a burst of twice the rate
    assert bench.core.counters.phases_rate_limited == 6
    assert announce(bench, "other", "alice", ["k2-n1"]) is not None  # another owner's own
    bench.clock.advance(1.0)
    assert announce(bench, "j99", "mallory", ["k1-n1"]) is not None  # refilled


def test_a_job_holds_its_nodes_alone_and_jobs_are_bounded_by_the_nodes() -> None:
    """Many job ids from one owner naming one node: each takes it from the last, which is
    forgotten with no node left; never more jobs than nodes."""
    bench = make_bench(jobs=JobLimits(owner_announcements_per_s=1e6, job_announcements_per_s=1e6))
    for k in range(1000):
        announce(bench, f"fake{k}", "mallory", ["k1-n1"])
    assert list(bench.core.jobs) == ["fake999"]
    assert bench.core.job_of("k1-n1") == "fake999"
    for k in range(20):
        announce(bench, f"spread{k}", "mallory", [f"k{k % 3 + 1}-n{k % 2 + 1}"])
    assert len(bench.core.jobs) <= bench.core.tree.n_servers


def test_jobs_per_owner_are_bounded() -> None:
    limits = JobLimits(owner_announcements_per_s=1e6, job_announcements_per_s=1e6)
    bench = make_bench(jobs=JobLimits(**{**limits.__dict__, "max_jobs_per_owner": 2}))
    for k, node in enumerate(["k1-n1", "k1-n2", "k2-n1"]):
        announce(bench, f"j{k}", "bob", [node])
    assert sorted(bench.core.jobs) == ["j0", "j1"]
    assert bench.core.counters.jobs_refused == 1
    assert announce(bench, "a0", "alice", ["k2-n1"]) is not None  # alice has her own


def test_a_job_naming_another_owners_live_job_nodes_is_refused() -> None:
    bench = make_bench()
    announce(bench, "train", "alice", ["k1-n1", "k1-n2"])
    assert announce(bench, "grab", "mallory", ["k1-n2", "k2-n1"]) is None
    assert bench.core.counters.job_claims_refused == 1
    assert bench.core.jobs["train"].nodes == ["k1-n1", "k1-n2"] and "grab" not in bench.core.jobs
    # alice's next job may take them (her own), and once her job's announcements are no
    # longer live (announced_live_s), so may anyone's
    assert announce(bench, "train2", "alice", ["k1-n2"]) is not None
    bench.clock.advance(bench.core.settings.announced_live_s + 1)
    assert announce(bench, "grab", "mallory", ["k1-n1"]) is not None
    assert bench.core.job_of("k1-n1") == "grab" and "train" not in bench.core.jobs


def test_a_silent_job_expires() -> None:
    bench = make_bench(jobs=JobLimits(expiry_s=600.0))
    announce(bench, "quiet", "alice", ["k1-n1"])
    bench.cycle(300.0)
    assert "quiet" in bench.core.jobs
    result = bench.cycle(301.0)
    assert "quiet" not in bench.core.jobs and bench.core.job_of("k1-n1") is None
    assert result.counters.jobs_expired == 1 and result.counters.jobs_live == 0


def test_a_host_list_is_expanded_against_the_site_only() -> None:
    site = SiteNames(["r01-n01", "r01-n02", "r02-n01"])
    assert expand_within("r01-n[01-03],r02-n01,zz9", site, 5) == (
        ["r01-n01", "r01-n02", "r02-n01"],
        2,
    )
    with pytest.raises(ValueError, match="too many names"):  # refused before any is made
        expand_within("zz[000001-100000]", site, 3)
    started = time.perf_counter()
    assert expand_within("zz[1-9]-n[000001-10000]", site, 100_000) == ([], 90_000)
    assert time.perf_counter() - started < 0.05  # a stranger's prefix: dropped at "zz"


def test_a_host_list_longer_than_the_site_is_refused_by_the_core() -> None:
    bench = make_bench()
    payload = json.dumps(
        {"v": 1, "job": "big", "ts": WALL0, "phase": "compute", "hostlist": "k1-n[1-100]"}
    ).encode()
    assert bench.core.on_phase("big", payload, "mallory") is None
    assert bench.core.rejected_total == 1 and not bench.core.jobs


def test_keyed_buckets_and_log_keys_are_bounded() -> None:
    buckets = KeyedBuckets(1.0, 1.0, max_keys=10)
    assert all(buckets.take(f"k{i}", 0.0) for i in range(100))
    assert len(buckets) == 10
    log = LogOncePer(__import__("logging").getLogger("test"))
    for i in range(3 * MAX_LOG_KEYS):
        log.tally(f"key{i}", 0.0)
    assert len(log._last) <= MAX_LOG_KEYS


def test_a_nodes_rate_is_judged_against_the_sites_period_not_its_own_word() -> None:
    """A node declaring 0.05 s sends 10 a second; the site's agents send every second."""
    declared = np.full(5, 0.05)
    for site_period_s, flagged in [(None, False), (1.0, True)]:
        bench = make_bench(telemetry_period_s=site_period_s)
        bench.core.period_s[:] = declared
        received = np.zeros(5)
        received[0] = 10
        bench.core.check_rates(received, 1.0)
        assert bool(bench.core.implausible[0]) is flagged
