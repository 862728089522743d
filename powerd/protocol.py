"""The powerd wire protocol, version 1: every payload and topic, in one place.

Both sides import this module; nothing else encodes or decodes payloads. The
contract it enforces is ``docs/PROTOCOL.md``. Decoding is strict: a payload
that is not a JSON object, lacks a required field, has a wrong type, a
non-finite number, a name that does not match its topic, or is over 64 KiB
raises ``ProtocolError`` with a reason, and nothing else. Unknown fields are
ignored, so version 1 can grow optional fields.
"""

from __future__ import annotations

import json
import math
import re
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import msgspec
import msgspec.inspect
from msgspec import UNSET, Meta, Struct, UnsetType

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
from powerd.vocabulary import (
    PHASES,
    PRIORITIES,
    PROTOCOL_VERSION,
    AckResult,
    ControllerState,
    Mode,
    NodeState,
    Phase,
    Priority,
    Version,
)

__all__ = [  # the vocabulary, re-exported: the protocol's users need not know where it lives
    "PHASES",
    "PRIORITIES",
    "PROTOCOL_VERSION",
    "AckResult",
    "ControllerState",
    "Mode",
    "NodeState",
    "Phase",
    "Priority",
]

MAX_PAYLOAD_BYTES = 64 * 1024
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z"  # \Z: "$" would allow a final newline
MAX_NAME_CHARS = 64  # the longest name NAME_PATTERN allows
_NAME_RE = re.compile(NAME_PATTERN)

Name = Annotated[str, Meta(pattern=NAME_PATTERN)]
# Counters (epoch, seq, telemetry seq) fit a signed 64-bit integer: what InfluxDB and
# every language's JSON reader keep exactly.
INT64_MAX = 2**63 - 1
NonNegInt = Annotated[int, Meta(ge=0, le=INT64_MAX)]
GpuIndex = Annotated[int, Meta(ge=0, le=1023)]
PositiveW = Annotated[float, Meta(gt=0)]
NonNegFloat = Annotated[float, Meta(ge=0)]
Percent = Annotated[float, Meta(ge=0, le=100)]
CLOCK_MAX_MHZ = 100_000  # the highest clock any message carries (a policy's is then clamped)
ClockMhz = Annotated[int, Meta(ge=0, le=CLOCK_MAX_MHZ)]
MAX_TTL_S = 86_400.0  # a command's ttl_s: the protocol's bound (agents set a tighter one)
# Hardware power smoothing (docs/POWER_SMOOTHING.md): what any device can hold, the bounds
# of powerd.gpu.base.SmoothingProfile (NVML's 5 presets; 32-bit mW/s and ms fields). Copied,
# not imported, so that the protocol stays free of the GPU layer; a test pins them equal.
SMOOTHING_PRESET_MAX = 4
SMOOTHING_MAX_RAMP_W_PER_S = (2**32 - 1) / 1000
SMOOTHING_MAX_HYSTERESIS_MS = float(2**32 - 1)
SmoothingPreset = Annotated[int, Meta(ge=0, le=SMOOTHING_PRESET_MAX)]
# Telemetry carries a GPU's smoothing state when it differs from the one that GPU's
# telemetry last carried, after a new controller epoch, and otherwise every this many
# samples (docs/PROTOCOL.md): a state changes a few times a day, and on every sample of
# every GB200 it cost the 150 MW site's controller a quarter more CPU to take telemetry in.
SMOOTHING_STATE_EVERY_SAMPLES = 10


class ProtocolError(ValueError):
    """A payload or topic that breaks the protocol; the message says how."""


# True while ``decode`` runs msgspec's decoder: the finiteness check of ``_Payload`` is then
# redundant (the decoder refuses NaN, Infinity and numbers that overflow), and it cost
# ~2.5 us of the ~5 us it takes to decode one telemetry message. Another thread that
# builds a message meanwhile skips the check too; ``encode`` checks again before sending.
_decoding = False


class _Payload(Struct, forbid_unknown_fields=False, omit_defaults=True):
    """Base of every message: refuses non-finite numbers when built in code.

    Decoding needs no check of its own: msgspec's JSON decoder has no NaN or
    Infinity tokens and refuses numbers that overflow a float ("Number out of
    range"; pinned by ``tests/protocol/test_protocol_payloads.py``). This check is for
    messages built in code; ``encode`` checks again, since structs are mutable.
    msgspec calls ``__post_init__`` when decoding too, where ``decode`` turns
    it off (``_decoding``): telemetry decoding is the controller's hottest path
    (docs/CONTROLLER.md). It looks only at the fields that can hold a float,
    named once per class in ``_finite_fields`` (``_name_float_fields`` below).
    """

    _finite_fields: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        if _decoding:  # msgspec's decoder has refused any non-finite number already
            return
        # Nested structs run their own __post_init__ when decoded or built, so only
        # this struct's own numbers are checked here (msgspec adds the path, `$.gpus[0]`).
        for name in self._finite_fields:
            value = getattr(self, name)
            if value.__class__ is list:  # a list of numbers (Summary's watts by class)
                if not all(math.isfinite(item) for item in value):
                    raise ValueError(f"non-finite number in {type(self).__name__}.{name}")
            elif value.__class__ is float and value - value != 0.0:  # inf - inf, nan - nan
                raise ValueError(f"non-finite number at {type(self).__name__}.{name}")


def _all_finite(struct: Struct) -> bool:
    """No NaN or infinity anywhere inside ``struct``: ``_check_finite``'s fast path, no paths."""
    for name in struct.__struct_fields__:
        value = getattr(struct, name)
        kind = value.__class__
        if kind is float:
            if value - value != 0.0:
                return False
        elif kind is list or kind is tuple:
            for item in value:
                if item.__class__ is float:
                    if item - item != 0.0:
                        return False
                elif isinstance(item, Struct) and not _all_finite(item):
                    return False
        elif isinstance(value, Struct) and not _all_finite(value):
            return False
    return True


def _check_finite(obj: Any, where: str) -> None:
    """Every number inside ``obj``, nested structs included (encode: set after construction)."""
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError(f"non-finite number at {where}")
    elif isinstance(obj, Struct):
        for field in obj.__struct_fields__:
            _check_finite(getattr(obj, field), f"{where}.{field}")
    elif isinstance(obj, list | tuple):
        for i, item in enumerate(obj):
            _check_finite(item, f"{where}[{i}]")


# --- hardware power smoothing: optional parts of telemetry, command and ack ----------


class GpuSmoothingState(_Payload):
    """Telemetry's compact view of the smoothing in force: the switch, the active preset
    and its power floor (percent of the enforced cap). The ramps are in the ack."""

    enabled: bool
    preset: SmoothingPreset
    floor_percent: Percent
    # optional addition to v1: who carries it out ("software": the jobs, told by the agent);
    # absent: the GPU. Open-ended, so that a later mechanism does not void older readers'
    # telemetry; a reader takes what it does not know as hardware.
    mechanism: Annotated[str, Meta(max_length=32)] | None = None


class GpuSmoothing(_Payload):
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


class GpuTelemetry(_Payload):
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


class Telemetry(_Payload):
    v: Version
    node: Name
    ts: float
    seq: NonNegInt
    mode: Mode
    gpus: list[GpuTelemetry]
    # optional addition to v1: the newest controller epoch the agent has seen (absent: none)
    epoch: NonNegInt | None = None


# --- fill: agent -> the jobs on its node (software power smoothing) ------------


class GpuFill(_Payload):
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


class FillRequest(_Payload):
    """Every agent sample while a GPU smooths in software (optional addition to v1). Not
    signed, and it moves no GPU: a job fills only up to its GPU's cap, which the agent
    alone sets. Only the node's agent may publish it (docs/BROKERS.md ACL)."""

    v: Version
    node: Name
    ts: float
    seq: NonNegInt
    gpus: list[GpuFill]


# --- command: controller -> one node ----------------------------------------


class CommClock(_Payload):
    """A clock policy the controller grants one GPU (optional addition to v1): while the
    agent holds it, ``job``'s own announcements move the GPU's clock lock at once:
    ``communication`` locks the SM clock to ``max_sm_clock_mhz`` (clamped into the
    device's range), any other phase removes the lock. ``owner``: the owner level of the
    job's phase topic (``jobs/{owner}/{job}/phase``); null: the unowned ``jobs/{job}/phase``.
    It holds only as long as the command that carried it (docs/PROTOCOL.md)."""

    job: Name
    max_sm_clock_mhz: Annotated[float, Meta(gt=0, le=CLOCK_MAX_MHZ)]
    owner: Name | None = None


class GpuCommand(_Payload):
    index: GpuIndex
    cap_w: PositiveW | UnsetType = UNSET
    # null removes a clock lock; absent leaves it as it is
    max_sm_clock_mhz: Annotated[float, Meta(gt=0)] | UnsetType | None = UNSET
    # optional addition to v1: hardware power smoothing to apply; absent leaves it as it is
    smoothing: GpuSmoothing | UnsetType = UNSET
    # optional addition to v1: the job whose announcements move this GPU's clock lock until
    # a newer command; absent (in the newest command): none
    comm_clock: CommClock | UnsetType = UNSET


class Command(_Payload):
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


class GpuAck(_Payload):
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


class AckError(_Payload):
    """One failure in applying a command. ``index`` is null for the whole command."""

    index: GpuIndex | None
    message: str


class Ack(_Payload):
    v: Version
    node: Name
    epoch: NonNegInt
    seq: NonNegInt
    ts: float
    result: AckResult
    gpus: list[GpuAck]
    errors: list[AckError]


# --- status: retained, the last will publishes the offline form --------------


class Status(_Payload):
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


class PhaseEvent(_Payload):
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
        if _NAME_RE.match(name) is None or longest_name(item) > 64:
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


class Heartbeat(_Payload):
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


class Summary(_Payload):
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


class Grant(_Payload):
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


class SiteLimit(_Payload):
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


def _can_hold_float(info: msgspec.inspect.Type) -> bool:
    if isinstance(info, msgspec.inspect.FloatType):
        return True
    if isinstance(info, msgspec.inspect.UnionType):
        return any(_can_hold_float(t) for t in info.types)
    if isinstance(info, msgspec.inspect.ListType | msgspec.inspect.TupleType):
        item_types = getattr(info, "item_types", None) or (getattr(info, "item_type", None),)
        # a list of floats: __post_init__ checks each (_FINITE_LISTS)
        return any(t is not None and _can_hold_float(t) for t in item_types)
    return False


def _name_float_fields(*classes: type[_Payload]) -> None:
    """Set each class's ``_finite_fields``: the fields whose type admits a float."""
    for cls in classes:
        info = msgspec.inspect.type_info(cls)
        assert isinstance(info, msgspec.inspect.StructType)
        cls._finite_fields = tuple(f.name for f in info.fields if _can_hold_float(f.type))


_name_float_fields(
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


# --- signatures: the last two members of every command and heartbeat ---------

SIGNED_CONTEXT = b"powerd/v1 signed\n"
# `,"key":"<16 hex>","sig":"<86 base64url>"}`: fixed in form and length, always last
_SIGNATURE_SUFFIX = re.compile(rb',"key":"([0-9a-f]{16})","sig":"([A-Za-z0-9_-]{86})"\}\Z')


def signed_bytes(topic: str, body: bytes) -> bytes:
    """What a signature covers: a context string, the topic, the message as encoded without
    its signature. The topic binds a command to its node and cluster: moved to another
    topic, the signature fails."""
    return SIGNED_CONTEXT + topic.encode("utf-8") + b"\n" + body


def attach_signature(body: bytes, key: str, sig: str) -> bytes:
    """``body`` (an encoded message: a JSON object) with ``key`` and ``sig`` appended as its
    last members. Readers that do not verify see two optional fields (docs/PROTOCOL.md)."""
    if not body.endswith(b"}") or body == b"{}":
        raise ProtocolError("only a non-empty JSON object can be signed")
    return b'%s,"key":"%s","sig":"%s"}' % (body[:-1], key.encode(), sig.encode())


def detach_signature(payload: bytes) -> tuple[bytes, str, str] | None:
    """The signed message (``payload`` as it was before ``attach_signature``), its key id and
    signature; None when ``payload`` does not end in a signature of the right form."""
    found = _SIGNATURE_SUFFIX.search(payload)
    if found is None:
        return None
    return payload[: found.start()] + b"}", found[1].decode(), found[2].decode()


# --- topics -------------------------------------------------------------------

TOPIC_ROOT = "powerd/v1"


@dataclass(frozen=True, slots=True)
class Topics:
    """Every topic of one cluster; with ``scope``, as seen by that scope's controllers and
    agents (a tree of controllers: their heartbeat is the scope's, docs/PROTOCOL.md)."""

    cluster: str = "default"
    scope: str | None = None

    def __post_init__(self) -> None:
        check_name(self.cluster, "cluster")
        if self.scope is not None:
            check_name(self.scope, "scope")

    @property
    def prefix(self) -> str:
        return f"{TOPIC_ROOT}/{self.cluster}"

    def telemetry(self, node: str) -> str:
        return f"{self.prefix}/nodes/{check_name(node, 'node')}/telemetry"

    def command(self, node: str) -> str:
        return f"{self.prefix}/nodes/{check_name(node, 'node')}/command"

    def ack(self, node: str) -> str:
        return f"{self.prefix}/nodes/{check_name(node, 'node')}/ack"

    def status(self, node: str) -> str:
        return f"{self.prefix}/nodes/{check_name(node, 'node')}/status"

    def fill(self, node: str) -> str:
        """The agent's software-smoothing fill targets for the jobs on ``node``."""
        return f"{self.prefix}/nodes/{check_name(node, 'node')}/fill"

    def phase(self, job: str, owner: str | None = None) -> str:
        """A job's phase topic; with ``owner``, the owned form ``jobs/{owner}/{job}/phase``
        that a broker ACL binds to the owner's login (``pattern write .../jobs/%u/+/phase``)."""
        if owner is None:
            return f"{self.prefix}/jobs/{check_name(job, 'job')}/phase"
        return f"{self.prefix}/jobs/{check_name(owner, 'owner')}/{check_name(job, 'job')}/phase"

    @property
    def heartbeat(self) -> str:
        """The heartbeat of the controllers these agents follow: the site's single
        controller's, or with ``scope`` the scope's leaf controllers'."""
        if self.scope is None:
            return f"{self.prefix}/controller/heartbeat"
        return f"{self.prefix}/scopes/{self.scope}/heartbeat"

    def summary(self, scope: str) -> str:
        return f"{self.prefix}/scopes/{check_name(scope, 'scope')}/summary"

    def grant(self, scope: str) -> str:
        return f"{self.prefix}/scopes/{check_name(scope, 'scope')}/grant"

    @property
    def coordinator_heartbeat(self) -> str:
        return f"{self.prefix}/coordinator/heartbeat"

    @property
    def site_limit(self) -> str:
        """An operator's temporary site limit (retained, signed): ``SiteLimit``."""
        return f"{self.prefix}/operator/site-limit"

    @property
    def site_limit_record(self) -> str:
        """The site limit a leading controller holds, republished under its own key
        (retained): a restarted controller's floor for the limits' ``(ts, seq)`` order."""
        return f"{self.prefix}/controller/site-limit"

    @property
    def coordinator_site_limit_record(self) -> str:
        """The same, of a tree's leading coordinator (which applies site limits there)."""
        return f"{self.prefix}/coordinator/site-limit"

    @property
    def all_summaries(self) -> str:
        return f"{self.prefix}/scopes/+/summary"

    # wildcards for subscribers
    @property
    def all_telemetry(self) -> str:
        return f"{self.prefix}/nodes/+/telemetry"

    @property
    def all_acks(self) -> str:
        return f"{self.prefix}/nodes/+/ack"

    @property
    def all_status(self) -> str:
        return f"{self.prefix}/nodes/+/status"

    @property
    def all_phases(self) -> str:
        return f"{self.prefix}/jobs/+/phase"

    @property
    def all_owned_phases(self) -> str:
        return f"{self.prefix}/jobs/+/+/phase"

    def job_of(self, topic: str) -> tuple[str | None, str]:
        """(owner, job) of a phase topic, owned or not; ProtocolError for any other topic."""
        parts = topic.split("/")
        if topic.startswith(self.prefix + "/jobs/") and parts[-1] == "phase":
            tail = parts[len(self.prefix.split("/")) + 1 : -1]
            if len(tail) == 1:
                return None, check_name(tail[0], "job")
            if len(tail) == 2:
                return check_name(tail[0], "owner"), check_name(tail[1], "job")
        raise ProtocolError(f"topic {topic!r} is not a phase topic of {self.prefix!r}")

    def parse(self, topic: str) -> tuple[str, str | None]:
        """Split a topic of this cluster into (kind, name).

        kind is one of telemetry, command, ack, status, fill, phase, heartbeat, summary,
        grant, coordinator, site_limit, site_limit_record, coordinator_site_limit_record;
        name is the node, job or scope
        (None for the site controller's heartbeat, the coordinator's and the site limits).
        Raises ProtocolError otherwise.
        """
        head = self.prefix + "/"
        if not topic.startswith(head):
            raise ProtocolError(f"topic {topic!r} is not under {self.prefix!r}")
        parts = topic[len(head) :].split("/")
        if parts == ["controller", "heartbeat"]:
            return "heartbeat", None
        if parts == ["coordinator", "heartbeat"]:
            return "coordinator", None
        if parts == ["operator", "site-limit"]:
            return "site_limit", None
        if parts == ["controller", "site-limit"]:
            return "site_limit_record", None
        if parts == ["coordinator", "site-limit"]:
            return "coordinator_site_limit_record", None
        if len(parts) == 3 and parts[0] == "scopes" and parts[2] in _SCOPE_KINDS:
            return parts[2], check_name(parts[1], "scope")
        if len(parts) == 3 and parts[0] == "nodes" and parts[2] in _NODE_KINDS:
            return parts[2], check_name(parts[1], "node")
        if len(parts) in (3, 4) and parts[0] == "jobs" and parts[-1] == "phase":
            return "phase", self.job_of(topic)[1]  # owned or not
        raise ProtocolError(f"topic {topic!r} is not a powerd v1 topic")


_NODE_KINDS = frozenset({"telemetry", "command", "ack", "status", "fill"})
_SCOPE_KINDS = frozenset({"heartbeat", "summary", "grant"})


def check_name(name: str, what: str) -> str:
    """Return ``name`` if it is a valid cluster, node or job name, else raise ProtocolError."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ProtocolError(f"{what} name {name!r} must match {NAME_PATTERN}")
    return name


# --- encoding and decoding ----------------------------------------------------

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
)

_ENCODER = msgspec.json.Encoder()
_DECODERS: dict[type, msgspec.json.Decoder[Any]] = {
    cls: msgspec.json.Decoder(cls) for cls in typing.get_args(Message)
}
_NAME_FIELD: dict[type, str] = {
    Telemetry: "node",
    FillRequest: "node",
    Ack: "node",
    Status: "node",
    PhaseEvent: "job",
    Summary: "scope",
    Grant: "scope",
}


def encode(message: Message) -> bytes:
    """Encode a message as compact UTF-8 JSON.

    Refuses, with ProtocolError, to send anything ``decode`` would reject: the
    encoded bytes are decoded again, because msgspec checks constraints only
    when decoding. That costs microseconds and keeps every sender honest.
    """
    try:
        if not _all_finite(message):  # then find where, for the message
            _check_finite(message, type(message).__name__)
    except ValueError as exc:
        raise ProtocolError(f"cannot encode {type(message).__name__}: {exc}") from None
    data = _ENCODER.encode(message)
    decode(type(message), data)  # type: ignore[type-var]  # (a Message is one of M's types)
    return data


def decode(
    cls: type[M], payload: bytes | bytearray | memoryview | str, name: str | None = None
) -> M:
    """Decode and validate one payload as ``cls``.

    ``name`` is the node or job name from the topic; where the message carries
    one, the two must match. Raises ProtocolError, and only that, on any
    invalid input.
    """
    if isinstance(payload, str):
        payload = payload.encode("utf-8", "surrogatepass")
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise ProtocolError(f"payload must be bytes, not {type(payload).__name__}")
    size = memoryview(payload).nbytes  # bytes, whatever the memoryview's item size
    if size > MAX_PAYLOAD_BYTES:
        raise ProtocolError(f"payload of {size} bytes is over {MAX_PAYLOAD_BYTES}")
    global _decoding
    _decoding = True
    try:
        message: M = _DECODERS[cls].decode(payload)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"invalid {cls.__name__}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"not a valid JSON {cls.__name__}: {exc}") from None
    except (ValueError, TypeError, RecursionError) as exc:  # belt and braces
        raise ProtocolError(f"invalid {cls.__name__}: {exc}") from None
    finally:
        _decoding = False
    field = _NAME_FIELD.get(cls)
    if field is not None and name is not None and getattr(message, field) != name:
        raise ProtocolError(
            f"{cls.__name__}.{field} {getattr(message, field)!r} does not match topic name {name!r}"
        )
    return message


def peek_order(payload: bytes | str) -> tuple[int, int]:
    """Best-effort (epoch, seq) of a command that failed validation, for its rejected ack.

    Returns (0, 0) when the payload does not even carry them as integers.
    """
    try:
        # the stdlib parser, not msgspec: it reads 1e999 elsewhere in the payload
        # as inf instead of giving up, so epoch and seq are still found
        raw = json.loads(payload, parse_constant=_not_json)
    except Exception:  # anything at all: this runs on payloads already known to be bad
        return 0, 0
    if not isinstance(raw, dict):
        return 0, 0
    epoch, seq = raw.get("epoch"), raw.get("seq")
    # within int64, as a valid message's (found by bench/fuzz.py: a bigger one made the
    # rejected ack itself unencodable)
    if (
        type(epoch) is int
        and type(seq) is int
        and 0 <= epoch <= INT64_MAX
        and 0 <= seq <= INT64_MAX
    ):
        return epoch, seq
    return 0, 0


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


def names(items: Iterable[str], what: str) -> list[str]:
    """Validate a list of names (nodes, jobs)."""
    return [check_name(item, what) for item in items]
