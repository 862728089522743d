"""Leadership: epochs from heartbeats, step-down, standby takeover (docs/PROTOCOL.md rule 2),
liveness by receipt and peers' clocks ("Clocks")."""

from __future__ import annotations

import pytest

from powerd.leadership.state import Leadership
from powerd.protocol import Heartbeat

TAKEOVER_S = 10.0
WALL = 1_795_320_000.0  # this controller's wall clock at monotonic 0
HOUR_S = 3600.0


def beat(controller: str, epoch: int, state: str = "leader", ts: float = WALL) -> Heartbeat:
    return Heartbeat(v=1, epoch=epoch, ts=ts, controller=controller, state=state)  # type: ignore[arg-type]


def live(lead: Leadership, hb: Heartbeat, now: float, skew_s: float = 0.0) -> bool:
    """``hb`` delivered live at monotonic ``now``, our wall clock ``skew_s`` ahead of WALL."""
    return lead.observe(hb, now, WALL + now + skew_s, live=True)


def retained(lead: Leadership, hb: Heartbeat, now: float, skew_s: float = 0.0) -> bool:
    return lead.observe(hb, now, WALL + now + skew_s, live=False)


def leader(name: str = "ctl-b", epoch: int = 5) -> Leadership:
    lead = Leadership(name, TAKEOVER_S, highest_epoch_seen=epoch - 1)
    assert lead.take_over() == epoch
    return lead


# --- starting -------------------------------------------------------------------------


def test_alone_it_leads_at_once_with_epoch_1() -> None:
    lead = Leadership("ctl-a", TAKEOVER_S)
    assert lead.should_lead(now_mono=0.0)
    assert lead.take_over() == 1
    assert lead.leading and lead.epoch == 1
    assert not lead.should_lead(now_mono=1.0)  # already leading


@pytest.mark.parametrize("state", ["leader", "standby"])
def test_it_takes_the_highest_epoch_it_saw_plus_one(state: str) -> None:
    lead = Leadership("ctl-a", TAKEOVER_S)
    for name, epoch in (("ctl-x", 3), ("ctl-y", 41), ("ctl-z", 7)):
        retained(lead, beat(name, epoch, state, ts=WALL + 40.0), now=100.0)
    assert lead.take_over() == 42


def test_a_restarted_controller_outnumbers_its_own_previous_epoch() -> None:
    lead = Leadership("ctl-a", TAKEOVER_S)
    retained(lead, beat("ctl-a", 9, ts=WALL + 70.0), now=100.0)  # ours, from before a crash
    assert lead.should_lead(100.0)  # our own name's: a leader known dead
    assert lead.take_over() == 10


def test_a_live_leader_keeps_it_standby_until_silent_for_takeover_after_s() -> None:
    standby = Leadership("ctl-b", TAKEOVER_S)
    live(standby, beat("ctl-a", 4, ts=WALL + 99.5), now=100.0)
    assert not standby.should_lead(100.0)
    assert standby.leader_seen_mono == 100.0  # by receipt, not by its ts
    assert not standby.should_lead(100.0 + TAKEOVER_S)  # exactly the limit: not yet
    assert standby.should_lead(100.0 + TAKEOVER_S + 0.1)
    assert standby.take_over() == 5


def test_heartbeats_keep_it_standby_for_ever() -> None:
    standby = Leadership("ctl-b", TAKEOVER_S)
    for t in range(0, 300, 1):
        live(standby, beat("ctl-a", 4, ts=WALL + t - 0.1), now=float(t))
        assert not standby.should_lead(float(t) + 0.5)


def test_a_retained_leader_heartbeat_says_who_leads_never_that_it_lives() -> None:
    """On subscribe: the standby waits takeover_after_s for that leader to be heard live,
    however fresh or stale its ts looks (this clock may be the wrong one)."""
    for ts in (WALL + 100.0, WALL - HOUR_S):
        lead = Leadership("ctl-b", TAKEOVER_S)
        retained(lead, beat("ctl-a", 4, ts=ts), now=100.0)
        assert not lead.should_lead(100.0 + TAKEOVER_S)
        assert lead.should_lead(100.0 + TAKEOVER_S + 0.1)  # never heard live: dead
        assert lead.take_over() == 5


def test_retained_heartbeats_never_keep_a_standby_passive() -> None:
    """A dead leader's retained heartbeat, re-delivered at every resubscribe, however
    fresh its ts (a clock ahead), does not hold the standby past takeover_after_s."""
    standby = Leadership("ctl-b", TAKEOVER_S)
    live(standby, beat("ctl-a", 4, ts=WALL + 100.0), now=100.0)  # then ctl-a dies
    for t in range(101, 130):
        retained(standby, beat("ctl-a", 4, ts=WALL + 100.0 + 20.0), now=float(t))
    assert standby.should_lead(100.0 + TAKEOVER_S + 0.1)


def test_a_standby_heartbeat_does_not_hold_it_back() -> None:
    """A leader that stopped cleanly leaves a standby heartbeat: take over at once."""
    lead = Leadership("ctl-b", TAKEOVER_S)
    retained(lead, beat("ctl-a", 4, "standby"), now=100.0)
    assert lead.should_lead(100.0)
    assert lead.take_over() == 5


def test_the_leaders_clean_stop_lets_a_watching_standby_take_over_at_once() -> None:
    standby = Leadership("ctl-b", TAKEOVER_S)
    live(standby, beat("ctl-a", 4, ts=WALL + 100.0), now=100.0)
    assert not standby.should_lead(101.0)
    live(standby, beat("ctl-a", 4, "standby", ts=WALL + 101.0), now=101.0)  # ctl-a stops
    assert standby.should_lead(101.0)
    assert standby.take_over() == 5


def test_a_replayed_clean_stop_moves_no_leadership() -> None:
    """A captured standby heartbeat: of an older epoch, retained, older than the leader's
    last heartbeat, or sent long ago by its time base: the standby keeps waiting."""
    standby = Leadership("ctl-c", TAKEOVER_S)
    live(standby, beat("ctl-a", 4, "standby", ts=WALL + 10.0), now=10.0)  # captured then
    live(standby, beat("ctl-b", 5, ts=WALL + 99.0), now=100.0)  # the leader now
    replays = [
        (beat("ctl-a", 4, "standby", ts=WALL + 10.0), True),  # an older epoch's
        (beat("ctl-b", 5, "standby", ts=WALL + 100.5), False),  # retained
        (beat("ctl-b", 5, "standby", ts=WALL + 98.0), True),  # older than its last beat
    ]
    for hb, is_live in replays:
        standby.observe(hb, 100.5, WALL + 100.5, live=is_live)
        assert not standby.should_lead(100.5), hb
    standby.observe(beat("ctl-b", 5, "standby", ts=WALL + 100.6), 100.6, WALL + 100.6)
    assert standby.should_lead(100.6)  # the real one, live and now


def test_another_controllers_standby_heartbeat_does_not_end_the_wait() -> None:
    standby = Leadership("ctl-b", TAKEOVER_S)
    live(standby, beat("ctl-a", 4, ts=WALL + 100.0), now=100.0)
    live(standby, beat("ctl-c", 3, "standby", ts=WALL + 101.0), now=101.0)
    assert not standby.should_lead(101.0)


def test_its_own_heartbeat_back_from_the_broker_changes_nothing() -> None:
    lead = leader("ctl-b", 5)
    assert not live(lead, beat("ctl-b", 5), now=100.0)
    assert lead.leading and lead.leader_seen_mono == float("-inf")


# --- clocks -----------------------------------------------------------------------------


def test_a_heartbeat_from_the_future_is_a_clock_alarm_and_leads_nobody() -> None:
    """A leader an hour ahead: refused (it would hold the standby passive as long as it
    runs ahead, and agents refuse it alike); its epoch is learned all the same."""
    standby = Leadership("ctl-b", TAKEOVER_S)
    live(standby, beat("ctl-a", 7, ts=WALL + 100.0 + HOUR_S), now=100.0)
    assert standby.skew.alarms == 1
    assert standby.should_lead(100.0 + TAKEOVER_S + 0.1)
    assert standby.take_over() == 8  # above it: the bad-clock leader steps down on ours


def test_a_leader_behind_is_followed_and_its_skew_measured() -> None:
    standby = Leadership("ctl-b", TAKEOVER_S)
    for t in range(100, 110):
        live(standby, beat("ctl-a", 7, ts=WALL + t - HOUR_S), now=float(t))
    assert not standby.should_lead(110.0)
    assert standby.skew.alarms == 0
    assert standby.skew.largest_s == pytest.approx(HOUR_S)


def test_a_replayed_leader_heartbeat_keeps_nobody_passive() -> None:
    """Live replays of the followed leader's heartbeats (not newer than its newest) are
    no liveness: the dead leader's standby takes over on time."""
    standby = Leadership("ctl-b", TAKEOVER_S)
    for t in range(100, 105):
        live(standby, beat("ctl-a", 7, ts=WALL + t), now=float(t))
    for t in range(105, 120):  # ctl-a is dead; someone replays its beats
        live(standby, beat("ctl-a", 7, ts=WALL + 100 + t % 5), now=float(t))
    assert standby.heartbeats_replayed == 15
    assert standby.should_lead(104.0 + TAKEOVER_S + 0.1)


def test_a_deposed_leaders_heartbeat_keeps_nobody_passive() -> None:
    standby = Leadership("ctl-c", TAKEOVER_S)
    live(standby, beat("ctl-b", 9, ts=WALL + 100.0), now=100.0)
    for t in range(101, 120):  # ctl-b died; ctl-a, deposed by it, still beats
        live(standby, beat("ctl-a", 8, ts=WALL + t), now=float(t))
    assert standby.should_lead(100.0 + TAKEOVER_S + 0.1)
    assert standby.take_over() == 10


def test_its_heartbeats_carry_the_epochs_time_base_whatever_its_wall_clock_does() -> None:
    lead = Leadership("ctl-a", TAKEOVER_S)
    lead.take_over()
    assert lead.beat_ts(now_mono=10.0, wall=WALL + 10.0) == WALL + 10.0
    assert lead.beat_ts(now_mono=11.0, wall=WALL + 11.0 + HOUR_S) == WALL + 11.0  # stepped
    assert lead.beat_ts(now_mono=12.0, wall=WALL + 12.0 - HOUR_S) == WALL + 12.0
    lead.take_over()  # a new epoch, a new base: this clock
    assert lead.beat_ts(now_mono=13.0, wall=WALL + 13.0 - HOUR_S) == WALL + 13.0 - HOUR_S


def test_a_standby_ahead_continues_the_time_base_its_leader_sent() -> None:
    """A standby an hour ahead that takes over sends its leader's time base (as it
    measured it on receipt), which the agents took, not its own an hour ahead."""
    standby = Leadership("ctl-b", TAKEOVER_S)
    live(standby, beat("ctl-a", 4, ts=WALL + 100.0), now=100.0, skew_s=HOUR_S)
    assert standby.should_lead(111.0)
    standby.take_over()
    assert standby.beat_ts(111.0, WALL + 111.0 + HOUR_S) == pytest.approx(WALL + 111.0)


# --- stepping down ---------------------------------------------------------------------


def test_steps_down_on_a_higher_epoch() -> None:
    lead = leader("ctl-a", 5)
    assert live(lead, beat("ctl-z", 6, ts=WALL + 100.0), now=100.0)
    assert not lead.leading
    assert not lead.should_lead(100.0 + TAKEOVER_S - 1)
    assert lead.should_lead(100.0 + TAKEOVER_S + 1)  # the other went silent
    assert lead.take_over() == 7


def test_same_epoch_the_lower_name_wins() -> None:
    b = leader("ctl-b", 5)
    assert live(b, beat("ctl-a", 5), now=100.0)  # "ctl-a" < "ctl-b"
    assert not b.leading
    a = leader("ctl-a", 5)
    assert not live(a, beat("ctl-b", 5), now=100.0)
    assert a.leading


def test_a_lower_epoch_does_not_make_it_step_down() -> None:
    lead = leader("ctl-z", 5)
    assert not live(lead, beat("ctl-a", 4), now=100.0)
    assert lead.leading


def test_a_standby_or_retained_heartbeat_does_not_make_it_step_down() -> None:
    lead = leader("ctl-b", 5)
    assert not live(lead, beat("ctl-a", 9, "standby"), now=100.0)
    assert not retained(lead, beat("ctl-a", 9), now=100.0)
    assert lead.leading
    assert lead.highest_epoch_seen == 9  # remembered for the next takeover


def test_two_controllers_started_together_settle_on_one_leader() -> None:
    """Both see nothing and lead with epoch 1; their heartbeats decide, by name."""
    a, b = Leadership("ctl-a", TAKEOVER_S), Leadership("ctl-b", TAKEOVER_S)
    assert a.take_over() == b.take_over() == 1
    now = 0.0
    for _ in range(30):
        now += 1.0
        for me, other in ((a, b), (b, a)):
            if other.leading:
                hb = beat(other.name, other.epoch, ts=other.beat_ts(now, WALL + now))
                live(me, hb, now)
            if me.should_lead(now):
                me.take_over()
    assert (a.leading, b.leading) == (True, False)
    assert a.epoch == 1  # the winner keeps its epoch


def test_failover_after_the_leader_dies() -> None:
    a, b = Leadership("ctl-a", TAKEOVER_S), Leadership("ctl-b", TAKEOVER_S)
    a.take_over()
    now = 0.0
    for _ in range(5):  # a leads, b is standby
        now += 1.0
        live(b, beat("ctl-a", a.epoch, ts=a.beat_ts(now, WALL + now)), now)
        assert not b.should_lead(now)
    took_over_at = None
    for _ in range(20):  # a dies
        now += 1.0
        if b.should_lead(now):
            took_over_at = now
            break
    assert took_over_at == pytest.approx(5.0 + TAKEOVER_S + 1.0)
    assert b.take_over() == a.epoch + 1
    # a comes back (same epoch as before its death), sees b's heartbeat and yields
    live(a, beat("ctl-b", b.epoch, ts=b.beat_ts(now, WALL + now)), now)
    assert not a.leading and not a.should_lead(now + 1.0)


def test_the_wall_clock_floor_counts_only_when_no_heartbeat_was_seen() -> None:
    """The service's floor is the wall clock in ms: a controller that found no heartbeat at
    all leads above a leader that died before it started. Once any epoch is known, the
    next is that plus one: a clock an hour ahead lifts no epoch by an hour."""
    alone = Leadership("ctl-a", TAKEOVER_S)
    assert alone.take_over(floor=1_795_320_000_000) == 1_795_320_000_000
    assert alone.take_over(floor=1_795_323_600_000) == 1_795_320_000_001  # its own + 1
    ahead = Leadership("ctl-b", TAKEOVER_S)
    retained(ahead, beat("ctl-a", 1_795_320_000_001), now=0.0)
    assert ahead.take_over(floor=1_795_323_600_000) == 1_795_320_000_002
