"""The controller judges its telemetry path over a window (powerd.controller.ingest_health):
one sample replaced now and then is coalescing and says nothing; a share of them, or any
sample lost on the way, is worth an operator's attention."""

from __future__ import annotations

import pytest

from powerd.controller.ingest_health import DROPPED_SHARE, JUDGE_S, JUDGE_SAMPLES, IngestHealth

CYCLE_S = 0.5


def run(health: IngestHealth, cycles: int, received: int, dropped_every: int = 0, lost_at=()):
    """``cycles`` cycles of ``received`` samples each, one of them dropped every
    ``dropped_every`` cycles, one lost at the cycles in ``lost_at``; the messages."""
    out = []
    for k in range(cycles):
        dropped = 1 if dropped_every and k % dropped_every == 0 else 0
        message = health.add(k * CYCLE_S, received, dropped, int(k in lost_at), 1)
        if message is not None:
            out.append(message)
    return out


def test_a_sample_replaced_now_and_then_is_not_a_controller_falling_behind():
    """One node at 10 Hz, 0.5 s cycles (bench_smooth_loop): a sample replaced once in 25 s
    warned "over capacity" every minute; it is 1 in 250."""
    assert run(IngestHealth(), cycles=50, received=5, dropped_every=50) == []


def test_a_share_of_samples_replaced_is_over_capacity():
    messages = run(IngestHealth(), cycles=50, received=5, dropped_every=2)  # 1 in 10
    assert messages and all(m.startswith("telemetry over capacity: ") for m in messages)
    # the first window: cycles 0-20 (10 s), 105 samples, 11 of them replaced
    assert "11 of 105 samples dropped" in messages[0] and "in 10.0 s" in messages[0]


def test_any_sample_lost_is_said_however_few():
    messages = run(IngestHealth(), cycles=50, received=5, lost_at=(7,))
    assert len(messages) == 1 and messages[0].startswith("telemetry lost: ")
    assert "1 lost" in messages[0]


@pytest.mark.parametrize("received", [1, 400])
def test_judged_after_its_seconds_or_its_samples_whichever_first(received):
    health = IngestHealth()
    dropped = int(received * 2 * DROPPED_SHARE) + 1  # well over the share
    first = None
    for k in range(100):
        if health.add(k * CYCLE_S, received, dropped, 0, 0) is not None:
            first = k * CYCLE_S
            break
    assert first is not None
    if received >= JUDGE_SAMPLES:
        assert first == 0.0  # a flood is judged at once
    else:
        assert first == pytest.approx(JUDGE_S)
