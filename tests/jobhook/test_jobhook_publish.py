"""PhaseReporter against a real Mosquitto: what it publishes, in what order, as valid payloads."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from powerd.jobhook import PhaseReporter
from powerd.protocol import PhaseEvent, Topics, decode
from tests.support.brokers import TEST_USER, MqttProbe

JOB = "llama-70b-pretrain"
NODES = ["r01-n03", "r01-n04"]
TOPIC = Topics().phase(JOB, owner=TEST_USER)  # the broker login owns the job


@pytest.fixture
def reporters() -> Iterator[list[PhaseReporter]]:
    """Reporters made by a test, closed after it."""
    made: list[PhaseReporter] = []
    yield made
    for reporter in made:
        reporter.close(timeout_s=1.0)


def make(reporters: list[PhaseReporter], url: str, **kwargs: object) -> PhaseReporter:
    kwargs.setdefault("reconnect_max_s", 0.5)
    reporter = PhaseReporter(url, kwargs.pop("job", JOB), **kwargs)  # type: ignore[arg-type]
    reporters.append(reporter)
    return reporter


async def next_events(
    probe: MqttProbe, count: int, after: int, topic: str = TOPIC, job: str = JOB
) -> list[PhaseEvent]:
    """The next ``count`` phase events on ``topic`` past ``after``, decoded strictly."""
    events = []
    position = after
    for _ in range(count):
        message = await probe.expect(topic, after=position)
        position = next(
            i for i in range(position, len(probe.messages)) if probe.messages[i] is message
        )
        position += 1
        events.append(decode(PhaseEvent, message.payload, job))
    return events


async def test_startup_carries_the_nodes_and_the_priority(mosquitto, reporters):
    async with MqttProbe(mosquitto.port, [TOPIC]) as probe:
        reporter = make(reporters, mosquitto.url, nodes=NODES, priority="high")
        before = time.time()
        reporter.startup(expected_s=120)
        reporter.set_phase("compute")
        startup, compute = await next_events(probe, 2, after=0)
    assert startup.v == 1
    assert startup.job == JOB
    assert startup.phase == "startup"
    assert startup.nodes == NODES
    assert startup.priority == "high"
    assert startup.expected_s == 120
    assert before - 1 <= startup.ts <= time.time() + 1
    # the node list goes with startup only; the priority with every event
    assert compute.phase == "compute"
    assert compute.nodes is None
    assert compute.priority == "high"
    assert compute.expected_s is None
    assert probe.messages[0].retain is False


async def test_phase_block_announces_entry_then_the_phase_it_interrupted(mosquitto, reporters):
    async with MqttProbe(mosquitto.port, [TOPIC]) as probe:
        reporter = make(reporters, mosquitto.url, nodes=NODES)
        reporter.startup()
        with reporter.phase("checkpoint", expected_s=45):  # after startup: back to compute
            assert reporter.current_phase == "checkpoint"
        reporter.set_phase("communication")
        with reporter.phase("eval"):
            with reporter.phase("checkpoint"):
                pass
        with reporter.phase("idle", then="eval"):
            pass
        events = await next_events(probe, 10, after=0)
    assert [e.phase for e in events] == [
        "startup",
        "checkpoint",
        "compute",
        "communication",
        "eval",
        "checkpoint",
        "eval",  # the inner block returns to the outer one
        "communication",  # and the outer to what it interrupted
        "idle",
        "eval",  # `then` overrides what the block interrupted
    ]
    assert events[1].expected_s == 45
    assert events[2].expected_s is None
    assert all(e.priority == "normal" for e in events)
    assert [e.ts for e in events] == sorted(e.ts for e in events)
    assert reporter.current_phase == "eval"


async def test_exit_phase_is_published_when_the_block_raises(mosquitto, reporters):
    class Boom(Exception):
        pass

    error = Boom("disk full")
    async with MqttProbe(mosquitto.port, [TOPIC]) as probe:
        reporter = make(reporters, mosquitto.url)
        reporter.set_phase("communication")
        with pytest.raises(Boom) as raised:
            with reporter.phase("checkpoint", expected_s=30):
                raise error
        events = await next_events(probe, 3, after=0)
    # the very same exception, not wrapped and with nothing chained to it by the hook
    assert raised.value is error
    assert error.__cause__ is None and error.__context__ is None
    assert [e.phase for e in events] == ["communication", "checkpoint", "communication"]


async def test_shutdown_publishes_shutdown_then_closes(mosquitto, reporters):
    async with MqttProbe(mosquitto.port, [TOPIC]) as probe:
        reporter = make(reporters, mosquitto.url, nodes=NODES)
        reporter.startup()
        reporter.set_phase("compute")
        await asyncio.to_thread(reporter.shutdown)
        events = await next_events(probe, 3, after=0)
    assert [e.phase for e in events] == ["startup", "compute", "shutdown"]
    stats = reporter.stats()
    assert stats.closed and not stats.connected
    assert (stats.sent, stats.queued, stats.in_flight, stats.dropped) == (3, 0, 0, 0)
    # after close, calls are still checked but send nothing, and raise nothing
    reporter.set_phase("eval")
    with reporter.phase("checkpoint"):
        pass
    assert reporter.stats().sent == 3 and reporter.stats().queued == 0
    with pytest.raises(ValueError):
        reporter.set_phase("bogus")


async def test_cluster_prefix_and_job_topic(mosquitto, reporters):
    topic = Topics("lab-a").phase("bert.ft_2", owner=TEST_USER)
    async with MqttProbe(mosquitto.port, ["powerd/v1/#"]) as probe:
        reporter = make(reporters, mosquitto.url, job="bert.ft_2", cluster="lab-a", priority="low")
        reporter.set_phase("eval", expected_s=12.5)
        (event,) = await next_events(probe, 1, after=0, topic=topic, job="bert.ft_2")
    assert probe.messages[0].topic == f"powerd/v1/lab-a/jobs/{TEST_USER}/bert.ft_2/phase"
    assert (event.phase, event.priority, event.expected_s) == ("eval", "low", 12.5)


async def test_many_threads_at_once_lose_nothing_and_keep_each_threads_order(mosquitto, reporters):
    threads, per_thread = 4, 50
    async with MqttProbe(mosquitto.port, [TOPIC]) as probe:
        reporter = make(reporters, mosquitto.url, queue_size=threads * per_thread)
        assert await asyncio.to_thread(reporter.wait_connected, 10)
        start = threading.Barrier(threads)

        def worker(t: int) -> None:
            start.wait()
            for i in range(per_thread):
                # expected_s carries (thread, sequence) through the broker
                reporter.set_phase("communication", expected_s=t * 1000 + i)

        pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        events = await next_events(probe, threads * per_thread, after=0)
    assert await asyncio.to_thread(reporter.flush, 10)
    stats = reporter.stats()
    assert (stats.sent, stats.dropped) == (threads * per_thread, 0)
    for t in range(threads):
        seen = [int(e.expected_s) % 1000 for e in events if int(e.expected_s) // 1000 == t]
        assert seen == list(range(per_thread))


async def test_socket_has_tcp_nodelay(mosquitto, reporters):
    reporter = make(reporters, mosquitto.url)
    assert await asyncio.to_thread(reporter.wait_connected, 10)
    sock = reporter._publisher.client.socket()  # paho's socket of the live connection
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
