"""Keeping an MQTT connection up, and stopping the tasks that use one: shared by the
agent and the controller.

``keep_connected`` is the one reconnect loop: run a session (connect, subscribe,
serve until the connection breaks), and on a broker or network failure log it,
back off (exponential, full jitter: ``powerd.backoff``) and go again, until the
owner is stopping. The agent's session is aiomqtt; the controller's control
session is ``powerd.mqtt.link`` (paho on the event loop) and its telemetry
session the receive-only ``powerd.mqtt.stream``; what they share is here.

``cancel_until_done`` stops tasks for good. Python 3.11's ``asyncio.wait_for``
(inside aiomqtt's publish and connect, and in ``asyncio.timeout`` users) can lose
a cancel that arrives as its inner call completes; the task then runs on. Seen as
an agent that never finished stopping (once in a loaded CI run). So: cancel
again until done, and every loop here also checks its owner's stop flag, so a lost
cancel costs at most one more pass.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from powerd.backoff import Backoff

CANCEL_RETRY_S = 0.5


@dataclass
class SessionStats:
    """How a kept-up connection fared: for logs, tests and the demo."""

    sessions: int = 0  # sessions that came up (connected)
    failures: int = 0  # sessions that failed to come up or broke
    up: asyncio.Event = field(default_factory=asyncio.Event)  # set while a session is up


async def keep_connected(
    session: Callable[[Callable[[], None]], Awaitable[object]],
    *,
    what: str,
    backoff: Backoff,
    stopping: Callable[[], bool],
    log: logging.Logger,
    expected: tuple[type[BaseException], ...],
    misconfigured: tuple[type[BaseException], ...] = (),
    bugs_reconnect: bool = False,
    on_down: Callable[[], None] | None = None,
    stats: SessionStats | None = None,
) -> None:
    """Run ``session`` again and again until ``stopping()``, backing off between attempts.

    ``session(connected)`` connects and serves; it calls ``connected()`` once the
    connection is up (the backoff starts over, ``stats.up`` is set) and returns or
    raises when it ends. ``expected`` failures (the broker or the network) are
    logged as warnings, ``misconfigured`` ones (an unreadable password or TLS
    file) as errors, both naming ``what`` (the broker's display URL, the
    connection); with ``bugs_reconnect`` any other exception is logged with its
    traceback and the loop goes on (the controller's telemetry: a bug there must
    not end telemetry silently), else it propagates. ``on_down`` runs after every
    session, however it ended.
    """
    stats = stats if stats is not None else SessionStats()

    def connected() -> None:
        backoff.reset()
        stats.sessions += 1
        stats.up.set()

    while not stopping():
        try:
            await session(connected)
        except expected as exc:
            stats.failures += 1
            log.warning("%s: %s", what, exc)
        except misconfigured as exc:
            stats.failures += 1
            log.error("%s: %s", what, exc)
        except Exception:
            if not bugs_reconnect:
                raise
            stats.failures += 1
            log.exception("%s failed; reconnecting", what)
        finally:
            stats.up.clear()
            if on_down is not None:
                on_down()
        if stopping():
            return
        delay_s = backoff.next_delay_s()
        log.info("reconnecting (%s) in %.1f s", what, delay_s)
        await asyncio.sleep(delay_s)


async def cancel_until_done(
    tasks: Iterable[asyncio.Task[object]], log: logging.Logger, retry_s: float = CANCEL_RETRY_S
) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again every ``retry_s`` (see above).

    Their outcomes are collected: a task that ended with an error (already logged
    where it happened) is noted at debug level, never raised here.
    """
    tasks = set(tasks)
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=retry_s)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.debug("task %s ended with %r", task.get_name(), task.exception())
