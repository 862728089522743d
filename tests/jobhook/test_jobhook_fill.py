"""FillFollower against a real Mosquitto: the agent's fill requests become the power each GPU
is held at, from the job's own knowledge of when it waits, works and stops."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from powerd.jobhook import FillFollower
from powerd.protocol import FillRequest, GpuFill, Topics, encode
from tests.support.brokers import MqttProbe
from tests.support.clock import ManualClock

NODE = "r01-n03"
TOPIC = Topics("default").fill(NODE)


class Calls:
    """What the callback was handed, and an event per call."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[int, float]]] = []
        self.cond = threading.Condition()

    def __call__(self, node: str, targets: dict[int, float]) -> None:
        with self.cond:
            self.seen.append((node, dict(targets)))
            self.cond.notify_all()

    def received(self, fill: FillFollower, count: int, timeout_s: float = 10.0) -> None:
        """Until ``fill`` has taken ``count`` requests in (each one calls back after)."""
        with self.cond:
            assert self.cond.wait_for(lambda: fill.received >= count, timeout_s), fill.received

    def wait(self, count: int, timeout_s: float = 10.0) -> dict[int, float]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.seen) >= count, timeout_s), self.seen
            return self.seen[-1][1]


def request(seq: int, power_w: float, floor_w: float = 100.0) -> bytes:
    gpus = [
        GpuFill(
            index=i,
            power_w=power_w + i,
            cap_w=700.0,
            floor_w=floor_w,
            ramp_up_w_per_s=80.0,
            ramp_down_w_per_s=50.0,
            hysteresis_s=1.0,
        )
        for i in range(2)
    ]
    return encode(FillRequest(v=1, node=NODE, ts=0.0, seq=seq, gpus=gpus))


@pytest.fixture
def follower(mosquitto) -> Iterator[tuple[FillFollower, Calls, ManualClock]]:
    clock = ManualClock(100.0)
    calls = Calls()
    made = FillFollower(
        mosquitto.url, [NODE], calls, clock=clock.monotonic, refresh_s=0.05, stale_after_s=1e6
    )
    made.start()
    assert made.wait_subscribed(10.0)
    yield made, calls, clock
    made.close()


async def test_working_holds_the_floor_waiting_falls_at_once_no_faster_than_the_rate(
    mosquitto, follower
):
    fill, calls, clock = follower
    async with MqttProbe(mosquitto.port, []) as agent:
        await agent.publish(TOPIC, request(1, 600.0), qos=0)
        assert calls.wait(1) == {0: 100.0, 1: 100.0}  # working: the floor only
        fill.waiting()  # the job waits: hold what it drew while working
        assert fill.targets(NODE) == {0: 600.0, 1: 601.0}
        # the agent's samples during the wait include the busy work: they change nothing
        await agent.publish(TOPIC, request(2, 600.0), qos=0)
        calls.received(fill, 2)
        assert fill.targets(NODE) == {0: 600.0, 1: 601.0}
        clock.advance(1.0)  # it falls at once, at 50 W/s: compute resumed steps it up by
        assert fill.targets(NODE) == {0: 550.0, 1: 551.0}  # no more than a window's 80 W
        clock.advance(2.0)  # ready (80 W under) until 1 s + 80/50 s, then as one held through
        assert fill.targets(NODE) == {0: 500.0, 1: 501.0}  # the hysteresis: 50 W/s from 1 s
        clock.advance(100.0)  # never below the floor while the job runs
        assert fill.targets(NODE) == {0: 100.0, 1: 100.0}
        fill.working()
        assert fill.targets(NODE) == {0: 100.0, 1: 100.0}
        await agent.publish(TOPIC, request(3, 550.0), qos=0)  # a sample while working
        calls.received(fill, 3)
        fill.stopping()  # the end: the fall from the last worked draw, no floor
        assert fill.targets(NODE) == {0: 550.0, 1: 551.0}
        await agent.publish(TOPIC, request(4, 580.0), qos=0)  # while stopping: changes nothing
        calls.received(fill, 4)
        assert fill.targets(NODE) == {0: 550.0, 1: 551.0}
        clock.advance(1.0)  # no hysteresis: the job will not resume
        assert fill.targets(NODE) == {0: 500.0, 1: 501.0}
        clock.advance(9.0)
        assert fill.targets(NODE) == {0: 50.0, 1: 51.0}  # below the floor now: none held
        assert not fill.wait_ramped(done_w=50.0, timeout_s=0.0)
        clock.advance(0.02)
        assert fill.wait_ramped(done_w=50.0, timeout_s=0.0)
        assert fill.rejected == 0 and fill.received == 4


async def test_the_refresh_hands_the_falling_target_over_between_samples(mosquitto, follower):
    fill, calls, clock = follower
    async with MqttProbe(mosquitto.port, []) as agent:
        await agent.publish(TOPIC, request(1, 400.0, floor_w=0.0), qos=0)
        calls.wait(1)
        fill.stopping()
        clock.advance(2.0)  # 2 s at 50 W/s: 300 W
        n = len(calls.seen)
        assert calls.wait(n + 2) == {0: 300.0, 1: 301.0}  # no new request: the refresh
        assert not fill.wait_ramped(done_w=10.0, timeout_s=0.0)


async def test_bad_payloads_are_dropped_and_a_raising_callback_does_no_harm(mosquitto):
    raised = threading.Event()

    def boom(node: str, targets: dict[int, float]) -> None:
        raised.set()
        raise RuntimeError("the training loop's bug")

    fill = FillFollower(mosquitto.url, [NODE], boom)
    fill.start()
    try:
        assert fill.wait_subscribed(10.0)
        async with MqttProbe(mosquitto.port, []) as agent:
            await agent.publish(TOPIC, b'{"v":1,"node":"other","ts":0,"seq":1,"gpus":[]}')
            await agent.publish(TOPIC, b"not json")
            await agent.publish(TOPIC, request(1, 300.0))
            assert raised.wait(10.0)
        assert fill.rejected == 2 and fill.received == 1
        assert fill.targets(NODE) == {0: 100.0, 1: 100.0}
    finally:
        fill.close()


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="at least one node"):
        FillFollower("mqtt://localhost", [], lambda n, t: None)
    with pytest.raises(ValueError, match="refresh_s"):
        FillFollower("mqtt://localhost", [NODE], lambda n, t: None, refresh_s=0.0)


@pytest.fixture
def stale_in_5s(mosquitto) -> Iterator[tuple[FillFollower, Calls, ManualClock]]:
    """A follower whose requests go stale 5 s after the last one."""
    clock = ManualClock(100.0)
    calls = Calls()
    made = FillFollower(mosquitto.url, [NODE], calls, clock=clock.monotonic, stale_after_s=5.0)
    made.start()
    assert made.wait_subscribed(10.0)
    yield made, calls, clock
    made.close()


async def one_request(mosquitto, fill: FillFollower, calls: Calls, power_w: float, floor_w: float):
    async with MqttProbe(mosquitto.port, []) as agent:
        await agent.publish(TOPIC, request(1, power_w, floor_w=floor_w), qos=0)
        calls.received(fill, 1)


async def test_without_requests_it_falls_as_if_stopping(mosquitto, stale_in_5s):
    """The agent stopped (or switched smoothing off): no one repeats the order, so after
    stale_after_s the follower lets the draw fall at the last rate, without the floor."""
    fill, calls, clock = stale_in_5s
    await one_request(mosquitto, fill, calls, 600.0, floor_w=300.0)
    assert fill.targets(NODE) == {0: 300.0, 1: 300.0}  # working: the floor
    clock.advance(5.0)
    assert fill.targets(NODE) == {0: 300.0, 1: 300.0}  # not stale yet
    clock.advance(1.0 + 2.0)  # stale for 3 s: 1 s hysteresis, then 2 s at 50 W/s
    assert fill.targets(NODE) == {0: 500.0, 1: 501.0}
    clock.advance(20.0)
    assert fill.targets(NODE) == {0: 0.0, 1: 0.0}  # no floor: down to nothing


async def test_starting_raises_the_draw_slowly_to_the_cap(mosquitto, follower):
    fill, calls, clock = follower
    async with MqttProbe(mosquitto.port, []) as agent:
        await agent.publish(TOPIC, request(1, 120.0, floor_w=0.0), qos=0)  # idle
        calls.received(fill, 1)
        fill.starting()
        assert fill.targets(NODE) == {0: 120.0, 1: 121.0}
        await agent.publish(TOPIC, request(2, 300.0, floor_w=0.0), qos=0)  # its own filling
        calls.received(fill, 2)
        clock.advance(2.0)  # 80 W/s from the draw before it started, not from the filled one
        assert fill.targets(NODE) == {0: 280.0, 1: 281.0}
        clock.advance(100.0)
        assert fill.targets(NODE) == {0: 700.0, 1: 700.0}  # never above the cap
        fill.working()
        assert fill.targets(NODE) == {0: 0.0, 1: 0.0}  # compute: nothing to fill


async def test_going_stale_while_starting_falls_from_where_it_had_risen(mosquitto, stale_in_5s):
    fill, calls, clock = stale_in_5s
    await one_request(mosquitto, fill, calls, 120.0, floor_w=0.0)
    fill.starting()
    clock.advance(5.0)  # risen 400 W at 80 W/s: 520 W
    assert fill.targets(NODE)[0] == 520.0
    clock.advance(0.5)  # stale now: it falls from 520 W, not from the 120 W before the start
    assert fill.targets(NODE)[0] == 520.0  # the hysteresis first
    clock.advance(1.0 + 2.0)  # then 50 W/s
    assert fill.targets(NODE)[0] == pytest.approx(520.0 - 50.0 * 2.5)


async def test_a_change_of_state_goes_on_from_where_the_gpu_is(mosquitto, follower):
    """A job that ends in a checkpoint, or waits while it starts, never has a target jump up
    (a rise at once) or down (a fall at once) when it tells the follower what it does next."""
    fill, calls, clock = follower
    async with MqttProbe(mosquitto.port, []) as agent:
        await agent.publish(TOPIC, request(1, 600.0), qos=0)
        calls.received(fill, 1)
        fill.waiting()  # a final checkpoint
        clock.advance(1.0 + 4.0)  # past its readiness: 4 s at 50 W/s after the hysteresis
        assert fill.targets(NODE) == {0: 400.0, 1: 401.0}
        fill.stopping()  # it ends there: from 400 W down, not from the 600 W it worked at
        assert fill.targets(NODE) == {0: 400.0, 1: 401.0}
        clock.advance(2.0)
        assert fill.targets(NODE) == {0: 300.0, 1: 301.0}
        fill.working()
        await agent.publish(TOPIC, request(2, 120.0, floor_w=0.0), qos=0)  # idle again
        calls.received(fill, 2)
        fill.starting()
        clock.advance(3.0)  # risen 240 W at 80 W/s
        assert fill.targets(NODE) == {0: 360.0, 1: 361.0}
        fill.waiting()  # a wait while it starts: hold where it had risen to, not its idle draw
        assert fill.targets(NODE) == {0: 360.0, 1: 361.0}
        clock.advance(2.0)  # 2 s at 50 W/s, at once: it resumes to its idle draw, no step
        assert fill.targets(NODE) == {0: 260.0, 1: 261.0}
        fill.starting()  # and on from there, not from the idle draw
        assert fill.targets(NODE) == {0: 260.0, 1: 261.0}
        clock.advance(1.0)
        assert fill.targets(NODE) == {0: 340.0, 1: 341.0}
