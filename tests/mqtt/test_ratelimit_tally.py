"""LogOncePer.tally and LogOncePer.log: the limit for messages that give their own count."""

from __future__ import annotations

import logging

import pytest

from powerd.ratelimit import LogOncePer


def test_tally_counts_weighted_events_and_includes_the_one_returned() -> None:
    limiter = LogOncePer(logging.getLogger("powerd.test.tally"), interval_s=60.0)
    assert limiter.interval_s == 60.0
    assert limiter.tally("drop", 0.0, 10) == 10  # the first: at once, its own count
    assert limiter.tally("drop", 1.0, 5) is None
    assert limiter.tally("drop", 59.0, 7) is None
    assert limiter.tally("other", 59.0) == 1  # keys are independent
    assert limiter.tally("drop", 60.0, 3) == 15  # what was held, and this one
    assert limiter.tally("drop", 120.0, 0) == 0  # started over; a zero count still reports


def test_log_takes_the_level(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("powerd.test.tally")
    caplog.set_level(logging.INFO, logger=logger.name)
    limiter = LogOncePer(logger, interval_s=10.0)
    assert limiter.log(logging.ERROR, "k", 0.0, "bad %s", "x")
    assert not limiter.log(logging.ERROR, "k", 5.0, "bad %s", "x")
    assert limiter.log(logging.INFO, "k", 10.0, "bad %s", "y")
    got = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == logger.name]
    assert got == [
        (logging.ERROR, "bad x"),
        (logging.INFO, "bad y (1 more like it in the last 10 s)"),
    ]
