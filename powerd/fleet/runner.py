"""``powerd fleet``'s I/O: a ``FleetModel`` on a real broker, in one thread.

One thread and one ``select`` loop drive two sets of connections:

- telemetry connections (``powerd.fleet.wire``: QoS 0 PUBLISH frames written
  into a buffer, sent when the socket takes them) carry every simulated
  node's telemetry, spread evenly over the period in a shuffled order, as
  agents that started at random times would send it;
- control connections (paho, TCP_NODELAY) subscribe to their share of the
  nodes' command topics (one topic per node, as agents do, so a burst of
  commands spreads over them as it would over thousands of agents' own
  connections: one connection taking every command overflows the broker's
  per-client queue, 1,000 messages by default, and drops commands), publish
  the acks, and the first takes the controller's heartbeat. Retained offline
statuses of the nodes simulated as stopped are published at start and
cleared at the end.

What it measures, as agents would see it, is returned as a :class:`FleetReport`:
heartbeat gaps, epochs, commands and acks, and the reaction to racks pushed
over their capping threshold (``push_every_s``).
"""

from __future__ import annotations

import logging
import math
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt

from powerd.fleet.model import FleetModel
from powerd.fleet.wire import TopicFrames, WirePublisher
from powerd.mqtt.link import paho_client
from powerd.mqtt.url import NO_DELAY, BrokerSettings

log = logging.getLogger("powerd.fleet")

DRAIN_S = 0.005  # longest on one readable connection before the others get a turn
MAX_BURST = 2000  # telemetry messages published between two looks at the sockets
TICK_S = 0.01  # how often the loop publishes what has come due


@dataclass(frozen=True)
class RunOptions:
    period_s: float = 1.0  # telemetry period of every node
    connections: int = 4  # telemetry connections
    control_connections: int = 16  # command and ack connections
    duration_s: float | None = None  # None: until stopped
    push_every_s: float = 0.0  # push a rack over its capping threshold this often (0: never)
    push_hold_s: float = 5.0  # and release it after this long
    warmup_s: float = 10.0  # no pushes before this
    connect_timeout_s: float = 30.0


@dataclass
class FleetReport:
    duration_s: float = 0.0
    nodes: int = 0
    reporting_nodes: int = 0
    telemetry_sent: int = 0
    telemetry_dropped: int = 0  # not sent: the broker did not read the fleet fast enough
    commands: int = 0
    acks: dict[str, int] = field(default_factory=dict)
    heartbeats: int = 0
    epochs: list[int] = field(default_factory=list)  # live leader epochs, in order seen
    heartbeat_gaps_s: list[float] = field(default_factory=list)
    heartbeat_at_s: list[float] = field(default_factory=list)  # when each gap ended, from start
    # the same gaps between the heartbeats' own timestamps: how late the leader sent them
    # (the rest of a gap is the broker's and this process's)
    heartbeat_sent_gaps_s: list[float] = field(default_factory=list)
    failsafe_entries: int = 0
    clock_locks: int = 0  # by commands
    phase_locks: int = 0  # by the jobs' announcements, under the controller's clock policies
    signatures_unchecked: int = 0  # commands taken on their key id alone (--verify-every)
    applied_by_kind: dict[str, int] = field(default_factory=dict)  # cut, raise, no cap moved
    phase_events: int = 0
    pushes: list[dict[str, float | None]] = field(default_factory=list)
    period_s: float = 1.0  # the telemetry period: the simulated time one round stands for
    smoothing_gpus: int = 0  # GPUs with hardware power smoothing
    # per telemetry round, as it closes: (seconds since start, the site's GPUs' draw W,
    # GPUs with smoothing switched on)
    rounds: list[tuple[float, float, int]] = field(default_factory=list)
    started_wall: float = 0.0  # wall clock at the start: what the rounds' times count from
    overhead_w: float = 0.0  # the site's watts that are not GPUs (constant in the model)

    def site_power(self) -> list[tuple[float, float]]:
        """(seconds since the start, the site's draw W: GPUs and overheads), a round each."""
        return [(round(t, 3), round(w + self.overhead_w, 1)) for t, w, _ in self.rounds]

    def summary(self) -> dict[str, Any]:
        gaps = np.array(self.heartbeat_gaps_s or [math.nan])
        from_push = [p["back_s"] for p in self.pushes if p["back_s"] is not None]
        from_seen = [p["back_from_visible_s"] for p in self.pushes if p["back_s"] is not None]
        return {
            "duration_s": round(self.duration_s, 1),
            "nodes": self.nodes,
            "reporting_nodes": self.reporting_nodes,
            "telemetry_sent": self.telemetry_sent,
            "telemetry_per_s": round(self.telemetry_sent / max(self.duration_s, 1e-9)),
            "telemetry_dropped": self.telemetry_dropped,
            "commands": self.commands,
            "acks": self.acks,
            "heartbeats": self.heartbeats,
            "epochs": sorted(set(self.epochs)),
            "heartbeat_gap_s": _percentiles(gaps),
            "heartbeat_sent_gap_s": _percentiles(
                np.array(self.heartbeat_sent_gaps_s or [math.nan])
            ),
            "failsafe_entries": self.failsafe_entries,
            "clock_locks": self.clock_locks,
            "phase_locks": self.phase_locks,
            "signatures_unchecked": self.signatures_unchecked,
            "applied_by_kind": self.applied_by_kind,
            "phase_events": self.phase_events,
            "pushes": len(self.pushes),
            "pushes_brought_back": len(from_push),
            "reaction_s": _percentiles(np.array(from_push or [math.nan])),
            "reaction_from_visible_s": _percentiles(np.array(from_seen or [math.nan])),
            "gpu_power_w_per_s": self._ramps(),
            "smoothing": self._smoothing(),
        }

    def late_heartbeats(self, over_s: float = 1.2) -> list[tuple[float, float, float]]:
        """(seconds since the start, gap, gap between their timestamps) of every heartbeat
        that came over ``over_s`` after the one before: when in the run the agents heard
        their leader late, and how much of it the leader sent late."""
        return [
            (round(t, 2), round(gap, 3), round(sent, 3))
            for t, gap, sent in zip(
                self.heartbeat_at_s, self.heartbeat_gaps_s, self.heartbeat_sent_gaps_s, strict=True
            )
            if gap > over_s
        ]

    def _ramps(self) -> dict[str, float | None]:
        """How fast the simulated GPUs' summed draw moved from one round to the next, W/s: as
        the grid would see the site's GPUs. A round stands for one period of simulated time
        (each GPU's draw moves by one ``period_s`` a sample), whether the fleet sent it on
        time or caught up after falling behind. ``*_at_s``: when (seconds since the start, at
        the round's end)."""
        if len(self.rounds) < 2:
            return {"up_max": None, "down_max": None, "up_max_at_s": None, "down_max_at_s": None}
        rate = np.diff(np.array([r[1] for r in self.rounds])) / self.period_s
        up, down = int(rate.argmax()), int(rate.argmin())
        return {
            "up_max": round(float(rate[up]), 1),
            "down_max": round(float(rate[down]), 1),
            "up_max_at_s": round(self.rounds[up + 1][0], 1),
            "down_max_at_s": round(self.rounds[down + 1][0], 1),
        }

    def _smoothing(self) -> dict[str, Any]:
        """When 50 %, 99 % and all of the GPUs with hardware smoothing first had it on
        (seconds since the start; None: never in the run)."""

        def first(share: float) -> float | None:
            need = share * self.smoothing_gpus
            return next((round(t, 1) for t, _, on in self.rounds if on >= need), None)

        on = self.rounds[-1][2] if self.rounds else 0
        held = {"p50_s": first(0.5), "p99_s": first(0.99), "all_s": first(1.0)}
        return {
            "gpus": self.smoothing_gpus,
            "on_at_end": on,
            **(held if self.smoothing_gpus else {}),
        }


def _percentiles(values: np.ndarray) -> dict[str, float | None]:
    def q(p: float) -> float | None:
        v = float(np.nanpercentile(values, p)) if not np.all(np.isnan(values)) else math.nan
        return None if math.isnan(v) else round(v, 3)

    return {"p50": q(50), "p99": q(99), "max": q(100), "count": int(np.sum(~np.isnan(values)))}


class FleetRunner:
    def __init__(
        self,
        model: FleetModel,
        broker: BrokerSettings,
        cluster: str,
        options: RunOptions,
        client_id: str = "powerd-fleet",
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.model = model
        self.broker = broker
        self.topics = model.topics  # the model's: with its scope's heartbeat
        self.options = options
        self.client_id = client_id
        self._monotonic = monotonic
        self._wall = wall
        self._rng = np.random.default_rng(model.options.seed + 1)
        reporting = model.reporting()
        self._order = reporting[self._rng.permutation(len(reporting))]
        self._topics = [self.topics.telemetry(name) for name in model.names]
        self._command_prefix = self.topics.prefix + "/nodes/"
        self._clients: list[mqtt.Client] = []  # control connections
        self._wires: list[WirePublisher] = []  # telemetry connections
        self._frames = [TopicFrames(topic) for topic in self._topics]
        self._connected: set[int] = set()
        self._unsubscribed: dict[int, int] = {}
        self._messages = 0
        self._last_beat: float | None = None
        self._started = 0.0
        self.report = FleetReport(
            nodes=len(model.names), reporting_nodes=len(reporting), period_s=options.period_s
        )
        self._pushable = self._pushable_racks()

    # --- connections --------------------------------------------------------------------

    def _client(self, k: int, nodes: list[int]) -> mqtt.Client:
        """Control connection ``k``: the command topics of ``nodes`` (and, for 0, heartbeats)."""
        client = paho_client(self.broker, f"{self.client_id}-control-{k}")
        topics = [(self.topics.command(self.model.names[n]), 1) for n in nodes]
        if k == 0:
            topics.append((self.topics.heartbeat, 1))
        chunks = [topics[i : i + 500] for i in range(0, len(topics), 500)]

        def on_connect(c: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
            if reason.is_failure:
                raise ConnectionError(f"fleet connection {k} refused: {reason}")
            self._unsubscribed[k] = len(chunks)
            for chunk in chunks:
                c.subscribe(chunk)
            if not chunks:
                self._connected.add(k)

        def on_subscribe(_c: mqtt.Client, _u: Any, _m: int, reasons: Any, _p: Any) -> None:
            if any(r.is_failure for r in reasons):
                raise ConnectionError(f"fleet connection {k}: subscription refused")
            self._unsubscribed[k] -= 1
            if self._unsubscribed[k] == 0:
                self._connected.add(k)

        client.on_connect = on_connect
        client.on_subscribe = on_subscribe
        client.on_message = self._on_message
        return client

    def _connect(self) -> None:
        n_control = max(1, self.options.control_connections)
        nodes = range(len(self.model.names))
        for k in range(n_control):
            client = self._client(k, [n for n in nodes if n % n_control == k])
            client.connect(self.broker.host, self.broker.port, int(self.broker.keepalive_s))
            sock = client.socket()
            if isinstance(sock, socket.socket):
                for option in NO_DELAY:  # an ack goes out at once
                    sock.setsockopt(*option)
            self._clients.append(client)
        for k in range(max(1, self.options.connections)):
            wire = WirePublisher(self.broker, f"{self.client_id}-telemetry-{k}")
            wire.connect(self.options.connect_timeout_s)
            self._wires.append(wire)
        deadline = self._monotonic() + self.options.connect_timeout_s
        while len(self._connected) < len(self._clients):
            if self._monotonic() > deadline:
                raise ConnectionError(f"fleet: broker {self.broker.display} did not answer")
            self._io(0.05)

    # --- the loop -----------------------------------------------------------------------

    def run(self, stopping: Callable[[], bool] = lambda: False) -> FleetReport:
        """Run until ``duration_s`` (or ``stopping()``); what was measured."""
        self._connect()
        model, period = self.model, self.options.period_s
        start = self._started = self._monotonic()
        model.start(start)
        ts = self.report.started_wall = self._wall()
        self.report.overhead_w = float(model.tree.overhead_below_w[0])
        for stopped in np.flatnonzero(model.offline).tolist():
            self._clients[0].publish(
                self.topics.status(model.names[stopped]),
                model.offline_status(stopped, ts),
                qos=1,
                retain=True,
            )
        sent = 0  # telemetry messages since start
        n = len(self._order)
        next_misc = start + 1.0
        next_push = start + self.options.warmup_s
        releases: list[tuple[float, int]] = []
        log.info(
            "fleet: %d nodes (%d reporting) every %.3g s on %d connections to %s",
            len(model.names),
            n,
            period,
            len(self._wires),
            self.broker.display,
        )
        try:
            while not stopping():
                now = self._monotonic()
                if self.options.duration_s is not None and now - start >= self.options.duration_s:
                    break
                if model.tick(now):
                    log.warning("fleet: no live controller heartbeat: every node in failsafe")
                for job, payload in model.phase_events(now, self._wall()):
                    self._clients[0].publish(self.topics.phase(job), payload, qos=1)
                due = int((now - start) / period * n) + 1 if n else 0
                burst = min(due - sent, MAX_BURST)
                if burst > 0:
                    model._clock_now = now
                    ts = self._wall()
                    while burst > 0:  # in segments that end where a round does
                        if sent % n == 0:
                            self._close_round(now - start)
                            model.new_round()
                        size = min(burst, n - sent % n)
                        nodes = self._order[sent % n : sent % n + size].tolist()
                        for node, payload in zip(
                            nodes, model.telemetry_of(nodes, ts, period), strict=True
                        ):
                            wire = self._wires[node % len(self._wires)]
                            wire.write(self._frames[node].frame(payload))
                        sent += size
                        burst -= size
                    for wire in self._wires:
                        wire.flush()
                if self.options.push_every_s > 0 and now >= next_push:
                    next_push = now + self.options.push_every_s
                    rack = self._next_rack()
                    if rack is not None:
                        model.push(rack, now)
                        releases.append((now + self.options.push_hold_s, rack))
                for at, rack in [r for r in releases if r[0] <= now]:
                    model.release(rack)
                    releases.remove((at, rack))
                if now >= next_misc:
                    next_misc = now + 1.0
                    for client in self._clients:
                        client.loop_misc()
                    for wire in self._wires:
                        wire.tick()
                # a burst every TICK_S: the broker sees ~100 writes a second, not one per message
                self._io(0.0 if due > sent + MAX_BURST else TICK_S)
        finally:
            self.report.duration_s = self._monotonic() - start
            self._finish()
        return self.report

    def _close_round(self, since_start_s: float) -> None:
        """A round of telemetry is complete: the site's draw and smoothing, as it ends."""
        if self.model.counters.telemetry:  # not before the first round
            self.report.rounds.append(
                (since_start_s, sum(self.model.power_w), self.model.smoothing_on())
            )

    def _io(self, timeout_s: float) -> None:
        socks: dict[Any, mqtt.Client | WirePublisher] = {
            c.socket(): c for c in self._clients if c.socket() is not None
        }
        socks.update({w.sock: w for w in self._wires if w.sock is not None})
        writers = [
            s
            for s, c in socks.items()
            if (c.want_write() if isinstance(c, mqtt.Client) else c.wants_write)
        ]
        readable, writable, _ = select.select(list(socks), writers, [], timeout_s)
        for sock in writable:
            conn = socks[sock]
            if isinstance(conn, mqtt.Client):
                conn.loop_write()
            else:
                conn.flush()
        for sock in readable:
            conn = socks[sock]
            if isinstance(conn, mqtt.Client):
                self._drain(conn)
            else:
                conn.tick()

    def _drain(self, client: mqtt.Client) -> None:
        deadline = self._monotonic() + DRAIN_S
        while self._monotonic() < deadline:
            before = self._messages
            if client.loop_read() != mqtt.MQTT_ERR_SUCCESS or self._messages == before:
                return

    def _on_message(self, client: mqtt.Client, _u: Any, message: mqtt.MQTTMessage) -> None:
        self._messages += 1
        now, wall = self._monotonic(), self._wall()
        topic = message.topic
        payload = bytes(message.payload)
        if topic == self.topics.heartbeat:
            sent_before = self.model.heartbeat_ts
            if self.model.on_heartbeat(payload, now, wall, live=not message.retain):
                if self._last_beat is not None:
                    self.report.heartbeat_gaps_s.append(now - self._last_beat)
                    self.report.heartbeat_at_s.append(now - self._started)
                    self.report.heartbeat_sent_gaps_s.append(self.model.heartbeat_ts - sent_before)
                self._last_beat = now
                self.report.epochs.append(self.model.newest_epoch)
            return
        if topic.startswith(self._command_prefix) and topic.endswith("/command"):
            node = topic[len(self._command_prefix) : -len("/command")]
            ack = self.model.on_command(node, payload, now, wall)
            if ack is not None:
                client.publish(self.topics.ack(node), ack, qos=1)

    def _finish(self) -> None:
        model, report = self.model, self.report
        for node in np.flatnonzero(model.offline):  # leave no retained status behind
            self._clients[0].publish(self.topics.status(model.names[node]), b"", qos=1, retain=True)
        deadline = self._monotonic() + 2.0
        while any(c.want_write() for c in self._clients) and self._monotonic() < deadline:
            self._io(0.05)
        for client in self._clients:
            client.disconnect()
            client.loop_write()
        for wire in self._wires:
            report.telemetry_dropped += wire.dropped
            wire.close()
        c = model.counters
        report.telemetry_sent, report.commands, report.acks = c.telemetry, c.commands, c.acks
        report.heartbeats, report.failsafe_entries = c.heartbeats, c.failsafe_entries
        report.clock_locks, report.phase_events = c.clock_locks, c.phase_events
        report.phase_locks, report.signatures_unchecked = c.phase_locks, c.signatures_unchecked
        report.applied_by_kind = dict(c.applied_by_kind)
        report.smoothing_gpus = model.smoothing_gpus
        for push in model.pushes:
            back = None if push.back_at is None else push.back_at - push.at
            seen = None
            if push.back_at is not None and push.visible_at is not None:
                seen = push.back_at - push.visible_at
            report.pushes.append(
                {
                    "rack": float(push.rack),
                    "visible_s": None if push.visible_at is None else push.visible_at - push.at,
                    "back_s": back,
                    "back_from_visible_s": seen,
                }
            )

    # --- pushes -------------------------------------------------------------------------

    def _pushable_racks(self) -> list[int]:
        """Racks whose every node is simulated and reports: their power is all known."""
        model = self.model
        reporting = np.zeros(len(model.names), dtype=bool)
        reporting[model.reporting()] = True
        out = []
        for rack in model.racks:
            children = np.flatnonzero(model.tree.parent == rack)
            names = [model.topology.names[c] for c in children]
            if all(name in model.index and reporting[model.index[name]] for name in names):
                out.append(int(rack))
        return out

    def _next_rack(self) -> int | None:
        busy = {p.rack for p in self.model.pushed()}
        free = [r for r in self._pushable if r not in busy]
        return None if not free else int(self._rng.choice(free))
