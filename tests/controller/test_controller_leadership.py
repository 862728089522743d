"""Leadership: epochs from heartbeats, step-down, standby takeover (docs/PROTOCOL.md rule 2)."""

from __future__ import annotations

import pytest

from powerd.controller.leadership import Leadership
from powerd.protocol import Heartbeat

TAKEOVER_S = 10.0


def beat(controller: str, epoch: int, state: str = "leader") -> Heartbeat:
    return Heartbeat(v=1, epoch=epoch, ts=0.0, controller=controller, state=state)  # type: ignore[arg-type]


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
    lead.observe(beat("ctl-x", 3, state), now_mono=100.0, age_s=60.0)  # old retained one
    lead.observe(beat("ctl-y", 41, state), now_mono=100.0, age_s=60.0)
    lead.observe(beat("ctl-z", 7, state), now_mono=100.0, age_s=60.0)
    assert lead.should_lead(100.0)  # none of them is a live leader
    assert lead.take_over() == 42


def test_a_restarted_controller_outnumbers_its_own_previous_epoch() -> None:
    lead = Leadership("ctl-a", TAKEOVER_S)
    lead.observe(beat("ctl-a", 9), now_mono=100.0, age_s=30.0)  # our own, from before a crash
    assert lead.take_over() == 10


def test_a_live_leader_keeps_it_standby_until_silent_for_takeover_after_s() -> None:
    standby = Leadership("ctl-b", TAKEOVER_S)
    standby.observe(beat("ctl-a", 4), now_mono=100.0, age_s=0.5)
    assert not standby.should_lead(100.0)
    assert standby.leader_seen_mono == 99.5  # when it was sent, by its age
    assert not standby.should_lead(99.5 + TAKEOVER_S)  # exactly the limit: not yet
    assert standby.should_lead(99.5 + TAKEOVER_S + 0.1)
    assert standby.take_over() == 5


def test_heartbeats_keep_it_standby_for_ever() -> None:
    standby = Leadership("ctl-b", TAKEOVER_S)
    for t in range(0, 300, 1):
        standby.observe(beat("ctl-a", 4), now_mono=float(t), age_s=0.1)
        assert not standby.should_lead(float(t) + 0.5)


def test_a_stale_retained_leader_heartbeat_does_not_hold_it_back() -> None:
    lead = Leadership("ctl-b", TAKEOVER_S)
    lead.observe(beat("ctl-a", 4), now_mono=100.0, age_s=TAKEOVER_S + 1.0)
    assert lead.should_lead(100.0)
    assert lead.take_over() == 5


def test_a_standby_heartbeat_does_not_hold_it_back() -> None:
    """A leader that stopped cleanly leaves a standby heartbeat: take over at once."""
    lead = Leadership("ctl-b", TAKEOVER_S)
    lead.observe(beat("ctl-a", 4, "standby"), now_mono=100.0, age_s=0.0)
    assert lead.should_lead(100.0)
    assert lead.take_over() == 5


def test_the_leaders_clean_stop_lets_a_watching_standby_take_over_at_once() -> None:
    standby = Leadership("ctl-b", TAKEOVER_S)
    standby.observe(beat("ctl-a", 4), now_mono=100.0, age_s=0.0)
    assert not standby.should_lead(101.0)
    standby.observe(beat("ctl-a", 4, "standby"), now_mono=101.0, age_s=0.0)  # ctl-a stops
    assert standby.should_lead(101.0)
    assert standby.take_over() == 5


def test_another_controllers_standby_heartbeat_does_not_end_the_wait() -> None:
    standby = Leadership("ctl-b", TAKEOVER_S)
    standby.observe(beat("ctl-a", 4), now_mono=100.0, age_s=0.0)
    standby.observe(beat("ctl-c", 3, "standby"), now_mono=101.0, age_s=0.0)
    assert not standby.should_lead(101.0)


def test_its_own_heartbeat_back_from_the_broker_changes_nothing() -> None:
    lead = leader("ctl-b", 5)
    assert not lead.observe(beat("ctl-b", 5), now_mono=100.0, age_s=0.0)
    assert lead.leading and lead.leader_seen_mono == float("-inf")


# --- stepping down ---------------------------------------------------------------------


def test_steps_down_on_a_higher_epoch() -> None:
    lead = leader("ctl-a", 5)
    assert lead.observe(beat("ctl-z", 6), now_mono=100.0, age_s=0.0)
    assert not lead.leading
    assert not lead.should_lead(100.0 + TAKEOVER_S - 1)
    assert lead.should_lead(100.0 + TAKEOVER_S + 1)  # the other went silent
    assert lead.take_over() == 7


def test_same_epoch_the_lower_name_wins() -> None:
    b = leader("ctl-b", 5)
    assert b.observe(beat("ctl-a", 5), now_mono=100.0, age_s=0.0)  # "ctl-a" < "ctl-b"
    assert not b.leading
    a = leader("ctl-a", 5)
    assert not a.observe(beat("ctl-b", 5), now_mono=100.0, age_s=0.0)
    assert a.leading


def test_a_lower_epoch_does_not_make_it_step_down() -> None:
    lead = leader("ctl-z", 5)
    assert not lead.observe(beat("ctl-a", 4), now_mono=100.0, age_s=0.0)
    assert lead.leading


def test_a_standby_or_stale_heartbeat_does_not_make_it_step_down() -> None:
    lead = leader("ctl-b", 5)
    assert not lead.observe(beat("ctl-a", 9, "standby"), now_mono=100.0, age_s=0.0)
    assert not lead.observe(beat("ctl-a", 9), now_mono=100.0, age_s=TAKEOVER_S + 5)
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
                me.observe(beat(other.name, other.epoch), now, age_s=0.05)
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
        b.observe(beat("ctl-a", a.epoch), now, age_s=0.0)
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
    a.observe(beat("ctl-b", b.epoch), now, age_s=0.0)
    assert not a.leading and not a.should_lead(now + 1.0)


def test_an_epoch_is_at_least_the_floor_and_above_every_one_seen() -> None:
    """The service's floor is the wall clock in ms: a controller that found no retained
    heartbeat still leads above a leader that died before it started."""
    lead = leader("ctl-a", epoch=2)
    assert lead.take_over(floor=1_795_320_000_000) == 1_795_320_000_000
    assert lead.take_over(floor=5) == 1_795_320_000_001  # above its own, whatever the floor
    other = Leadership("ctl-b", takeover_after_s=10.0)
    other.observe(beat("ctl-a", 1_795_320_000_001), 0.0, age_s=0.0)
    assert other.take_over(floor=1_795_320_000_000) == 1_795_320_000_002
