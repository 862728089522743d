"""powerd.topology.scope: scopes, the scoped tree a leaf manages, and the fallback check."""

from __future__ import annotations

import numpy as np
import pytest

from policies.tree import RACK, ROW, SERVER
from powerd.topology import BudgetError, load_budgets, parse_budgets
from powerd.topology.scope import (
    Scope,
    check_scopes,
    leaf_pool_w,
    parse_scope,
    rows_budget_w,
    rows_within_site,
    scoped,
)
from tests.support.tree_sites import three_rows

TREE_3ROWS = "powerd/data/budgets/tree-3rows.toml"


def test_parse_scope_forms():
    assert parse_scope("row1") == Scope("row1", ("row1",))
    assert parse_scope("east:row1, row2") == Scope("east", ("row1", "row2"))
    assert str(parse_scope("east:row1,row2")) == "east:row1,row2"
    assert str(parse_scope("row1")) == "row1"
    for bad in ("", "a b", "east:", "east:row1,row1", "/x:row1"):
        with pytest.raises(ValueError):
            parse_scope(bad)


def test_scoped_tree_keeps_its_rows_and_gives_the_root_their_sums():
    site = parse_budgets(three_rows())
    part = scoped(site, parse_scope("two:r2,r3"))
    assert part.rows == ("r2", "r3")
    assert all(s.startswith(("r2-", "r3-")) for s in part.servers)
    assert len(part.servers) == 4 and part.n_gpus == 16
    assert part.names[0] == "s.two"
    assert part.budget_w[0] == 24_000 and part.limit_w[0] == 28_000
    assert part.overhead_w[0] == 0.0
    # the site's ramp in proportion to the scope's share of the rows' budgets
    assert part.ramp_w_per_s[0] == pytest.approx(12_000 * 24 / 36)
    tree = part.tree
    assert [len(tree.level_nodes[lvl]) for lvl in (ROW, RACK, SERVER)] == [2, 2, 4]
    # the same servers, GPUs and per-node numbers as in the site's tree
    whole = site.tree
    for name in part.servers:
        k, j = part.tree.server_ordinal[name], whole.server_ordinal[name]
        mine, theirs = part.tree.server_gpus[k], whole.server_gpus[j]
        assert np.array_equal(tree.failsafe_cap_w[mine.start : mine.stop],
                              whole.failsafe_cap_w[theirs.start : theirs.stop])  # fmt: skip
        assert tree.budget_w[tree.index[name]] == whole.budget_w[whole.index[name]]
    assert site.n_gpus == 24  # the site itself is untouched


def test_rows_over_the_leaf_pool_are_refused_with_the_figures():
    demo = load_budgets("powerd/data/budgets/demo.toml")  # rows 200 kW, site 180 kW
    assert rows_within_site(demo) is not None
    with pytest.raises(BudgetError, match=r"sum to 200\.0 kW, above the 180\.0 kW"):
        scoped(demo, parse_scope(demo.rows[0]))


def test_the_site_overhead_is_taken_at_the_site_threshold():
    site = load_budgets("powerd/data/budgets/site-150mw.toml")
    assert leaf_pool_w(site) == pytest.approx(146e6 - 30e6 / 0.98)
    assert rows_budget_w(site) == pytest.approx(16 * 7.2e6)
    assert rows_within_site(site) is None
    assert rows_within_site(load_budgets(TREE_3ROWS)) is None


def test_check_scopes_names_what_is_wrong():
    site = parse_budgets(three_rows())
    with pytest.raises(BudgetError, match="no row named 'r9'"):
        check_scopes(site, [parse_scope("r9")])
    with pytest.raises(BudgetError, match="row r1 is in scopes a and b"):
        check_scopes(site, [parse_scope("a:r1"), parse_scope("b:r1,r2")])
    with pytest.raises(BudgetError, match="rows in no scope: r3"):
        check_scopes(site, [parse_scope("r1"), parse_scope("r2")], whole=True)
    check_scopes(site, [parse_scope("r1"), parse_scope("x:r2,r3")], whole=True)
