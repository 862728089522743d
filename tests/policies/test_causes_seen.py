"""policies.causes as the controller uses it: which GPUs it sees held, the cause, the level."""

from __future__ import annotations

import numpy as np

from policies.causes import (
    CAPPING,
    CLOCK_LOCK,
    FAILSAFE,
    GRANT,
    NO_LEVEL,
    NOT_HELD,
    SITE_LIMIT,
    STAGED,
    binding_levels,
    cap_levels,
    held_back_w,
    initial_levels,
    seen_causes,
)
from policies.settings import Decision, PolicySettings
from policies.tree import PHASE_CODES, RACK, ROW, SITE
from tests.support.policy_trees import make_state, uncapping_everywhere, uniform_tree, with_bands

COMPUTE, CHECKPOINT = PHASE_CODES["compute"], PHASE_CODES["checkpoint"]
SETTINGS = PolicySettings()  # a 200-1200 W GPU is at its cap within 50 W of it


def tree():
    """Site 0, row 1, racks 2 and 3; GPUs 0-1 in rack 2, GPUs 2-3 in rack 3; every node
    below its uncapping threshold."""
    return uncapping_everywhere(uniform_tree(1, 2, 1, 2))


def decision(cap_w, node_capping=(), cut_levels=()) -> Decision:
    n = len(cap_w)
    return Decision(
        cap_w=np.asarray(cap_w, float),
        max_sm_clock_mhz=np.full(n, np.nan),
        node_power_w=np.zeros(6),
        node_predicted_w=np.zeros(6),
        node_capping=np.asarray(node_capping or [False] * 6, bool),
        floor_hold_energy_j=0.0,
        cut_levels=np.asarray(cut_levels or [0] * n, np.uint8),
    )


def test_held_is_at_its_cap_below_its_max_while_its_job_works_or_clock_locked():
    t = tree()
    causes = np.array([STAGED, FAILSAFE, CAPPING, CAPPING], np.int8)
    # 0: 30 W under a 700 W cap: held; 1: 60 W under its cap: not; 2: at its max: not;
    # 3: at its cap but checkpointing: not (a wait is not slowed by power)
    state = make_state(t, [670, 640, 1200, 700], [700, 700, 1200, 700],
                       phase=[COMPUTE, COMPUTE, COMPUTE, CHECKPOINT])  # fmt: skip
    seen = seen_causes(t, state, causes, SETTINGS)
    assert list(seen) == [STAGED, NOT_HELD, NOT_HELD, NOT_HELD]
    # a clock lock holds a working GPU whatever its cap, and is its cause
    locked = np.array([False, True, True, True])
    seen = seen_causes(t, state, causes, SETTINGS, locked)
    assert list(seen) == [STAGED, CLOCK_LOCK, CLOCK_LOCK, NOT_HELD]
    # held back: max limit less cap; for a clock lock, less the draw
    np.testing.assert_allclose(held_back_w(t, state, seen), [500.0, 560.0, 0.0, 0.0])


def test_the_nearest_capping_node_binds_and_the_root_reads_what_bounds_it():
    t = tree()
    # rack 2 and the site capping: GPUs 0-1 bound by their rack, 2-3 by the site
    d = decision([500] * 4, node_capping=[True, False, True, False, False, False])
    assert list(binding_levels(t, d)) == [RACK, RACK, SITE, SITE]
    assert list(binding_levels(t, d, root=SITE_LIMIT)) == [RACK, RACK, SITE_LIMIT, SITE_LIMIT]
    # nothing capping: the nearest level that cut, else none
    d = decision([500] * 4, cut_levels=[1 << ROW, (1 << SITE) | (1 << RACK), 0, 1 << SITE])
    assert list(binding_levels(t, d, root=GRANT)) == [ROW, RACK, NO_LEVEL, GRANT]
    # nothing capping or cut (rule 3c levelled it): the nearest node between its bands
    between = with_bands(t, [3], 1e9, 1e9, -1.0)  # rack 3 above its uncapping threshold
    assert list(binding_levels(between, d)) == [ROW, RACK, RACK, SITE]  # a cut comes first


def test_a_gpu_takes_its_level_when_it_takes_capping_and_keeps_it_while_held():
    levels = initial_levels(4)
    old = np.full(4, 700.0)
    before = np.array([FAILSAFE, CAPPING, CAPPING, STAGED], np.int8)
    after = np.array([CAPPING, CAPPING, CAPPING, STAGED], np.int8)
    levels[1:3] = ROW
    bound = np.array([RACK, RACK, RACK, RACK], np.int8)
    # 0: held at its failsafe start by a full rack; 1: cut again, now by its rack;
    # 2: capping carried on (cap rising); 3: staged, no level
    out = cap_levels(levels, before, after, old, decision([700, 600, 750, 600]), bound)
    assert list(out) == [RACK, RACK, ROW, NO_LEVEL]
    # 1 and 2 read lowered again (their caps in force read back before the cut landed)
    # while nothing binds them: the same cut, their levels kept (seen under load: a
    # capping-held GPU recorded with no level)
    unbound = np.full(4, NO_LEVEL, np.int8)
    again = cap_levels(out, after, after, old, decision([700, 600, 600, 600]), unbound)
    assert list(again) == [RACK, RACK, ROW, NO_LEVEL]
