"""The tree a cycle decides under: the budgets file's, under what is in force now.

``tree_in_force(file_tree, ...)`` is the one way from the file's limits and bands to
those a cycle's ``policies.decide`` runs under; the controller (a site's, a leaf's) and
the replay call it. Pure: what is in force (a grant, an operator's line) is worked out
by its owner (``powerd.controller.scoping``, ``powerd.controller.site_limit``), which
keep their state (a grant's age, the line's last step) and pass the values here.

In order, each a function of its own:

1. **A root budget** (``with_root_budget``, policies/coordination.py): a leaf of a tree
   of controllers under the coordinator's grant, or its file budget once none is live.
   Its root's budget, bands and ramp are the grant's; under safety by caps the grant
   bounds the caps in force under the root (``Tree.root_caps_limit_w``).
2. **An operator's site limit** (``with_site_limit``): the site's capping threshold and
   target on the glide line (``SiteLine``), never above the file's. Under safety by caps
   the caps under the site ride the line instead (``root_caps_limit_w``), never lower than
   ``not_below_w``, which the controller sets to where the caps in force could be without
   moving any draw (each at most its draw plus what a GPU that lends keeps,
   ``policies.allocation.caps_at_draw_w``) less the ramp's fall since the last cycle:
   headroom nobody draws goes at once and the draw (at most the caps) falls no faster than
   the ramp (``policies.allocation`` rule 4 spreads a cycle's fall). The line ends at the
   limit itself (no band below a limit the caps guarantee).
3. **The grid's ramp-up** (``with_grid_ramp``, policies/smoothing.py): the site's
   sum-of-caps ramp at most ``DEFAULT_MARGIN`` (0.9) of the grid's ramp-up limit, where the
   caps are the draw's bound on its rise: under grid smoothing (GPUs smoothed in software
   rise as fast as their caps let them) and under safety by caps (a GPU that asks draws at
   its cap, so a raise is drawn at once).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from policies.coordination import with_root_budget
from policies.smoothing import with_grid_ramp
from policies.tree import SITE, Tree

# The share of the grid's ramp-down an operator's line falls at: a cycle that comes late
# (1.1 s) cuts what the line fell in it in one step, which a 1 s window of the grid may see
# whole. (The rise's share is policies.smoothing.DEFAULT_MARGIN, the same 0.9.)
GLIDE_SHARE_OF_RAMP = 0.9


@dataclass(frozen=True)
class RootBudget:
    """What a leaf's root may draw now (``powerd.controller.scoping.InForce``)."""

    budget_w: float
    ramp_w_per_s: float  # inf: no limit
    fractions: tuple[float, float, float]  # the site's cap threshold, target, uncap threshold


@dataclass(frozen=True)
class SiteLine:
    """An operator's limit in force and this cycle's point on the line down to it."""

    limit_w: float
    glide_w: float  # the line this cycle (``powerd.controller.site_limit.SiteLimits``)
    not_below_w: float = -math.inf  # no lower: the ramp since the last cycles' commitments


def tree_in_force(
    file_tree: Tree,
    *,
    root_budget: RootBudget | None = None,
    site_line: SiteLine | None = None,
    grid_ramp_up_w_per_s: float = math.inf,
    by_caps: bool = False,
    grid_smoothing: bool = False,
) -> Tree:
    """``file_tree`` under what is in force (module docstring, rules 1-3).
    ``grid_ramp_up_w_per_s``: the grid spec's ramp-up limit (``inf``: none), applied where
    the caps bound the draw's rise (``grid_smoothing``, ``by_caps``); a leaf passes ``inf``
    (its grant's ramp is its share of the grid's already)."""
    tree = file_tree
    if root_budget is not None:
        tree = with_root_budget(
            tree, root_budget.budget_w, root_budget.ramp_w_per_s, root_budget.fractions
        )
    if site_line is not None:
        tree = with_site_limit(
            tree, site_line.limit_w, site_line.glide_w, site_line.not_below_w, by_caps=by_caps
        )
    if not (by_caps or grid_smoothing):
        return tree
    return with_grid_ramp(tree, grid_ramp_up_w_per_s)


def target_share(tree: Tree, by_caps: bool = False) -> float:
    """Where a limit's glide ends, as a share of the limit: the site's capping target over
    its capping threshold in the file's bands; the limit itself under safety by caps."""
    if by_caps:
        return 1.0
    return float(tree.cap_target_w[SITE]) / float(tree.cap_threshold_w[SITE])


def with_site_limit(
    tree: Tree,
    limit_w: float,
    glide_w: float,
    not_below_w: float = -math.inf,
    by_caps: bool = False,
) -> Tree:
    """``tree`` with the site's bands under an operator's limit, never above the file's:
    while ``glide_w`` is above the limit's target, capping threshold and target on the
    line and the uncapping threshold under it as in the file's bands; then the file's bands
    scaled to the limit. The target is never lower than ``not_below_w`` (once the line has
    ended, up to the limit). The caps under the site (safety by caps, ``by_caps``) are
    held to the line, never lower than ``not_below_w``; else to the capping threshold."""
    threshold = float(tree.cap_threshold_w[SITE])
    share_target = target_share(tree)
    share_uncap = float(tree.uncap_threshold_w[SITE]) / threshold
    if glide_w > limit_w * share_target:
        bands = {
            "cap_threshold_w": glide_w,
            "cap_target_w": max(glide_w, not_below_w),
            "uncap_threshold_w": glide_w * share_uncap / share_target,
        }
    else:  # a site behind its line still comes down no faster than it
        bands = {
            "cap_threshold_w": limit_w,
            "cap_target_w": max(limit_w * share_target, min(not_below_w, limit_w)),
            "uncap_threshold_w": limit_w * share_uncap,
        }
    lower = {n: v for n, v in bands.items() if v < float(getattr(tree, n)[SITE])}
    caps_w = max(glide_w, not_below_w) if by_caps else lower.get("cap_threshold_w", math.inf)
    caps_w = min(tree.root_caps_limit_w, caps_w)
    if not lower and caps_w >= tree.root_caps_limit_w:
        return tree
    arrays: dict[str, Any] = {}
    for name, value in lower.items():
        column = np.array(getattr(tree, name), dtype=float)
        column[SITE] = value
        arrays[name] = column
    return dataclasses.replace(tree, **arrays, root_caps_limit_w=caps_w)
