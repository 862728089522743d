"""FillFollower's rule as a property: whatever the job tells it and whenever, the targets it
hands out never fall more than one window's share in any window while the job does no work,
never leave ``[0, cap]``, a change of state never raises one at once, and a wait falls at
once but stays ready to resume within one window's rise for as long as the rule promises (docs/JOBHOOK.md). No broker: requests go in through ``take``, the decoded form of
every message (the network side is tested against Mosquitto in test_jobhook_fill.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from powerd.jobhook import FillFollower
from powerd.protocol import FillRequest, GpuFill
from tests.support.clock import ManualClock

NODE = "n1"
EPS_W = 1e-6

profiles = st.fixed_dictionaries(
    {
        "cap_w": st.floats(200.0, 1200.0),
        "floor_share": st.sampled_from([0.0, 0.0, 0.2, 0.5]),
        "up_w_per_s": st.sampled_from([0.0, 11.0, 50.0, 70.0, 400.0]),
        "down_w_per_s": st.sampled_from([0.0, 11.0, 50.0, 70.0, 400.0]),
        "hysteresis_s": st.sampled_from([0.0, 0.25, 1.0, 2.0]),
    }
)
events = st.lists(
    st.one_of(
        st.tuples(st.just("sample"), st.floats(0.0, 1.0)),  # the draw, as a share of the cap
        st.tuples(st.just("advance"), st.floats(0.0, 0.7)),
        st.tuples(st.just("state"), st.sampled_from(["waiting", "working"])),
        st.tuples(st.just("state"), st.sampled_from(["stopping", "starting"])),
        st.tuples(st.just("announce"), st.floats(0.1, 4.0)),  # waiting(expected_s)
    ),
    min_size=1,
    max_size=40,
)
STOP_THEN_WAIT = [("state", "stopping"), ("advance", 0.5), ("state", "waiting")]
STOP_FOR_A_WINDOW = [("state", "stopping"), ("advance", 0.5), ("advance", 0.5)]
RAMPS = {"cap_w": 700.0, "floor_share": 0.0, "up_w_per_s": 50.0, "down_w_per_s": 50.0}


def request(profile: dict[str, float], share: float) -> FillRequest:
    cap_w = profile["cap_w"]
    gpu = GpuFill(
        index=0,
        power_w=share * cap_w,
        cap_w=cap_w,
        floor_w=profile["floor_share"] * cap_w,
        ramp_up_w_per_s=profile["up_w_per_s"],
        ramp_down_w_per_s=profile["down_w_per_s"],
        hysteresis_s=profile["hysteresis_s"],
    )
    return FillRequest(v=1, node=NODE, ts=0.0, seq=0, gpus=[gpu])


def h100_working_at_475_w() -> tuple[ManualClock, FillFollower, dict[str, float]]:
    """A follower of one H100 (700 W cap, 70 W/s each way, 1 s hysteresis) whose job works
    at 475 W, on a manual clock."""
    clock = ManualClock(100.0)
    fill = FillFollower(
        "mqtt://127.0.0.1:1", [NODE], lambda node, targets: None, clock=clock.monotonic
    )
    profile = {**RAMPS, "up_w_per_s": 70.0, "down_w_per_s": 70.0, "hysteresis_s": 1.0}
    fill.take(NODE, request(profile, 475.0 / 700.0))
    return clock, fill, profile


def enter(fill: FillFollower, state: str) -> None:
    {
        "waiting": fill.waiting,
        "working": fill.working,
        "stopping": fill.stopping,
        "starting": fill.starting,
    }[state]()


@settings(max_examples=500, deadline=None)
@given(profile=profiles, first_share=st.floats(0.0, 1.0), script=events)
@example(profile={**RAMPS, "hysteresis_s": 1.0}, first_share=0.8, script=STOP_THEN_WAIT)
@example(profile={**RAMPS, "hysteresis_s": 1.0}, first_share=0.8, script=STOP_FOR_A_WINDOW)
def test_no_window_falls_more_than_its_share_and_a_wait_stays_ready(profile, first_share, script):
    clock = ManualClock(100.0)
    fill = FillFollower(
        "mqtt://127.0.0.1:1", [NODE], lambda node, targets: None, clock=clock.monotonic
    )
    window_s, down, up = profile["hysteresis_s"], profile["down_w_per_s"], profile["up_w_per_s"]
    fill.take(NODE, request(profile, first_share))
    state, worked_w = "working", first_share * profile["cap_w"]
    sampled_w = worked_w  # the draw the agent sampled last
    seen: list[tuple[float, float]] = []  # (t, target) since the job last worked
    wait: tuple[float, float] | None = None  # (entered at, H): a wait entered from work

    def look() -> None:
        target = fill.targets(NODE)[0]
        assert -EPS_W <= target <= profile["cap_w"] + EPS_W
        if state == "working":
            assert target == pytest.approx(profile["floor_share"] * profile["cap_w"])
            return
        now = clock.monotonic()
        for t, earlier in seen:  # the grid measures a ramp as the change over its window
            if now - t <= window_s:
                assert earlier - target <= down * window_s + EPS_W, (t, now, earlier, target)
        seen.append((now, target))
        if wait is not None and state == "waiting":
            entered, held_w = wait
            # it falls at once, but stays ready to climb back within one window's rise
            # through the hysteresis, and on until the fall has taken that much
            fall_s = up * window_s / down if down > 0 else math.inf
            if now <= entered + max(window_s, fall_s):
                assert target >= held_w - up * window_s - EPS_W, (entered, now, target)

    for kind, value in script:
        if kind == "announce":  # a wait whose length the job says: never below the rule's
            if state == "working":  # wait, so the readiness below holds as it is
                seen.clear()
                wait = (clock.monotonic(), worked_w)
            else:
                wait = None  # from a wait: one that begins where it is; from a start or a
            before = fill.targets(NODE)[0]  # stop: a wait that does not raise it at once
            fill.waiting(expected_s=value)
            if state != "working":
                assert (
                    fill.targets(NODE)[0]
                    <= max(before, profile["floor_share"] * profile["cap_w"]) + EPS_W
                )
            state = "waiting"
            look()
            continue
        if kind == "sample":
            fill.take(NODE, request(profile, value))
            sampled_w = value * profile["cap_w"]
            if state == "working":
                worked_w = value * profile["cap_w"]
        elif kind == "advance":
            clock.advance(value)
        elif value != state:
            before = fill.targets(NODE)[0]
            wait = None
            if state == "working":
                seen.clear()  # work draws what it draws: the fill starts afresh
                if value == "waiting":
                    wait = (clock.monotonic(), worked_w)
            elif value != "working":  # a change of state never raises a target at once,
                enter(fill, value)  # but for the floor, of a job that runs again after a stop
                allowed_w = before
                if value != "stopping":
                    allowed_w = max(before, profile["floor_share"] * profile["cap_w"])
                if value == "starting":  # nor above the draw: a start rises from where it is
                    allowed_w = max(allowed_w, sampled_w)
                state = value
                assert fill.targets(NODE)[0] <= allowed_w + EPS_W
                look()
                continue
            enter(fill, value)
            if value == "working":  # until a sample at work, it stands where work found it
                worked_w = max(before, sampled_w)
            state = value
        look()
    fill.close()


def test_a_long_wait_fills_back_up_before_compute_resumes():
    """An H100 works at 475 W; its job checkpoints for 30 s, the controller stages its cap
    down to the 200 W minimum and it draws 98 W. Compute resumed at once would step it up
    102 W, more than its 70 W share of a window's rise (70 W/s over 1 s): the job must fill
    back up first, from the 98 W it draws, at 70 W/s. After a 1.5 s collective, fallen at
    once by its 70 W share and held there, it may resume at once."""
    clock = ManualClock(100.0)
    fill = FillFollower(
        "mqtt://127.0.0.1:1", [NODE], lambda node, targets: None, clock=clock.monotonic
    )
    assert not fill.must_rise_first()  # no request: nothing is smoothed
    assert fill.wait_risen(timeout_s=0.0)
    profile = {**RAMPS, "up_w_per_s": 70.0, "down_w_per_s": 70.0, "hysteresis_s": 1.0}
    fill.take(NODE, request(profile, 475.0 / 700.0))
    assert not fill.must_rise_first()  # working
    fill.waiting()
    clock.advance(1.5)
    assert fill.targets(NODE)[0] == pytest.approx(475.0 - 70.0)
    assert not fill.must_rise_first()
    fill.working()
    fill.take(NODE, request(profile, 475.0 / 700.0))
    fill.waiting()  # the checkpoint
    for _ in range(30):
        clock.advance(1.0)
        fill.take(NODE, request({**profile, "cap_w": 200.0}, 98.0 / 200.0))
    assert fill.targets(NODE)[0] == 0.0  # fallen below the GPU's own draw
    assert fill.must_rise_first()
    fill.starting()
    assert fill.targets(NODE)[0] == pytest.approx(98.0)  # from where it stands
    assert not fill.wait_risen(timeout_s=0.0)
    clock.advance(1.0)
    assert fill.targets(NODE)[0] == pytest.approx(168.0)
    assert not fill.wait_risen(timeout_s=0.0)
    clock.advance(0.45)
    assert fill.wait_risen(timeout_s=0.0)  # within a watt of the 200 W cap compute will take
    assert fill.targets(NODE)[0] <= 200.0
    fill.close()


def test_fill_back_up_rises_only_where_it_must_or_after_a_checkpoint():
    clock, fill, profile = h100_working_at_475_w()
    fill.waiting()
    clock.advance(0.5)  # fallen 35 W, within its share: nothing to fill, the wait goes on
    assert fill.fill_back_up(timeout_s=0.0)
    assert fill.targets(NODE)[0] == pytest.approx(440.0)
    clock.advance(1.0)  # fallen 70 W, but after a checkpoint it fills back up all the same
    fill.take(NODE, request(profile, 440.0 / 700.0))  # the agent's sample: where it stands
    assert not fill.fill_back_up(timeout_s=0.0, after_checkpoint=True)  # rising, not risen
    clock.advance(0.5)
    assert fill.targets(NODE)[0] == pytest.approx(475.0)  # 440 W + 70 W/s, at the level
    assert fill.wait_risen(timeout_s=0.0)
    fill.close()


def test_a_cap_raised_during_a_wait_counts_where_the_gpu_worked_held_at_its_cap():
    """An H100 works held at its 474 W cap; the controller hands it 51 W more just as its
    job's collective begins, so the draw at work never shows it. Sampled at 440 W by the
    end of a 1.5 s wait, compute would put it at its new 525 W cap: 85 W up at once,
    more than its 70 W share, so it fills back up first. One that worked at 400 W under
    the same cap wanted no more: it resumes at 400 W, fallen 34 W, within its share."""
    clock = ManualClock(100.0)
    fill = FillFollower(
        "mqtt://127.0.0.1:1", [NODE], lambda node, targets: None, clock=clock.monotonic
    )
    profile = {**RAMPS, "up_w_per_s": 70.0, "down_w_per_s": 68.0, "hysteresis_s": 1.0}
    held = {**profile, "cap_w": 474.0}
    fill.take(NODE, request(held, 1.0))  # drawing its cap
    fill.waiting()
    clock.advance(1.5)
    fill.take(NODE, request({**profile, "cap_w": 525.0}, 440.0 / 525.0))  # the raise
    assert fill.resume_levels(NODE) == {0: 525.0}
    assert fill.must_rise_first()
    fill.working()
    fill.take(NODE, request(held, 400.0 / 474.0))  # a step that wanted less than its cap
    fill.waiting()
    clock.advance(1.5)
    fill.take(NODE, request({**profile, "cap_w": 525.0}, 366.0 / 525.0))
    assert fill.resume_levels(NODE) == {0: pytest.approx(400.0)}
    assert not fill.must_rise_first()
    fill.close()


def test_no_fill_back_up_once_the_requests_go_stale():
    clock = ManualClock(100.0)
    fill = FillFollower(
        "mqtt://127.0.0.1:1",
        [NODE],
        lambda node, targets: None,
        clock=clock.monotonic,
        stale_after_s=5.0,
    )
    profile = {**RAMPS, "up_w_per_s": 70.0, "down_w_per_s": 70.0, "hysteresis_s": 1.0}
    fill.take(NODE, request(profile, 475.0 / 700.0))
    fill.waiting()
    clock.advance(4.0)  # held 1 s, fallen 210 W since, and sampled there
    fill.take(NODE, request(profile, 265.0 / 700.0))
    assert fill.must_rise_first()
    clock.advance(6.0)  # the agent went quiet: nothing is smoothed, nothing to wait for
    assert not fill.must_rise_first()
    fill.starting()
    assert fill.wait_risen(timeout_s=0.0)
    fill.close()


def test_take_refuses_a_node_it_does_not_follow():
    fill = FillFollower("mqtt://127.0.0.1:1", [NODE], lambda n, t: None)
    with pytest.raises(ValueError, match="not a node"):
        fill.take("elsewhere", request({**RAMPS, "hysteresis_s": 1.0}, 0.5))
    assert fill.received == 0
    fill.close()


def test_an_announced_wait_is_back_where_compute_resumes_when_it_should_end():
    """An H100 works at 475 W (70 W/s each way, 1 s hysteresis); its job announces a 3 s
    wait. The target falls at once at 70 W/s to its share of a window's rise under 475 W,
    stays there, and meets the climb that brings it back to 475 W at 3 s: 440 W at 0.5 s,
    405 W from 1 to 2 s (the valley), 440 W at 2.5 s, 475 W at 3 s, so compute resumes with
    nothing to fill first. Not announced, it has fallen to 335 W by then (from 2 s on, as
    one held through the hysteresis) and must fill back up. A wait that outlasts its
    announcement holds 475 W through another hysteresis, then falls again."""
    clock, fill, profile = h100_working_at_475_w()
    fill.waiting(expected_s=3.0)
    seen = []
    for _ in range(6):
        clock.advance(0.5)
        seen.append(fill.targets(NODE)[0])
    assert seen == pytest.approx([440.0, 405.0, 405.0, 405.0, 440.0, 475.0])
    assert not fill.must_rise_first()
    clock.advance(1.0)  # it goes on: held through the hysteresis after its end
    assert fill.targets(NODE)[0] == pytest.approx(475.0)
    clock.advance(1.0)
    assert fill.targets(NODE)[0] == pytest.approx(405.0)
    fill.working()
    fill.take(NODE, request(profile, 475.0 / 700.0))
    fill.waiting()  # the same wait, not announced
    clock.advance(3.0)
    assert fill.targets(NODE)[0] == pytest.approx(335.0)
    fill.take(NODE, request(profile, 335.0 / 700.0))  # the agent sees it there
    assert fill.must_rise_first()
    # an announcement that says nothing (not finite, not positive) is no announcement
    for nonsense in (math.nan, math.inf, 0.0, -1.0):
        fill.working()
        fill.take(NODE, request(profile, 475.0 / 700.0))  # the agent's sample: not stale
        fill.waiting(expected_s=nonsense)
        clock.advance(3.0)
        assert fill.targets(NODE)[0] == pytest.approx(335.0)
    fill.close()


def test_an_announced_wait_climbs_to_a_cap_handed_back_just_before_it():
    """An H100 works held at its 560 W cap; the controller hands it 25 W more as its job's
    3 s checkpoint begins, so the draw at work never shows it: compute will put it at 585
    W. The plan brings it there by the checkpoint's end (climbing from 560 W, never faster
    than 70 W/s), not to the 560 W it stood at, so compute resumes with nothing to fill
    first; a 0.2 s wait announced from the same place climbs only what 0.2 s allows."""
    for expected_s, end_w in ((3.0, 585.0), (0.2, 574.0)):
        clock = ManualClock(100.0)
        fill = FillFollower(
            "mqtt://127.0.0.1:1", [NODE], lambda node, targets: None, clock=clock.monotonic
        )
        profile = {**RAMPS, "up_w_per_s": 70.0, "down_w_per_s": 70.0, "hysteresis_s": 1.0}
        fill.take(NODE, request({**profile, "cap_w": 560.0}, 1.0))  # held at its cap
        fill.take(NODE, request({**profile, "cap_w": 585.0}, 560.0 / 585.0))  # the raise
        fill.waiting(expected_s=expected_s)
        assert fill.targets(NODE)[0] == pytest.approx(560.0)  # no step up at once
        clock.advance(expected_s)
        assert fill.targets(NODE)[0] == pytest.approx(end_w)
        assert fill.must_rise_first() is False
        fill.close()


def test_a_wait_announced_after_another_is_back_at_the_later_end():
    """A 1.5 s collective, then at once a 3 s checkpoint (the job still waits): the target
    goes on as a wait that begins there, to the checkpoint's end: back at 475 W 4.5 s in,
    not fallen since 2.5 s as the collective's end would have it."""
    clock, fill, _ = h100_working_at_475_w()
    fill.waiting(expected_s=1.5)
    clock.advance(1.5)
    fill.waiting(expected_s=3.0)  # a wait from here, to its own end
    clock.advance(1.0)  # fallen at once to its share of a window's rise under it
    assert fill.targets(NODE)[0] == pytest.approx(405.0)
    clock.advance(1.0)  # the valley: fallen 70 W, 70 W to climb in the last second
    assert fill.targets(NODE)[0] == pytest.approx(405.0)
    clock.advance(1.0)
    assert fill.targets(NODE)[0] == pytest.approx(475.0)
    assert not fill.must_rise_first()
    fill.close()


def test_after_a_checkpoint_it_fills_back_up_to_where_compute_was_then_not_its_stage_cap():
    """An H100 works held at its 560 W cap; its job waits 3 s, announced, and the cap is
    640 W at the end. In a checkpoint that is the controller's staged cap, climbing with
    the fill a headroom over it (counted as drawn when compute begins): the plan ends at
    560 W, where compute would have put it as the checkpoint began, and filling back up
    after it stops there. Chasing the staged cap filled for its whole headroom while
    compute waited (1.4 s at 70 W/s in `powerd demo`), and compute stepped up to the new
    one all the same. In a collective it is a cap handed back, counted as drawn when it
    came (rule 4), which compute resumed takes: the plan goes there (at once, landing as
    it ends), and compute waits for nothing (it waited 1.5 s in a demo)."""
    profile = {**RAMPS, "up_w_per_s": 70.0, "down_w_per_s": 70.0, "hysteresis_s": 1.0}
    for checkpoint, end_w in ((True, 560.0), (False, 640.0)):
        clock = ManualClock(100.0)
        fill = FillFollower(
            "mqtt://127.0.0.1:1", [NODE], lambda node, targets: None, clock=clock.monotonic
        )
        fill.take(NODE, request({**profile, "cap_w": 560.0}, 1.0))  # held at its cap
        fill.waiting(expected_s=3.0, checkpoint=checkpoint)
        clock.advance(3.0)
        assert fill.targets(NODE)[0] == pytest.approx(560.0)  # the plan is back, as begun
        fill.take(NODE, request({**profile, "cap_w": 640.0}, 560.0 / 640.0))  # the raise
        assert fill.targets(NODE)[0] == pytest.approx(end_w)
        assert fill.fill_back_up(0.0, after_checkpoint=checkpoint)  # nothing to fill
        fill.close()


def test_a_stop_before_any_sample_at_work_falls_from_where_work_found_it():
    """An H100 worked at 300 W, then waited and filled back up to 475 W; compute resumes
    and the job stops 20 ms later, before the agent's next sample. The stop falls from 475
    W at 70 W/s, not from the 300 W its earlier work was sampled at (a fall of 175 W at
    once, which broke the ramp-down in `powerd demo` when waits were not announced)."""
    clock = ManualClock(100.0)
    fill = FillFollower(
        "mqtt://127.0.0.1:1", [NODE], lambda node, targets: None, clock=clock.monotonic
    )
    profile = {**RAMPS, "up_w_per_s": 70.0, "down_w_per_s": 70.0, "hysteresis_s": 1.0}
    fill.take(NODE, request(profile, 300.0 / 700.0))  # at work
    fill.waiting()
    fill.take(NODE, request(profile, 100.0 / 700.0))
    fill.starting()  # fills back up from its 300 W target, at 70 W/s
    clock.advance(175.0 / 70.0)
    assert fill.targets(NODE)[0] == pytest.approx(475.0)
    fill.working()
    clock.advance(0.02)
    fill.stopping()
    assert fill.targets(NODE)[0] == pytest.approx(475.0)
    clock.advance(1.0)
    assert fill.targets(NODE)[0] == pytest.approx(405.0)
    fill.close()
