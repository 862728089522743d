"""ClockGrants on its own: which GPUs a cycle's commands grant their job's comm clock."""

from __future__ import annotations

import math

import numpy as np

from powerd.controller.clock_grants import ClockGrants, same
from powerd.controller.counters import CycleCounters
from powerd.controller.jobs import JobRegistry
from tests.controller.controller_parts import parts
from tests.controller.test_controller_core import COMM_CLOCK_MHZ, phase_payload


def test_nan_is_the_same_as_nan() -> None:
    a, b = np.array([np.nan, 1.0, np.nan]), np.array([np.nan, 1.0, 2.0])
    assert list(same(a, b)) == [True, True, False]


def test_a_live_job_is_granted_its_clock_and_followed_once_its_agents_acked() -> None:
    p = parts()
    registry = JobRegistry(p.tree, p.settings, p.clock, p.log_once, p.reject)
    grants = ClockGrants(p.tree, p.settings)
    registry.on_phase("llm", phase_payload("llm", "startup", ["k2-n1"]), "a", CycleCounters())
    gpus = p.tree.server_gpus[2]
    policies = grants.policies(p.clock.t, registry)
    assert grants.key("llm", "a") == policies.job[2] == 0 and grants.key("x", None) == 1
    assert list(np.flatnonzero(policies.granted)) == list(gpus)
    assert list(policies.clock_mhz[gpus.start : gpus.stop]) == [COMM_CLOCK_MHZ] * 2
    assert policies.changed[gpus.start] and not policies.follows.any()
    grants.sent(2, gpus, policies)
    grants.acked[2] = p.clock.t  # its agent took the policy
    p.clock.advance(1.0)
    registry.on_phase("llm", phase_payload("llm", "communication"), "a", CycleCounters())
    policies = grants.policies(p.clock.t, registry)
    assert list(np.flatnonzero(policies.follows)) == list(gpus)
    grants.forget(2, gpus)
    assert grants.job[2] == -1 and grants.acked[2] == math.inf
    assert grants.policies(p.clock.t, registry).changed[gpus.start]


def test_an_agent_that_refused_a_policy_is_not_granted_one() -> None:
    p = parts()
    registry = JobRegistry(p.tree, p.settings, p.clock, p.log_once, p.reject)
    grants = ClockGrants(p.tree, p.settings)
    registry.on_phase("llm", phase_payload("llm", "startup", ["k3-n1"]), None, CycleCounters())
    grants.refused[p.tree.server_gpus[4].start] = True
    granted = grants.policies(p.clock.t, registry).granted
    assert list(np.flatnonzero(granted)) == [p.tree.server_gpus[4].start + 1]
    grants.reset()
    assert not grants.refused.any()
