"""What powerd writes to the time-series store: the one place that names it.

Five measurements, each a ``Measurement`` constant that lists its tags and
fields with their types and units (``docs/TELEMETRY.md`` is the same table in
prose; the Grafana dashboards query these names in InfluxQL):

- ``gpu``: one point per GPU per telemetry sample (written by the controller
  from the agents' telemetry),
- ``tree``: one point per budget-tree node (site, row, rack, node) per
  control cycle,
- ``decision``: one point per control cycle: what the controller did and how
  healthy the cluster looked,
- ``phase_event``: one point per phase change a training job announced,
- ``job_held``: per control cycle, a job's GPUs held below what they would draw, by
  cause and level (``powerd.controller.job_causes``).

Everything is built as InfluxDB line protocol strings: the one internal form,
which both the v2 write API and the local ``.lp`` file take as they are
(``powerd.line_protocol`` escapes, builds and reads the lines; its names are
re-exported here).

Types never vary between points, so InfluxDB never sees a field type
conflict: every field is declared FLOAT, INT or STRING and the builders
coerce to it (``*_w``, ``*_s``, ``*_pct``, clocks: always floats; counts,
epochs and 0/1 flags: always integers). A field that is ``None`` or not
finite is left out of the point; a point with no field left is not written
(the builders return ``None``). Timestamps are Unix seconds (float) in, whole
nanoseconds out (``precision=ns``); every point carries one, so points written
late (after an outage) keep the time they describe.

``parse_line`` reads a line back (tests, and the planner reading a ``.lp`` file).
"""

from __future__ import annotations

from typing import Any

from policies.causes import CAUSES, LEVEL_TAGS
from powerd.line_protocol import (
    FLOAT,
    INT,
    PREFIX_CACHE_MAX,
    STRING,
    Field,
    FieldType,
    Measurement,
    ParsedLine,
    Tag,
    escape_key,
    escape_measurement,
    escape_string,
    iter_lines,
    parse_line,
    to_ns,
)
from powerd.protocol import SOFTWARE_MECHANISM, PhaseEvent, Telemetry
from powerd.vocabulary import LEVELS, MODES, PHASES, PRIORITIES

__all__ = [
    "DECISION",
    "FLOAT",
    "GPU",
    "INT",
    "JOB_HELD",
    "MEASUREMENTS",
    "PHASE_EVENT",
    "STRING",
    "TREE",
    "Field",
    "FieldType",
    "Measurement",
    "ParsedLine",
    "Tag",
    "decision_line",
    "escape_key",
    "escape_measurement",
    "escape_string",
    "gpu_line",
    "iter_lines",
    "job_held_line",
    "parse_line",
    "phase_event_from_message",
    "phase_event_line",
    "telemetry_lines",
    "to_ns",
    "tree_line",
]


def _tag(
    name: str, description: str, required: bool = False, allowed: tuple[str, ...] | None = None
) -> Tag:
    return Tag(name, description, required, allowed)


_CLUSTER = _tag("cluster", "cluster name (controller.cluster)", required=True)
_SITE = _tag("site", "site (root of the budget tree)")
_ROW = _tag("row", "row the point is under")
_RACK = _tag("rack", "rack the point is under")

GPU = Measurement(
    name="gpu",
    description="one GPU's telemetry sample",
    writer="controller (from every agent's telemetry)",
    rate="one point per GPU per telemetry period (default 1 s)",
    tags=(
        _CLUSTER,
        _SITE,
        _ROW,
        _RACK,
        _tag("node", "server (agent) name", required=True),
        _tag("gpu", "GPU index on the node (0-based)", required=True),
        _tag("job", "training job running on the node; absent when none is known"),
        _tag("phase", "job phase", allowed=PHASES),
        _tag("mode", "agent mode: controlled, failsafe or local", allowed=MODES),
    ),
    fields=(
        Field("power_w", FLOAT, "W", "power drawn"),
        Field("energy_j", FLOAT, "J", "energy counter since the driver loaded (monotonic)"),
        Field("cap_w", FLOAT, "W", "power limit the GPU enforces now (read back)"),
        Field("cap_min_w", FLOAT, "W", "lowest power limit the GPU accepts"),
        Field("cap_max_w", FLOAT, "W", "highest power limit the GPU accepts"),
        Field("sm_clock_mhz", FLOAT, "MHz", "SM clock"),
        Field("max_sm_clock_mhz", FLOAT, "MHz", "SM clock lock; absent when not locked"),
        Field("util_pct", FLOAT, "%", "GPU utilisation"),
        Field("temp_c", FLOAT, "°C", "GPU temperature"),
        Field("capped", INT, "0/1", "1 when cap_w is below cap_max_w"),
        Field("seq", INT, "count", "telemetry sequence number of the node (gaps: lost samples)"),
        Field(
            "smoothing_enabled",
            INT,
            "0/1",
            "1 when the GPU's power smoothing (grid smoothing) is switched on; absent where"
            " the GPU reports no smoothing state",
        ),
        Field(
            "smoothing_software",
            INT,
            "0/1",
            "1 when the job carries the smoothing out (software), 0 when the GPU does"
            " (hardware); absent where the GPU reports no smoothing state",
        ),
        Field(
            "smoothing_floor_pct",
            FLOAT,
            "%",
            "the smoothing's power floor, percent of the enforced cap; absent where the GPU"
            " reports no smoothing state",
        ),
    ),
)

TREE = Measurement(
    name="tree",
    description="one budget-tree node's aggregates after a control cycle",
    writer="controller",
    rate="one point per tree node (site, rows, racks, nodes) per control cycle (default 1 s)",
    tags=(
        _CLUSTER,
        _tag("level", "site, row, rack or node", required=True, allowed=LEVELS),
        _tag("name", "the tree node's name", required=True),
        _SITE,
        _ROW,
        _RACK,
    ),
    fields=(
        Field("power_w", FLOAT, "W", "measured power under the node (GPUs plus overhead)"),
        Field("budget_w", FLOAT, "W", "planned power of the node"),
        Field("limit_w", FLOAT, "W", "hard limit (the breaker)"),
        Field("cap_threshold_w", FLOAT, "W", "capping starts above this"),
        Field("cap_target_w", FLOAT, "W", "capping brings the node down to this"),
        Field("uncap_threshold_w", FLOAT, "W", "caps are handed back below this"),
        Field("predicted_w", FLOAT, "W", "power predicted for the next cycle under the new caps"),
        Field("cap_sum_w", FLOAT, "W", "sum of the GPU caps under the node, plus overhead"),
        Field("capped_share", FLOAT, "fraction", "share of GPUs under the node with cap < cap_max"),
        Field("capping", INT, "0/1", "1 while the node is being capped"),
    ),
)

DECISION = Measurement(
    name="decision",
    description="one control cycle: what the controller did and the cluster's health",
    writer="controller (the leader)",
    rate="one point per control cycle (default 1 s)",
    tags=(_CLUSTER, _tag("controller", "name of the controller that led the cycle")),
    fields=(
        Field("cycle_s", FLOAT, "s", "time the cycle took (policy, commands)"),
        Field("commands_sent", INT, "count", "commands published this cycle"),
        Field("resends", INT, "count", "commands re-sent for want of an ack"),
        Field("acks_received", INT, "count", "acks received since the last cycle"),
        Field("acks_missing", INT, "count", "commands past ack_timeout_s without an ack"),
        Field(
            "acks_stale",
            INT,
            "count",
            "our newest command acked stale: the node holds one we did not send",
        ),
        Field("acks_late", INT, "count", "acks of a newest command after its node went stale"),
        Field("commands_in_flight", INT, "count", "commands sent, not yet answered or overdue"),
        Field("stale_nodes", INT, "count", "nodes whose telemetry is older than stale_after_s"),
        Field("failsafe_nodes", INT, "count", "nodes reporting failsafe mode"),
        Field("offline_nodes", INT, "count", "nodes whose status is offline"),
        Field("rejected_payloads", INT, "count", "invalid payloads received (cumulative)"),
        Field("epoch", INT, "count", "controller epoch (grows at every failover)"),
        Field("gpus_capped", INT, "count", "GPUs with cap < cap_max after the cycle"),
        Field("site_ramp_w_per_s", FLOAT, "W/s", "rate of change of the site's cap sum"),
        Field(
            "site_power_ramp_w_per_s",
            FLOAT,
            "W/s",
            "rate of change of the site's measured power over the cycle (its change since the"
            " last cycle, over the cycle's length); absent on a controller's first cycle",
        ),
        Field(
            "grid_ramp_up_w_per_s",
            FLOAT,
            "W/s",
            "the grid's limit on the measured site power's rise ([site.grid], over its"
            " window_s); absent: no grid spec, or no limit on rises",
        ),
        Field(
            "grid_ramp_down_w_per_s",
            FLOAT,
            "W/s",
            "the grid's limit on the measured site power's fall, a positive number"
            " ([site.grid], over its window_s); absent: no grid spec, or no limit on falls",
        ),
        Field(
            "site_limit_w",
            FLOAT,
            "W",
            "an operator's temporary site limit in force (demand response); absent: none",
        ),
        Field("telemetry_received", INT, "count", "telemetry messages received this cycle"),
        Field(
            "telemetry_dropped",
            INT,
            "count",
            "telemetry replaced by a newer sample of its node before it was decoded",
        ),
        Field("telemetry_lost", INT, "count", "telemetry missing from agents' seq (never came)"),
        Field(
            "telemetry_waiting", INT, "count", "nodes with telemetry not yet decoded at decision"
        ),
        Field("ingest_s", FLOAT, "s", "CPU time spent decoding telemetry since the last cycle"),
        Field("raises_deferred", INT, "count", "nodes whose raise or lock waits, max_raises_per_s"),
        Field("uncap_waiting", INT, "count", "capped nodes whose turn to be handed watts is later"),
        Field("cut_waiting", INT, "count", "nodes whose turn to be cut for a budget is later"),
        Field("clock_policy_gpus", INT, "count", "GPUs whose agent locks clocks on announcements"),
        Field("nodes_drifted", INT, "count", "nodes found holding other caps than commanded"),
        Field(
            "failsafe_over_plan",
            INT,
            "count",
            "nodes whose agents' failsafe cap is above the budgets file's",
        ),
        Field(
            "nodes_implausible",
            INT,
            "count",
            "nodes whose telemetry says what no GPU can do: counted at their caps, not commanded",
        ),
        Field(
            "inputs_refused",
            INT,
            "count",
            "messages dropped unread since the last cycle (telemetry over 1 MiB or retained,"
            " phases retained or over their rates, telemetry over the site's rate) and new"
            " jobs or claims refused; the log says which",
        ),
        Field(
            "clock_alarms",
            INT,
            "count",
            "heartbeats, grants and site limits refused since start: their ts ran more than "
            "max_clock_skew_s ahead of this controller's clock",
        ),
        Field(
            "peer_skew_s",
            FLOAT,
            "s",
            "the largest clock skew measured of a peer controller (this clock minus its "
            "heartbeats' ts on receipt; positive: the peer is behind); absent: none heard",
        ),
        Field(
            "node_skew_s",
            FLOAT,
            "s",
            "the live nodes' largest clock skew, signed (this clock minus a node's telemetry "
            "ts on receipt; positive: the node is behind); absent: no node heard",
        ),
        Field(
            "nodes_skewed",
            INT,
            "count",
            "live nodes whose clock is more than max_clock_skew_s off this controller's "
            "(their agents refuse its heartbeats as from the future); the log names the worst",
        ),
    ),
)

PHASE_EVENT = Measurement(
    name="phase_event",
    description="a phase change announced by a training job",
    writer="controller (from jobs/{job}/phase)",
    rate="one point per announcement (a few per job per minute at most)",
    tags=(
        _CLUSTER,
        _tag("job", "job name", required=True),
        _tag("phase", "the phase entered", required=True, allowed=PHASES),
        _tag("priority", "job priority: high, normal or low", allowed=PRIORITIES),
    ),
    fields=(
        Field("events", INT, "count", "always 1: sum(events) counts announcements"),
        Field("nodes", INT, "count", "nodes named in the event; absent: all the job's nodes"),
        Field("expected_s", FLOAT, "s", "how long the job expects the phase to last"),
    ),
)

JOB_HELD = Measurement(
    name="job_held",
    description="a job's GPUs held below what they would draw, by cause and level",
    writer="controller (the leader)",
    rate="per control cycle, one point per job, cause and level with a GPU held (none: none)",
    tags=(
        _CLUSTER,
        _tag("controller", "name of the controller that led the cycle"),
        _tag("job", "job name; `no job` for GPUs no job is announced on", required=True),
        _tag("cause", "what lowered the caps (policies.causes)", required=True, allowed=CAUSES),
        _tag(
            "level",
            "for capping: the level whose budget cut (site, row, rack, node), or what bound"
            " the root: `site limit` (an operator's) or `grant` (a coordinator's)",
            allowed=LEVEL_TAGS,
        ),
    ),
    fields=(
        Field("gpus", INT, "count", "the job's GPUs held by this cause and level"),
        Field("held_w", FLOAT, "W", "watts held back: max limit less cap (less draw: clock lock)"),
        Field("job_gpus", INT, "count", "the job's GPUs under this controller"),
        Field("held_share", FLOAT, "fraction", "gpus / job_gpus"),
    ),
)

MEASUREMENTS: tuple[Measurement, ...] = (GPU, TREE, DECISION, PHASE_EVENT, JOB_HELD)


# --- builders ------------------------------------------------------------------


def gpu_line(
    ts: float,
    *,
    cluster: str,
    node: str,
    gpu: int,
    site: str | None = None,
    row: str | None = None,
    rack: str | None = None,
    job: str | None = None,
    phase: str | None = None,
    mode: str | None = None,
    **fields: float | int | None,
) -> str | None:
    """One ``gpu`` point; ``fields`` are those of ``GPU`` (power_w, cap_w, ...)."""
    tags = {
        "cluster": cluster,
        "site": site,
        "row": row,
        "rack": rack,
        "node": node,
        "gpu": gpu,
        "job": job,
        "phase": phase,
        "mode": mode,
    }
    return GPU.line(ts, tags, fields)


_GPU_PREFIXES: dict[tuple[Any, ...], str] = {}
_GPU_FAST_FIELDS = (
    ("power_w", FLOAT),
    ("energy_j", FLOAT),
    ("cap_w", FLOAT),
    ("cap_min_w", FLOAT),
    ("cap_max_w", FLOAT),
    ("sm_clock_mhz", FLOAT),
    ("max_sm_clock_mhz", FLOAT),
    ("util_pct", FLOAT),
    ("temp_c", FLOAT),
    ("capped", INT),
    ("seq", INT),
    ("smoothing_enabled", INT),
    ("smoothing_software", INT),
    ("smoothing_floor_pct", FLOAT),
)
# The fast path writes these fields with these types; the schema must agree.
assert all(GPU.field_type(name) == kind for name, kind in _GPU_FAST_FIELDS)


def _fast_gpu_line(
    cluster: str,
    telemetry: Telemetry,
    g: Any,
    site: str | None,
    row: str | None,
    rack: str | None,
    job: str | None,
    phase: str | None,
    ns: int,
    seq: Any,
) -> str | None:
    """``gpu_line``'s result for a decoded GPU sample, or None where it cannot be sure."""
    p, cap, low, high, util, temp = (
        g.power_w,
        g.cap_w,
        g.cap_min_w,
        g.cap_max_w,
        g.util_pct,
        g.temp_c,
    )
    energy, clock, lock = g.energy_j, g.sm_clock_mhz, g.max_sm_clock_mhz
    if not (
        p.__class__ is cap.__class__ is low.__class__ is high.__class__ is float
        and util.__class__ is temp.__class__ is float
        and clock.__class__ is int
        and seq.__class__ is int
        and (energy is None or energy.__class__ is float)
        and (lock is None or lock.__class__ is int)
    ):
        return None
    total = p + cap + low + high + util + temp + (0.0 if energy is None else energy)
    if total - total != 0.0:  # a NaN or an infinity somewhere (or an overflowing sum)
        return None
    smoothing = g.smoothing
    if smoothing is None:
        smoothing_part = ""
    else:
        on, floor = smoothing.enabled, smoothing.floor_percent
        if not (on.__class__ is bool and floor.__class__ is float and floor - floor == 0.0):
            return None
        software = int(smoothing.mechanism == SOFTWARE_MECHANISM)
        smoothing_part = (
            f",smoothing_enabled={int(on)}i,smoothing_software={software}i,"
            f"smoothing_floor_pct={floor!r}"
        )
    key = (cluster, site, row, rack, telemetry.node, g.index, job, phase, telemetry.mode)
    prefix = _GPU_PREFIXES.get(key)
    if prefix is None:
        tags = {
            "cluster": cluster,
            "site": site,
            "row": row,
            "rack": rack,
            "node": telemetry.node,
            "gpu": g.index,
            "job": job,
            "phase": phase,
            "mode": telemetry.mode,
        }
        prefix = GPU._prefix(tags)
        if len(_GPU_PREFIXES) >= PREFIX_CACHE_MAX:
            _GPU_PREFIXES.clear()
        _GPU_PREFIXES[key] = prefix
    energy_part = "" if energy is None else f",energy_j={energy!r}"
    lock_part = "" if lock is None else f",max_sm_clock_mhz={float(lock)!r}"
    return (
        f"{prefix} power_w={p!r}{energy_part},cap_w={cap!r},cap_min_w={low!r},"
        f"cap_max_w={high!r},sm_clock_mhz={float(clock)!r}{lock_part},util_pct={util!r},"
        f"temp_c={temp!r},capped={int(cap < high)}i,seq={seq}i{smoothing_part} {ns}"
    )


def telemetry_lines(
    cluster: str,
    telemetry: Telemetry,
    *,
    site: str | None = None,
    row: str | None = None,
    rack: str | None = None,
    job: str | None = None,
    phase: str | None = None,
) -> list[str]:
    """``gpu`` points for every GPU of one decoded telemetry message.

    The placement (site, row, rack) and the job and phase running on the node
    come from the controller; the rest from the message (the ``smoothing_*``
    fields only where a GPU reports its power smoothing state).

    The controller's recorder calls this for every node every ``fine_every_s``
    (8,300 points a second on the 150 MW site), so the common case is written
    out here: tags escaped once per GPU (cached), fields in one f-string. Any
    GPU the fast path does not cover (a non-finite or non-float number, a
    struct built in code) goes through ``gpu_line``; both give the same line
    (``tests/recorder/test_telemetry_schema.py``).
    """
    lines = []
    ns = to_ns(telemetry.ts)
    seq = telemetry.seq
    for g in telemetry.gpus:
        line = _fast_gpu_line(cluster, telemetry, g, site, row, rack, job, phase, ns, seq)
        if line is not None:
            lines.append(line)
            continue
        smoothing = g.smoothing
        line = gpu_line(
            telemetry.ts,
            cluster=cluster,
            node=telemetry.node,
            gpu=g.index,
            site=site,
            row=row,
            rack=rack,
            job=job,
            phase=phase,
            mode=telemetry.mode,
            power_w=g.power_w,
            energy_j=g.energy_j,
            cap_w=g.cap_w,
            cap_min_w=g.cap_min_w,
            cap_max_w=g.cap_max_w,
            sm_clock_mhz=g.sm_clock_mhz,
            max_sm_clock_mhz=g.max_sm_clock_mhz,
            util_pct=g.util_pct,
            temp_c=g.temp_c,
            capped=g.cap_w < g.cap_max_w,
            seq=telemetry.seq,
            smoothing_enabled=None if smoothing is None else smoothing.enabled,
            smoothing_software=(
                None if smoothing is None else smoothing.mechanism == SOFTWARE_MECHANISM
            ),
            smoothing_floor_pct=None if smoothing is None else smoothing.floor_percent,
        )
        if line is not None:
            lines.append(line)
    return lines


def tree_line(
    ts: float,
    *,
    cluster: str,
    level: str,
    name: str,
    site: str | None = None,
    row: str | None = None,
    rack: str | None = None,
    **fields: float | int | bool | None,
) -> str | None:
    """One ``tree`` point; ``fields`` are those of ``TREE`` (power_w, budget_w, ...)."""
    tags = {
        "cluster": cluster,
        "level": level,
        "name": name,
        "site": site,
        "row": row,
        "rack": rack,
    }
    return TREE.line(ts, tags, fields)


def decision_line(
    ts: float,
    *,
    cluster: str,
    controller: str | None = None,
    **fields: float | int | None,
) -> str | None:
    """One ``decision`` point; ``fields`` are those of ``DECISION`` (cycle_s, epoch, ...)."""
    return DECISION.line(ts, {"cluster": cluster, "controller": controller}, fields)


def phase_event_line(
    ts: float,
    *,
    cluster: str,
    job: str,
    phase: str,
    priority: str | None = None,
    nodes: int | None = None,
    expected_s: float | None = None,
) -> str:
    """One ``phase_event`` point."""
    line = PHASE_EVENT.line(
        ts,
        {"cluster": cluster, "job": job, "phase": phase, "priority": priority},
        {"events": 1, "nodes": nodes, "expected_s": expected_s},
    )
    assert line is not None  # `events` is always there
    return line


def phase_event_from_message(cluster: str, event: PhaseEvent) -> str:
    """The ``phase_event`` point of one decoded phase message."""
    return phase_event_line(
        event.ts,
        cluster=cluster,
        job=event.job,
        phase=event.phase,
        priority=event.priority,
        nodes=event.node_count(),  # a host list counted, not expanded
        expected_s=event.expected_s,
    )


def job_held_line(
    ts: float,
    *,
    cluster: str,
    job: str,
    cause: str,
    controller: str | None = None,
    level: str | None = None,
    gpus: int,
    held_w: float,
    job_gpus: int,
) -> str | None:
    """One ``job_held`` point."""
    tags = {"cluster": cluster, "controller": controller, "job": job, "cause": cause}
    tags["level"] = level
    share = gpus / job_gpus if job_gpus else None
    fields = {"gpus": gpus, "held_w": held_w, "job_gpus": job_gpus, "held_share": share}
    return JOB_HELD.line(ts, tags, fields)
