"""What the controller records of why a job's GPUs are held: cause and level, per job.

A ControllerCore on test_controller_core's budgets with its fake clock; the agents draw
what their jobs want under the caps they were commanded (``step``).
"""

from __future__ import annotations

import dataclasses

from policies.causes import LEVEL_TAGS
from powerd.controller.job_causes import NO_JOB, JobHeld, root_level
from powerd.controller.records import Records
from powerd.telemetry_schema import parse_line
from tests.controller.test_controller_core import BANDS, NODES, Bench, make_bench
from tests.support.policy_trees import uniform_tree

CK = ["k2-n1", "k2-n2"]  # rack k2 has room for its GPUs at their maximum


def step(bench: Bench, want_w: dict[str, float], cycles: int = 1) -> list[JobHeld]:
    """Each node reports drawing what it wants (100 W if not named) under its caps; a cycle;
    the agents apply its commands. What held the jobs' GPUs at the last cycle."""
    for _ in range(cycles):
        for node in NODES:
            caps = bench.caps.get(node, [400.0, 400.0])  # agents start at their failsafe
            bench.report(node, [min(want_w.get(node, 100.0), c) for c in caps], cap_w=caps)
        bench.apply(bench.cycle(0.5))
    return bench.core.job_causes.held


def as_rows(held: list[JobHeld]) -> set[tuple[str, str, str | None, int]]:
    return {(h.job, h.cause, h.level, h.gpus) for h in held}


def test_a_rack_budget_holding_a_jobs_gpus_is_recorded_as_capping_by_the_rack():
    """Rack k1's 2,600 W limit holds its four GPUs at 625 W (safety by caps, the default)."""
    bench = make_bench()
    bench.phase("train", "compute", ["k1-n1", "k1-n2"])
    want = {"k1-n1": 690.0, "k1-n2": 690.0, **dict.fromkeys(CK, 690.0)}
    first = step(bench, want)  # at their failsafe caps: held there since the agents started
    assert as_rows(first) == {
        ("train", "failsafe start", None, 4),
        (NO_JOB, "failsafe start", None, 4),
    }
    held = step(bench, want, cycles=3)
    assert as_rows(held) == {("train", "capping", "rack", 4)}  # k2's GPUs got their maximum
    (train,) = held
    assert train.job_gpus == 4 and train.held_w == 4 * (700.0 - 625.0)
    # and the records say so: one job_held point
    records = Records("lab", bench.topology, "ctl-a")
    result = bench.cycle(0.5)
    lines = [parse_line(x) for x in records.cycle(bench.core, result, 1_795_000_000.0)]
    (point,) = [p for p in lines if p.measurement == "job_held"]
    assert point.tags == {
        "cluster": "lab", "controller": "ctl-a", "job": "train", "cause": "capping", "level": "rack"
    }  # fmt: skip
    assert point.fields == {"gpus": 4, "held_w": 300.0, "job_gpus": 4, "held_share": 1.0}


def test_a_checkpoints_staged_caps_hold_the_job_as_it_resumes():
    bench = make_bench(policy=BANDS)
    bench.phase("ck", "compute", CK)
    step(bench, dict.fromkeys(CK, 690.0), cycles=3)
    bench.phase("ck", "checkpoint", CK)
    assert step(bench, dict.fromkeys(CK, 300.0)) == []  # a wait is not slowed by its caps
    assert bench.caps["k2-n1"] == [325.0, 325.0]  # staged: its draw plus 25 W
    bench.phase("ck", "compute", CK)
    assert as_rows(step(bench, dict.fromkeys(CK, 690.0))) == {("ck", "staged phase", None, 4)}


def test_a_low_job_cut_for_a_high_one_is_held_by_the_priority_shift():
    """Rack k1 between its bands: the high job's GPUs are held at their caps, the low job
    gives (rule 3b), and is then held at the caps it gave down to."""
    bench = make_bench(policy=BANDS)
    bench.phase("hi", "compute", ["k1-n1"], priority="high")
    bench.phase("lo", "compute", ["k1-n2"], priority="low")
    bench.caps["k1-n1"] = [250.0, 250.0]
    held = step(bench, {"k1-n1": 690.0, "k1-n2": 420.0}, cycles=3)
    assert ("lo", "priority shift", None, 2) in as_rows(held)
    assert bench.caps["k1-n2"][0] < 400.0  # it gave


def test_the_root_reads_an_operators_limit_or_a_grant():
    tree = uniform_tree(1, 1, 1, 2)
    assert LEVEL_TAGS[root_level(None, tree)] == "site"
    assert LEVEL_TAGS[root_level(150_000.0, tree)] == "site limit"
    granted = dataclasses.replace(tree, root_caps_limit_w=2_000.0)
    assert LEVEL_TAGS[root_level(None, granted)] == "grant"
    assert LEVEL_TAGS[root_level(1_500.0, granted)] == "site limit"  # an operator's line
