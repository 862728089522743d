"""The fleet simulator's nodes answer like agents: telemetry, commands, heartbeats, failsafe."""

from __future__ import annotations

import time

import pytest

from powerd.fleet.model import FleetModel, FleetOptions
from powerd.protocol import (
    Ack,
    Command,
    GpuCommand,
    Heartbeat,
    PhaseEvent,
    Telemetry,
    Topics,
    decode,
    encode,
)
from powerd.topology import Topology, parse_budgets
from tests.support.fleet_sites import small_site
from tests.support.keys import STRANGER, VERIFIER, sign

TOPICS = Topics("default")

WALL = 1.8e9


def fleet(topology: Topology, options: FleetOptions) -> FleetModel:
    """A fleet whose nodes trust the suite's controller key, as agents would."""
    return FleetModel(topology, options, verifier=VERIFIER)


@pytest.fixture
def model() -> FleetModel:
    m = fleet(parse_budgets(small_site(racks=2)), FleetOptions(noise=0.0))
    m.new_round()
    return m


def beat(epoch: int = 1, ts: float = WALL, state: str = "leader") -> bytes:
    body = encode(Heartbeat(v=1, epoch=epoch, ts=ts, controller="c", state=state))  # type: ignore[arg-type]
    return sign(TOPICS.heartbeat, body)


def command(epoch: int, seq: int, caps: list[float], lock: float | None = None) -> bytes:
    """The command unsigned: ``ack`` signs it for the node it is sent to."""
    gpus = [GpuCommand(index=i, cap_w=c, max_sm_clock_mhz=lock) for i, c in enumerate(caps)]
    return encode(Command(v=1, epoch=epoch, seq=seq, ts=WALL, ttl_s=30.0, gpus=gpus))


def telemetry(model: FleetModel, node: int = 0) -> Telemetry:
    return decode(Telemetry, model.telemetry(node, WALL, 1.0), model.names[node])


def ack(model: FleetModel, payload: bytes, node: int = 0, now: float = 1.0) -> Ack:
    name = model.names[node]
    raw = model.on_command(name, sign(TOPICS.command(name), payload), now, WALL)
    assert raw is not None
    return decode(Ack, raw, model.names[node])


def test_telemetry_is_valid_protocol_and_counts_up(model: FleetModel) -> None:
    first, second = telemetry(model), telemetry(model)
    assert (first.seq, second.seq) == (1, 2)
    assert first.mode == "failsafe" and first.epoch is None  # fresh agents: no leader yet
    assert len(first.gpus) == 4
    gpu = first.gpus[0]
    assert gpu.cap_w == 960.0  # the model's failsafe cap
    assert gpu.power_w == pytest.approx(0.6 * 1200.0)  # base load under the cap
    assert second.gpus[0].energy_j == pytest.approx(2 * gpu.power_w)


def test_commands_are_refused_in_failsafe_and_applied_under_a_live_leader(
    model: FleetModel,
) -> None:
    refused = ack(model, command(1, 1, [1100.0] * 4))
    assert refused.result == "rejected" and "failsafe" in refused.errors[0].message
    assert model.on_heartbeat(beat(1), now=1.0, wall=WALL)
    applied = ack(model, command(1, 2, [1100.0, 50.0, 5000.0, 700.0], lock=1500.0))
    assert applied.result == "applied"
    assert [g.cap_w for g in applied.gpus] == [1100.0, 200.0, 1200.0, 700.0]  # clamped
    assert [g.clamped for g in applied.gpus] == [False, True, True, False]
    assert {g.max_sm_clock_mhz for g in applied.gpus} == {1500}
    sample = telemetry(model)
    assert sample.mode == "controlled" and sample.epoch == 1
    assert [g.cap_w for g in sample.gpus] == [1100.0, 200.0, 1200.0, 700.0]
    assert sample.gpus[1].power_w == 200.0  # held by its cap
    assert {g.max_sm_clock_mhz for g in sample.gpus} == {1500}
    # unlocked again by an explicit null
    ack(model, command(1, 3, [1100.0] * 4, lock=None))
    assert {g.max_sm_clock_mhz for g in telemetry(model).gpus} == {None}


def test_older_commands_are_stale(model: FleetModel) -> None:
    model.on_heartbeat(beat(5), now=1.0, wall=WALL)
    assert ack(model, command(5, 10, [1000.0] * 4)).result == "applied"
    assert ack(model, command(5, 10, [300.0] * 4)).result == "stale"  # the same seq again
    assert ack(model, command(4, 99, [300.0] * 4)).result == "stale"  # an older epoch
    assert [g.cap_w for g in telemetry(model).gpus] == [1000.0] * 4


def test_no_heartbeat_puts_every_node_in_failsafe(model: FleetModel) -> None:
    model.on_heartbeat(beat(1), now=1.0, wall=WALL)
    ack(model, command(1, 1, [1200.0] * 4, lock=1000.0))
    assert not model.tick(now=10.5)  # failsafe_after_s is 10 s
    assert model.tick(now=11.5)
    sample = telemetry(model)
    assert sample.mode == "failsafe"
    assert [g.cap_w for g in sample.gpus] == [960.0] * 4
    assert {g.max_sm_clock_mhz for g in sample.gpus} == {None}
    assert model.on_heartbeat(beat(2), now=12.0, wall=WALL)  # a new leader: controlled
    assert telemetry(model).mode == "controlled"


def test_retained_future_or_standby_heartbeats_do_not_make_a_leader(model: FleetModel) -> None:
    """As agents (powerd.agent.following): a retained heartbeat is no liveness, however
    fresh its ts; nor one from more than max_clock_skew_s ahead; nor a standby's."""
    assert not model.on_heartbeat(beat(1, ts=WALL), now=1.0, wall=WALL, live=False)
    assert not model.on_heartbeat(beat(1, ts=WALL + 60), now=1.0, wall=WALL)
    assert not model.on_heartbeat(beat(1, state="standby"), now=1.0, wall=WALL)
    assert not model.on_heartbeat(b"{nope", now=1.0, wall=WALL)
    assert model.failsafe and model.counters.rejected_payloads == 1


def test_a_running_site_starts_at_its_maximum_caps_under_the_old_leader() -> None:
    m = fleet(parse_budgets(small_site(racks=1)), FleetOptions(start="running"))
    m.new_round()
    m.start(now=100.0)
    sample = decode(Telemetry, m.telemetry(0, WALL, 1.0), m.names[0])
    assert sample.mode == "controlled" and [g.cap_w for g in sample.gpus] == [1200.0] * 4
    assert not m.tick(now=109.0) and m.tick(now=111.0)  # the old leader's heartbeat lapses


def test_a_pushed_rack_is_seen_over_and_brought_back(model: FleetModel) -> None:
    model.on_heartbeat(beat(1), now=0.0, wall=WALL)
    rack = int(model.racks[0])
    nodes = [n for n in range(len(model.names)) if int(model.gpu_rack[model._first_gpu[n]]) == rack]
    for n in nodes:  # uncapped, as a controller hands back watts below the thresholds
        ack(model, command(1, 1, [1200.0] * 4), node=n)
    push = model.push(rack, now=1.0)
    model._clock_now = 1.5
    for n in nodes:
        model.telemetry(n, WALL, 1.0)
    assert push.visible_at == 1.5  # reported power over the rack's capping threshold
    threshold = float(model.tree.cap_threshold_w[rack])
    assert model.rack_real_w(rack) > threshold
    for n in nodes:  # the controller cuts every GPU of the rack
        ack(model, command(1, 2, [700.0] * 4), node=n, now=2.0)
    assert model.rack_real_w(rack) <= threshold and push.back_at == 2.0
    model.release(rack)
    assert model.pushed() == []


def test_silent_and_offline_nodes_do_not_report() -> None:
    m = fleet(
        parse_budgets(small_site(racks=2)),
        FleetOptions(silent_fraction=0.25, offline_fraction=0.25),
    )
    reporting = set(m.reporting().tolist())
    assert len(reporting) == len(m.names) // 2
    assert not reporting & set(m.silent.nonzero()[0].tolist())
    assert not reporting & set(m.offline.nonzero()[0].tolist())
    status = m.offline_status(int(m.offline.nonzero()[0][0]), time.time())
    assert b'"state":"offline"' in status


def test_jobs_announce_startup_then_alternate_compute_and_communication() -> None:
    from powerd.fleet.jobs import COMM_LOAD, STARTUP_S
    from powerd.protocol import PhaseEvent

    m = fleet(
        parse_budgets(small_site(racks=4)),
        FleetOptions(jobs=2, compute_s=10.0, communication_s=2.0, noise=0.0),
    )
    m.new_round()
    assert [len(j.nodes) for j in m.jobs] == [36, 36] and m.jobs[0].priority == "high"

    def events(now: float) -> dict[str, PhaseEvent]:
        return {j: decode(PhaseEvent, p, j) for j, p in m.phase_events(now, WALL)}

    first = events(0.0)
    assert {e.phase for e in first.values()} == {"startup"}
    assert sorted(first["fleet-job000"].nodes or []) == sorted(m.names[n] for n in m.jobs[0].nodes)
    assert events(1.0) == {}
    assert {e.phase for e in events(STARTUP_S).values()} == {"compute"}
    node = m.jobs[1].nodes[0]
    computing = telemetry(m, node).gpus[0].power_w
    later = events(STARTUP_S + 10.0)
    assert {e.phase for e in later.values()} == {"communication"}
    assert all(e.nodes is None for e in later.values())  # only startup names the nodes
    assert telemetry(m, node).gpus[0].power_w == pytest.approx(COMM_LOAD * computing)
    assert {e.phase for e in events(STARTUP_S + 12.0).values()} == {"compute"}
    assert m.counters.phase_events == 8


def test_a_job_too_big_for_a_node_list_is_announced_as_a_host_list() -> None:
    from powerd.fleet.sites import cut_site

    m = fleet(parse_budgets(cut_site(rows=4)), FleetOptions(jobs=1))  # 5,184 nodes
    ((job, payload),) = m.phase_events(0.0, WALL)
    assert job == m.jobs[0].name
    event = decode(PhaseEvent, payload)
    assert event.phase == "startup" and event.nodes is None and event.hostlist is not None
    assert event.node_names() == [m.names[n] for n in m.jobs[0].nodes]


def test_unsigned_forged_or_misdirected_control_messages_move_nothing(model: FleetModel) -> None:
    """As an agent: only what the trusted key signed for this node's topic counts."""
    assert not model.on_heartbeat(
        encode(Heartbeat(v=1, epoch=9, ts=WALL, controller="x", state="leader")), now=1.0, wall=WALL
    )
    assert not model.on_heartbeat(
        STRANGER.sign(
            TOPICS.heartbeat,
            encode(Heartbeat(v=1, epoch=9, ts=WALL, controller="x", state="leader")),
        ),
        now=1.0,
        wall=WALL,
    )
    assert model.failsafe and model.newest_epoch == -1
    assert model.on_heartbeat(beat(1), now=1.0, wall=WALL)
    caps_before = list(model.cap_w)
    body = command(1, 5, [1100.0] * 4)
    name = model.names[0]
    for payload in (
        body,  # unsigned
        STRANGER.sign(TOPICS.command(name), body),  # signed by a key nobody trusts
        sign(TOPICS.command(model.names[1]), body),  # signed for another node
    ):
        raw = model.on_command(name, payload, 1.0, WALL)
        assert raw is not None and decode(Ack, raw, name).result == "rejected"
    assert model.cap_w == caps_before
    assert model.counters.rejected_payloads == 5


def test_sampled_signature_checks_still_refuse_unsigned_and_unknown_keys() -> None:
    """``verify_every``: one command in N has its signature checked, the others only their
    key id; unsigned commands and strangers' keys are refused whichever they are."""
    model = fleet(parse_budgets(small_site(racks=2)), FleetOptions(noise=0.0, verify_every=4))
    model.new_round()
    assert model.on_heartbeat(beat(1), now=1.0, wall=WALL)
    name = model.names[0]
    for seq in range(1, 9):  # every position in the sampling cycle, twice
        body = command(1, seq, [1000.0] * 4)
        for payload in (body, STRANGER.sign(TOPICS.command(name), body)):
            raw = model.on_command(name, payload, 1.0, WALL)
            assert raw is not None and decode(Ack, raw, name).result == "rejected"
        assert ack(model, body).result == "applied"
    # 24 commands, one in four checked in full (the 4th, 8th ... 24th): the trusted key's
    # are every third, so its 12th and 24th were checked, its other six on the key id
    assert model.counters.signatures_unchecked == 6


def test_a_locked_gpu_draws_its_clock_tables_share():
    """The fleet's GPUs answer a clock lock as the simulated GPU does: the model's clock
    table's power at the lock where there is one, the parametric share where there is not."""
    from powerd.fleet.model import locked_power_share
    from powerd.gpu.clock_table import shipped_clock_table
    from powerd.gpu.workload_model import lock_response

    table = shipped_clock_table("GB200")
    assert table is not None
    assert locked_power_share("GB200", 1887, table) == lock_response(table, 1887)[1] < 1.0
    assert locked_power_share("GB200", 2062, table) == 1.0
    assert shipped_clock_table("A40") is None
    assert 0.3 < locked_power_share("A40", 1000, None) < 1.0


def test_a_locked_gpu_answers_from_the_table_its_budgets_file_chose_the_clock_from(tmp_path):
    from powerd.gpu.clock_table import shipped_table
    from powerd.gpu.workload_model import lock_response
    from powerd.topology import load_budgets
    from tests.topology.test_topology_clock_table import bloom_site

    top = load_budgets(bloom_site(tmp_path))
    mine, shipped = top.clock_tables["H100"], shipped_table("h100-gpt3-175b")
    assert lock_response(mine, 1500)[1] != lock_response(shipped, 1500)[1]
    m = fleet(top, FleetOptions(noise=0.0))
    m.new_round()
    assert m.on_heartbeat(beat(1), now=1.0, wall=WALL)
    assert ack(m, command(1, 1, [700.0] * 4, lock=1500.0)).result == "applied"
    want_w = 0.6 * 700.0  # the base load, unlocked
    expected = want_w * lock_response(mine, 1500)[1]
    assert [g.power_w for g in telemetry(m).gpus] == pytest.approx([expected] * 4, abs=0.05)


def test_under_power_smoothing_the_draw_ramps_holds_its_floor_and_the_cap_still_bites() -> None:
    """As the simulated GB200 moves it (powerd.gpu.simulated): a communication dip is held for
    the hysteresis, then falls at the ramp-down rate; the compute that follows comes back at
    the ramp-up rate; never under the floor, and a lower cap bites at once."""
    from powerd.fleet.jobs import COMM_LOAD
    from powerd.protocol import GpuSmoothing

    m = fleet(
        parse_budgets(small_site(racks=1)),
        FleetOptions(jobs=1, compute_s=10.0, communication_s=5.0, noise=0.0, base_load=0.8),
    )
    m.new_round()
    m.on_heartbeat(beat(1), now=0.0, wall=WALL)
    profile = GpuSmoothing(
        preset=1,
        enabled=True,
        floor_percent=50.0,
        ramp_up_w_per_s=100.0,
        ramp_down_w_per_s=50.0,
        ramp_down_hysteresis_ms=2000.0,
    )
    gpus = [GpuCommand(index=i, cap_w=1200.0, smoothing=profile) for i in range(4)]
    body = encode(Command(v=1, epoch=1, seq=1, ts=WALL, ttl_s=30.0, gpus=gpus))
    applied = ack(m, body)
    assert applied.result == "applied" and applied.gpus[0].smoothing == profile
    node = m.jobs[0].nodes[0]
    assert node == 0

    def draw() -> float:
        return telemetry(m, node).gpus[0].power_w  # one second passes each sample

    m.phase_events(0.0, WALL)  # startup, then compute
    m.phase_events(2.0, WALL)
    computing = 0.8 * 1200.0
    sample = telemetry(m, node)  # the first since the change: it carries the new state
    assert sample.gpus[0].power_w == computing
    assert sample.gpus[0].smoothing is not None and sample.gpus[0].smoothing.enabled
    assert telemetry(m, node).gpus[0].smoothing is None  # unchanged: not again before its turn
    m.phase_events(12.0, WALL)  # communication: the demand falls to COMM_LOAD at once
    assert COMM_LOAD * computing < 0.5 * 1200.0  # so the floor (600 W) holds it
    assert [draw(), draw()] == [computing, computing]  # the 2 s hysteresis
    assert [draw(), draw()] == [computing - 50.0, computing - 100.0]  # then 50 W/s
    m.phase_events(17.0, WALL)  # compute again: back up at 100 W/s
    assert [draw(), draw()] == [computing - 100.0 + 100.0, computing]
    body = encode(
        Command(v=1, epoch=1, seq=2, ts=WALL, ttl_s=30.0, gpus=[GpuCommand(index=0, cap_w=700.0)])
    )
    ack(m, body)
    assert draw() == 700.0  # the cap is a hard limit: no ramp down to it
    m.phase_events(27.0, WALL)  # communication under the 700 W cap: held at 350 W at least
    for _ in range(20):
        assert draw() >= 0.5 * 700.0
    assert draw() == 0.5 * 700.0


def test_applied_commands_are_counted_by_what_they_did_to_the_caps(model: FleetModel) -> None:
    """What the simulated agents were sent, as the scale benchmark breaks it down."""
    assert model.on_heartbeat(beat(1), now=1.0, wall=WALL)
    start = list(model.cap_w[:4])
    assert ack(model, command(1, 1, [c - 100.0 for c in start])).result == "applied"
    assert ack(model, command(1, 2, [c - 100.0 for c in start])).result == "applied"
    assert ack(model, command(1, 3, [c - 50.0 for c in start])).result == "applied"
    assert model.counters.applied_by_kind == {"cut": 1, "no cap moved": 1, "raise": 1}
