"""The leadership shell on its own (powerd.leadership.shell), over a fake link: the
takeover with its epoch, the heartbeat schedule, stepping down on a peer's heartbeat,
the lost broker, the clean stop's standby heartbeat and the watchdog while the broker
is down. The services over a real broker: tests/controller, tests/coordinator."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest

from powerd.leadership.shell import LeaderShell
from powerd.mqtt.link import LinkError, MqttLink
from powerd.mqtt.url import BrokerSettings, parse_broker_url
from powerd.protocol import Heartbeat, ProtocolError, encode
from powerd.signing import Signer, Verifier
from powerd.systemd import SystemdNotifier
from powerd.vocabulary import PROTOCOL_VERSION

TOPIC = "powerd/v1/test/controller/heartbeat"
KEY = Signer.generate()
PEERS = Verifier([KEY.trusted()])
WALL = 1_800_000_000.0


@dataclass(frozen=True)
class Config:
    name: str = "b"
    broker: BrokerSettings = field(
        default_factory=lambda: replace(
            parse_broker_url("mqtt://127.0.0.1:1"), reconnect_min_s=0.01, reconnect_max_s=0.02
        )
    )
    heartbeat_s: float = 1.0
    takeover_after_s: float = 3.0
    epoch_discovery_s: float = 0.0
    max_clock_skew_s: float = 30.0


class FakeLink:
    """What the shell uses of an ``MqttLink``; ``connect`` fails (the broker is down)."""

    def __init__(self) -> None:
        self.connected = asyncio.Event()
        self.sent: list[tuple[str, bytes, bool]] = []
        self.closed = 0

    async def connect(self) -> None:
        raise LinkError("connection refused")

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> int:
        self.sent.append((topic, payload, retain))
        return len(self.sent)

    async def published(self, mid: int, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        self.closed += 1


class Notifier(SystemdNotifier):
    def __init__(self) -> None:
        super().__init__(socket_path="")
        self.pings = 0
        self.statuses: list[str] = []

    def watchdog(self) -> None:
        self.pings += 1

    def status(self, status: str) -> None:
        self.statuses.append(status)


@dataclass
class Clocks:
    mono: float = 100.0
    wall: float = WALL


@dataclass
class Harness:
    shell: LeaderShell
    link: FakeLink
    clocks: Clocks
    notifier: Notifier
    epochs: list[int]


def harness(seq: int | None = 7) -> Harness:
    link, clocks, notifier = FakeLink(), Clocks(), Notifier()
    epochs: list[int] = []
    shell = LeaderShell(
        Config(),
        cast(MqttLink, link),
        TOPIC,
        KEY,
        PEERS,
        on_take_over=epochs.append,
        seq=lambda: seq,
        watchdog_s=0.01,
        notifier=notifier,
        monotonic=lambda: clocks.mono,
        wall=lambda: clocks.wall,
        log=logging.getLogger("test.leadership"),
    )
    return Harness(shell, link, clocks, notifier, epochs)


def beat(name: str, epoch: int, ts: float, state: Any = "leader") -> bytes:
    body = Heartbeat(v=PROTOCOL_VERSION, epoch=epoch, ts=ts, controller=name, state=state)
    return KEY.sign(TOPIC, encode(body))


def sent_beats(link: FakeLink) -> list[Heartbeat]:
    return [PEERS.decode(Heartbeat, topic, payload) for topic, payload, _ in link.sent]


def test_a_controller_that_saw_no_heartbeat_leads_with_the_wall_clock_epoch() -> None:
    h = harness()
    assert h.shell.take_over_if_due(now=5.0)
    epoch = int(WALL * 1000)
    assert h.epochs == [epoch]  # the service's part, before leading is set
    assert h.shell.leading.is_set() and h.shell.leadership.epoch == epoch
    assert h.notifier.statuses == [f"leading, epoch {epoch}"]
    assert not h.shell.take_over_if_due(now=6.0)  # once


def test_a_stopping_shell_takes_no_lead() -> None:
    h = harness()
    h.shell.stopping = True
    assert not h.shell.take_over_if_due(now=5.0)
    assert not h.shell.leading.is_set()


def test_a_live_leader_is_followed_and_a_standby_takes_over_once_it_is_silent() -> None:
    h = harness()
    h.shell.on_heartbeat(beat("a", 41, WALL), live=True)
    assert not h.shell.take_over_if_due(now=0.0)
    h.clocks.mono += 3.5  # silent past takeover_after_s
    assert h.shell.take_over_if_due(now=1.0)
    assert h.epochs == [42]  # the highest seen + 1


def test_the_leader_beats_every_heartbeat_s_retained_with_its_seq() -> None:
    h = harness(seq=7)
    h.shell.beat(now=5.0)
    assert h.link.sent == []  # a standby sends none
    h.shell.take_over_if_due(now=5.0)
    h.shell.beat(now=5.0)
    h.shell.beat(now=5.5)
    h.shell.beat(now=6.0)
    beats = sent_beats(h.link)
    assert [(b.state, b.seq, b.controller) for b in beats] == [("leader", 7, "b")] * 2
    assert all(retain for _, _, retain in h.link.sent)


def test_a_standby_wakes_for_its_own_schedule_a_leader_for_its_next_beat() -> None:
    h = harness()
    assert h.shell.wake(10.0) == 10.0
    h.shell.take_over_if_due(now=5.0)
    h.shell.beat(now=5.0)
    assert h.shell.wake(10.0) == 6.0


def test_a_higher_epoch_heard_live_steps_the_leader_down() -> None:
    h = harness()
    h.shell.take_over_if_due(now=5.0)
    h.shell.on_heartbeat(beat("c", h.shell.leadership.epoch + 1, WALL), live=True)
    assert not h.shell.leading.is_set() and not h.shell.leadership.leading


def test_a_heartbeat_not_signed_by_a_peer_is_refused() -> None:
    h = harness()
    body = Heartbeat(v=PROTOCOL_VERSION, epoch=9, ts=WALL, controller="x", state="leader")
    with pytest.raises(ProtocolError):
        h.shell.on_heartbeat(Signer.generate().sign(TOPIC, encode(body)), live=True)


def test_a_lost_broker_ends_leading_until_the_next_session() -> None:
    h = harness()
    h.shell.take_over_if_due(now=5.0)
    h.shell.down()
    assert h.link.closed == 1
    assert not h.shell.leading.is_set() and not h.shell.leadership.leading


async def test_a_clean_stop_hands_over_with_a_retained_standby_heartbeat() -> None:
    h = harness()
    h.shell.take_over_if_due(now=5.0)
    h.link.connected.set()
    await h.shell.step_down_on_exit()
    [standby] = sent_beats(h.link)
    assert standby.state == "standby" and standby.epoch == h.shell.leadership.epoch
    assert h.link.sent[0][2] and not h.shell.leadership.leading


async def test_a_standby_sends_nothing_on_a_clean_stop() -> None:
    h = harness()
    h.link.connected.set()
    await h.shell.step_down_on_exit()
    assert h.link.sent == []


async def test_the_watchdog_is_pinged_while_the_broker_is_down_and_a_stop_ends_serve() -> None:
    h = harness()
    stop = asyncio.Event()
    sessions: list[MqttLink] = []

    async def loop(link: MqttLink) -> None:
        sessions.append(link)

    task = asyncio.create_task(h.shell.serve(stop, loop, "connecting"))
    while h.notifier.pings < 3 or h.shell.stats.failures < 2:
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert sessions == []  # never connected: the session's loop never ran
    assert h.shell.stopping and not h.shell.stats.up.is_set()
    assert h.link.closed >= 2  # after every failed session, and on the way out
