"""ControllerCore's state: telemetry, statuses and bad input in, cluster state out.

No broker and no sleeping: the core takes raw payload bytes and a fake
monotonic clock. The builders here (a small budgets file, payloads, ``Bench``)
are shared by the other ``test_controller_*`` unit tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest

from policies import PHASE_CODES, PRIORITY_CODES, PolicySettings
from powerd.controller.core import (
    POWER_OVER_CAP_RATIO,
    POWER_OVER_CAP_W,
    ControllerCore,
    ControllerSettings,
    CycleCounters,
    CycleResult,
)
from powerd.protocol import (
    Ack,
    AckError,
    Command,
    GpuAck,
    GpuTelemetry,
    PhaseEvent,
    Status,
    Telemetry,
    encode,
)
from powerd.topology import Topology, parse_budgets
from powerd.vocabulary import AckResult, NodeState
from tests.support.clock import ManualClock

# Two rows. Rack k1 is tight: four H100 at 650 W (2600 W) plus its 100 W switch
# are far above its capping threshold (0.98 x 1500 = 1470 W); racks k2 and k3
# have room for every GPU at its 700 W maximum. Nodes never cap themselves
# (no limit of their own), the rows and the site have room for everything.
BUDGETS = """
[site]
name = "lab"
limit_kw = 20
budget_kw = 18

[models.H100]
failsafe_cap_w = 400
comm_clock_mhz = 1100

[[rows]]
name = "r1"
limit_kw = 15
budget_kw = 14

[[rows.racks]]
name = "k1"
limit_w = 2600
budget_w = 1500
overhead_w = 100
nodes = { count = 2, name = "{rack}-n{i}", gpus = 2, model = "H100" }

[[rows.racks]]
name = "k2"
limit_w = 3000
budget_w = 2900
nodes = { count = 2, name = "{rack}-n{i}", gpus = 2, model = "H100" }

[[rows]]
name = "r2"
limit_kw = 5
budget_kw = 4

[[rows.racks]]
name = "k3"
limit_w = 2000
budget_w = 1800

[[rows.racks.nodes]]
name = "k3-n1"
gpus = 2
model = "H100"
"""
NODES = ("k1-n1", "k1-n2", "k2-n1", "k2-n2", "k3-n1")
CAP_MIN_W, CAP_MAX_W, FAILSAFE_W, COMM_CLOCK_MHZ = 200.0, 700.0, 400.0, 1100.0
K1_TARGET_W = 0.95 * 1500  # rack k1's capping target
# The bands (policies/capping.py), for the tests whose numbers are theirs: rack k1 cut to its
# capping target, caps handed back a step a cycle. Under safety by caps, the default, rack
# k1 is held within its 2,600 W limit by its caps and the others keep what they hold.
BANDS = PolicySettings(safety_by_caps=False)
WALL0 = 1_795_000_000.0  # the fake wall clock is WALL0 + the fake monotonic clock


def budgets(text: str = BUDGETS) -> Topology:
    return parse_budgets(text, source="test-budgets.toml")


# --- payloads ----------------------------------------------------------------------


def telemetry_payload(
    node: str,
    power_w: float | Sequence[float],
    cap_w: float | Sequence[float] = CAP_MAX_W,
    *,
    n_gpus: int = 2,
    mode: str = "controlled",
    clock_mhz: int | None = None,
    seq: int = 0,
    ts: float = WALL0,
    epoch: int | None = None,
) -> bytes:
    powers = _per_gpu(power_w, n_gpus)
    caps = _per_gpu(cap_w, len(powers))
    return encode(
        Telemetry(
            v=1,
            node=node,
            ts=ts,
            seq=seq,
            mode=mode,  # type: ignore[arg-type]
            gpus=[
                GpuTelemetry(
                    index=i,
                    uuid=f"GPU-{node}-{i}",
                    power_w=float(p),
                    energy_j=1000.0,
                    cap_w=float(c),
                    cap_min_w=CAP_MIN_W,
                    cap_max_w=CAP_MAX_W,
                    sm_clock_mhz=1700,
                    max_sm_clock_mhz=clock_mhz,
                    util_pct=90.0,
                    temp_c=55.0,
                )
                for i, (p, c) in enumerate(zip(powers, caps, strict=True))
            ],
            epoch=epoch,
        )
    )


def _per_gpu(value: float | Sequence[float], n: int) -> list[float]:
    return [float(value)] * n if isinstance(value, int | float) else [float(v) for v in value]


def status_payload(node: str, state: NodeState, ts: float = WALL0) -> bytes:
    return encode(Status(v=1, node=node, state=state, ts=ts, gpus=2, agent_version="0.1.0"))


def ack_payload(
    node: str,
    command: Command,
    result: AckResult = "applied",
    *,
    epoch: int | None = None,
    seq: int | None = None,
    cap_w: dict[int, float] | None = None,
    errors: Sequence[str] = (),
    ts: float = WALL0,
) -> bytes:
    """The ack an agent would send for ``command``: caps read back as commanded unless given."""
    read_back = dict(zip((g.index for g in command.gpus), caps_w(command), strict=True)) | (
        cap_w or {}
    )
    return encode(
        Ack(
            v=1,
            node=node,
            epoch=command.epoch if epoch is None else epoch,
            seq=command.seq if seq is None else seq,
            ts=ts,
            result=result,
            gpus=[]
            if result == "rejected"
            else [
                GpuAck(index=i, cap_w=c, max_sm_clock_mhz=None, clamped=False)
                for i, c in sorted(read_back.items())
            ],
            errors=[AckError(index=None, message=m) for m in errors],
        )
    )


def phase_payload(
    job: str,
    phase: str,
    nodes: Sequence[str] | None = None,
    priority: str = "normal",
    expected_s: float | None = None,
) -> bytes:
    return encode(
        PhaseEvent(
            v=1,
            job=job,
            ts=WALL0,
            phase=phase,  # type: ignore[arg-type]
            nodes=None if nodes is None else list(nodes),
            priority=priority,  # type: ignore[arg-type]
            expected_s=expected_s,
        )
    )


# --- a core on the test tree -------------------------------------------------------


def caps_w(command: Command) -> list[float]:
    """The caps a command sets, one per GPU; every GPU in a controller's command has one."""
    caps = [g.cap_w for g in command.gpus]
    assert all(isinstance(c, float) for c in caps), caps
    return [float(c) for c in caps if isinstance(c, float)]


@dataclass
class Bench:
    """A ControllerCore on ``BUDGETS`` with a fake clock, and what the agents would say."""

    core: ControllerCore
    clock: ManualClock
    topology: Topology
    caps: dict[str, list[float]] = field(default_factory=dict)  # as the agents hold them

    def gpus(self, node: str) -> range:
        return self.topology.server_gpus(node)

    def report(self, node: str, power_w: float | Sequence[float], **kw) -> Telemetry | None:
        """Telemetry from ``node``; caps default to what the node was last commanded. A
        power the GPU could not draw under its cap (beyond the controller's plausibility
        bound) is what its power limiter makes of it: the cap. Real GPUs report more only
        for a moment at a load step (docs/HARDWARE.md), and the controller doubts a node
        whose telemetry says otherwise for longer."""
        kw.setdefault("cap_w", self.caps.get(node, CAP_MAX_W))
        powers = _per_gpu(power_w, kw.get("n_gpus", 2))
        caps = _per_gpu(kw["cap_w"], len(powers))
        drawn = [
            c if p > c * POWER_OVER_CAP_RATIO + POWER_OVER_CAP_W else p
            for p, c in zip(powers, caps + caps[-1:] * (len(powers) - len(caps)), strict=True)
        ]
        return self.core.on_telemetry(node, telemetry_payload(node, drawn, **kw))

    def report_all(self, power_w: dict[str, float] | float = 300.0, **kw) -> None:
        for node in NODES:
            p = power_w if isinstance(power_w, int | float) else power_w.get(node, 300.0)
            self.report(node, p, **kw)

    def cycle(self, advance_s: float = 0.0) -> CycleResult:
        """Advance the clock, then run one cycle."""
        self.clock.advance(advance_s)
        return self.core.cycle()

    def apply(self, result: CycleResult, ack: bool = True) -> dict[str, Command]:
        """The agents apply (and, by default, acknowledge) every command of a cycle."""
        out = {}
        for node, command in result.commands:
            self.caps[node] = [g.cap_w for g in command.gpus]  # type: ignore[misc]
            out[node] = command
            if ack:
                self.core.on_ack(node, ack_payload(node, command))
        return out

    def phase(self, job: str, phase: str, nodes=None, priority: str = "normal"):
        return self.core.on_phase(job, phase_payload(job, phase, nodes, priority))


def make_bench(text: str = BUDGETS, **settings) -> Bench:
    topology = budgets(text)
    clock = ManualClock(100.0)
    core = ControllerCore(
        topology.tree,
        ControllerSettings(**settings),
        monotonic=clock,
        wall=lambda: WALL0 + clock.t,
    )
    return Bench(core, clock, topology)


@pytest.fixture
def bench() -> Bench:
    return make_bench()


def node_index(bench: Bench, name: str) -> int:
    return bench.topology.node_index(name)


def snapshot(core: ControllerCore) -> dict:
    """Everything the inputs can change, copied."""
    return {
        "power": core.power_w.copy(),
        "cap": core.cap_w.copy(),
        "clock": core.clock_mhz.copy(),
        "seen": core.last_seen.copy(),
        "mode": list(core.mode),
        "offline": core.offline.copy(),
        "jobs": {k: (list(j.nodes), j.phase, j.priority) for k, j in core.jobs.items()},
        "server_job": list(core.server_job),
        "pending": dict(core.pending),
        "commanded": core.commanded_cap_w.copy(),
    }


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], np.ndarray):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        else:
            assert a[key] == b[key], key


# --- the tree's servers ---------------------------------------------------------------


def test_the_tree_maps_each_node_to_its_contiguous_gpus() -> None:
    top = budgets()
    tree = top.tree
    assert tree.server_names == NODES
    assert [(r.start, r.stop) for r in tree.server_gpus] == [
        (0, 2),
        (2, 4),
        (4, 6),
        (6, 8),
        (8, 10),
    ]
    assert [top.names[i] for i in tree.server_nodes] == list(NODES)
    assert tree.server_ordinal["k2-n2"] == 3
    assert tree.gpu_server_ordinal.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


# --- telemetry into the state --------------------------------------------------------


def test_telemetry_lands_on_the_nodes_gpus(bench: Bench) -> None:
    sample = bench.report("k2-n2", [610.0, 620.0], cap_w=[650.0, 660.0], clock_mhz=1100)
    assert sample is not None and sample.node == "k2-n2"
    core, gpus = bench.core, bench.gpus("k2-n2")
    assert list(core.power_w[gpus.start : gpus.stop]) == [610.0, 620.0]
    assert list(core.cap_w[gpus.start : gpus.stop]) == [650.0, 660.0]
    assert list(core.clock_mhz[gpus.start : gpus.stop]) == [1100.0, 1100.0]
    # everyone else still at the failsafe figures, never heard from
    others = np.setdiff1d(np.arange(core.tree.n_gpus), np.arange(gpus.start, gpus.stop))
    assert np.all(core.power_w[others] == FAILSAFE_W)
    assert np.all(np.isnan(core.clock_mhz[others]))
    assert core.last_seen[3] == bench.clock.t
    assert core.mode[3] == "controlled"
    bench.report("k2-n2", 100.0)  # unlocked: NaN again
    assert np.all(np.isnan(core.clock_mhz[gpus.start : gpus.stop]))


def test_cycle_sums_power_up_the_tree_with_overheads(bench: Bench) -> None:
    bench.report_all(
        {"k1-n1": 500.0, "k1-n2": 400.0, "k2-n1": 300.0, "k2-n2": 200.0, "k3-n1": 100.0}
    )
    power = bench.cycle().decision.node_power_w
    at = lambda name: power[node_index(bench, name)]  # noqa: E731
    assert at("k1-n1") == 1000.0
    assert at("k1") == 1000.0 + 800.0 + 100.0  # overhead_w of the rack
    assert at("k2") == 600.0 + 400.0
    assert at("r1") == at("k1") + at("k2")
    assert at("k3") == at("r2") == 200.0
    assert at("lab") == at("r1") + at("r2")


def test_state_before_any_telemetry_is_failsafe_power_and_no_commands(bench: Bench) -> None:
    result = bench.cycle()
    assert result.commands == []
    assert result.counters.stale_nodes == len(NODES)
    state, live = bench.core.cluster_state(bench.clock.t, CycleCounters())
    assert not live.any() and not state.controllable.any()
    assert np.all(state.power_w == FAILSAFE_W) and np.all(state.cap_w == FAILSAFE_W)
    assert result.decision.node_power_w[0] == 10 * FAILSAFE_W + 100.0


def test_first_cycle_uses_cycle_s_then_the_clock(bench: Bench) -> None:
    bench.cycle()
    assert bench.core.last_dt_s == 1.0
    bench.cycle(advance_s=2.5)
    assert bench.core.last_dt_s == 2.5
    bench.cycle(advance_s=0.0)  # two cycles at one instant: a tiny positive dt, not 0
    assert 0 < bench.core.last_dt_s <= 1e-3


def test_gpu_index_beyond_the_budgets_file_is_ignored(bench: Bench) -> None:
    before = bench.core.power_w.copy()
    sample = bench.report("k3-n1", [610.0, 620.0, 630.0])  # the file gives k3-n1 two GPUs
    assert sample is not None
    gpus = bench.gpus("k3-n1")
    assert list(bench.core.power_w[gpus.start : gpus.stop]) == [610.0, 620.0]
    # the extra GPU did not spill into anybody else's slot
    np.testing.assert_array_equal(bench.core.power_w[: gpus.start], before[: gpus.start])
    assert bench.core.rejected_total == 0
    result = bench.cycle()
    command = dict(result.commands)["k3-n1"]
    assert [g.index for g in command.gpus] == [0, 1]


def test_unknown_node_is_ignored_not_rejected(bench: Bench) -> None:
    before = snapshot(bench.core)
    assert bench.core.on_telemetry("k9-n9", telemetry_payload("k9-n9", 650.0)) is None
    bench.core.on_status("k9-n9", status_payload("k9-n9", "offline"))
    bench.core.on_ack("k9-n9", b"whatever")  # not even decoded
    assert_same(before, snapshot(bench.core))
    assert bench.core.rejected_total == 0


# --- malformed payloads ----------------------------------------------------------------

GOOD_TELEMETRY = telemetry_payload("k1-n1", 300.0)
BAD_PAYLOADS = [
    pytest.param(b"", id="empty"),
    pytest.param(b"not json", id="not-json"),
    pytest.param(b"[1, 2]", id="array"),
    pytest.param(b"{}", id="empty-object"),
    pytest.param(GOOD_TELEMETRY.replace(b'"v":1', b'"v":2'), id="version-2"),
    pytest.param(GOOD_TELEMETRY.replace(b'"power_w":300.0', b'"power_w":"300"'), id="string-power"),
    pytest.param(
        GOOD_TELEMETRY.replace(b'"power_w":300.0', b'"power_w":-5.0'), id="negative-power"
    ),
    pytest.param(GOOD_TELEMETRY.replace(b'"power_w":300.0', b'"power_w":1e999'), id="infinite"),
    pytest.param(GOOD_TELEMETRY.replace(b'"power_w":300.0', b'"power_w":NaN'), id="nan"),
    pytest.param(GOOD_TELEMETRY.replace(b'"mode":"controlled"', b'"mode":"boss"'), id="bad-mode"),
    pytest.param(GOOD_TELEMETRY.replace(b'"node":"k1-n1"', b'"node":"k1-n2"'), id="name-mismatch"),
    pytest.param(GOOD_TELEMETRY[:-1] + b',"pad":"' + b"x" * 70_000 + b'"}', id="over-64KiB"),
    pytest.param(b"\xff\xfe\x00", id="binary"),
]


@pytest.mark.parametrize("payload", BAD_PAYLOADS)
@pytest.mark.parametrize("kind", ["telemetry", "status", "ack", "phase"])
def test_malformed_payload_is_counted_and_changes_nothing(
    bench: Bench, kind: str, payload: bytes
) -> None:
    bench.report_all(650.0)
    bench.phase("j1", "startup", ["k2-n1"], priority="high")
    bench.apply(bench.cycle(), ack=False)  # commands pending
    before = snapshot(bench.core)
    handlers: dict[str, Callable[[str, bytes], object]] = {
        "telemetry": bench.core.on_telemetry,
        "status": bench.core.on_status,
        "ack": bench.core.on_ack,
        "phase": bench.core.on_phase,
    }
    handler = handlers[kind]
    target = "j1" if kind == "phase" else "k1-n1"
    assert handler(target, payload) is None
    assert_same(before, snapshot(bench.core))
    assert bench.core.rejected_total == 1
    result = bench.cycle(advance_s=1.0)
    assert result.counters.rejected_payloads == 1
    assert bench.cycle(advance_s=1.0).counters.rejected_payloads == 0  # per cycle
    assert bench.core.rejected_total == 1  # since the start


def test_rejected_count_adds_up_over_many_bad_payloads(bench: Bench) -> None:
    for i in range(50):
        bench.core.on_telemetry("k1-n1", b"{" * i)
    bench.core.count_rejected()  # what the service calls for a bad topic
    assert bench.core.rejected_total == 51
    assert bench.cycle().counters.rejected_payloads == 51


def test_valid_payloads_with_unknown_fields_are_accepted(bench: Bench) -> None:
    payload = GOOD_TELEMETRY[:-1] + b',"future_field":{"x":1}}'
    assert bench.core.on_telemetry("k1-n1", payload) is not None
    assert bench.core.rejected_total == 0


# --- stale, offline, failsafe ------------------------------------------------------------


def test_stale_node_counts_at_failsafe_power_and_is_not_commanded() -> None:
    # the agents fall back to failsafe as soon as the controller calls them stale; the bands
    # cut the rack-mate for the silent node (safety by caps leaves it its maximum: 2 x 700 W
    # + 2 x 400 W + 100 W fit rack k1's limit)
    bench = make_bench(stale_after_s=5.0, agent_failsafe_after_s=5.0, policy=BANDS)
    bench.report_all({"k1-n1": 100.0, "k1-n2": 100.0})  # rack k1 well under its budget
    bench.apply(bench.cycle())
    for _ in range(5):  # k1-n1 falls silent; its rack-mate starts drawing 650 W
        bench.clock.advance(1.0)
        for node in NODES[1:]:
            bench.report(node, 650.0 if node == "k1-n2" else 300.0)
    result = bench.cycle()
    assert result.counters.stale_nodes == 0  # exactly stale_after_s: still fresh
    bench.apply(result)
    bench.clock.advance(0.5)
    for node in NODES[1:]:
        bench.report(node, 650.0 if node == "k1-n2" else 300.0)
    result = bench.cycle()
    c = result.counters
    assert (c.stale_nodes, c.offline_nodes, c.failsafe_nodes) == (1, 0, 0)
    power = result.decision.node_power_w
    assert power[node_index(bench, "k1-n1")] == 2 * FAILSAFE_W
    assert power[node_index(bench, "k1")] == 2 * FAILSAFE_W + 2 * 650.0 + 100.0
    assert "k1-n1" not in dict(result.commands)
    # the silent node is taken at its failsafe power, so its rack-mate gives the rest
    k1n2 = bench.gpus("k1-n2")
    assert result.decision.cap_w[k1n2.start] == pytest.approx((K1_TARGET_W - 800.0 - 100.0) / 2)
    stale = bench.gpus("k1-n1")
    assert np.all(result.decision.cap_w[stale.start : stale.stop] == FAILSAFE_W)
    assert 0 not in bench.core.pending  # no resend to a silent node
    bench.clock.advance(60.0)
    for node in NODES[1:]:
        bench.report(node, 300.0)
    assert "k1-n1" not in dict(bench.cycle().commands)


def test_node_back_from_silence_is_commanded_only_where_it_holds_other_caps() -> None:
    # the bands hand every GPU here its maximum, so a node back at its failsafe caps holds
    # other caps than the decision's (safety by caps takes the caps a node holds, within its
    # limits, as they are: it commands none of them)
    bench = make_bench(stale_after_s=5.0, policy=BANDS)
    bench.report_all(300.0)
    bench.apply(bench.cycle())
    silent = bench.cycle(advance_s=6.0)
    assert silent.commands == [] and silent.counters.stale_nodes == len(NODES)
    bench.clock.advance(1.0)
    # all back; k2-n1 restarted meanwhile and holds its failsafe caps, the rest what they held
    # (sampled 7 s after their acks: caps read back that late are settled, CAP_SETTLE_S)
    for node in NODES:
        caps = {"cap_w": FAILSAFE_W} if node == "k2-n1" else {}
        bench.report(node, 300.0, ts=WALL0 + 7.0, **caps)
    result = bench.cycle()
    # what each holds is read from its telemetry: only the one that differs is commanded
    assert [node for node, _ in result.commands] == ["k2-n1"]
    assert all(c > FAILSAFE_W for c in caps_w(dict(result.commands)["k2-n1"]))  # handed back
    assert result.counters.resends == 0


def test_node_heard_but_not_yet_decoded_after_silence_is_not_commanded() -> None:
    """Back, but its payload still waits in the inbox: not stale, and not commanded on
    what it held before it went away (it may have restarted). Under the bands, whose
    decision (every GPU's maximum here) differs from the failsafe caps the restarted node
    holds."""
    bench = make_bench(stale_after_s=5.0, policy=BANDS)
    bench.report_all(300.0)
    bench.apply(bench.cycle())
    bench.cycle(advance_s=6.0)
    bench.clock.advance(1.0)
    for node in NODES[1:]:
        bench.report(node, 300.0)
    waiting = (np.array([0]), np.array([bench.clock.t]))  # k1-n1: received, not decoded
    result = bench.core.cycle(waiting)
    assert result.counters.stale_nodes == 0 and result.counters.telemetry_waiting == 1
    assert result.commands == []
    k1n1 = bench.gpus("k1-n1")
    assert not result.decision.cap_w[k1n1.start] < FAILSAFE_W  # counted at what it may hold
    bench.report("k1-n1", 300.0, cap_w=FAILSAFE_W, ts=WALL0 + 7.0)  # decoded now: restarted
    assert [node for node, _ in bench.cycle(advance_s=1.0).commands] == ["k1-n1"]


def test_offline_status_counts_at_failsafe_power_until_telemetry_returns() -> None:
    # the bands, whose decision (not the failsafe caps) the node back online is commanded to
    bench = make_bench(policy=BANDS)
    bench.report_all(300.0, cap_w=FAILSAFE_W)  # its last caps were its failsafe caps
    bench.cycle()
    bench.core.on_status("k2-n1", status_payload("k2-n1", "offline"))
    bench.report_all(650.0, cap_w=FAILSAFE_W, n_gpus=2)  # fresh telemetry from all but ...
    bench.core.on_status("k2-n1", status_payload("k2-n1", "offline"))  # ... its will follows
    result = bench.cycle(advance_s=1.0)
    c = result.counters
    assert (c.offline_nodes, c.stale_nodes) == (1, 0)
    assert result.decision.node_power_w[node_index(bench, "k2-n1")] == 2 * FAILSAFE_W
    assert "k2-n1" not in dict(result.commands)
    state, live = bench.core.cluster_state(bench.clock.t, CycleCounters())
    gpus = bench.gpus("k2-n1")
    assert not live[2] and not state.controllable[gpus.start : gpus.stop].any()
    # an online status alone does not make it live: its telemetry is what counts
    bench.core.on_status("k2-n1", status_payload("k2-n1", "online"))
    bench.clock.advance(10.0)
    bench.report_all(300.0)
    bench.report("k2-n1", 300.0, cap_w=FAILSAFE_W, n_gpus=2)  # back at its failsafe caps
    result = bench.cycle()
    assert result.counters.offline_nodes == 0
    assert "k2-n1" in dict(result.commands)  # it holds other caps than the decision's


def test_failsafe_node_counts_its_measured_power_and_is_asked_again(bench: Bench) -> None:
    bench.report_all(300.0)
    bench.apply(bench.cycle())
    bench.report("k3-n1", 350.0, cap_w=FAILSAFE_W, mode="failsafe")
    for _ in range(3):
        result = bench.cycle(advance_s=1.0)
        assert result.counters.failsafe_nodes == 1
        assert result.decision.node_power_w[node_index(bench, "k3-n1")] == 700.0
        # it holds its failsafe caps, not what it was last asked: asked again every cycle
        assert [n for n, _ in result.commands] == ["k3-n1"]
        bench.apply(result, ack=False)
    bench.report("k3-n1", 350.0, cap_w=CAP_MAX_W, mode="controlled")
    bench.apply(bench.cycle(advance_s=1.0))
    result = bench.cycle(advance_s=1.0)
    assert result.counters.failsafe_nodes == 0 and result.commands == []


def test_a_failsafe_node_is_taken_at_the_caps_it_reports_whatever_is_in_flight(
    bench: Bench,
) -> None:
    """A node with a command in flight is taken at what it was asked, unless its agent is
    in failsafe (or local mode): it refuses commands, and holds what it reports."""
    bench.report_all(300.0)
    bench.apply(bench.cycle())
    gpus = bench.gpus("k3-n1")
    for _ in range(3):
        bench.clock.advance(1.0)
        now = WALL0 + bench.clock.t
        bench.report("k3-n1", 350.0, cap_w=FAILSAFE_W, mode="failsafe", ts=now)
        result = bench.cycle()
        assert result.state is not None
        assert list(result.state.cap_w[gpus.start : gpus.stop]) == [FAILSAFE_W, FAILSAFE_W]
        bench.apply(result, ack=False)  # asked again: in flight, refused
    assert bench.core.pending


# --- priorities and phases reach the policy ---------------------------------------------


def test_job_priority_and_phase_reach_the_cluster_state(bench: Bench) -> None:
    bench.report_all(300.0)
    bench.phase("big", "startup", ["k1-n1", "k2-n2"], priority="high")
    bench.phase("big", "checkpoint", priority="high")
    bench.phase("small", "startup", ["k3-n1"], priority="low")
    bench.cycle()
    state, _ = bench.core.cluster_state(bench.clock.t, CycleCounters())
    per_node = {
        n: (int(state.priority[bench.gpus(n).start]), int(state.phase[bench.gpus(n).start]))
        for n in NODES
    }
    assert per_node == {
        "k1-n1": (PRIORITY_CODES["high"], PHASE_CODES["checkpoint"]),
        "k1-n2": (PRIORITY_CODES["normal"], PHASE_CODES["compute"]),
        "k2-n1": (PRIORITY_CODES["normal"], PHASE_CODES["compute"]),
        "k2-n2": (PRIORITY_CODES["high"], PHASE_CODES["checkpoint"]),
        "k3-n1": (PRIORITY_CODES["low"], PHASE_CODES["startup"]),
    }


def test_a_job_announced_with_a_host_list_runs_on_its_nodes(bench: Bench) -> None:
    """A large job names its nodes as a Slurm-style host list (PhaseEvent.hostlist); the
    controller expands it (names not in the budgets file left out, as from a list)."""
    event = PhaseEvent(
        v=1, job="big", ts=WALL0, phase="startup", priority="high", hostlist="k1-n[1-2],k9-n1"
    )
    assert bench.core.on_phase("big", encode(event)) is not None
    assert bench.core.jobs["big"].nodes == ["k1-n1", "k1-n2"]
    assert bench.core.job_of("k1-n2") == "big" and bench.core.job_of("k2-n1") is None
    state, _ = bench.core.cluster_state(bench.clock.t, CycleCounters())
    assert state.priority[bench.gpus("k1-n2").start] == PRIORITY_CODES["high"]


def test_payload_naming_another_node_or_job_than_its_topic_is_rejected(bench: Bench) -> None:
    bench.report_all(300.0)
    bench.apply(bench.cycle(), ack=False)
    before = snapshot(bench.core)
    bench.core.on_status("k1-n1", status_payload("k1-n2", "offline"))
    bench.core.on_phase("job-a", phase_payload("job-b", "startup", ["k1-n1"]))
    bench.core.on_telemetry("k1-n1", telemetry_payload("k1-n2", 650.0))
    assert_same(before, snapshot(bench.core))
    assert bench.core.rejected_total == 3


def test_an_epoch_reported_in_telemetry_changes_no_epoch(bench: Bench) -> None:
    """Issue 12, finding 2: one node's login reporting epoch + 10^18 made the controller take
    new epochs. Telemetry's epoch is information only: epochs come from verified heartbeats."""
    epoch = bench.core.epoch
    bench.report_all(300.0)
    bench.core.on_telemetry("k2-n2", telemetry_payload("k2-n2", 300.0, epoch=epoch + 10**18))
    result = bench.cycle(advance_s=1.0)
    assert bench.core.epoch == epoch
    assert all(command.epoch == epoch for _, command in result.commands)


def test_a_local_mode_node_counts_its_power_but_is_never_commanded(bench: Bench) -> None:
    """A local-mode agent refuses commands: sending it one every cycle would be noise."""
    for node in NODES:
        bench.core.on_telemetry(
            node, telemetry_payload(node, 700.0, mode="local" if node == "k1-n1" else "controlled")
        )
    result = bench.core.cycle()
    assert "k1-n1" not in [node for node, _ in result.commands]
    assert {node for node, _ in result.commands} <= set(NODES) - {"k1-n1"}
    gpus = bench.gpus("k1-n1")
    assert np.all(result.decision.cap_w[gpus.start : gpus.stop] == CAP_MAX_W)  # untouched
    assert result.decision.node_power_w[node_index(bench, "k1-n1")] >= 2 * 700.0


def test_a_silent_node_counts_at_its_last_caps_until_the_agents_failsafe_time() -> None:
    """A silent agent may hold caps above its failsafe cap until its own failsafe_after_s."""
    bench = make_bench(stale_after_s=2.0, agent_failsafe_after_s=10.0)
    bench.report_all(300.0, cap_w=CAP_MAX_W)  # every node holds its maximum caps
    bench.cycle()
    bench.clock.advance(3.0)  # k1-n1 silent 3 s: stale, but may still hold 700 W caps
    for node in NODES[1:]:
        bench.report(node, 300.0, cap_w=CAP_MAX_W)
    k1n1 = node_index(bench, "k1-n1")
    result = bench.cycle()
    assert result.counters.stale_nodes == 1
    assert result.decision.node_power_w[k1n1] == 2 * CAP_MAX_W
    bench.clock.advance(8.0)  # 11 s: past the agents' failsafe_after_s
    for node in NODES[1:]:
        bench.report(node, 300.0, cap_w=CAP_MAX_W)
    result = bench.cycle()
    assert result.decision.node_power_w[k1n1] == 2 * FAILSAFE_W


def test_an_offline_node_counts_at_its_last_caps_if_above_failsafe(bench: Bench) -> None:
    """A stopped agent (on_exit keep) leaves its caps where they were."""
    bench.report_all(300.0, cap_w=650.0)
    bench.cycle()
    bench.core.on_status("k2-n1", status_payload("k2-n1", "offline"))
    result = bench.cycle(advance_s=1.0)
    assert result.counters.offline_nodes == 1
    assert result.decision.node_power_w[node_index(bench, "k2-n1")] == 2 * 650.0
