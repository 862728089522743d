"""The power smoothing profile a controller asks of every GPU that has hardware smoothing.

Each GPU's share of the site's grid spec (``policies.smoothing.gpu_ramps``: the
site's ramp limits × margin / the site's GPUs, and the spec's floor as a share
of the cap), written as the protocol's ``GpuSmoothing`` for preset
``GRID_PRESET``. The share is of the *whole site's* GPUs, so every leaf of a
tree of controllers asks the same of its GPUs and their sum stays within the
site's limits. The agent clamps the floor into its device's range and says so
in its ack (docs/POWER_SMOOTHING.md).
"""

from __future__ import annotations

import math

from policies.in_force import tree_in_force
from policies.smoothing import DEFAULT_MARGIN, gpu_profile_values, gpu_ramps
from policies.tree import Tree
from powerd.protocol import SMOOTHING_MAX_RAMP_W_PER_S, GpuSmoothing
from powerd.topology import BudgetError, Topology

GRID_PRESET = 0  # the preset written and activated; the agent restores it on exit


def grid_smoothing(site: Topology, margin: float = DEFAULT_MARGIN) -> GpuSmoothing:
    """The profile for every GPU of ``site`` (the whole budgets file, not a scope of it);
    BudgetError when its grid spec limits nothing."""
    spec = site.grid
    if spec is None or not spec.can_smooth:
        raise BudgetError(
            site.source,
            "[site.grid]",
            "grid smoothing (controller.grid_smoothing) needs a ramp limit or a floor here "
            "(docs/BUDGETS.md, 'The grid spec')",
        )
    ramps = gpu_ramps(
        spec.ramp_up_w_per_s,
        spec.ramp_down_w_per_s,
        spec.floor_fraction,
        site.tree.n_gpus,
        margin,
        hysteresis_s=spec.window_s,
    )
    values = gpu_profile_values(ramps, 0.0, 100.0, SMOOTHING_MAX_RAMP_W_PER_S)
    return GpuSmoothing(
        preset=GRID_PRESET,
        enabled=True,
        floor_percent=values.floor_percent,
        ramp_up_w_per_s=values.ramp_up_w_per_s,
        ramp_down_w_per_s=values.ramp_down_w_per_s,
        ramp_down_hysteresis_ms=values.ramp_down_hysteresis_ms,
    )


def file_tree_in_force(site: Topology, grid_smoothing: bool, by_caps: bool) -> Tree:
    """The tree a site's single controller runs under, before any operator's limit
    (``policies.in_force.tree_in_force``): its sum-of-caps ramp at most the GPUs' share of
    the grid's ramp-up where the caps bound the draw's rise, under grid smoothing (GPUs
    smoothed in software rise as fast as their caps let them) or safety by caps (a GPU
    that asks draws at its cap)."""
    ramp_up = math.inf if site.grid is None else site.grid.ramp_up_w_per_s
    return tree_in_force(
        site.tree, grid_ramp_up_w_per_s=ramp_up, by_caps=by_caps, grid_smoothing=grid_smoothing
    )


def grid_ramp_w_per_s(smoothing: GpuSmoothing | None, n_gpus: int) -> float:
    """The most the caps of ``n_gpus`` GPUs may rise together under ``smoothing``: the sum of
    their shares of the grid's ramp-up (a leaf's bound in a tree of controllers; for the
    whole site it is the margin × the grid's ramp-up that ``file_tree_in_force`` applies). ``inf``
    without smoothing."""
    if smoothing is None:
        return math.inf
    return smoothing.ramp_up_w_per_s * n_gpus
