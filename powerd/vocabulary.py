"""The words every part of powerd shares, defined once: phases, priorities, levels, modes.

Imports nothing of powerd (and nothing but the standard library), so anything
may import it: the wire protocol's types (``powerd.protocol``), the policies'
codes (``policies.tree``), the telemetry schema's tag values
(``powerd.telemetry_schema``), the job hook, the simulators.
``tests/protocol/test_vocabulary.py`` checks that each of them uses these and no
copy of its own.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

# The wire protocol's version: every payload carries `"v": 1` (docs/PROTOCOL.md).
PROTOCOL_VERSION: Final = 1
Version = Literal[1]

# What a training job is doing, as it announces it (jobs/{job}/phase).
Phase = Literal["startup", "compute", "communication", "checkpoint", "eval", "idle", "shutdown"]
PHASES: tuple[Phase, ...] = get_args(Phase)
# The phases that do training work: a job waiting on something resumes to one of them.
PROGRESS_PHASES: tuple[Phase, ...] = ("compute", "eval")

# A job's priority, highest first. Watts are taken from the lowest first.
Priority = Literal["high", "normal", "low"]
PRIORITIES: tuple[Priority, ...] = get_args(Priority)

# The levels of the power tree, from the top.
Level = Literal["site", "row", "rack", "node"]
LEVELS: tuple[str, ...] = get_args(Level)

# An agent's mode, as its telemetry reports it.
Mode = Literal["controlled", "failsafe", "local"]
MODES: tuple[str, ...] = get_args(Mode)
# how a controller counts a node it has not heard from for stale_after_s, or offline
STALE: Final = "stale"

# A node's retained status (the last will publishes "offline").
NodeState = Literal["online", "failsafe", "offline"]

# What an agent did with a command.
AckResult = Literal["applied", "partial", "stale", "rejected"]

# A controller's heartbeat says whether it leads.
ControllerState = Literal["leader", "standby"]

# A GPU's failsafe cap when neither the budgets file nor the agent's config gives one:
# this share of its maximum cap (Meta plans a 1200 W GB200 at 960 W, docs/DOMAIN.md).
DEFAULT_FAILSAFE_FRACTION: Final = 0.8
