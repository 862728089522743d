"""Control decisions as pure, vectorised functions over numpy arrays.

No I/O, no clocks, no MQTT: the controller calls them every cycle and the
planner replays profiles through the same functions.
"""

from policies.capping import decide
from policies.phases import infer_phases
from policies.settings import Decision, PolicySettings
from policies.tree import (
    HIGH,
    LOW,
    NORMAL,
    PHASE_CODES,
    PRIORITY_CODES,
    RACK,
    ROW,
    SERVER,
    SITE,
    ClusterState,
    Tree,
)
from powerd.vocabulary import PHASES

__all__ = [
    "HIGH",
    "LOW",
    "NORMAL",
    "PHASES",
    "PHASE_CODES",
    "PRIORITY_CODES",
    "RACK",
    "ROW",
    "SERVER",
    "SITE",
    "ClusterState",
    "Decision",
    "PolicySettings",
    "Tree",
    "decide",
    "infer_phases",
]
