"""Phase announcements from a training job to the powerd controller.

A training loop tells the controller what it is doing (``compute``,
``checkpoint``, ``eval``, ...) on ``powerd/v1/{cluster}/jobs/{job}/phase``
(see ``docs/PROTOCOL.md`` and ``docs/JOBHOOK.md``)::

    reporter = PhaseReporter("mqtt://broker:1883", job="llama-70b-pretrain",
                             nodes=["r01-n03", "r01-n04"], priority="high",
                             enabled=(rank == 0))
    reporter.startup()
    with reporter.phase("checkpoint", expected_s=45):
        save()
    reporter.shutdown()

or, configured from the environment (``POWERD_BROKER``, ``POWERD_JOB``, ...)::

    from powerd.jobhook import phase
    with phase("checkpoint"):
        save()

Guarantees, whatever the broker does (down, slow, unreachable, wrong URL):

* No call blocks on the network: a call validates its arguments, encodes one
  payload and appends it to a small bounded queue; a background thread hands
  queued payloads to paho-mqtt's network thread (``loop_start``), which
  connects, reconnects with backoff and publishes (QoS 1).
* When the queue is full (broker unreachable or too slow) the oldest payload
  is dropped and counted (``stats().dropped``); the latest phases survive.
* No exception from the hook reaches the training loop, except ``ValueError``
  for bad arguments (invalid job or node name, unknown phase, invalid
  priority...): that is a programming error, found on the first run. Anything
  else is logged, at most once a minute per kind of trouble. A broker URL that
  does not parse is logged and turns publishing off.
* ``close()`` (and ``shutdown()``) flush what they can within
  ``flush_timeout_s``, and return within about a second more in any case.
* Every method is thread-safe. Payloads are sent in the order the calls were
  made, also across reconnects.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import logging
import math
import os
import re
import secrets
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from powerd.backoff import Backoff
from powerd.mqtt_url import NO_DELAY, BrokerSettings, parse_broker_url
from powerd.protocol import PhaseEvent, ProtocolError, Topics, encode
from powerd.protocol import check_name as _protocol_check_name
from powerd.ratelimit import LogOncePer
from powerd.vocabulary import PHASES, PRIORITIES, PROTOCOL_VERSION

__all__ = [
    "ENV_BROKER",
    "ENV_CLUSTER",
    "ENV_JOB",
    "ENV_NODES",
    "ENV_PRIORITY",
    "PRIORITIES",
    "PhaseBlock",
    "PhaseReporter",
    "ReporterStats",
    "expand_hostlist",
    "get_reporter",
    "phase",
    "set_default_reporter",
    "set_phase",
    "shutdown",
    "startup",
]

log = logging.getLogger("powerd.jobhook")

# phases a `with phase(...)` block may announce; startup and shutdown have their own calls
BLOCK_PHASES: tuple[str, ...] = tuple(p for p in PHASES if p not in ("startup", "shutdown"))
DEFAULT_RESUME_PHASE = "compute"

ENV_BROKER = "POWERD_BROKER"
ENV_JOB = "POWERD_JOB"
ENV_CLUSTER = "POWERD_CLUSTER"
ENV_PRIORITY = "POWERD_PRIORITY"
ENV_NODES = "POWERD_NODES"
# the first of these that is set gives this process's rank; only rank 0 publishes
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")

_NAME_RULE = "1 to 64 characters from A-Z a-z 0-9 . _ -, starting with a letter or digit"
_LOG_INTERVAL_S = 60.0
_TICK_S = 1.0  # housekeeping period of the sender thread (watchdog, drop logging)
_IN_FLIGHT_WINDOW = 10  # payloads handed to paho and not yet acknowledged, at most
_RESYNC_GIVE_UP_S = 30.0  # after a reconnect, wait this long at most for old payloads' acks
_CLOSE_GRACE_S = 1.0  # close() waits this much beyond flush_timeout_s for the teardown


@dataclass(frozen=True)
class ReporterStats:
    """A snapshot of a reporter's state, from ``PhaseReporter.stats()``."""

    enabled: bool  # publishing at all (False: disabled, closed before start, or a bad URL)
    connected: bool  # connected to the broker now
    queued: int  # payloads waiting in the reporter's queue
    in_flight: int  # handed to the MQTT client, not yet acknowledged by the broker
    sent: int  # acknowledged by the broker
    dropped: int  # given up: pushed out of the full queue, or left over at close
    connects: int  # successful connections so far (1 + reconnections)
    phase: str | None  # the last phase announced
    closed: bool  # close() or shutdown() was called


class PhaseReporter:
    """Announces a training job's phases on ``powerd/v1/{cluster}/jobs/{job}/phase``.

    ``broker``: ``mqtt://[user@]host[:port]`` or ``mqtts://``; ``None`` or ``""``
    turns publishing off. ``enabled=False`` also turns it off (arguments are
    still checked): pass ``enabled=(rank == 0)`` in a distributed job, so that
    one process speaks for the job. ``settings`` supplies what a URL cannot
    carry (password file, CA and client certificates); the password may also
    come from ``$POWERD_MQTT_PASSWORD``.

    Raises ``ValueError`` for bad arguments only; see the module docstring for
    what it guarantees.
    """

    def __init__(
        self,
        broker: str | None,
        job: str,
        nodes: Iterable[str] | None = None,
        *,
        priority: str = "normal",
        cluster: str = "default",
        enabled: bool = True,
        queue_size: int = 100,
        flush_timeout_s: float = 2.0,
        reconnect_max_s: float = 10.0,
        client_id: str | None = None,
        settings: BrokerSettings | None = None,
    ) -> None:
        self.job = _check_name(job, "job")
        self.cluster = _check_name(cluster, "cluster")
        self.priority = _check_priority(priority)
        self.nodes = _check_nodes(nodes)
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise ValueError(f"queue_size must be an integer >= 1, not {queue_size!r}")
        self.flush_timeout_s = _check_seconds(flush_timeout_s, "flush_timeout_s")
        reconnect_max_s = _check_seconds(reconnect_max_s, "reconnect_max_s")
        if reconnect_max_s <= 0:
            raise ValueError("reconnect_max_s must be > 0")
        if client_id is not None and not isinstance(client_id, str):
            raise ValueError(f"client_id must be a string, not {type(client_id).__name__}")
        self.topic = Topics(self.cluster).phase(self.job)
        self._check_startup_fits(self.nodes)

        self.broker = broker
        self.error: str | None = None  # why publishing is off, when it is off by failure
        self._logs = LogOncePer(log, _LOG_INTERVAL_S)
        self._log_lock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[bytes] = collections.deque()
        self._queue_size = queue_size
        self._current: str | None = None
        self._connected = False
        self._unacked = 0
        self._resync = False  # reconnected with payloads in flight: wait for them first
        self._resync_since = 0.0
        self._sent = 0
        self._dropped = 0
        self._connects = 0
        self._dropped_logged = 0
        self._closing = False
        self._close_deadline = 0.0
        self._client: mqtt.Client | None = None
        self._thread: threading.Thread | None = None
        self._settings: BrokerSettings | None = None
        self._publishing = False  # payloads go to the queue (as opposed to nowhere)

        if not enabled:
            return
        if not broker:
            log.info("phase reporting for job %s is off: no broker configured", self.job)
            return
        try:
            if not isinstance(broker, str):
                raise ValueError(f"broker must be a URL string, not {type(broker).__name__}")
            base = settings or BrokerSettings(host="localhost", port=1883)
            base = replace(
                base,
                reconnect_min_s=min(base.reconnect_min_s, reconnect_max_s),
                reconnect_max_s=reconnect_max_s,
            )
            self._settings = parse_broker_url(broker, base)
            host = self._settings.host
            try:  # what the resolver would choke on, in the network thread
                host.encode("idna")
            except UnicodeError:
                raise ValueError(f"broker host {host!r} is not a host name") from None
            self._client = self._make_client(client_id)
        except Exception as exc:  # a wrong URL or TLS file must not stop training
            self.error = f"phase reporting for job {self.job} is off: {_redact(str(exc), broker)}"
            self._client = None
            self._publishing = True  # so that lost payloads are counted as dropped
            log.error("%s", self.error)
            return
        self._publishing = True
        self._thread = threading.Thread(
            target=self._run, name=f"powerd-jobhook-{self.job}", daemon=True
        )
        _open_reporters.add(self)
        self._thread.start()
        log.info(
            "phase reporting for job %s to %s on %s", self.job, self._settings.display, self.topic
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> PhaseReporter:
        """A reporter configured from the environment: see ``_reporter_from_env``."""
        return _reporter_from_env(environ, **overrides)

    # --- what a training loop calls ---------------------------------------------

    def startup(self, nodes: Iterable[str] | None = None, expected_s: float | None = None) -> None:
        """Announce ``startup`` with the job's nodes (``nodes`` replaces the list given before)."""
        expected = _check_expected(expected_s)
        if nodes is not None:
            checked = _check_nodes(nodes)
            self._check_startup_fits(checked)
            self.nodes = checked
        self._announce("startup", expected, self.nodes)

    def set_phase(self, phase: str, expected_s: float | None = None) -> None:
        """Announce that the job is now in ``phase`` (until the next announcement)."""
        self._announce(_check_phase(phase, PHASES), _check_expected(expected_s))

    def phase(
        self, phase: str, expected_s: float | None = None, then: str | None = None
    ) -> PhaseBlock:
        """A ``with`` block in ``phase``: announced on entry, and on exit (even when the
        block raises) the phase it interrupted is announced again, or ``then`` if given.

        The interrupted phase is the current one, except that before any phase, and
        after ``startup``, it is ``compute``.
        """
        checked = _check_phase(phase, BLOCK_PHASES)
        expected = _check_expected(expected_s)
        resume = None if then is None else _check_phase(then, PHASES)
        return PhaseBlock(self, checked, expected, resume)

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Announce ``shutdown``, then ``close()``."""
        self._announce("shutdown", None)
        self.close(timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """Send what can be sent within ``timeout_s`` (default ``flush_timeout_s``), then
        disconnect. Returns within about ``timeout_s`` + 1 s whatever the broker does;
        payloads not sent by then are counted as dropped. Calling it again does nothing.
        """
        try:
            timeout = self.flush_timeout_s if timeout_s is None else _check_seconds(timeout_s)
            with self._cond:
                if not self._closing:
                    self._closing = True
                    self._close_deadline = time.monotonic() + timeout
                    self._cond.notify_all()
                deadline = self._close_deadline
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()) + _CLOSE_GRACE_S)
        except ValueError:
            raise
        except Exception as exc:
            self._warn("internal", "phase reporter of job %s: close failed: %r", self.job, exc)

    # --- state, for tests and for the end of a run --------------------------------

    @property
    def current_phase(self) -> str | None:
        return self._current

    @property
    def enabled(self) -> bool:
        return self._client is not None

    def stats(self) -> ReporterStats:
        with self._cond:
            return self._stats_locked()

    def wait_until(self, predicate: Callable[[ReporterStats], bool], timeout_s: float) -> bool:
        """Block until ``predicate(stats)`` holds, at most ``timeout_s``; return whether it does.

        Woken by every change of state, so no polling. The training loop never needs
        this; it is for tests, and for a script that wants to know.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not predicate(self._stats_locked()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def wait_connected(self, timeout_s: float) -> bool:
        return self.wait_until(lambda s: s.connected, timeout_s)

    def flush(self, timeout_s: float) -> bool:
        """Block until every payload so far is acknowledged, at most ``timeout_s``."""
        if self._client is None:
            return True
        return self.wait_until(lambda s: s.queued == 0 and s.in_flight == 0, timeout_s)

    def __enter__(self) -> PhaseReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self._settings.display if self._settings else "off"
        return f"PhaseReporter(job={self.job!r}, cluster={self.cluster!r}, broker={where})"

    # --- internals: caller side (never blocks: one short lock, no I/O) -----------

    def _announce(
        self, phase: str, expected_s: float | None, nodes: list[str] | None = None
    ) -> None:
        """Record and queue one phase change. Arguments are already checked."""
        self._record(phase, expected_s, nodes, None, block=False)

    def _enter_block(self, phase: str, expected_s: float | None, then: str | None) -> str:
        """Announce ``phase``; return the phase to announce when the block ends."""
        return self._record(phase, expected_s, None, then, block=True)

    def _record(
        self,
        phase: str,
        expected_s: float | None,
        nodes: list[str] | None,
        then: str | None,
        block: bool,
    ) -> str:
        """Make ``phase`` current and queue its payload; return the phase a block resumes.

        One lock round, no I/O: the queue's order is the order of the calls, and the
        phase a block resumes is the one current when it began.
        """
        resume = then or DEFAULT_RESUME_PHASE
        payload = None
        if self._publishing:
            try:
                payload = self._encode(phase, expected_s, nodes)
            except Exception as exc:  # never into the training loop
                self._warn("internal", "phase reporter of job %s failed: %r", self.job, exc)
        try:
            closed = False
            with self._cond:
                if block and then is None and self._current in BLOCK_PHASES:
                    resume = self._current
                self._current = phase
                if payload is None:
                    pass
                elif self._client is None:  # publishing was meant, but the broker URL is bad
                    self._dropped += 1
                elif self._closing:
                    closed = True
                else:
                    if len(self._queue) >= self._queue_size:
                        self._queue.popleft()  # the oldest goes: the latest phases matter most
                        self._dropped += 1
                    self._queue.append(payload)
                    self._cond.notify_all()
            if closed:
                self._warn(
                    "closed", "phase reporter of job %s is closed: %s not sent", self.job, phase
                )
        except Exception as exc:
            self._warn("internal", "phase reporter of job %s failed: %r", self.job, exc)
        return resume

    def _encode(self, phase: str, expected_s: float | None, nodes: list[str] | None) -> bytes:
        event = PhaseEvent(
            v=PROTOCOL_VERSION,
            job=self.job,
            ts=time.time(),
            phase=phase,  # type: ignore[arg-type]
            nodes=nodes,
            priority=self.priority,  # type: ignore[arg-type]
            expected_s=expected_s,
        )
        return encode(event)

    def _check_startup_fits(self, nodes: list[str] | None) -> None:
        """A node list too long for one payload is an argument error: find it now."""
        if nodes is None:
            return
        try:
            self._encode("startup", 0.0, nodes)
        except ProtocolError as exc:
            raise ValueError(f"{len(nodes)} nodes do not fit in one phase payload: {exc}") from None

    def _stats_locked(self) -> ReporterStats:
        return ReporterStats(
            enabled=self._client is not None,
            connected=self._connected,
            queued=len(self._queue),
            in_flight=self._unacked,
            sent=self._sent,
            dropped=self._dropped,
            connects=self._connects,
            phase=self._current,
            closed=self._closing,
        )

    def _warn(self, key: str, msg: str, *args: object) -> None:
        """Log a warning at most once a minute per ``key``; never raises."""
        try:
            with self._log_lock:
                self._logs.warning(key, time.monotonic(), msg, *args)
        except Exception:
            pass

    # --- internals: the MQTT client and its callbacks (paho's network thread) ----

    def _make_client(self, client_id: str | None) -> mqtt.Client:
        settings = self._settings
        assert settings is not None
        client = _MqttClient(
            CallbackAPIVersion.VERSION2,
            client_id=client_id or f"powerd-job-{self.job}-{secrets.token_hex(4)}",
            clean_session=True,
            protocol=mqtt.MQTTv311,
        )
        client.powerd_on_crash = self._on_network_crash
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_socket_open = _set_no_delay
        # typed int in paho, used as seconds in float arithmetic: sub-second delays work
        client.reconnect_delay_set(
            settings.reconnect_min_s,  # type: ignore[arg-type]
            settings.reconnect_max_s,  # type: ignore[arg-type]
        )
        client.max_inflight_messages_set(_IN_FLIGHT_WINDOW)
        if settings.username:
            client.username_pw_set(settings.username, settings.password())
        if settings.tls:
            context = ssl.create_default_context(cafile=settings.ca_file)
            if settings.cert_file:
                context.load_cert_chain(settings.cert_file, settings.key_file)
            client.tls_set_context(context)
        # no network I/O here: the connection is made by the network thread
        client.connect_async(settings.host, settings.port, keepalive=int(settings.keepalive_s))
        return client

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        try:
            if reason.is_failure:
                self._warn(
                    "connect",
                    "broker %s refused phase reporter of job %s: %s; retrying",
                    self._display(),
                    self.job,
                    reason,
                )
                return
            with self._cond:
                self._connected = True
                self._connects += 1
                self._resync = self._unacked > 0
                self._resync_since = time.monotonic()
                self._cond.notify_all()
            log.debug("phase reporter of job %s connected to %s", self.job, self._display())
        except Exception:
            pass

    def _on_network_crash(self, exc: BaseException) -> None:
        self._warn(
            "network",
            "phase reporter of job %s: MQTT network thread failed (%r); restarting it",
            self.job,
            exc,
        )

    def _on_connect_fail(self, client: Any, userdata: Any) -> None:
        self._warn(
            "connect",
            "phase reporter of job %s cannot connect to %s; retrying in the background",
            self.job,
            self._display(),
        )

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any
    ) -> None:
        try:
            with self._cond:
                self._connected = False
                closing = self._closing
                self._cond.notify_all()
            if not closing:
                self._warn(
                    "disconnect",
                    "phase reporter of job %s lost broker %s (%s); reconnecting in the background",
                    self.job,
                    self._display(),
                    reason,
                )
        except Exception:
            pass

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        try:
            with self._cond:
                self._unacked = max(0, self._unacked - 1)
                self._sent += 1
                if self._unacked == 0:
                    self._resync = False
                self._cond.notify_all()
        except Exception:
            pass

    def _display(self) -> str:
        return self._settings.display if self._settings else "(no broker)"

    # --- internals: the sender thread ---------------------------------------------

    def _sendable(self) -> bool:
        return (
            self._connected
            and bool(self._queue)
            and self._unacked < _IN_FLIGHT_WINDOW
            and not self._resync
        )

    def _run(self) -> None:
        """Move payloads from the queue to paho, in order; watch paho's thread; tear down."""
        client = self._client
        assert client is not None
        restarts = Backoff(1.0, 60.0)
        next_restart = 0.0
        next_tick = 0.0
        try:
            client.loop_start()
            while True:
                payload = None
                with self._cond:
                    now = time.monotonic()
                    if self._closing and (
                        (not self._queue and self._unacked == 0) or now >= self._close_deadline
                    ):
                        left = len(self._queue) + self._unacked
                        self._dropped += left
                        self._queue.clear()
                        self._unacked = 0
                        self._cond.notify_all()
                        break
                    if self._sendable():
                        payload = self._queue.popleft()
                        self._unacked += 1
                    elif now < next_tick:
                        wait = next_tick - now
                        if self._closing:
                            wait = min(wait, self._close_deadline - now)
                        self._cond.wait(max(0.0, wait))
                if payload is not None:
                    self._send(client, payload)
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + _TICK_S
                    next_restart = self._housekeeping(client, restarts, next_restart, now)
        except Exception as exc:
            self._warn("internal", "phase reporter of job %s stopped: %r", self.job, exc)
            with self._cond:
                self._dropped += len(self._queue) + self._unacked
                self._queue.clear()
                self._unacked = 0
                self._closing = True
                self._cond.notify_all()
        finally:
            self._teardown(client)

    def _send(self, client: mqtt.Client, payload: bytes) -> None:
        try:
            info = client.publish(self.topic, payload, qos=1)
            # NO_CONN is fine: paho keeps a QoS 1 message and sends it on reconnection
            kept = info.rc != MQTTErrorCode.MQTT_ERR_QUEUE_SIZE
        except Exception as exc:
            kept = False
            self._warn("publish", "phase reporter of job %s cannot publish: %r", self.job, exc)
        if not kept:
            with self._cond:
                self._unacked = max(0, self._unacked - 1)
                self._dropped += 1
                self._cond.notify_all()

    def _housekeeping(
        self, client: mqtt.Client, restarts: Backoff, next_restart: float, now: float
    ) -> float:
        with self._cond:
            dropped = self._dropped
            if self._resync and now - self._resync_since > _RESYNC_GIVE_UP_S:
                # paho should have sent them again; if it has not, stop waiting for it
                self._dropped += self._unacked
                self._unacked = 0
                self._resync = False
                self._cond.notify_all()
            closing = self._closing
        if dropped > self._dropped_logged:
            self._dropped_logged = dropped
            self._warn(
                "dropped",
                "phase reporter of job %s has dropped %d phase events so far "
                "(queue of %d full: broker %s unreachable or slow)",
                self.job,
                dropped,
                self._queue_size,
                self._display(),
            )
        # paho's network thread ends on an unexpected exception (a host name the
        # resolver cannot even encode, for one): start it again, with backoff
        if not closing and now >= next_restart and _thread_of(client) is None:
            with self._cond:
                self._connected = False
                self._cond.notify_all()
            settings = self._settings
            assert settings is not None
            client.connect_async(settings.host, settings.port, int(settings.keepalive_s))
            client.loop_start()
            return now + restarts.next_delay_s()
        return next_restart

    def _teardown(self, client: mqtt.Client) -> None:
        """Disconnect and stop paho's thread (this may wait for a connect attempt to time out)."""
        for step in (client.disconnect, client.loop_stop):
            with contextlib.suppress(Exception):
                step()
        with self._cond:
            self._connected = False
            self._cond.notify_all()
            sent, dropped = self._sent, self._dropped
        _open_reporters.discard(self)
        if dropped:
            log.warning(
                "phase reporter of job %s closed: %d phase events sent, %d dropped",
                self.job,
                sent,
                dropped,
            )

    def _after_fork_in_child(self) -> None:
        """A forked child (a data loader worker) gets fresh locks and never publishes."""
        self._cond = threading.Condition(threading.Lock())
        self._log_lock = threading.Lock()
        self._queue.clear()
        self._publishing = False
        self._closing = True
        self._connected = False
        self._client = None
        self._thread = None


class _MqttClient(mqtt.Client):
    """paho's client; its network thread reports an unexpected exception to
    ``powerd_on_crash`` (logged once a minute) instead of printing a traceback."""

    powerd_on_crash: Callable[[BaseException], None] | None = None

    def _thread_main(self) -> None:
        try:
            super()._thread_main()
        except Exception as exc:
            callback = self.powerd_on_crash
            if callback is not None:
                with contextlib.suppress(Exception):
                    callback(exc)


class PhaseBlock:
    """The ``with`` block returned by ``PhaseReporter.phase()`` (and ``jobhook.phase()``)."""

    def __init__(
        self, reporter: PhaseReporter, phase: str, expected_s: float | None, then: str | None
    ) -> None:
        self.reporter = reporter
        self.phase = phase
        self.expected_s = expected_s
        self.then = then
        self.resume: str | None = None

    def __enter__(self) -> PhaseBlock:
        self.resume = self.reporter._enter_block(self.phase, self.expected_s, self.then)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # returns None: an exception from the block goes on unchanged
        self.reporter._announce(self.resume or DEFAULT_RESUME_PHASE, None)


# --- argument checks: ValueError with a message that says what to fix ------------


def _check_name(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} name must be a string, not {type(value).__name__}")
    try:
        return _protocol_check_name(value, what)
    except ProtocolError:
        raise ValueError(f"invalid {what} name {value!r}: use {_NAME_RULE}") from None


def _check_nodes(nodes: Iterable[str] | None) -> list[str] | None:
    if nodes is None:
        return None
    if isinstance(nodes, str | bytes):
        raise ValueError(f"nodes must be a list of node names, not the string {nodes!r}")
    try:
        items = list(nodes)
    except TypeError:
        raise ValueError(f"nodes must be a list of node names, not {nodes!r}") from None
    return [_check_name(node, "node") for node in items]


def _check_priority(priority: object) -> str:
    if not isinstance(priority, str) or priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, not {priority!r}")
    return priority


def _check_phase(phase: object, allowed: tuple[str, ...]) -> str:
    if isinstance(phase, str) and phase in allowed:
        return phase
    if isinstance(phase, str) and phase in PHASES:
        raise ValueError(
            f"phase {phase!r} cannot be a `with` block: use startup() or shutdown(); "
            f"a block is one of {', '.join(allowed)}"
        )
    raise ValueError(f"unknown phase {phase!r}: use one of {', '.join(allowed)}")


def _check_expected(expected_s: object) -> float | None:
    if expected_s is None:
        return None
    return _check_seconds(expected_s, "expected_s")


def _check_seconds(value: object, what: str = "timeout_s") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, not {value!r}")
    return float(value)


def _redact(text: str, url: object) -> str:
    """``text`` without the password a malformed broker URL may carry."""
    try:
        password = urlsplit(str(url)).password
    except ValueError:
        password = None
    return text.replace(password, "***") if password else text


def _set_no_delay(client: Any, userdata: Any, sock: Any) -> None:
    try:
        for option in NO_DELAY:
            sock.setsockopt(*option)
    except Exception:
        pass  # not critical: only latency


def _thread_of(client: mqtt.Client) -> threading.Thread | None:
    """paho's network thread, None once it has ended (paho keeps it in ``_thread``)."""
    thread = getattr(client, "_thread", None)
    return thread if thread is not None and thread.is_alive() else None


# --- configuration from the environment ----------------------------------------


def expand_hostlist(spec: str) -> list[str]:
    """Expand a Slurm-style host list: ``"r01-n[03-05,07],gpu7"`` -> five names.

    Raises ValueError on a malformed list.
    """
    items: list[str] = []
    depth = 0
    current = ""
    for char in spec:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {spec!r}")
        if depth == 0 and (char == "," or char.isspace()):
            if current:
                items.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {spec!r}")
    if current:
        items.append(current)
    hosts: list[str] = []
    for item in items:
        parts = re.split(r"(\[[^\[\]]*\])", item)
        choices: list[list[str]] = []
        for part in parts:
            if part.startswith("[") and part.endswith("]"):
                choices.append(_expand_range(part[1:-1], spec))
            elif "[" in part or "]" in part:
                raise ValueError(f"nested brackets in host list {spec!r}")
            else:
                choices.append([part])
        count = math.prod(len(c) for c in choices)
        if len(hosts) + count > 100_000:
            raise ValueError(f"host list {spec!r} expands to too many names")
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def _expand_range(body: str, spec: str) -> list[str]:
    out: list[str] = []
    for piece in body.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", piece.strip())
        if not match:
            raise ValueError(f"bad range {piece!r} in host list {spec!r}")
        start, end = match.group(1), match.group(2) or match.group(1)
        if int(end) < int(start) or int(end) - int(start) > 100_000:
            raise ValueError(f"bad range {piece!r} in host list {spec!r}")
        width = len(start)
        out.extend(f"{n:0{width}d}" for n in range(int(start), int(end) + 1))
    return out


def _env_rank(env: Mapping[str, str]) -> int:
    for variable in RANK_VARIABLES:
        value = env.get(variable, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{variable}={value!r} is not an integer rank") from None
    return 0


def _env_nodes(env: Mapping[str, str]) -> list[str] | None:
    spec = env.get(ENV_NODES, "").strip()
    if spec:
        try:
            return _check_nodes(expand_hostlist(spec))
        except ValueError as exc:
            raise ValueError(f"{ENV_NODES}: {exc}") from None
    slurm = env.get("SLURM_JOB_NODELIST", "").strip()
    if slurm:
        try:
            return _check_nodes(expand_hostlist(slurm))
        except ValueError as exc:
            log.warning("SLURM_JOB_NODELIST not used for the phase reporter's nodes: %s", exc)
            return None
    world, local = env.get("WORLD_SIZE"), env.get("LOCAL_WORLD_SIZE")
    if world is None or world == local:  # one node: this one
        host = socket.gethostname().split(".")[0]
        try:
            return [_check_name(host, "node")]
        except ValueError:
            return None
    return None  # several nodes and no list: the controller infers them from telemetry


def _reporter_from_env(environ: Mapping[str, str] | None = None, **overrides: Any) -> PhaseReporter:
    """A reporter configured from the environment; ``overrides`` go to ``PhaseReporter``.

    ``POWERD_BROKER``: broker URL; unset, the reporter is off (every call is a no-op).
    ``POWERD_JOB``: job name (else ``slurm-$SLURM_JOB_ID``); required when a broker is set.
    ``POWERD_CLUSTER`` (``default``), ``POWERD_PRIORITY`` (``normal``).
    ``POWERD_NODES``: node names, comma separated, Slurm ranges allowed
    (``r01-n[03-06]``); else ``$SLURM_JOB_NODELIST``; else this host in a
    single-node job; else omitted.
    Only rank 0 (``$RANK``, else ``$SLURM_PROCID``, ``$OMPI_COMM_WORLD_RANK``,
    ``$PMI_RANK``; 0 when none is set) publishes.
    A malformed value raises ValueError naming its variable.
    """
    env = os.environ if environ is None else environ
    broker = env.get(ENV_BROKER, "").strip() or None
    job = env.get(ENV_JOB, "").strip()
    if not job and env.get("SLURM_JOB_ID", "").strip():
        job = f"slurm-{env['SLURM_JOB_ID'].strip()}"
    if not job:
        if broker:
            raise ValueError(f"{ENV_BROKER} is set but {ENV_JOB} is not: name the job in {ENV_JOB}")
        job = "unnamed-job"  # reporting is off anyway
    kwargs: dict[str, Any] = {}
    for variable, key, default, check in (
        (ENV_JOB, "job", job, lambda v: _check_name(v, "job")),
        (ENV_CLUSTER, "cluster", "default", lambda v: _check_name(v, "cluster")),
        (ENV_PRIORITY, "priority", "normal", _check_priority),
    ):
        value = env.get(variable, "").strip() or default
        try:
            kwargs[key] = check(value)
        except ValueError as exc:
            raise ValueError(f"{variable}: {exc}") from None
    kwargs["nodes"] = _env_nodes(env)
    kwargs["enabled"] = _env_rank(env) == 0
    kwargs.update(overrides)
    return PhaseReporter(broker, **kwargs)


# --- the module-level reporter: `from powerd.jobhook import phase` ---------------

_default: PhaseReporter | None = None
_default_lock = threading.Lock()
_open_reporters: weakref.WeakSet[PhaseReporter] = weakref.WeakSet()


def get_reporter() -> PhaseReporter:
    """The process's default reporter, made from the environment on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = PhaseReporter.from_env()
        return _default


def set_default_reporter(reporter: PhaseReporter | None) -> PhaseReporter | None:
    """Replace the default reporter (None: made from the environment again on next use).

    Returns the previous one, not closed.
    """
    global _default
    with _default_lock:
        previous, _default = _default, reporter
    return previous


def startup(nodes: Iterable[str] | None = None, expected_s: float | None = None) -> None:
    get_reporter().startup(nodes, expected_s)


def set_phase(phase: str, expected_s: float | None = None) -> None:
    get_reporter().set_phase(phase, expected_s)


def phase(phase: str, expected_s: float | None = None, then: str | None = None) -> PhaseBlock:
    return get_reporter().phase(phase, expected_s, then)


def shutdown(timeout_s: float | None = None) -> None:
    get_reporter().shutdown(timeout_s)


@atexit.register
def _close_all_at_exit() -> None:
    """Flush reporters left open (each within its own flush timeout)."""
    for reporter in list(_open_reporters):
        reporter.close()


def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()
    for reporter in list(_open_reporters):
        reporter._after_fork_in_child()
    _open_reporters.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
