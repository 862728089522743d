"""The budgets file: the power tree, its limits, budgets and failsafe caps.

A budgets file (TOML, format reference in ``docs/BUDGETS.md``) describes
site → rows → racks → nodes (servers) → GPUs. Every tree node has a hard
limit (the breaker) and a budget; capping bands as fractions of the budget,
inherited down the tree; a ramp limit; its own non-GPU overhead. Every GPU
has a failsafe cap (per model, overridable per row, rack or node) and a GPU
model with its cap range. Racks and nodes can be listed one by one or
generated compactly (``count`` plus a name template), because the real site
has ~20,750 servers.

``load_budgets`` / ``parse_budgets`` return a validated, read-only
``Topology`` or raise ``BudgetError`` whose message names the file, the tree
node and the number at fault; nothing is half-loaded and nothing global
changes. The modules: ``parse`` (TOML to columns; ``reader``, ``models_table``
and ``grid_table`` read its values and tables), ``checks`` (the named
whole-tree checks), ``units`` (spellings, plausible ranges, unit hints),
``model`` (``Topology`` and its ``tree``, the ``policies.tree.Tree`` everyone
shares). Per-GPU data lives only in numpy arrays (built by ``np.repeat`` from
per-server columns), so the 83K-GPU site loads in well under a second.
"""

from powerd.topology.model import BudgetError, Server, Topology
from powerd.topology.parse import (
    DEFAULT_CAP_TARGET,
    DEFAULT_CAP_THRESHOLD,
    DEFAULT_UNCAP_THRESHOLD,
    FORMAT_VERSION,
    MAX_COUNT,
    MAX_GPUS_PER_NODE,
    load_budgets,
    parse_budgets,
)
from powerd.topology.units import PLAUSIBLE_W, RAMP_PLAUSIBLE_PER_S

__all__ = [
    "DEFAULT_CAP_TARGET",
    "DEFAULT_CAP_THRESHOLD",
    "DEFAULT_UNCAP_THRESHOLD",
    "FORMAT_VERSION",
    "MAX_COUNT",
    "MAX_GPUS_PER_NODE",
    "PLAUSIBLE_W",
    "RAMP_PLAUSIBLE_PER_S",
    "BudgetError",
    "Server",
    "Topology",
    "load_budgets",
    "parse_budgets",
]
