"""Every message of the wire protocol, version 1, as a msgspec struct (docs/PROTOCOL.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from msgspec import UNSET, Meta, UnsetType

from powerd.hostlist import (
    SiteNames,
    compress_hostlist,
    count_hosts,
    expand_hostlist,
    expand_within,
    first_name,
    longest_name,
    parse_hostlist,
)
from powerd.protocol.constraints import (
    CLOCK_MAX_MHZ,
    MAX_TTL_S,
    NAME_RE,
    SMOOTHING_MAX_HYSTERESIS_MS,
    SMOOTHING_MAX_RAMP_W_PER_S,
    ClockMhz,
    GpuIndex,
    Name,
    NonNegFloat,
    NonNegInt,
    Payload,
    Percent,
    PositiveW,
    SmoothingPreset,
    name_float_fields,
)
from powerd.vocabulary import (
    AckResult,
    ControllerState,
    Mode,
    NodeState,
    Phase,
    Priority,
    Version,
)

# --- hardware power smoothing: optional parts of telemetry, command and ack ----------


# GpuSmoothingState.mechanism of smoothing the GPU's jobs carry out (told by the agent)
SOFTWARE_MECHANISM = "software"


class GpuSmoothingState(Payload):
    """Telemetry's compact view of the smoothing in force: the switch, the active preset
    and its power floor (percent of the enforced cap). The ramps are in the ack."""

    enabled: bool
    preset: SmoothingPreset
    floor_percent: Percent
    # optional addition to v1: who carries it out ("software": the jobs, told by the agent);
    # absent: the GPU. Open-ended, so that a later mechanism does not void older readers'
    # telemetry; a reader takes what it does not know as hardware.
    mechanism: Annotated[str, Meta(max_length=32)] | None = None


class GpuSmoothing(Payload):
    """A hardware power smoothing profile: written into ``preset``, which is activated, and
    the device-wide switch set to ``enabled``. Units: percent of the enforced cap, W/s, ms.
    The bounds are what any device can hold; the agent clamps the floor into the device's
    own range (and says so in the ack's ``clamped``)."""

    preset: SmoothingPreset
    enabled: bool
    floor_percent: Percent
    ramp_up_w_per_s: Annotated[float, Meta(ge=0, le=SMOOTHING_MAX_RAMP_W_PER_S)]
    ramp_down_w_per_s: Annotated[float, Meta(ge=0, le=SMOOTHING_MAX_RAMP_W_PER_S)]
    ramp_down_hysteresis_ms: Annotated[float, Meta(ge=0, le=SMOOTHING_MAX_HYSTERESIS_MS)]


# --- telemetry: agent -> anyone, every sample period -------------------------


class GpuTelemetry(Payload):
    index: GpuIndex
    uuid: str
    power_w: NonNegFloat
    energy_j: NonNegFloat | None
    cap_w: NonNegFloat
    cap_min_w: NonNegFloat
    cap_max_w: NonNegFloat
    sm_clock_mhz: ClockMhz
    max_sm_clock_mhz: ClockMhz | None
    util_pct: Percent
    temp_c: float
    # optional additions to v1
    power_reading: Literal["instant", "average_1s", "simulated"] | None = None
    # power smoothing in force; absent where the GPU has none, where it could not be read
    # this sample, and where it is what this GPU's telemetry last carried, fewer than
    # SMOOTHING_STATE_EVERY_SAMPLES samples ago
    smoothing: GpuSmoothingState | None = None


class Telemetry(Payload):
    v: Version
    node: Name
    ts: float
    seq: NonNegInt
    mode: Mode
    gpus: list[GpuTelemetry]
    # optional addition to v1: the newest controller epoch the agent has seen (absent: none)
    epoch: NonNegInt | None = None


# --- fill: agent -> the jobs on its node (software power smoothing) ------------


class GpuFill(Payload):
    """What one GPU's job needs to hold it up (``powerd.gpu.software_smoothing``): its
    draw as sampled and its enforced cap, the floor to hold while it runs (never above
    the cap), how fast and after how long its draw may fall once it waits or stops, and
    how fast its busy work may raise it while the job starts."""

    index: GpuIndex
    power_w: NonNegFloat
    cap_w: NonNegFloat
    floor_w: NonNegFloat
    ramp_up_w_per_s: Annotated[float, Meta(ge=0, le=SMOOTHING_MAX_RAMP_W_PER_S)]
    ramp_down_w_per_s: Annotated[float, Meta(ge=0, le=SMOOTHING_MAX_RAMP_W_PER_S)]
    hysteresis_s: Annotated[float, Meta(ge=0, le=SMOOTHING_MAX_HYSTERESIS_MS / 1000)]


class FillRequest(Payload):
    """Every agent sample while a GPU smooths in software (optional addition to v1). Not
    signed, and it moves no GPU: a job fills only up to its GPU's cap, which the agent
    alone sets. Only the node's agent may publish it (docs/BROKERS.md ACL)."""

    v: Version
    node: Name
    ts: float
    seq: NonNegInt
    gpus: list[GpuFill]


# --- command: controller -> one node ----------------------------------------


class CommClock(Payload):
    """A clock policy the controller grants one GPU (optional addition to v1): while the
    agent holds it, ``job``'s own announcements move the GPU's clock lock at once:
    ``communication`` locks the SM clock to ``max_sm_clock_mhz`` (clamped into the
    device's range), any other phase removes the lock. ``owner``: the owner level of the
    job's phase topic (``jobs/{owner}/{job}/phase``); null: the unowned ``jobs/{job}/phase``.
    It holds only as long as the command that carried it (docs/PROTOCOL.md)."""

    job: Name
    max_sm_clock_mhz: Annotated[float, Meta(gt=0, le=CLOCK_MAX_MHZ)]
    owner: Name | None = None


class GpuCommand(Payload):
    index: GpuIndex
    cap_w: PositiveW | UnsetType = UNSET
    # null removes a clock lock; absent leaves it as it is
    max_sm_clock_mhz: Annotated[float, Meta(gt=0)] | UnsetType | None = UNSET
    # optional addition to v1: hardware power smoothing to apply; absent leaves it as it is
    smoothing: GpuSmoothing | UnsetType = UNSET
    # optional addition to v1: the job whose announcements move this GPU's clock lock until
    # a newer command; absent (in the newest command): none
    comm_clock: CommClock | UnsetType = UNSET


class Command(Payload):
    v: Version
    epoch: NonNegInt
    seq: NonNegInt
    ts: float
    # agents hold a command at most their own max_command_ttl_s, whatever it says
    ttl_s: Annotated[float, Meta(gt=0, le=MAX_TTL_S)]
    gpus: list[GpuCommand]

    def __post_init__(self) -> None:
        super().__post_init__()
        seen: set[int] = set()
        for gpu in self.gpus:
            if gpu.index in seen:
                raise ValueError(f"GPU index {gpu.index} appears twice in `gpus`")
            seen.add(gpu.index)


# --- ack: agent -> controller, once per command ------------------------------


class GpuAck(Payload):
    index: GpuIndex
    cap_w: NonNegFloat | None
    max_sm_clock_mhz: ClockMhz | None
    clamped: bool
    # optional addition to v1: the smoothing read back after a command that set it; absent
    # (null) when the command did not, or the GPU has no smoothing (then an error says so)
    smoothing: GpuSmoothing | None = None
    # optional addition to v1: the clock policy the agent holds for the GPU after the
    # command (its clock clamped into the device's range); absent (null): none
    comm_clock: CommClock | None = None


class AckError(Payload):
    """One failure in applying a command. ``index`` is null for the whole command."""

    index: GpuIndex | None
    message: str


class Ack(Payload):
    v: Version
    node: Name
    epoch: NonNegInt
    seq: NonNegInt
    ts: float
    result: AckResult
    gpus: list[GpuAck]
    errors: list[AckError]


# --- status: retained, the last will publishes the offline form --------------


class Status(Payload):
    v: Version
    node: Name
    state: NodeState
    ts: float
    gpus: NonNegInt
    agent_version: str
    # optional addition to v1: the highest failsafe cap the agent holds its GPUs at when
    # no controller leads (its config's); the controller compares it with the plan
    failsafe_cap_w: NonNegFloat | None = None
    # optional addition to v1: the agent's telemetry period (a node sending much faster is
    # not one agent: the controller doubts it)
    period_s: Annotated[float, Meta(gt=0)] | None = None


# --- phase: a training job announces a phase change --------------------------


class PhaseEvent(Payload):
    v: Version
    job: Name
    ts: float
    phase: Phase
    nodes: list[Name] | None = None
    priority: Priority = "normal"
    expected_s: NonNegFloat | None = None
    # optional addition to v1: the nodes as a Slurm-style host list ("r01-n[01-18],r02-n07"),
    # for a job whose list does not fit in one payload (a 150 MW job's 10,368 nodes are
    # 176 KB as a list, 25 KB as this); not together with `nodes`. Checked when decoded,
    # with no name made: at most powerd.hostlist.MAX_HOSTS names, each a valid node name.
    hostlist: Annotated[str, Meta(min_length=1)] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hostlist is not None:
            if self.nodes is not None:
                raise ValueError("`nodes` and `hostlist` together: send one of them")
            _check_hostlist_names(self.hostlist)

    def node_names(self) -> list[str] | None:
        """The job's nodes, from `nodes` or the expanded `hostlist`; None if neither."""
        if self.hostlist is None:
            return self.nodes
        return expand_hostlist(self.hostlist)

    def node_names_within(self, site: SiteNames, limit: int) -> tuple[list[str], int] | None:
        """The job's nodes that are ``site``'s, and how many it names that are not; None
        if it names none. ValueError for a host list naming more than ``limit`` (refused
        before a name is made): powerd.hostlist.expand_within."""
        if self.hostlist is not None:
            return expand_within(self.hostlist, site, limit)
        if self.nodes is None:
            return None
        if len(self.nodes) > limit:
            raise ValueError(f"{len(self.nodes)} nodes named, over the {limit} there are")
        known = [n for n in self.nodes if n in site.names]
        return known, len(self.nodes) - len(known)

    def node_count(self) -> int | None:
        """How many nodes it names (its host list counted, not expanded); None: none."""
        if self.hostlist is not None:
            return count_hosts(self.hostlist)
        return None if self.nodes is None else len(self.nodes)


def _check_hostlist_names(hostlist: str) -> None:
    """ValueError unless every name ``hostlist`` expands to is a node name, checked per
    item (its first name's form, its longest name's length) with no name made: a name is
    its literals and digits, so they all match NAME_PATTERN if the first does and the
    longest is short enough."""
    for item in parse_hostlist(hostlist):
        name = first_name(item)
        if NAME_RE.match(name) is None or longest_name(item) > 64:
            raise ValueError(f"`hostlist` names {name[:80]!r}, not a node name")


# A job's node list longer than this as JSON goes as a host list (PhaseEvent.hostlist): a
# shorter one stays a list, which every v1 controller reads.
NODE_LIST_MAX_BYTES = 16 * 1024


def job_nodes_fields(nodes: list[str] | None) -> dict[str, Any]:
    """``PhaseEvent`` keyword arguments for a job's ``nodes``: the list while it is short,
    else the same names compressed into ``hostlist``; none for None."""
    if nodes is None:
        return {}
    if sum(len(n) + 3 for n in nodes) <= NODE_LIST_MAX_BYTES:
        return {"nodes": nodes}
    return {"hostlist": compress_hostlist(nodes)}


# --- heartbeat: controller -> agents, every second, retained -----------------


class Heartbeat(Payload):
    """``seq`` (optional addition to v1): the highest command seq the leader has sent in
    this epoch; an agent that (re)starts takes no command at or below it (a replay). On
    a coordinator's heartbeat, its last grant round's seq: a leaf takes no older grant."""

    v: Version
    epoch: NonNegInt
    ts: float
    controller: Name
    state: ControllerState
    seq: NonNegInt | None = None


# --- the tree of controllers: leaf summary -> coordinator, grant -> leaf -------------

ClassWatts = Annotated[list[NonNegFloat], Meta(min_length=3, max_length=3)]


class Summary(Payload):
    """A leaf (scoped) controller's account of its scope, once per coordinator period.

    Watts by priority class are lists in ``PRIORITIES`` order (high, normal, low).
    ``fixed_w`` is what no cut can remove: overheads, the GPUs the leaf cannot command
    (at what they are counted), and every commandable GPU's minimum cap. ``demand_w``:
    what commandable GPUs draw above their minimum caps; ``held_w``: what GPUs held at
    their caps could draw more (their caps' distance to the maximum). ``budget_w`` is the
    budget in force, and ``grant_seq`` the grant it came from (null: the file's budget).
    """

    v: Version
    scope: Name
    controller: Name
    epoch: NonNegInt
    seq: NonNegInt
    ts: float
    measured_w: NonNegFloat
    predicted_w: NonNegFloat
    cap_sum_w: NonNegFloat
    fixed_w: NonNegFloat
    demand_w: ClassWatts
    held_w: ClassWatts
    budget_w: PositiveW
    file_budget_w: PositiveW
    limit_w: PositiveW
    ramp_w_per_s: Annotated[float, Meta(gt=0)] | None  # null: no ramp limit
    nodes: NonNegInt
    stale_nodes: NonNegInt
    grant_epoch: NonNegInt | None = None
    grant_seq: NonNegInt | None = None
    # optional addition to v1: a leaf under safety by caps says the caps in force under its
    # root plus its overheads (what it may draw whatever its demand: above ``budget_w``
    # until its cuts to a lowered grant land, at its ramp); null: a leaf under the bands
    caps_in_force_w: NonNegFloat | None = None


class Grant(Payload):
    """The site coordinator's budget for one scope, valid ``ttl_s`` after it is received.

    ``budget_w`` replaces the scope's file budget (its root's bands are the site's
    fractions of it); ``ramp_w_per_s`` is the scope's share of the site's ramp limit
    (null: none). After ``ttl_s`` without a newer grant the leaf holds
    ``min(budget_w, file budget)`` for ``ttl_s`` more, then its file budget.
    """

    v: Version
    scope: Name
    coordinator: Name
    epoch: NonNegInt
    seq: NonNegInt
    ts: float
    ttl_s: Annotated[float, Meta(gt=0, le=MAX_TTL_S)]
    budget_w: PositiveW
    ramp_w_per_s: Annotated[float, Meta(gt=0)] | None = None


# --- site limit: an operator's (or the utility's) temporary cap on the site ---------------


class SiteLimit(Payload):
    """A temporary limit on the site's power (demand response: "120 MW for 15 minutes,
    starting now"), signed by an operator key, retained. The controller (or, in a tree,
    the coordinator) brings the site under ``limit_w`` no faster than the site's ramp-down
    limit, holds it there from ``starts_ts`` until ``expires_ts`` (wall clock), then hands
    the file's budget back. ``limit_w`` null clears any limit. The newest by ``(ts, seq)``
    wins."""

    v: Version
    operator: Name
    seq: NonNegInt
    ts: float
    limit_w: PositiveW | None
    starts_ts: float
    expires_ts: float
    reason: Annotated[str, Meta(max_length=200)] = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.expires_ts <= self.starts_ts:
            raise ValueError("expires_ts must be after starts_ts")


# --- leader state: what a leader holds, for people (``powerd status``, ``powerd limit``) -----


class HeldLimit(Payload):
    """The operator site limit a leader holds (the newest it took, by ``(ts, seq)``):
    ``limit_w`` null is a clear; ``in_force``: within its window by the leader's clock."""

    operator: Name
    ts: float
    seq: NonNegInt
    limit_w: PositiveW | None
    starts_ts: float
    expires_ts: float
    in_force: bool


class RefusedLimit(Payload):
    """The last operator site limit a leader refused, though signed by a trusted key: its
    ``(ts, seq)`` and the leader's reason (not newer than the one held; a clock alarm;
    already over)."""

    ts: float
    seq: NonNegInt
    reason: Annotated[str, Meta(max_length=300)]


class NodeCounts(Payload):
    """Nodes by the mode they report; ``stale``: not heard within ``stale_after_s``, or
    offline (not counted under a mode)."""

    controlled: NonNegInt
    failsafe: NonNegInt
    local: NonNegInt
    stale: NonNegInt


class LevelCounts(Payload):
    """Levels whose measured power is over their limit (the breaker's), by level."""

    site: NonNegInt
    row: NonNegInt
    rack: NonNegInt


class LeaderState(Payload):
    """A leader's state, for people: signed, retained on its role's topic
    (``Topics.controller_state``, ``scope_state``, ``coordinator_state``), at once after
    it takes or refuses a site limit, and every few seconds. A standby publishes none; a
    new leader overwrites it. Counts, not per-node data. Nothing decides anything from it:
    ``SiteLimitRecord`` is the limits' order across restarts, not this."""

    v: Version
    role: Literal["controller", "coordinator"]
    name: Name
    epoch: NonNegInt
    ts: float
    scope: Name | None = None  # a leaf controller's scope; null: the site
    limit: HeldLimit | None = None
    refused: RefusedLimit | None = None
    nodes: NodeCounts | None = None  # null: a coordinator (it counts no nodes)
    over_limit: LevelCounts | None = None
    leaves_silent: NonNegInt | None = None  # a coordinator: leaves it did not hear


name_float_fields(
    HeldLimit,
    RefusedLimit,
    NodeCounts,
    LevelCounts,
    LeaderState,
    GpuSmoothingState,
    GpuSmoothing,
    GpuTelemetry,
    Telemetry,
    GpuFill,
    FillRequest,
    CommClock,
    GpuCommand,
    Command,
    GpuAck,
    AckError,
    Ack,
    Status,
    PhaseEvent,
    Heartbeat,
    Summary,
    Grant,
    SiteLimit,
)

Message = (
    Telemetry
    | Command
    | Ack
    | Status
    | PhaseEvent
    | Heartbeat
    | Summary
    | Grant
    | SiteLimit
    | FillRequest
    | LeaderState
)
M = TypeVar(
    "M",
    Telemetry,
    Command,
    Ack,
    Status,
    PhaseEvent,
    Heartbeat,
    Summary,
    Grant,
    SiteLimit,
    FillRequest,
    LeaderState,
)
