"""Site limits judged by receipt (powerd.site_limits.limits, docs/PROTOCOL.md "Clocks"):
a live limit's window runs from its receipt on the caller's clock; a retained one is placed
by the wall clock; one from the future is a clock alarm; order by (ts, seq)."""

from __future__ import annotations

from powerd.protocol import SiteLimit
from powerd.site_limits.limits import SiteLimits

TS = 1_795_320_000.0
MIN_S = 60.0


def limit(
    limit_w: float | None, ts: float = TS, seq: int = 1, for_s: float = 15 * MIN_S
) -> SiteLimit:
    return SiteLimit(
        v=1, operator="grid", seq=seq, ts=ts, limit_w=limit_w, starts_ts=ts, expires_ts=ts + for_s
    )


def test_a_controller_20_minutes_ahead_applies_a_new_limit_for_its_whole_length() -> None:
    """Received live at monotonic 100 s by a controller whose wall clock reads 20 min past
    the limit's ts: in force from receipt for 15 minutes (before: logged, never applied)."""
    limits = SiteLimits()
    assert limits.take(limit(90e3), now=100.0, wall=TS + 20 * MIN_S, live=True) is None
    assert limits.active_w(100.0) == 90e3
    assert limits.active_w(100.0 + 15 * MIN_S - 1) == 90e3
    assert limits.active_w(100.0 + 15 * MIN_S) is None


def test_a_controller_behind_does_not_hold_it_longer() -> None:
    limits = SiteLimits()
    assert limits.take(limit(90e3), now=100.0, wall=TS - 20.0, live=True) is None
    assert limits.active_w(100.0 + 15 * MIN_S) is None


def test_a_retained_limit_is_placed_by_the_wall_clock() -> None:
    """On subscribe (a restart): sent 10 minutes ago by this clock, 5 minutes are left."""
    limits = SiteLimits()
    assert limits.take(limit(90e3), now=100.0, wall=TS + 10 * MIN_S, live=False) is None
    assert limits.active_w(100.0 + 5 * MIN_S - 1) == 90e3
    assert limits.active_w(100.0 + 5 * MIN_S) is None


def test_a_retained_limit_already_over_is_not_taken() -> None:
    limits = SiteLimits()
    why = limits.take(limit(90e3), now=100.0, wall=TS + 16 * MIN_S, live=False)
    assert "already over" in (why or "")
    assert limits.limit is None


def test_a_limit_from_the_future_is_a_clock_alarm() -> None:
    limits = SiteLimits()
    why = limits.take(limit(90e3, ts=TS + 3600.0), now=100.0, wall=TS, live=True)
    assert "clock alarm" in (why or "")
    assert limits.clock_alarms == 1 and limits.limit is None


def test_an_older_clear_replayed_after_the_record_changes_nothing() -> None:
    """A restart: the leader's record of the limit (retained, under its key) and an old
    clear replayed as retained on the operator's topic, in either order: the limit stays."""
    newer, old_clear = limit(90e3, ts=TS, seq=5), limit(None, ts=TS - 600.0, seq=4)
    for first, second in ((newer, old_clear), (old_clear, newer)):
        limits = SiteLimits()
        limits.take(first, now=100.0, wall=TS + 60.0, live=False)
        limits.take(second, now=100.0, wall=TS + 60.0, live=False)
        assert limits.active_w(101.0) == 90e3
