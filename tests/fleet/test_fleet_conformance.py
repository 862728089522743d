"""The fleet simulator answers as a real agent does: the same heartbeats, commands and
silences, fed to ``powerd.agent.core.AgentCore`` on simulated GB200s and to one node of a
``FleetModel``, give the same acks and the same telemetry.

``powerd/fleet/model.py`` re-implements the agent's answers in bulk (the 150 MW site's
82,944 GPUs at 1 Hz would not fit otherwise), so a change to how the agent behaves must
be copied there; this is the test that says when it was not. What it compares is what
the controller reads: an ack's result, order and each GPU's cap, clock lock, ``clamped``,
smoothing profile and clock policy, whether it carries errors; telemetry's mode, epoch and
each GPU's cap, lock and smoothing state, also after a job's phase announcements. Not compared: the draw (the fleet's is a share of a
demand, the simulated GPU's follows workload curves) and error texts.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import UNSET, UnsetType

from powerd.agent.config import FailsafeConfig
from powerd.agent.core import AgentCore
from powerd.fleet.model import FleetModel, FleetOptions
from powerd.gpu.simulated import open_simulated
from powerd.protocol import (
    SMOOTHING_MAX_HYSTERESIS_MS,
    SMOOTHING_MAX_RAMP_W_PER_S,
    SMOOTHING_STATE_EVERY_SAMPLES,
    Ack,
    Command,
    CommClock,
    ControllerState,
    GpuCommand,
    GpuSmoothing,
    Heartbeat,
    PhaseEvent,
    Telemetry,
    Topics,
    decode,
    encode,
)
from powerd.topology import parse_budgets
from powerd.vocabulary import Phase
from tests.support.clock import WALL0, ManualClock
from tests.support.fleet_sites import small_site
from tests.support.keys import STRANGER, VERIFIER, sign

TOPICS = Topics("default")
AFTER_S = 10.0  # failsafe_after_s of both
TTL_S = 30.0  # longer than AFTER_S: the agent's command TTL (not simulated) never decides
CAP_TOLERANCE_W = 0.0015  # the simulated GPU reads its limit back in whole milliwatts
SAMPLE_TOLERANCE_W = 0.051  # and the fleet's telemetry writes watts to one decimal


@dataclass(frozen=True)
class Beat:
    epoch: int
    leader: bool
    age_s: float


@dataclass(frozen=True)
class Order:
    epoch: int
    seq: int
    gpus: tuple[GpuCommand, ...]
    trusted: bool  # signed with the controller's key, or a stranger's


@dataclass(frozen=True)
class Wait:
    seconds: float


@dataclass(frozen=True)
class Sample:
    pass


@dataclass(frozen=True)
class Announce:
    """A job's phase announcement on its topic (unsigned: it moves only what a policy let)."""

    job: str
    owner: str | None
    phase: Phase


Step = Beat | Order | Wait | Sample | Announce
JOBS = ("j1", "j2")
OWNERS = (None, "alice")

smoothings = st.builds(
    GpuSmoothing,
    preset=st.integers(0, 4),  # the protocol's 5, as many as the simulated GB200 has
    enabled=st.booleans(),
    floor_percent=st.floats(0.0, 100.0),  # it takes 0-90 %: above is clamped
    ramp_up_w_per_s=st.floats(0.0, SMOOTHING_MAX_RAMP_W_PER_S),
    ramp_down_w_per_s=st.floats(0.0, SMOOTHING_MAX_RAMP_W_PER_S),
    ramp_down_hysteresis_ms=st.floats(0.0, SMOOTHING_MAX_HYSTERESIS_MS),
)
clocks: st.SearchStrategy[float | UnsetType | None] = st.one_of(
    st.just(UNSET), st.none(), st.integers(1, 3000).map(float), st.floats(0.5, 3000.0)
)
caps: st.SearchStrategy[float | UnsetType] = st.one_of(
    st.just(UNSET), st.floats(0.001, 2000.0), st.sampled_from([200.0, 960.0, 1200.0])
)
comm_clocks = st.builds(
    CommClock,
    job=st.sampled_from(JOBS),
    max_sm_clock_mhz=st.one_of(st.integers(1, 3000).map(float), st.floats(0.5, 3000.0)),
    owner=st.sampled_from(OWNERS),
)
gpu_commands = st.builds(
    GpuCommand,
    index=st.integers(0, 4),  # 4: a GPU the node does not have
    cap_w=caps,
    max_sm_clock_mhz=clocks,
    smoothing=st.one_of(st.just(UNSET), smoothings),
    comm_clock=st.one_of(st.just(UNSET), comm_clocks),
)
steps: st.SearchStrategy[Step] = st.one_of(
    st.builds(
        Beat, st.integers(1, 3), st.booleans() | st.just(True), st.sampled_from([0, 0, 4, 12])
    ),
    st.builds(
        Order,
        st.integers(1, 3),
        st.integers(1, 8),
        st.lists(gpu_commands, max_size=5, unique_by=lambda g: g.index).map(tuple),
        st.booleans() | st.just(True),
    ),
    st.builds(Wait, st.sampled_from([0.5, 3.0, 6.0, 11.0])),
    st.just(Sample()),
    st.builds(
        Announce,
        st.sampled_from(JOBS),
        st.sampled_from(OWNERS),
        st.sampled_from(["communication", "communication", "compute", "checkpoint"]),
    ),
)


class Pair:
    """One agent and one fleet node, on one clock, trusting the same controller key."""

    def __init__(self) -> None:
        self.clock = ManualClock(5_000.0, wall=WALL0)
        topology = parse_budgets(small_site(racks=1))
        self.fleet = FleetModel(
            topology,
            FleetOptions(nodes=1, noise=0.0, failsafe_after_s=AFTER_S),
            verifier=VERIFIER,
        )
        self.node = self.fleet.names[0]
        gpus = open_simulated(f"{self.fleet.gpu_count[0]}xGB200", clock=self.clock.monotonic)
        failsafe_w = float(self.fleet.failsafe_cap_w[0])
        self.agent = AgentCore(
            self.node,
            gpus,
            FailsafeConfig(cap_w=failsafe_w),
            AFTER_S,
            verifier=VERIFIER,
            monotonic=self.clock.monotonic,
            wall=self.clock.time,
        )
        self.agent.start()
        self.fleet.start(self.clock.monotonic())
        self.fleet.new_round()

    def beat(self, step: Beat) -> None:
        state: ControllerState = "leader" if step.leader else "standby"
        body = Heartbeat(
            v=1, epoch=step.epoch, ts=self.clock.wall - step.age_s, controller="c", state=state
        )
        payload = sign(TOPICS.heartbeat, encode(body))
        self.agent.on_heartbeat(payload)
        self.fleet.on_heartbeat(payload, self.clock.monotonic(), self.clock.time())

    def order(self, step: Order) -> tuple[Ack, Ack]:
        body = encode(
            Command(
                v=1, epoch=step.epoch, seq=step.seq, ts=WALL0, ttl_s=TTL_S, gpus=list(step.gpus)
            )
        )
        topic = TOPICS.command(self.node)
        payload = sign(topic, body) if step.trusted else STRANGER.sign(topic, body)
        agent_ack = self.agent.on_command(payload)
        raw = self.fleet.on_command(self.node, payload, self.clock.monotonic(), self.clock.time())
        assert raw is not None
        return agent_ack, decode(Ack, raw, self.node)

    def wait(self, step: Wait) -> None:
        self.clock.advance(step.seconds)
        self.agent.tick()
        self.fleet.tick(self.clock.monotonic())

    def announce(self, step: Announce) -> None:
        event = PhaseEvent(v=1, job=step.job, ts=self.clock.wall, phase=step.phase)
        self.agent.on_phase(TOPICS.phase(step.job, step.owner), encode(event))
        self.fleet.on_phase(step.job, step.owner, step.phase, self.clock.monotonic())

    def sample(self) -> tuple[Telemetry, Telemetry]:
        agent = self.agent.telemetry()
        fleet = decode(Telemetry, self.fleet.telemetry(0, self.clock.time(), 1.0), self.node)
        return agent, fleet


def same_ack(agent: Ack, fleet: Ack) -> None:
    assert (fleet.result, fleet.epoch, fleet.seq) == (agent.result, agent.epoch, agent.seq)
    assert bool(fleet.errors) == bool(agent.errors), (agent.errors, fleet.errors)
    assert [g.index for g in fleet.gpus] == [g.index for g in agent.gpus]
    for a, f in zip(agent.gpus, fleet.gpus, strict=True):
        assert a.cap_w is not None and f.cap_w is not None
        assert f.cap_w == pytest.approx(a.cap_w, abs=CAP_TOLERANCE_W), (a, f)
        assert f.max_sm_clock_mhz == a.max_sm_clock_mhz, (a, f)
        assert f.clamped == a.clamped, (a, f)
        assert f.smoothing == a.smoothing, (a, f)
        assert f.comm_clock == a.comm_clock, (a, f)


def same_telemetry(agent: Telemetry, fleet: Telemetry) -> None:
    assert (fleet.mode, fleet.epoch) == (agent.mode, agent.epoch)
    assert [g.index for g in fleet.gpus] == [g.index for g in agent.gpus]
    for a, f in zip(agent.gpus, fleet.gpus, strict=True):
        assert f.cap_w == pytest.approx(a.cap_w, abs=SAMPLE_TOLERANCE_W), (a, f)
        assert f.max_sm_clock_mhz == a.max_sm_clock_mhz, (a, f)
        assert f.smoothing == a.smoothing, (a, f)


def run(pair: Pair, script: list[Step]) -> None:
    for step in script:
        if isinstance(step, Beat):
            pair.beat(step)
        elif isinstance(step, Order):
            same_ack(*pair.order(step))
        elif isinstance(step, Wait):
            pair.wait(step)
        elif isinstance(step, Announce):
            pair.announce(step)
        else:
            same_telemetry(*pair.sample())
    same_telemetry(*pair.sample())


@settings(max_examples=150, deadline=None)
@given(st.lists(steps, max_size=25))
def test_the_fleet_answers_every_sequence_as_an_agent_does(script: list[Step]) -> None:
    run(Pair(), script)


def test_a_command_with_everything_in_it_is_answered_alike() -> None:
    """Each kind of answer once, by hand: the property test above may find them late."""
    profile = GpuSmoothing(
        preset=2,
        enabled=True,
        floor_percent=95.0,  # clamped to 90
        ramp_up_w_per_s=10.85,
        ramp_down_w_per_s=10.85,
        ramp_down_hysteresis_ms=1000.0,
    )
    pair = Pair()
    before, _ = pair.order(Order(1, 1, (GpuCommand(index=0, cap_w=900.0),), True))
    assert before.result == "rejected"  # no live controller yet
    pair.beat(Beat(epoch=1, leader=True, age_s=0.0))
    entries = (
        GpuCommand(index=0, cap_w=5000.0, max_sm_clock_mhz=1400.0, smoothing=profile),
        GpuCommand(index=1, cap_w=700.0, smoothing=msgspec.structs.replace(profile, preset=4)),
        GpuCommand(index=2, max_sm_clock_mhz=None),
        GpuCommand(index=7, cap_w=700.0),
    )
    agent, fleet = pair.order(Order(1, 2, entries, True))
    same_ack(agent, fleet)
    assert agent.result == "partial"  # the unknown GPU 7
    assert agent.gpus[0].clamped and agent.gpus[0].smoothing is not None
    assert agent.gpus[0].smoothing.floor_percent == 90.0
    same_telemetry(*pair.sample())
    stale, fleet_stale = pair.order(Order(1, 2, entries, True))
    same_ack(stale, fleet_stale)
    assert stale.result == "stale"
    forged, fleet_forged = pair.order(Order(1, 3, entries, False))
    same_ack(forged, fleet_forged)
    assert forged.result == "rejected"
    pair.wait(Wait(AFTER_S + 1.0))  # the controller fell silent: failsafe caps, clocks free
    carried = []  # a state goes out when it changes and every tenth sample: within ten
    for _ in range(SMOOTHING_STATE_EVERY_SAMPLES):
        agent_sample, fleet_sample = pair.sample()
        same_telemetry(agent_sample, fleet_sample)
        assert agent_sample.mode == "failsafe"
        carried += [g.smoothing for g in agent_sample.gpus[:1] if g.smoothing is not None]
    assert len(carried) == 1 and carried[0].enabled  # failsafe leaves smoothing as it is


def test_a_newer_epoch_from_a_heartbeat_too_old_to_be_live_still_fences_older_commands() -> None:
    """A signed heartbeat proves its epoch's leader exists, however old it is: both sides take
    the epoch, and then refuse the deposed leader's commands as stale."""
    pair = Pair()
    pair.beat(Beat(epoch=1, leader=True, age_s=0.0))
    pair.beat(Beat(epoch=2, leader=True, age_s=AFTER_S + 2.0))  # not live, but epoch 2 exists
    agent, fleet = pair.order(Order(1, 5, (GpuCommand(index=0, cap_w=800.0),), True))
    same_ack(agent, fleet)
    assert agent.result == "stale"


def test_a_clock_policy_is_held_and_followed_alike() -> None:
    """A granted policy, by hand: the job's communication locks the clock, compute frees it,
    a command without the policy ends it (and the lock an announcement made), and an
    announcement of another job or owner moves nothing."""
    pair = Pair()
    pair.beat(Beat(epoch=1, leader=True, age_s=0.0))
    policy = CommClock(job="j1", max_sm_clock_mhz=5.0)  # below the device's range
    grant = tuple(GpuCommand(index=i, cap_w=900.0, comm_clock=policy) for i in range(2))
    agent, fleet = pair.order(Order(1, 1, grant, True))
    same_ack(agent, fleet)
    held = agent.gpus[0].comm_clock
    assert held is not None and agent.gpus[0].clamped
    clock_mhz = round(held.max_sm_clock_mhz)
    assert clock_mhz == pair.fleet.clock_min_mhz[0]  # clamped up into the range

    def locks() -> list[int | None]:
        agent_sample, fleet_sample = pair.sample()
        same_telemetry(agent_sample, fleet_sample)
        return [g.max_sm_clock_mhz for g in fleet_sample.gpus]

    pair.announce(Announce("j1", "alice", "communication"))  # another owner's j1
    pair.announce(Announce("j2", None, "communication"))
    assert set(locks()) == {None}
    pair.announce(Announce("j1", None, "communication"))
    assert locks()[:3] == [clock_mhz, clock_mhz, None]
    pair.announce(Announce("j1", None, "compute"))
    assert set(locks()) == {None}
    pair.announce(Announce("j1", None, "communication"))
    agent, fleet = pair.order(Order(1, 2, (GpuCommand(index=0, cap_w=900.0),), True))
    same_ack(agent, fleet)
    assert agent.gpus[0].comm_clock is None
    assert set(locks()) == {None}  # the policy ended with the command that left it out
    pair.announce(Announce("j1", None, "communication"))
    assert set(locks()) == {None}
