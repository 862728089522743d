"""The job hook's sending side: an ordered, bounded queue of payloads, a sender
thread, and paho-mqtt's client, which publishes them at QoS 1 on one topic.

``Publisher`` is what ``PhaseReporter`` talks to: ``enqueue`` (never blocks:
one short lock, no I/O), ``stats``, ``flush``, ``close``. Everything about
paho stays in this module.

How payloads move: callers append to a deque of at most ``queue_size``
payloads (when full, the oldest is dropped and counted). The sender thread
hands them to paho in order, at most ``_IN_FLIGHT_WINDOW`` unacknowledged at
a time, only while connected. paho's network thread (``loop_start``)
connects, reconnects with backoff and publishes; QoS 1 messages it holds when
a connection drops are sent again on reconnection, so after a reconnect the
sender waits for those acknowledgements (``resync``, at most
``_RESYNC_GIVE_UP_S``) before handing paho anything newer: the order survives
reconnects.

Why this module overrides paho internals (paho-mqtt 2.x, private API):
paho's network thread ends on an unexpected exception (a host name the
resolver cannot even encode, an ``on_socket_open`` callback that raises...),
prints a traceback through ``threading.excepthook`` and never reconnects
again. A training job must neither see that traceback nor lose its reporter,
so ``_MqttClient`` overrides the private ``_thread_main`` to hand the
exception to ``powerd_on_crash`` (logged at most once a minute), and
``_thread_of`` reads paho's private ``_thread`` to notice that the network
thread has ended, so that the sender thread starts it again, with backoff.
No other module touches paho's internals.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import secrets
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from powerd.backoff import Backoff
from powerd.mqtt.url import NO_DELAY, BrokerSettings

log = logging.getLogger("powerd.jobhook")

_TICK_S = 1.0  # housekeeping period of the sender thread (watchdog, drop logging)
_IN_FLIGHT_WINDOW = 10  # payloads handed to paho and not yet acknowledged, at most
_RESYNC_GIVE_UP_S = 30.0  # after a reconnect, wait this long at most for old payloads' acks
_CLOSE_GRACE_S = 1.0  # close() waits this much beyond its timeout_s for the teardown


class Warn(Protocol):
    """Logs a warning at most once a minute per ``key``; never raises."""

    def __call__(self, key: str, msg: str, *args: object) -> None: ...


@dataclass(frozen=True)
class PublisherStats:
    """A snapshot of a publisher's state, from ``Publisher.stats()``."""

    connected: bool  # connected to the broker now
    queued: int  # payloads waiting in the queue
    in_flight: int  # handed to paho, not yet acknowledged by the broker
    sent: int  # acknowledged by the broker
    dropped: int  # given up: pushed out of the full queue, or left over at close
    connects: int  # successful connections so far (1 + reconnections)
    closed: bool  # close() was called, or the sender thread stopped


class Publisher:
    """Publishes payloads on ``topic``, in the order they were queued, at QoS 1.

    Makes paho's client on construction (no network I/O: a bad TLS or password
    file raises here); ``start()`` starts the sender thread, which starts paho's.

    ``cond`` guards all of the publisher's state, and is notified on every
    change of it. The caller may share it (``PhaseReporter`` does: it makes a
    phase current and queues its payload in one step, and waits on it for any
    change of ``stats()``); it must then be reentrant (an ``RLock``'s), since the
    caller may hold it while calling ``enqueue`` or ``stats``. ``warn`` logs
    trouble at most once a minute per kind. ``on_stopped`` is called once the
    sender thread has torn the connection down.
    """

    def __init__(
        self,
        settings: BrokerSettings,
        topic: str,
        *,
        job: str,
        queue_size: int,
        warn: Warn,
        client_id: str | None = None,
        cond: threading.Condition | None = None,
        on_stopped: Callable[[], None] | None = None,
    ) -> None:
        self.topic = topic
        self.job = job  # for log messages and the thread's name
        self._settings = settings
        self._queue_size = queue_size
        self._warn = warn
        self._on_stopped = on_stopped
        self._cond = cond if cond is not None else threading.Condition(threading.RLock())
        self._queue: collections.deque[bytes] = collections.deque()
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
        self._thread: threading.Thread | None = None
        self._client: mqtt.Client | None = self._make_client(client_id)

    # --- the interface: callers' side (never blocks: one short lock, no I/O) -----

    def start(self) -> None:
        """Start the sender thread (once)."""
        self._thread = threading.Thread(
            target=self._run, name=f"powerd-jobhook-{self.job}", daemon=True
        )
        self._thread.start()

    @property
    def enabled(self) -> bool:
        """Whether it publishes at all (False in a forked child)."""
        return self._client is not None

    @property
    def client(self) -> mqtt.Client | None:
        """paho's client, for tests (None in a forked child)."""
        return self._client

    @property
    def display(self) -> str:
        """The broker, for log messages (no password)."""
        return self._settings.display

    def enqueue(self, payload: bytes) -> bool:
        """Queue ``payload`` after those queued before; False (and nothing queued) once
        closed. When the queue is full the oldest payload is dropped and counted."""
        with self._cond:
            if self._closing:
                return False
            if len(self._queue) >= self._queue_size:
                self._queue.popleft()  # the oldest goes: the latest phases matter most
                self._dropped += 1
            self._queue.append(payload)
            self._cond.notify_all()
            return True

    def stats(self) -> PublisherStats:
        with self._cond:
            return PublisherStats(
                connected=self._connected,
                queued=len(self._queue),
                in_flight=self._unacked,
                sent=self._sent,
                dropped=self._dropped,
                connects=self._connects,
                closed=self._closing,
            )

    def flush(self, timeout_s: float) -> bool:
        """Block until every payload so far is acknowledged, at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._unacked:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout_s: float) -> None:
        """Send what can be sent within ``timeout_s``, then disconnect. Returns within
        about ``timeout_s`` + 1 s whatever the broker does; payloads not sent by then
        are counted as dropped. A second call changes nothing: it waits, at most, as long
        as the first one.
        """
        with self._cond:
            if not self._closing:
                self._closing = True
                self._close_deadline = time.monotonic() + timeout_s
                self._cond.notify_all()
            deadline = self._close_deadline
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()) + _CLOSE_GRACE_S)

    def after_fork_in_child(self, cond: threading.Condition) -> None:
        """In a forked child: take ``cond`` (fresh) and never publish."""
        self._cond = cond
        self._queue.clear()
        self._closing = True
        self._connected = False
        self._client = None
        self._thread = None

    # --- paho's client and its callbacks (paho's network thread) -----------------

    def _make_client(self, client_id: str | None) -> mqtt.Client:
        settings = self._settings
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
        client.max_inflight_messages_set(_IN_FLIGHT_WINDOW)
        connect_async(client, settings)
        return client

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        try:
            if reason.is_failure:
                self._warn(
                    "connect",
                    "broker %s refused phase reporter of job %s: %s; retrying",
                    self.display,
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
            log.debug("phase reporter of job %s connected to %s", self.job, self.display)
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
            self.display,
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
                    self.display,
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

    # --- the sender thread ----------------------------------------------------------

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
                self.display,
            )
        # paho's network thread ends on an unexpected exception (a host name the
        # resolver cannot even encode, for one): start it again, with backoff
        if not closing and now >= next_restart and _thread_of(client) is None:
            with self._cond:
                self._connected = False
                self._cond.notify_all()
            settings = self._settings
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
        if self._on_stopped is not None:
            self._on_stopped()
        if dropped:
            log.warning(
                "phase reporter of job %s closed: %d phase events sent, %d dropped",
                self.job,
                sent,
                dropped,
            )


class _MqttClient(mqtt.Client):
    """paho's client; its network thread reports an unexpected exception to
    ``powerd_on_crash`` (logged once a minute) instead of printing a traceback.

    Overrides paho's private ``_thread_main``: see the module docstring for why.
    """

    powerd_on_crash: Callable[[BaseException], None] | None = None

    def _thread_main(self) -> None:
        try:
            super()._thread_main()
        except Exception as exc:
            callback = self.powerd_on_crash
            if callback is not None:
                with contextlib.suppress(Exception):
                    callback(exc)


def connect_async(client: mqtt.Client, settings: BrokerSettings) -> None:
    """Set up a paho client as ``settings`` say (login, TLS, reconnect delays, no Nagle)
    and start connecting; no network I/O here: the network thread connects."""
    client.on_socket_open = _set_no_delay
    # typed int in paho, used as seconds in float arithmetic: sub-second delays work
    client.reconnect_delay_set(
        settings.reconnect_min_s,  # type: ignore[arg-type]
        settings.reconnect_max_s,  # type: ignore[arg-type]
    )
    if settings.username:
        client.username_pw_set(settings.username, settings.password())
    if settings.tls:
        context = ssl.create_default_context(cafile=settings.ca_file)
        if settings.cert_file:
            context.load_cert_chain(settings.cert_file, settings.key_file)
        client.tls_set_context(context)
    client.connect_async(settings.host, settings.port, keepalive=int(settings.keepalive_s))


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
