"""Drive an AgentCore on simulated GPUs and a fake clock, without a broker: tests/agent/test_agent_core_*."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from powerd.agent.config import AgentMode, FailsafeConfig
from powerd.agent.core import AgentCore
from powerd.gpu import Gpu
from powerd.gpu.simulated import SimulatedGpu, open_simulated
from powerd.protocol import Command, ControllerState, GpuCommand, Heartbeat, Topics, encode
from tests.support.clock import WALL0, ManualClock
from tests.support.keys import VERIFIER, sign

MONO0 = 5_000.0
NODE = "r01-n03"
FAILSAFE_W = 500.0
AFTER_S = 10.0
TOPICS = Topics("default")
COMMAND_TOPIC = TOPICS.command(NODE)

Node = tuple[AgentCore, list[SimulatedGpu]]


def core_clock() -> ManualClock:
    """The clock the agent-core tests start from: monotonic 5,000 s, wall ``WALL0``."""
    return ManualClock(MONO0, wall=WALL0)


def heartbeat(
    clock: ManualClock, epoch: int = 1, *, age_s: float = 0.0, state: ControllerState = "leader"
) -> bytes:
    """A signed heartbeat of controller ``ctl-a``, sent ``age_s`` seconds ago by the clock's
    wall time."""
    beat = Heartbeat(v=1, epoch=epoch, ts=clock.wall - age_s, controller="ctl-a", state=state)
    return sign(TOPICS.heartbeat, encode(beat))


def command(epoch: int, seq: int, *gpus: GpuCommand, ttl_s: float = 30.0) -> bytes:
    """A command for ``NODE``, signed by the suite's controller key."""
    body = encode(Command(v=1, epoch=epoch, seq=seq, ts=WALL0, ttl_s=ttl_s, gpus=list(gpus)))
    return sign(COMMAND_TOPIC, body)


def cap(index: int, cap_w: float) -> GpuCommand:
    return GpuCommand(index=index, cap_w=cap_w)


def settings_of(gpus: list[SimulatedGpu]) -> list[tuple[float, int | None]]:
    """(power limit, locked SM clock) of each GPU."""
    return [(g.power_limit_w(), g.locked_max_sm_clock_mhz()) for g in gpus]


def make_core(
    clock: ManualClock,
    failsafe: FailsafeConfig | None = None,
    mode: AgentMode = "controlled",
    spec: str = "4xH100",
    **options: float,
) -> Node:
    """A core on simulated GPUs that run on ``clock``, failsafe cap 500 W unless told; not started."""
    gpus = open_simulated(spec, clock=clock.monotonic)
    core = AgentCore(
        NODE,
        gpus,
        failsafe if failsafe is not None else FailsafeConfig(cap_w=FAILSAFE_W),
        AFTER_S,
        verifier=VERIFIER,
        mode=mode,
        monotonic=clock.monotonic,
        wall=clock.time,
        **options,  # type: ignore[arg-type]
    )
    return core, gpus


def started_core(clock: ManualClock, spec: str = "4xH100") -> Node:
    """A started core: in failsafe, as no heartbeat has come yet."""
    core, gpus = make_core(clock, spec=spec)
    core.start()
    return core, gpus


def controlled_core(clock: ManualClock, spec: str = "4xH100", epoch: int = 1) -> Node:
    """A started core following a live leader of ``epoch``."""
    core, gpus = started_core(clock, spec)
    core.on_heartbeat(heartbeat(clock, epoch))
    assert core.mode == "controlled"
    return core, gpus


def mode_after(clock: ManualClock, core: AgentCore, seconds: float) -> str:
    """Let ``seconds`` pass, tick, and say which mode the core is in then."""
    clock.advance(seconds)
    core.tick()
    return core.mode


def heartbeat_each_second(
    clock: ManualClock,
    core: AgentCore,
    seconds: int,
    make: Callable[[ManualClock], bytes] = heartbeat,
) -> None:
    """For ``seconds`` seconds: each second, a heartbeat made by ``make``, then a tick."""
    for _ in range(seconds):
        clock.advance(1.0)
        core.on_heartbeat(make(clock))
        core.tick()


def core_following(clock: ManualClock, gpus: Sequence[Gpu]) -> AgentCore:
    """A started core on these GPUs (failsafe cap 500 W), following a live leader."""
    core = AgentCore(
        NODE,
        gpus,
        FailsafeConfig(cap_w=FAILSAFE_W),
        AFTER_S,
        verifier=VERIFIER,
        monotonic=clock.monotonic,
        wall=clock.time,
    )
    core.start()
    core.on_heartbeat(heartbeat(clock))
    return core
