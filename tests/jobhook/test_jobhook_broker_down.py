"""The broker down, stopped mid-run, silent, unresolvable, or misspelt: training goes on.

Every call returns and raises nothing; what could not be sent is counted as
dropped (oldest first); when the broker comes back, later phases arrive. The
only timing asserted is a generous sanity bound: a hook that waited on the
network would blow it by orders of magnitude.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator

import pytest

import powerd.jobhook.publisher as jobhook_publisher
import powerd.jobhook.reporter as jobhook_reporter
from powerd.jobhook import PhaseReporter
from powerd.protocol import PhaseEvent, Topics, decode
from tests.support.brokers import TEST_USER, Mosquitto, MqttProbe

JOB = "resnet-sweep-7"
TOPIC = Topics().phase(JOB, owner=TEST_USER)  # the broker login owns the job
SANITY_S = 10.0  # for hundreds of calls that should take milliseconds


@pytest.fixture
def reporters() -> Iterator[list[PhaseReporter]]:
    made: list[PhaseReporter] = []
    yield made
    for reporter in made:
        reporter.close(timeout_s=0.5)


def make(reporters: list[PhaseReporter], url: str, **kwargs: object) -> PhaseReporter:
    kwargs.setdefault("reconnect_max_s", 0.5)
    reporter = PhaseReporter(url, JOB, **kwargs)  # type: ignore[arg-type]
    reporters.append(reporter)
    return reporter


def training_calls(reporter: PhaseReporter, steps: int) -> int:
    """What a training loop does, ``steps`` times; returns how many events it announced."""
    announced = 0
    for step in range(steps):
        reporter.set_phase("compute")
        reporter.set_phase("communication", expected_s=0.2)
        announced += 2
        if step % 5 == 0:
            with reporter.phase("checkpoint", expected_s=45):
                pass
            announced += 2
    return announced


async def arrives(probe: MqttProbe, phase: str, after: int) -> PhaseEvent:
    message = await probe.expect(
        TOPIC, lambda m: decode(PhaseEvent, m.payload, JOB).phase == phase, after=after
    )
    return decode(PhaseEvent, message.payload, JOB)


async def test_broker_not_running_then_started(tmp_path, reporters):
    broker = Mosquitto(tmp_path)  # its port, nothing listening on it yet
    reporter = make(reporters, broker.url, nodes=["r01-n03"], queue_size=8)
    started = time.monotonic()
    reporter.startup()
    announced = 1 + training_calls(reporter, 100)
    elapsed = time.monotonic() - started
    assert announced == 241  # every call came back
    assert elapsed < SANITY_S
    stats = reporter.stats()
    assert not stats.connected
    assert (stats.queued, stats.dropped, stats.sent) == (8, announced - 8, 0)

    broker.start()
    try:
        assert await asyncio.to_thread(reporter.wait_connected, 15)
        assert await asyncio.to_thread(reporter.flush, 10)
        assert reporter.stats().sent == 8  # the newest 8 survived the outage
        async with MqttProbe(broker.port, [TOPIC]) as probe:
            reporter.set_phase("eval")
            assert (await arrives(probe, "eval", after=0)).job == JOB
    finally:
        broker.stop()


async def test_broker_stopped_mid_run_then_restarted(mosquitto, reporters):
    reporter = make(reporters, mosquitto.url, queue_size=8)
    async with MqttProbe(mosquitto.port, [TOPIC]) as probe:
        reporter.startup()
        await arrives(probe, "startup", after=0)
    assert await asyncio.to_thread(reporter.flush, 10)

    mosquitto.stop()
    assert await asyncio.to_thread(reporter.wait_until, lambda s: not s.connected, 10)
    before = reporter.stats()
    started = time.monotonic()
    announced = training_calls(reporter, 50)
    assert announced == 120
    assert time.monotonic() - started < SANITY_S
    stats = reporter.stats()
    assert stats.queued == 8
    assert stats.dropped - before.dropped == announced - 8

    mosquitto.start()
    assert await asyncio.to_thread(reporter.wait_until, lambda s: s.connects >= 2, 15)
    # the newest 8 survived the outage; until they are out of the queue, 3 more announced
    # would push the oldest 3 out of it (queue_size 8)
    assert await asyncio.to_thread(reporter.flush, 10)
    assert reporter.stats().sent == 1 + 8
    async with MqttProbe(mosquitto.port, [TOPIC]) as probe:
        reporter.set_phase("idle")
        with reporter.phase("eval"):
            pass
        await arrives(probe, "idle", after=0)
        await arrives(probe, "eval", after=0)
    assert await asyncio.to_thread(reporter.flush, 10)
    assert reporter.stats().sent == 1 + 8 + 3


def test_silent_broker_never_blocks(reporters):
    """A broker that accepts the connection and never answers: a hung or overloaded one."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        reporter = make(reporters, f"mqtt://127.0.0.1:{port}", queue_size=4, flush_timeout_s=0.5)
        started = time.monotonic()
        announced = training_calls(reporter, 100)
        assert announced == 240
        assert time.monotonic() - started < SANITY_S
        stats = reporter.stats()
        assert (stats.connected, stats.queued, stats.dropped) == (False, 4, announced - 4)
        started = time.monotonic()
        reporter.close()
        assert time.monotonic() - started < SANITY_S  # bounded by flush_timeout_s + ~1 s
    assert reporter.stats().dropped == announced  # the 4 left at close count too


def test_unresolvable_host_never_blocks(reporters):
    reporter = make(reporters, "mqtt://no-such-broker.invalid:1883", queue_size=4)
    started = time.monotonic()
    assert training_calls(reporter, 100) == 240
    assert time.monotonic() - started < SANITY_S
    assert reporter.stats().dropped == 236


@pytest.mark.parametrize(
    "url",
    ["http://broker:1883", "mqtt://", "mqtt://broker:99999", "mqtt://broker/x", "mqtt://a..b"],
)
def test_wrong_url_turns_reporting_off_without_raising(url, caplog, reporters):
    with caplog.at_level(logging.ERROR, logger="powerd.jobhook"):
        reporter = make(reporters, url)
    assert training_calls(reporter, 10) == 24
    stats = reporter.stats()
    assert not stats.enabled
    assert stats.dropped == 24
    assert reporter.error and "off" in reporter.error
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    reporter.close()  # returns at once: nothing to flush


def test_password_in_a_wrong_url_is_not_logged(caplog, reporters):
    with caplog.at_level(logging.ERROR, logger="powerd.jobhook"):
        reporter = make(reporters, "http://jobs:s3cret@broker:1883")
    assert not reporter.stats().enabled
    assert "s3cret" not in caplog.text and "s3cret" not in (reporter.error or "")


def test_internal_failure_is_logged_once_not_raised(monkeypatch, caplog, reporters):
    reporter = make(reporters, "mqtt://127.0.0.1:9", queue_size=4)

    def broken_encode(message: object) -> bytes:
        raise RuntimeError("encoder exploded")

    monkeypatch.setattr(jobhook_reporter, "encode", broken_encode)
    with caplog.at_level(logging.WARNING, logger="powerd.jobhook"):
        assert training_calls(reporter, 20) == 48
        with pytest.raises(KeyError):  # the block's own exception still comes through
            with reporter.phase("eval"):
                raise KeyError("batch")
    failures = [r for r in caplog.records if "encoder exploded" in r.getMessage()]
    assert len(failures) == 1  # once a minute, not once a call
    assert reporter.current_phase == "communication"  # the state is kept all the same


async def test_network_thread_that_dies_is_restarted(mosquitto, monkeypatch, caplog, reporters):
    """paho's network thread ends on an unexpected exception; the reporter starts it again."""
    calls = 0
    real = jobhook_publisher._set_no_delay

    def fails_once(client: object, userdata: object, sock: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("socket option trouble")
        real(client, userdata, sock)

    monkeypatch.setattr(jobhook_publisher, "_set_no_delay", fails_once)
    with caplog.at_level(logging.WARNING, logger="powerd.jobhook"):
        reporter = make(reporters, mosquitto.url)
        reporter.set_phase("compute")
        assert await asyncio.to_thread(reporter.wait_connected, 15)
    assert calls >= 2
    assert "network thread failed" in caplog.text
    async with MqttProbe(mosquitto.port, [TOPIC]) as probe:
        reporter.set_phase("eval")
        await arrives(probe, "eval", after=0)
