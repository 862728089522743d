"""Drive an AgentCore on simulated GPUs and a fake clock, without a broker: the test_core_* suite."""

from __future__ import annotations

from collections.abc import Callable

from powerd.agent.config import AgentMode, FailsafeConfig
from powerd.agent.core import AgentCore
from powerd.gpu.simulated import SimulatedGpu, open_simulated
from powerd.protocol import Command, ControllerState, GpuCommand, Heartbeat, encode

WALL0 = 1_795_320_000.0
NODE = "r01-n03"
FAILSAFE_W = 500.0
AFTER_S = 10.0

Node = tuple[AgentCore, list[SimulatedGpu]]


class FakeClock:
    """Monotonic and wall time that move together, and only when told to."""

    def __init__(self) -> None:
        self.mono = 5_000.0
        self.wall = WALL0

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def heartbeat(
    clock: FakeClock, epoch: int = 1, *, age_s: float = 0.0, state: ControllerState = "leader"
) -> bytes:
    """A heartbeat of controller ``ctl-a``, sent ``age_s`` seconds ago by the clock's wall time."""
    return encode(
        Heartbeat(v=1, epoch=epoch, ts=clock.wall - age_s, controller="ctl-a", state=state)
    )


def command(epoch: int, seq: int, *gpus: GpuCommand, ttl_s: float = 30.0) -> bytes:
    return encode(Command(v=1, epoch=epoch, seq=seq, ts=WALL0, ttl_s=ttl_s, gpus=list(gpus)))


def cap(index: int, cap_w: float) -> GpuCommand:
    return GpuCommand(index=index, cap_w=cap_w)


def settings_of(gpus: list[SimulatedGpu]) -> list[tuple[float, int | None]]:
    """(power limit, locked SM clock) of each GPU."""
    return [(g.power_limit_w(), g.locked_max_sm_clock_mhz()) for g in gpus]


def make_core(
    clock: FakeClock,
    failsafe: FailsafeConfig | None = None,
    mode: AgentMode = "controlled",
    spec: str = "4xH100",
) -> Node:
    """A core on simulated GPUs that run on ``clock``, failsafe cap 500 W unless told; not started."""
    gpus = open_simulated(spec, clock=clock.monotonic)
    core = AgentCore(
        NODE,
        gpus,
        failsafe if failsafe is not None else FailsafeConfig(cap_w=FAILSAFE_W),
        AFTER_S,
        mode=mode,
        monotonic=clock.monotonic,
        wall=clock.time,
    )
    return core, gpus


def started_core(clock: FakeClock, spec: str = "4xH100") -> Node:
    """A started core: in failsafe, as no heartbeat has come yet."""
    core, gpus = make_core(clock, spec=spec)
    core.start()
    return core, gpus


def controlled_core(clock: FakeClock, spec: str = "4xH100", epoch: int = 1) -> Node:
    """A started core following a live leader of ``epoch``."""
    core, gpus = started_core(clock, spec)
    core.on_heartbeat(heartbeat(clock, epoch))
    assert core.mode == "controlled"
    return core, gpus


def mode_after(clock: FakeClock, core: AgentCore, seconds: float) -> str:
    """Let ``seconds`` pass, tick, and say which mode the core is in then."""
    clock.advance(seconds)
    core.tick()
    return core.mode


def heartbeat_each_second(
    clock: FakeClock,
    core: AgentCore,
    seconds: int,
    make: Callable[[FakeClock], bytes] = heartbeat,
) -> None:
    """For ``seconds`` seconds: each second, a heartbeat made by ``make``, then a tick."""
    for _ in range(seconds):
        clock.advance(1.0)
        core.on_heartbeat(make(clock))
        core.tick()
