"""powerd.coordinator.core: summaries in order, heard and silent leaves, grants per period."""

from __future__ import annotations

from typing import Any

import pytest

from powerd.coordinator.core import CoordinatorCore, leaf_specs
from powerd.protocol import Summary, encode
from powerd.topology import BudgetError, parse_budgets
from powerd.topology.scope import parse_scope
from tests.support.clock import ManualClock
from tests.support.tree_sites import three_rows


def make_core(clocks: ManualClock, ttl_s: float = 10.0) -> CoordinatorCore:
    site = parse_budgets(three_rows())
    scopes = [parse_scope(r) for r in ("r1", "r2", "r3")]
    return CoordinatorCore(site, scopes, "co", ttl_s, monotonic=clocks.monotonic, wall=clocks.time)


def summary(clocks: ManualClock, scope: str, high_w: float, low_w: float, **kw) -> Summary:
    fields: dict[str, Any] = dict(
        v=1, scope=scope, controller=f"leaf-{scope}", epoch=3, seq=1, ts=clocks.time(),
        measured_w=2600.0 + high_w + low_w, predicted_w=2600.0 + high_w + low_w,
        cap_sum_w=2600.0 + high_w + low_w, fixed_w=2600.0, demand_w=[high_w, 0.0, low_w],
        held_w=[0.0, 0.0, 0.0], budget_w=12_000.0, file_budget_w=12_000.0, limit_w=14_000.0,
        ramp_w_per_s=None, nodes=2, stale_nodes=0,
    )  # fmt: skip
    fields.update(kw)
    return Summary(**fields)


def test_specs_need_every_row_once():
    site = parse_budgets(three_rows())
    specs = leaf_specs(site, [parse_scope("r1"), parse_scope("rest:r2,r3")])
    assert [(s.scope.name, s.file_budget_w, s.limit_w) for s in specs] == [
        ("r1", 12_000.0, 14_000.0),
        ("rest", 24_000.0, 28_000.0),
    ]
    with pytest.raises(BudgetError, match="rows in no scope: r3"):
        leaf_specs(site, [parse_scope("r1"), parse_scope("r2")])


def test_no_summary_yet_every_leaf_gets_its_file_budget_signed_off_by_this_epoch():
    clocks = ManualClock()
    core = make_core(clocks)
    core.new_epoch(42)
    period = core.period()
    assert [(g.scope, g.budget_w, g.epoch, g.seq, g.ttl_s) for g in period.grants] == [
        ("r1", 12_000.0, 42, 1, 10.0),
        ("r2", 12_000.0, 42, 1, 10.0),
        ("r3", 12_000.0, 42, 1, 10.0),
    ]
    assert period.counters.leaves_silent == 3
    assert period.allocation.reserved_w == 36_000.0
    for grant in period.grants:  # every grant is a valid protocol message
        encode(grant)
    assert core.period().grants[0].seq == 2


def test_high_priority_rows_take_watts_from_low_priority_rows():
    clocks = ManualClock()
    core = make_core(clocks)
    # every row wants 9 kW above its 2.6 kW of floors: r1 for a high-priority job, r2 for
    # a normal one, r3 for a low one; 3 x 11.6 kW at target 0.95 is more than the 36 kW
    # pool
    assert core.on_summary(summary(clocks, "r1", 9000.0, 0.0))
    assert core.on_summary(summary(clocks, "r2", 0.0, 0.0, demand_w=[0.0, 9000.0, 0.0]))
    assert core.on_summary(summary(clocks, "r3", 0.0, 9000.0))
    wanted = core.period().allocation.wanted_w
    full = 11_600 / 0.95  # nothing held: what each draws, at its target
    assert wanted[:2] == pytest.approx([full, full])  # high and normal in full
    assert wanted[2] == pytest.approx(36_000 - 2 * full)  # low: what is left


def test_summaries_are_taken_in_order_and_only_while_fresh():
    clocks = ManualClock()
    core = make_core(clocks)
    assert core.on_summary(summary(clocks, "r1", 0.0, 0.0, seq=5))
    assert not core.on_summary(summary(clocks, "r1", 0.0, 0.0, seq=5))  # a replay
    assert not core.on_summary(summary(clocks, "r1", 0.0, 0.0, seq=9, epoch=2))  # deposed
    assert core.on_summary(summary(clocks, "r1", 0.0, 0.0, seq=1, epoch=4))  # a new leader
    assert not core.on_summary(summary(clocks, "nowhere", 0.0, 0.0))
    old = summary(clocks, "r2", 0.0, 0.0, ts=clocks.time() - 11.0)  # retained, leaf gone
    assert not core.on_summary(old, live=False)
    c = core.counters
    assert (c.summaries, c.summaries_stale, c.summaries_unknown) == (2, 3, 1)


def test_a_live_summary_counts_whatever_the_clocks_skew_behind_not_ahead():
    """A coordinator an hour ahead of its leaves hears them (live: sent now); a summary
    whose ts runs more than max_clock_skew_s ahead is refused, a clock alarm."""
    clocks = ManualClock()
    core = make_core(clocks)
    assert core.on_summary(summary(clocks, "r1", 0.0, 0.0, ts=clocks.time() - 3600.0))
    assert not core.on_summary(summary(clocks, "r2", 0.0, 0.0, ts=clocks.time() + 31.0))
    assert core.counters.clock_alarms == 1


def test_a_leaf_silent_for_the_ttl_is_reserved_its_last_budget():
    clocks = ManualClock()
    core = make_core(clocks)
    core.on_summary(summary(clocks, "r1", 8000.0, 0.0, budget_w=14_000.0))
    core.on_summary(summary(clocks, "r2", 0.0, 0.0))
    core.on_summary(summary(clocks, "r3", 0.0, 0.0))
    assert core.period().counters.leaves_heard == 3
    clocks.advance(10.5)
    core.on_summary(summary(clocks, "r2", 0.0, 0.0, seq=2))
    core.on_summary(summary(clocks, "r3", 0.0, 0.0, seq=2))
    period = core.period()
    assert period.counters.leaves_silent == 1
    assert period.allocation.reserved_w == 14_000.0  # more than r1's 12 kW file budget
    assert period.grants[0].budget_w == 12_000.0  # granted its file budget
    assert sum(g.budget_w for g in period.grants[1:]) <= core.site.pool_w - 14_000.0 + 1e-6


def test_an_operator_site_limit_shrinks_the_pool_by_the_site_threshold():
    clocks = ManualClock()
    core = make_core(clocks)
    assert core.pool_under(None) is core.site
    # the three_rows site has no overhead of its own: at threshold 0.98 the leaves' budgets
    # may sum to the limit / 0.98
    assert core.pool_under(29_400.0).pool_w == pytest.approx(30_000.0)
    assert core.pool_under(1e9).pool_w == core.site.pool_w  # never above the file's
    for scope in ("r1", "r2", "r3"):  # every leaf heard, each wanting 6 kW above its floors
        assert core.on_summary(summary(clocks, scope, 6000.0, 0.0))
    period = core.period(29_400.0)  # every leaf is lowered: at once, within the smaller pool
    assert sum(g.budget_w for g in period.grants) <= 30_000.0 + 1e-6
    assert all(g.budget_w < 12_000.0 for g in period.grants)


def test_under_safety_by_caps_an_operator_site_limit_is_the_pool_itself():
    """Leaves under caps run to their budgets, not to 98 % of them: the pool under a limit
    is the limit less the site's own overhead (with the threshold's division the site drew
    2 % over an operator's 50 kW limit, tests/fleet/test_tree_of_controllers_caps.py)."""
    clocks = ManualClock()
    core = make_core(clocks)
    for scope in ("r1", "r2", "r3"):
        assert core.on_summary(summary(clocks, scope, 6000.0, 0.0, caps_in_force_w=11_000.0))
    assert core.pool_under(29_400.0).pool_w == pytest.approx(29_400.0)
    period = core.period(29_400.0)
    assert sum(g.budget_w for g in period.grants) <= 29_400.0 + 1e-6


def test_a_site_limit_glides_the_pool_at_the_grids_ramp_down_where_there_is_one():
    """The grid limits measured power ([site.grid]); the site's own ramp limits the sum of
    its caps, 12 kW/s here (on the 150 MW site 5 MW/s against the grid's 1 MW/s): the pool
    under an operator's limit comes down at the grid's ramp-down, as a single controller's
    site does."""
    clocks = ManualClock()
    assert make_core(clocks).glide_ramp_w_per_s == 12_000.0  # no [site.grid]: the site's
    text = three_rows() + "[site.grid]\nramp_down_kw_per_s = 2\nramp_up_kw_per_s = 3\n"
    site = parse_budgets(text)
    scopes = [parse_scope(r) for r in ("r1", "r2", "r3")]
    core = CoordinatorCore(site, scopes, "co", 10.0, monotonic=clocks.monotonic, wall=clocks.time)
    assert core.glide_ramp_w_per_s == 2_000.0
