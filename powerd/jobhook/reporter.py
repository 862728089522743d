"""``PhaseReporter``: what a training loop calls. It checks the arguments (a
``ValueError`` says what to fix), keeps the current phase, encodes one payload
per call and hands it to its ``Publisher`` (``publisher.py``), which sends it.

See the package docstring (``powerd/jobhook/__init__.py``) for the guarantees.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from powerd.jobhook.publisher import Publisher
from powerd.mqtt.url import BrokerSettings, parse_broker_url
from powerd.protocol import PhaseEvent, ProtocolError, Topics, encode, job_nodes_fields
from powerd.protocol import check_name as _protocol_check_name
from powerd.ratelimit import LogOncePer
from powerd.vocabulary import PHASES, PRIORITIES, PROTOCOL_VERSION

__all__ = ["PhaseBlock", "PhaseReporter", "ReporterStats"]

log = logging.getLogger("powerd.jobhook")

# phases a `with phase(...)` block may announce; startup and shutdown have their own calls
BLOCK_PHASES: tuple[str, ...] = tuple(p for p in PHASES if p not in ("startup", "shutdown"))
DEFAULT_RESUME_PHASE = "compute"

_NAME_RULE = "1 to 64 characters from A-Z a-z 0-9 . _ -, starting with a letter or digit"
_LOG_INTERVAL_S = 60.0


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
    """Announces a training job's phases on ``powerd/v1/{cluster}/jobs/{owner}/{job}/phase``
    (``owner``: given, else the broker login; with neither, ``jobs/{job}/phase``).

    ``broker``: ``mqtt://[user@]host[:port]`` or ``mqtts://``; ``None`` or ``""``
    turns publishing off. ``enabled=False`` also turns it off (arguments are
    still checked): pass ``enabled=(rank == 0)`` in a distributed job, so that
    one process speaks for the job. ``settings`` supplies what a URL cannot
    carry (password file, CA and client certificates); the password may also
    come from ``$POWERD_MQTT_PASSWORD``.

    Raises ``ValueError`` for bad arguments only; see the package docstring
    (``powerd.jobhook``) for what it guarantees.
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
        owner: str | None = None,
    ) -> None:
        self.job = _check_name(job, "job")
        # Who speaks for the job: ``owner``, else the broker login. With one, phases go to
        # jobs/{owner}/{job}/phase, which the shipped ACL binds to that login, and the
        # controller lets nobody else change the job (docs/JOBHOOK.md, "Owners").
        self.owner = None if owner is None else _check_name(owner, "owner")
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
        self.topic = Topics(self.cluster).phase(self.job, self.owner)
        self._check_startup_fits(self.nodes)

        self.broker = broker
        self.error: str | None = None  # why publishing is off, when it is off by failure
        self._logs = LogOncePer(log, _LOG_INTERVAL_S)
        self._log_lock = threading.Lock()
        # guards the current phase and, shared with the publisher, its queue: a phase
        # becomes current and its payload is queued in one step, so the queue's order is
        # the calls' order. Reentrant: the publisher takes it again inside.
        self._cond = threading.Condition(threading.RLock())
        self._current: str | None = None
        self._dropped = 0  # payloads lost to a broker URL that does not parse
        self._closed = False  # closed without a publisher (or in a forked child)
        self._publisher: Publisher | None = None
        self._settings: BrokerSettings | None = None
        self._publishing = False  # payloads are made (as opposed to not at all)

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
            if self.owner is None and self._settings.username:
                self.owner = _check_name(self._settings.username, "owner (the broker login)")
                self.topic = Topics(self.cluster).phase(self.job, self.owner)
            host = self._settings.host
            try:  # what the resolver would choke on, in the network thread
                host.encode("idna")
            except UnicodeError:
                raise ValueError(f"broker host {host!r} is not a host name") from None
            self._publisher = Publisher(
                self._settings,
                self.topic,
                job=self.job,
                queue_size=queue_size,
                warn=self._warn,
                client_id=client_id,
                cond=self._cond,
                on_stopped=self._on_publisher_stopped,
            )
        except Exception as exc:  # a wrong URL or TLS file must not stop training
            self.error = f"phase reporting for job {self.job} is off: {_redact(str(exc), broker)}"
            self._publisher = None
            self._publishing = True  # so that lost payloads are counted as dropped
            log.error("%s", self.error)
            return
        self._publishing = True
        _open_reporters.add(self)
        self._publisher.start()
        log.info(
            "phase reporting for job %s to %s on %s", self.job, self._settings.display, self.topic
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> PhaseReporter:
        """A reporter configured from the environment: see ``env._reporter_from_env``."""
        from powerd.jobhook.env import _reporter_from_env  # env.py imports this module

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
            publisher = self._publisher
            if publisher is not None:
                publisher.close(timeout)  # it says closed from now on (its stats)
            else:
                with self._cond:
                    if not self._closed:
                        self._closed = True
                        self._cond.notify_all()
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
        return self._publisher is not None and self._publisher.enabled

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
        publisher = self._publisher
        if publisher is None or not publisher.enabled:
            return True
        return publisher.flush(timeout_s)

    def __enter__(self) -> PhaseReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self._settings.display if self._settings else "off"
        return f"PhaseReporter(job={self.job!r}, cluster={self.cluster!r}, broker={where})"

    # --- internals (never block: one short lock, no I/O) ---------------------------

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
                elif self._publisher is None:  # publishing was meant, but the broker URL is bad
                    self._dropped += 1
                elif not self._publisher.enqueue(payload):  # takes self._cond again
                    closed = True
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
            priority=self.priority,  # type: ignore[arg-type]
            expected_s=expected_s,
            **job_nodes_fields(nodes),  # a long list goes as a Slurm-style host list
        )
        return encode(event)

    def _check_startup_fits(self, nodes: list[str] | None) -> None:
        """A node list too long for one payload, even as a host list, is an argument error:
        find it now."""
        if nodes is None:
            return
        try:
            self._encode("startup", 0.0, nodes)
        except ProtocolError as exc:
            raise ValueError(f"{len(nodes)} nodes do not fit in one phase payload: {exc}") from None

    def _stats_locked(self) -> ReporterStats:
        publisher = self._publisher
        if publisher is None:
            return ReporterStats(
                enabled=False,
                connected=False,
                queued=0,
                in_flight=0,
                sent=0,
                dropped=self._dropped,
                connects=0,
                phase=self._current,
                closed=self._closed,
            )
        sending = publisher.stats()
        return ReporterStats(
            enabled=publisher.enabled,
            connected=sending.connected,
            queued=sending.queued,
            in_flight=sending.in_flight,
            sent=sending.sent,
            dropped=sending.dropped,
            connects=sending.connects,
            phase=self._current,
            closed=self._closed or sending.closed,
        )

    def _warn(self, key: str, msg: str, *args: object) -> None:
        """Log a warning at most once a minute per ``key``; never raises."""
        try:
            with self._log_lock:
                self._logs.warning(key, time.monotonic(), msg, *args)
        except Exception:
            pass

    def _on_publisher_stopped(self) -> None:
        _open_reporters.discard(self)

    def _after_fork_in_child(self) -> None:
        """A forked child (a data loader worker) gets fresh locks and never publishes."""
        self._cond = threading.Condition(threading.RLock())
        self._log_lock = threading.Lock()
        self._publishing = False
        self._closed = True
        if self._publisher is not None:
            self._publisher.after_fork_in_child(self._cond)


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


# reporters whose sender thread runs: closed at exit, silenced in a forked child
# (the hooks are in powerd/jobhook/__init__.py)
_open_reporters: weakref.WeakSet[PhaseReporter] = weakref.WeakSet()


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
