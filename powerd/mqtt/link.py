"""One MQTT connection on the asyncio event loop, for the controller's traffic volumes.

paho's external-loop API (``loop_read``, ``loop_write``, ``loop_misc`` and the
socket callbacks: the way aiomqtt drives paho too), with three differences
that matter at 20,000 messages a second (bench/RESULTS.md, "scale"):

- **Reading drains.** A readable socket is read message after message for up
  to ``DRAIN_S`` before the loop runs anything else: one wake-up takes
  hundreds of messages, and each is handed to ``on_message(topic, payload,
  arrived, retained)`` as it comes, with no message object, queue or task of ours.
- **Publishing never waits.** ``publish`` queues the packet in paho and
  returns; QoS 1 acknowledgements are paho's business. aiomqtt awaits each
  PUBACK and looks through every pending call on each publish: O(n^2) with
  thousands of commands in flight (65 s of CPU in 90 s, profiled), and a
  PUBACK late because the broker is busy became an error that ended the
  session. paho's in-flight window is unlimited (``max_inflight_messages``
  0): with a window, paho walks its whole queue on every PUBACK.
- **Sessions are the caller's.** ``connect()`` returns once the broker has
  accepted the connection and every subscription; ``lost`` resolves when the
  connection is gone; the caller decides about backoff and what a session is.

The agent keeps aiomqtt: one node's traffic is a few messages a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from powerd.mqtt.url import NO_DELAY, BrokerSettings

log = logging.getLogger("powerd.mqtt")

# Longest the loop stays on one readable socket before it runs its other callbacks
# (heartbeats, cycles, the other connection): a few hundred messages.
DRAIN_S = 0.005
CONNECT_TIMEOUT_S = 10.0

# topic, payload, monotonic arrival time, retained (delivered on subscribe: not sent now)
OnMessage = Callable[[str, bytes, float, bool], None]
LINK_ERRORS = (OSError, TimeoutError, ssl.SSLError)


def paho_client(broker: BrokerSettings, client_id: str) -> mqtt.Client:
    """A paho client for ``broker`` (MQTT 3.1.1, clean session, its login and TLS), with
    no limit of its own on messages queued or in flight: its callers bound those."""
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        clean_session=True,
        protocol=mqtt.MQTTv311,
    )
    kwargs = broker.client_kwargs()
    if "username" in kwargs:
        client.username_pw_set(kwargs["username"], kwargs["password"])
    if "tls_context" in kwargs:
        client.tls_set_context(kwargs["tls_context"])
    # unlimited in flight: with a window, paho walks its whole queue on every PUBACK
    client.max_inflight_messages_set(0)
    client.max_queued_messages_set(0)
    return client


SUBSCRIPTIONS_PER_PACKET = 256


class LinkError(Exception):
    """The broker refused the connection or a subscription, or the connection broke."""


class MqttLink:
    def __init__(
        self,
        broker: BrokerSettings,
        client_id: str,
        subscriptions: Sequence[tuple[str, int]],
        on_message: OnMessage,
        monotonic: Callable[[], float] = time.monotonic,
        no_delay: bool = True,
        refuse_retained: Callable[[str], bool] | None = None,
    ) -> None:
        """``no_delay``: TCP_NODELAY, for a connection that publishes (acks, commands).
        ``refuse_retained``: topics on which a retained message is never legitimate
        (a job's phases): such a message is dropped before ``on_message``, counted in
        ``retained_refused``. paho reads a message whole whatever its size (MQTT 3.1.1
        has no way to refuse one): the broker's ``max_packet_size`` bounds it."""
        self.broker = broker
        self.client_id = client_id
        self.subscriptions = list(subscriptions)
        self.on_message = on_message
        self.no_delay = no_delay
        self.connected = asyncio.Event()
        self.sessions = 0  # connections accepted so far
        self.received = 0  # messages handed to on_message
        self.retained_refused = 0  # retained messages dropped (refuse_retained)
        self._refuse_retained = refuse_retained
        self._monotonic = monotonic
        self._now = 0.0  # the arrival time stamped on the messages of one drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: mqtt.Client | None = None
        self._ready: asyncio.Future[None] | None = None
        self.lost: asyncio.Future[str] | None = None
        self._unsubscribed = 0
        self._misc: asyncio.Task[None] | None = None
        self._published: dict[int, asyncio.Future[None]] = {}

    # --- what the caller does ----------------------------------------------------------

    async def connect(self) -> None:
        """Connect and subscribe; raises LinkError, OSError or TimeoutError if that fails."""
        loop = self._loop = asyncio.get_running_loop()
        self._ready, self.lost = loop.create_future(), loop.create_future()
        client = self._client = self._new_client()
        try:
            await loop.run_in_executor(
                None, client.connect, self.broker.host, self.broker.port, self._keepalive_s
            )
            sock = client.socket()
            if self.no_delay and isinstance(sock, socket.socket):  # TLS sockets are too
                for option in NO_DELAY:
                    sock.setsockopt(*option)
            async with asyncio.timeout(CONNECT_TIMEOUT_S):  # not wait_for: see powerd.mqtt.stream
                await asyncio.shield(self._ready)
        except BaseException:
            self.close()
            raise
        self.sessions += 1
        self.connected.set()
        self._misc = asyncio.create_task(self._keepalive(client))

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> int | None:
        """Queue a message; its mid, or None when there is no connection to queue it on."""
        client = self._client
        if client is None or not self.connected.is_set():
            return None
        info = client.publish(topic, payload, qos=qos, retain=retain)
        return info.mid if info.rc == mqtt.MQTT_ERR_SUCCESS else None

    async def published(self, mid: int, timeout_s: float) -> bool:
        """Wait until the broker acknowledged QoS 1 message ``mid``; False on timeout."""
        assert self._loop is not None
        future = self._published.setdefault(mid, self._loop.create_future())
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(future)
            return True
        except TimeoutError:
            return False
        finally:
            self._published.pop(mid, None)

    def close(self) -> None:
        """Disconnect (a DISCONNECT if the socket takes it at once) and stop watching."""
        self.connected.clear()
        if self._misc is not None:
            self._misc.cancel()
            self._misc = None
        client, self._client = self._client, None
        if client is None:
            return
        sock = client.socket()
        if isinstance(sock, socket.socket) and self._loop is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(sock.fileno())
                self._loop.remove_writer(sock.fileno())
        with contextlib.suppress(Exception):
            client.disconnect()  # queues DISCONNECT; paho closes the socket once it is written
            client.loop_write()
        sock = client.socket()
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.close()
        self._lose("closed")

    # --- paho -------------------------------------------------------------------------

    @property
    def _keepalive_s(self) -> int:
        return int(self.broker.keepalive_s)

    def _new_client(self) -> mqtt.Client:
        client = paho_client(self.broker, self.client_id)
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write
        client.on_connect = self._on_connect
        client.on_subscribe = self._on_subscribe
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        return client

    # the socket callbacks may come from the executor thread that runs connect()

    def _on_socket_open(self, client: mqtt.Client, _userdata: Any, sock: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._watch, client, sock, False)

    def _on_register_write(self, client: mqtt.Client, _userdata: Any, sock: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._watch, client, sock, True)

    def _watch(self, client: mqtt.Client, sock: Any, write: bool) -> None:
        """In the loop: watch the socket, unless it was closed meanwhile (a stop, a failure)."""
        assert self._loop is not None
        current = client.socket()
        if current is None or current is not sock or current.fileno() < 0:
            return
        if write:
            self._loop.add_writer(current.fileno(), self._write, client)
        else:
            self._loop.add_reader(current.fileno(), self._drain, client)

    def _on_socket_close(self, _client: mqtt.Client, _userdata: Any, sock: Any) -> None:
        assert self._loop is not None
        fileno = sock.fileno()
        if fileno > -1:
            self._loop.remove_reader(fileno)
            self._loop.remove_writer(fileno)

    def _on_unregister_write(self, _client: mqtt.Client, _userdata: Any, sock: Any) -> None:
        assert self._loop is not None
        self._loop.remove_writer(sock.fileno())

    def _on_connect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: Any, _props: Any
    ) -> None:
        if reason.is_failure:
            self._fail_ready(LinkError(f"connection refused: {reason}"))
            return
        if not self.subscriptions:
            self._ready_now()
            return
        # in packets of SUBSCRIPTIONS_PER_PACKET (a leaf controller subscribes per node)
        chunks = [
            self.subscriptions[i : i + SUBSCRIPTIONS_PER_PACKET]
            for i in range(0, len(self.subscriptions), SUBSCRIPTIONS_PER_PACKET)
        ]
        self._unsubscribed = len(chunks)
        for chunk in chunks:
            client.subscribe(chunk)

    def _on_subscribe(
        self, _client: mqtt.Client, _userdata: Any, _mid: int, reasons: Any, _props: Any
    ) -> None:
        if any(r.is_failure for r in reasons):  # e.g. the ACL does not allow it
            why = ", ".join(str(r) for r in reasons)
            self._fail_ready(LinkError(f"subscription refused by the broker: {why}"))
            return
        self._unsubscribed -= 1
        if self._unsubscribed == 0:
            self._ready_now()

    def _on_disconnect(
        self, _client: mqtt.Client, _userdata: Any, _flags: Any, reason: Any, _props: Any
    ) -> None:
        self._fail_ready(LinkError(f"disconnected: {reason}"))
        self._lose(str(reason))

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        self.received += 1
        refuse = self._refuse_retained
        if message.retain and refuse is not None and refuse(message.topic):
            self.retained_refused += 1
            return
        self.on_message(message.topic, bytes(message.payload), self._now, bool(message.retain))

    def _on_publish(
        self, _client: mqtt.Client, _userdata: Any, mid: int, _reason: Any, _props: Any
    ) -> None:
        future = self._published.get(mid)
        if future is not None and not future.done():
            future.set_result(None)

    # --- the loop's side --------------------------------------------------------------

    def _drain(self, client: mqtt.Client) -> None:
        """Read messages off the socket until it is empty or ``DRAIN_S`` has passed."""
        now = self._now = self._monotonic()
        deadline = now + DRAIN_S
        sock = client.socket()
        pending = getattr(sock, "pending", None)  # TLS: decrypted bytes the fd does not show
        try:
            while True:
                before = self.received
                if client.loop_read() != mqtt.MQTT_ERR_SUCCESS:
                    return  # paho has called on_disconnect
                if self.received == before and not (pending and pending() > 0):
                    return  # nothing more to read now (or a packet's first bytes only)
                if self.received & 63 == 0:
                    self._now = self._monotonic()
                    if self._now > deadline:
                        return  # let the loop run its other callbacks; it calls back at once
        except Exception as exc:  # a broken socket (paho raises some errors as they come)
            self._lose(f"{type(exc).__name__}: {exc}")

    def _write(self, client: mqtt.Client) -> None:
        try:
            client.loop_write()
        except Exception as exc:
            self._lose(f"{type(exc).__name__}: {exc}")

    async def _keepalive(self, client: mqtt.Client) -> None:
        """paho's loop_misc: PINGREQ when due, and noticing a broker gone silent."""
        while client.loop_misc() == mqtt.MQTT_ERR_SUCCESS:
            await asyncio.sleep(1.0)
        self._lose("keepalive: no answer from the broker")

    def _ready_now(self) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)

    def _fail_ready(self, error: Exception) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()  # retrieved: no "never retrieved" warning if none waits

    def _lose(self, why: str) -> None:
        self.connected.clear()
        if self.lost is not None and not self.lost.done():
            self.lost.set_result(why)
