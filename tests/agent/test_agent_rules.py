"""The agent's rules (``powerd.agent.rules``), one copy each: ``AgentCore`` calls them for its
node, the fleet simulator for each of its nodes; the two paths give the same answers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from powerd.agent import rules
from powerd.protocol import AckError

orders = st.tuples(st.integers(-1, 5), st.integers(-1, 5))


@given(epoch=st.integers(0, 5), seq=st.integers(0, 5), newest=st.integers(-1, 5), last=orders)
def test_a_command_is_stale_unless_current_and_after_the_last_applied(
    epoch: int, seq: int, newest: int, last: rules.Order
) -> None:
    in_order = epoch >= newest and (epoch, seq) > last
    assert rules.is_stale(epoch, seq, newest, last) is not in_order


@given(last=orders, floor=st.none() | orders)
def test_a_live_heartbeat_only_raises_the_floor(
    last: rules.Order, floor: rules.Order | None
) -> None:
    after = rules.order_after_live(last, floor)
    assert after >= last and (floor is None or after >= floor)


def test_a_deposed_epoch_followed_starts_the_order_afresh() -> None:
    assert rules.order_after_new_epoch((5, 9), 3) == (3, -1)
    assert rules.order_after_new_epoch((5, 9), 6) == (5, 9)  # newer: the order holds


def test_refusals_and_liveness() -> None:
    assert rules.refusal("local", True) == rules.REFUSED_LOCAL
    assert rules.refusal("controlled", False) == rules.REFUSED_NOT_LIVE
    assert rules.refusal("controlled", True) is None
    assert rules.controller_live("controlled", 10.0, 10.0)
    assert not rules.controller_live("failsafe", 0.0, 10.0)
    assert rules.live_until(20.0, 5.0, 10.0) == 20.0  # never shortened
    assert rules.live_until(12.0, 5.0, 10.0) == 15.0


@given(held_w=st.floats(100.0, 1200.0), failsafe_w=st.floats(100.0, 1200.0))
def test_failsafe_is_make_before_break(held_w: float, failsafe_w: float) -> None:
    cap_w, below = rules.failsafe_cap_w(held_w, failsafe_w)
    assert cap_w <= failsafe_w  # nothing above its failsafe cap, at once
    assert below == (cap_w < failsafe_w - rules.FAILSAFE_BELOW_MARGIN_W)
    assert rules.failsafe_raise_at(1.0, 10.0, below) == (
        1.0 + rules.FAILSAFE_RAISE_SHARE * 10.0 if below else None
    )


def test_an_ack_lists_at_most_max_ack_errors() -> None:
    errors = [rules.unknown_gpu_error(i, [0, 1]) for i in range(100, 140)]
    ack = rules.make_ack("n1", 1, 2, 0.0, rules.applied_result(errors), [], errors)
    assert ack.result == "partial" and len(ack.errors) == rules.MAX_ACK_ERRORS
    assert ack.errors[-1] == AckError(index=None, message="9 more errors")
    assert rules.applied_result([]) == "applied"


def test_communication_locks_a_policys_clocks_and_any_other_phase_unlocks_them() -> None:
    assert rules.phase_locks("communication")
    assert not any(rules.phase_locks(p) for p in ("compute", "checkpoint", "eval", "startup"))


jobs = st.none() | st.tuples(st.sampled_from(["a", "b"]), st.none() | st.just("alice"))


@given(locked=st.booleans(), old=jobs, new=jobs)
def test_an_announcements_lock_stays_through_a_command_only_for_the_same_job(
    locked: bool, old: rules.PolicyJob | None, new: rules.PolicyJob | None
) -> None:
    stays = rules.lock_stays(locked, old, new)
    assert stays == (locked and old is not None and old == new)


def test_a_smoothing_profile_is_written_only_when_it_differs_and_its_floor_clamped() -> None:
    from powerd.gpu.base import SmoothingProfile, SmoothingRange

    device = SmoothingRange(10.0, 90.0, 4)
    active = SmoothingProfile(0, True, 50.0, 100.0, 100.0, 1000.0)
    assert rules.smoothing_to_write(active, active, device) == (None, False)
    low = SmoothingProfile(0, True, 2.0, 100.0, 100.0, 1000.0)  # under the device's floor
    write, clamped = rules.smoothing_to_write(active, low, device)
    assert clamped and write is not None and write.floor_percent == 10.0
