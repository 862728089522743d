"""ControllerCore cuts for a budget in turn (``_cut_in_turn``): an operator's site limit
glides the site down, and the nodes are cut a few racks a cycle, not all of them.

Found by ``bench_scale --site-limit-mw`` on the 150 MW site: a glide at the grid's 1 MW/s
cut its 82,944 GPUs by ~11 W each every cycle, a command to each of its 20,736 nodes every
second, which the broker and one fleet process could not carry (they fell seconds behind).
With turns the site falls as fast, along the same line, from fewer commands.

Under the bands (``BANDS``), whose budget a site limit lowers (the tree is the one
``SiteLimits.tree_under`` makes for them): safety by caps under a site limit is
tests/controller/test_site_limit_under_caps.py's.

``BUDGETS`` (tests/controller/test_controller_core.py): five 2-GPU H100 nodes (200-700 W)
in three racks; every GPU computes at 300 W, or what its cap lets it draw.
"""

from __future__ import annotations

import itertools

import pytest

from powerd.protocol import SiteLimit
from powerd.site_limits.limits import SiteLimits
from tests.controller.test_controller_core import (
    BANDS,
    CAP_MAX_W,
    NODES,
    WALL0,
    Bench,
    make_bench,
)

DRAW_W = 300.0
LIMIT_W = 2_500.0  # the site draws 3,100 W (100 W of it rack k1's overhead)
RAMP_W_PER_S = 100.0


def caps(holdings: dict[str, list[float]], node: str) -> list[float]:
    """What ``node`` holds: its last command's caps, else its maximum (never commanded)."""
    return holdings.get(node, [CAP_MAX_W] * 2)


def draws(bench: Bench) -> dict[str, list[float]]:
    return {node: [min(DRAW_W, c) for c in caps(bench.caps, node)] for node in NODES}


def glide(max_raises_per_cycle: int, cycles: int = 14) -> tuple[list[set[str]], list[float]]:
    """The nodes cut every cycle while the site glides down to ``LIMIT_W``, and the site's
    measured power before each cycle."""
    bench = make_bench(
        ack_timeout_s=3.0,
        command_ttl_s=30.0,
        max_raises_per_cycle=max_raises_per_cycle,
        policy=BANDS,
    )
    base = bench.core.tree
    limits = SiteLimits()
    limits.take(SiteLimit(v=1, operator="op", seq=1, ts=WALL0, limit_w=LIMIT_W,
                          starts_ts=WALL0, expires_ts=WALL0 + 3600.0))  # fmt: skip
    bench.report_all(DRAW_W)
    bench.apply(bench.cycle())  # a new controller commands every node once
    cut, measured = [], []
    for _ in range(cycles):
        bench.clock.advance(1.0)
        held = {node: list(caps) for node, caps in bench.caps.items()}
        drawn = draws(bench)
        for node, gpus_w in drawn.items():
            bench.report(node, gpus_w)
        site_w = sum(sum(w) for w in drawn.values()) + 100.0
        measured.append(site_w)
        bench.core.tree = limits.tree_under(  # as the service does before each cycle
            base, WALL0 + bench.clock.t, site_w, 1.0, RAMP_W_PER_S, bench.core.site_predicted_w
        )
        bench.apply(bench.cycle())
        lower = [n for n in NODES for a, b in zip(caps(bench.caps, n), caps(held, n), strict=True)
                 if a < b]  # fmt: skip
        cut.append(set(lower))
    return cut, measured


def test_a_glide_cuts_the_nodes_in_turn_along_the_same_line():
    every, every_site_w = glide(max_raises_per_cycle=100)
    turns, turn_site_w = glide(max_raises_per_cycle=2)  # a turn: about one node a cycle
    # without turns every node is cut every cycle of the glide
    assert max(len(c) for c in every) == len(NODES)
    # with them, one rack (one or two nodes) a cycle, its two nodes together
    assert max(len(c) for c in turns) <= 2
    assert all(("k1-n1" in c) == ("k1-n2" in c) for c in turns)
    assert sum(map(len, turns)) < sum(map(len, every)) / 2
    # and the site falls along the same line: the turn's GPUs give what all gave
    assert turn_site_w == pytest.approx(every_site_w, abs=1.0)
    assert turn_site_w[-1] <= LIMIT_W < turn_site_w[0]
    falls = [a - b for a, b in itertools.pairwise(turn_site_w)]
    assert max(falls) <= 0.9 * RAMP_W_PER_S + 1.0  # within the glide's share of the ramp
