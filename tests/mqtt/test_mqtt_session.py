"""powerd.mqtt.session: the one reconnect loop (agent, controller) and cancel_until_done."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from powerd.backoff import Backoff
from powerd.mqtt.session import SessionStats, cancel_until_done, keep_connected

log = logging.getLogger("test.session")


class BrokerDown(Exception):
    pass


class BadPassword(Exception):
    pass


def fast_backoff() -> Backoff:
    return Backoff(0.001, 0.002)


async def test_failed_sessions_back_off_then_a_session_comes_up_and_resets_the_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outcomes: list[Exception | None] = [BrokerDown("refused"), BadPassword("unreadable"), None]
    stats = SessionStats()
    backoff = fast_backoff()
    downs: list[int] = []
    stop = False
    attempts_at_connect: list[int] = []

    async def session(connected: Callable[[], None]) -> None:
        nonlocal stop
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        attempts_at_connect.append(backoff.attempt)
        connected()
        assert stats.up.is_set() and backoff.attempt == 0
        stop = True  # serve, then the owner stops

    with caplog.at_level(logging.INFO, logger="test.session"):
        await keep_connected(
            session,
            what="broker x",
            backoff=backoff,
            stopping=lambda: stop,
            log=log,
            expected=(BrokerDown,),
            misconfigured=(BadPassword,),
            on_down=lambda: downs.append(stats.sessions),
            stats=stats,
        )
    assert (stats.sessions, stats.failures) == (1, 2)
    assert attempts_at_connect == [2]  # two failures had grown the backoff
    assert downs == [0, 0, 1]  # on_down after every session, however it ended
    assert not stats.up.is_set()
    levels = {r.getMessage(): r.levelno for r in caplog.records}
    assert levels["broker x: refused"] == logging.WARNING
    assert levels["broker x: unreadable"] == logging.ERROR


async def test_a_bug_ends_the_loop_unless_bugs_reconnect() -> None:
    async def buggy(connected: Callable[[], None]) -> None:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        await keep_connected(
            buggy,
            what="x",
            backoff=fast_backoff(),
            stopping=lambda: False,
            log=log,
            expected=(BrokerDown,),
        )

    calls = 0

    async def buggy_twice(connected: Callable[[], None]) -> None:
        nonlocal calls
        calls += 1
        raise KeyError("bug")

    stats = SessionStats()
    await keep_connected(
        buggy_twice,
        what="x",
        backoff=fast_backoff(),
        stopping=lambda: calls >= 2,
        log=log,
        expected=(BrokerDown,),
        bugs_reconnect=True,
        stats=stats,
    )
    assert calls == 2 and stats.failures == 2


async def test_cancel_until_done_cancels_again_a_task_that_lost_a_cancel() -> None:
    """What Python 3.11's wait_for can do: a cancel swallowed, the task running on."""
    swallowed = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed.set()  # lost, as inside wait_for
        await asyncio.Event().wait()  # runs on until cancelled again

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)  # let it start
    await cancel_until_done([task], log, retry_s=0.01)
    assert swallowed.is_set() and task.cancelled()


async def test_cancel_until_done_collects_errors_without_raising() -> None:
    async def fails() -> None:
        raise RuntimeError("already logged where it happened")

    task = asyncio.create_task(fails())
    await asyncio.wait([task])
    await cancel_until_done([task], log)  # no exception
    assert isinstance(task.exception(), RuntimeError)
