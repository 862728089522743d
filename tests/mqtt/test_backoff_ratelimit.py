"""Backoff (exponential, full jitter), TokenBucket and LogOncePer, on fake clocks."""

from __future__ import annotations

import logging
import random

import pytest

from powerd.backoff import Backoff
from powerd.ratelimit import LogOncePer, TokenBucket
from tests.support.clock import ManualClock


class FixedRandom(random.Random):
    """A Random whose random() always returns ``value`` (in [0, 1))."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


# --- Backoff ---------------------------------------------------------------------


def test_first_delay_is_min() -> None:
    # the bound starts at min_s, so whatever the draw, the first delay is min_s
    for value in (0.0, 0.5, 0.999999):
        assert Backoff(0.5, 30.0, rng=FixedRandom(value)).next_delay_s() == 0.5


def test_bound_doubles_up_to_max() -> None:
    # a draw just below 1 gives (almost) the bound: 1, 2, 4, 8, 16, then capped at 20
    backoff = Backoff(1.0, 20.0, rng=FixedRandom(1.0 - 1e-12))
    delays = [backoff.next_delay_s() for _ in range(8)]
    assert delays == pytest.approx([1.0, 2.0, 4.0, 8.0, 16.0, 20.0, 20.0, 20.0])
    assert backoff.attempt == 8


def test_zero_draw_gives_min_every_time() -> None:
    backoff = Backoff(0.25, 10.0, rng=FixedRandom(0.0))
    assert [backoff.next_delay_s() for _ in range(10)] == [0.25] * 10


def test_delays_stay_within_min_and_bound_with_real_jitter() -> None:
    rng = random.Random(1234)
    backoff = Backoff(0.5, 30.0, rng=rng)
    delays = []
    for attempt in range(60):
        bound = min(30.0, 0.5 * 2.0**attempt)
        delay = backoff.next_delay_s()
        assert 0.5 <= delay <= bound
        delays.append(delay)
    # full jitter: once the bound is at max, delays spread over the range
    late = delays[10:]
    assert max(late) - min(late) > 10.0
    assert len(set(late)) == len(late)


def test_reset_starts_over() -> None:
    backoff = Backoff(1.0, 64.0, rng=FixedRandom(1.0 - 1e-12))
    for _ in range(5):
        backoff.next_delay_s()
    assert backoff.next_delay_s() == pytest.approx(32.0)
    backoff.reset()
    assert backoff.attempt == 0
    assert backoff.next_delay_s() == 1.0
    assert backoff.next_delay_s() == pytest.approx(2.0)


def test_min_equal_max_is_constant() -> None:
    backoff = Backoff(3.0, 3.0, rng=random.Random(7))
    assert [backoff.next_delay_s() for _ in range(5)] == [3.0] * 5


@pytest.mark.parametrize(("min_s", "max_s"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_invalid_bounds(min_s: float, max_s: float) -> None:
    with pytest.raises(ValueError):
        Backoff(min_s, max_s)


def test_long_outage_keeps_giving_delays() -> None:
    backoff = Backoff(0.5, 30.0, rng=random.Random(5))
    for _ in range(2000):
        assert 0.5 <= backoff.next_delay_s() <= 30.0


# --- TokenBucket ---------------------------------------------------------------


def test_bucket_allows_burst_then_refuses() -> None:
    clock = ManualClock()
    bucket = TokenBucket(rate_per_s=2.0, burst=3.0, clock=clock)
    assert [bucket.take() for _ in range(5)] == [True, True, True, False, False]


def test_bucket_refills_at_rate() -> None:
    clock = ManualClock()
    bucket = TokenBucket(rate_per_s=2.0, burst=3.0, clock=clock)
    for _ in range(3):
        assert bucket.take()
    assert not bucket.take()
    clock.advance(0.25)  # half a token
    assert not bucket.take()
    clock.advance(0.25)  # one token
    assert bucket.take()
    assert not bucket.take()
    clock.advance(1.0)  # two tokens
    assert [bucket.take() for _ in range(3)] == [True, True, False]


def test_bucket_never_holds_more_than_burst() -> None:
    clock = ManualClock()
    bucket = TokenBucket(rate_per_s=10.0, burst=2.0, clock=clock)
    clock.advance(3600.0)
    assert [bucket.take() for _ in range(4)] == [True, True, False, False]


def test_bucket_average_rate_over_time() -> None:
    clock = ManualClock()
    bucket = TokenBucket(rate_per_s=5.0, burst=5.0, clock=clock)
    taken = 0
    for _ in range(10_000):  # 100 s of attempts every 10 ms
        clock.advance(0.01)
        taken += bucket.take()
    assert 500 <= taken <= 505  # rate * time, plus at most the initial burst


# --- LogOncePer --------------------------------------------------------------


@pytest.fixture
def logger() -> logging.Logger:
    return logging.getLogger("powerd.test.ratelimit")


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "powerd.test.ratelimit"]


def test_logs_once_per_key_per_interval(
    caplog: pytest.LogCaptureFixture, logger: logging.Logger
) -> None:
    caplog.set_level(logging.WARNING, logger=logger.name)
    limiter = LogOncePer(logger, interval_s=60.0)
    assert limiter.warning("sender-a", 0.0, "bad payload from %s", "a") is True
    assert limiter.warning("sender-a", 10.0, "bad payload from %s", "a") is False
    assert limiter.warning("sender-a", 59.9, "bad payload from %s", "a") is False
    assert messages(caplog) == ["bad payload from a"]
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_reports_held_back_count_when_interval_passes(
    caplog: pytest.LogCaptureFixture, logger: logging.Logger
) -> None:
    caplog.set_level(logging.WARNING, logger=logger.name)
    limiter = LogOncePer(logger, interval_s=60.0)
    limiter.warning("k", 0.0, "rejected: %s", "x")
    for t in (1.0, 2.0, 3.0):
        limiter.warning("k", t, "rejected: %s", "x")
    assert limiter.warning("k", 60.0, "rejected: %s", "y") is True
    assert messages(caplog) == [
        "rejected: x",
        "rejected: y (3 more like it in the last 60 s)",
    ]
    # the count starts over after it was reported
    assert limiter.warning("k", 120.0, "rejected: %s", "z") is True
    assert messages(caplog)[-1] == "rejected: z"


def test_keys_are_independent(caplog: pytest.LogCaptureFixture, logger: logging.Logger) -> None:
    caplog.set_level(logging.WARNING, logger=logger.name)
    limiter = LogOncePer(logger, interval_s=60.0)
    assert limiter.warning("a", 0.0, "from a")
    assert limiter.warning("b", 1.0, "from b")
    assert not limiter.warning("a", 2.0, "from a")
    assert not limiter.warning("b", 3.0, "from b")
    assert limiter.warning("a", 60.0, "from a")
    assert not limiter.warning("b", 60.0, "from b")  # b's interval runs from 1.0
    assert limiter.warning("b", 61.0, "from b")
    assert messages(caplog) == [
        "from a",
        "from b",
        "from a (1 more like it in the last 60 s)",
        "from b (2 more like it in the last 60 s)",
    ]


def test_interval_is_configurable(caplog: pytest.LogCaptureFixture, logger: logging.Logger) -> None:
    caplog.set_level(logging.WARNING, logger=logger.name)
    limiter = LogOncePer(logger, interval_s=5.0)
    assert limiter.warning("k", 0.0, "m")
    assert not limiter.warning("k", 4.0, "m")
    assert limiter.warning("k", 5.0, "m")
    assert messages(caplog) == ["m", "m (1 more like it in the last 5 s)"]
