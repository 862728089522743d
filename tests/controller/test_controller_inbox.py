"""The controller's telemetry inbox: newest payload per node, fair order, bounded, counted."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from powerd.controller.inbox import TelemetryInbox, Waiting

TOPICS = [f"powerd/v1/c/nodes/n{i}/telemetry" for i in range(4)]


def test_newest_payload_wins_and_replacements_are_counted() -> None:
    inbox = TelemetryInbox(TOPICS)
    assert inbox.put(TOPICS[1], b"a", 1.0) == 1
    assert inbox.put(TOPICS[1], b"b", 2.0) == 1
    assert inbox.put(TOPICS[1], b"c", 3.0) == 1
    assert (len(inbox), inbox.received, inbox.replaced) == (1, 3, 2)
    assert inbox.take(10) == [Waiting(1, b"c", 3.0, 2)]
    assert len(inbox) == 0 and inbox.take(10) == []
    inbox.put(TOPICS[1], b"d", 4.0)  # the replaced count starts again once taken
    assert inbox.take(10) == [Waiting(1, b"d", 4.0, 0)]


def test_unknown_topics_are_counted_not_filed() -> None:
    inbox = TelemetryInbox(TOPICS)
    assert inbox.put("powerd/v1/c/nodes/ghost/telemetry", b"x", 1.0) is None
    assert (len(inbox), inbox.received, inbox.unknown) == (0, 0, 1)


def test_longest_waiting_first_and_a_refilled_slot_keeps_its_place() -> None:
    inbox = TelemetryInbox(TOPICS)
    for i in (2, 0, 3):
        inbox.put(TOPICS[i], b"x", float(i))
    inbox.put(TOPICS[2], b"y", 9.0)  # refilled: still first in line
    assert [w.server for w in inbox.take(2)] == [2, 0]
    inbox.put(TOPICS[2], b"z", 10.0)  # taken, so it queues behind 3
    assert [w.server for w in inbox.take(5)] == [3, 2]


def test_waiting_arrivals_are_those_still_in_the_inbox() -> None:
    inbox = TelemetryInbox(TOPICS)
    inbox.put(TOPICS[3], b"x", 5.0)
    inbox.put(TOPICS[1], b"x", 6.0)
    inbox.take(1)
    servers, arrived = inbox.waiting_arrivals()
    assert servers.tolist() == [1] and arrived.tolist() == [6.0]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("put"), st.integers(0, 3)),
            st.tuples(st.just("take"), st.integers(0, 5)),
        ),
        max_size=60,
    )
)
def test_every_payload_is_taken_or_counted_replaced_and_memory_is_bounded(ops) -> None:
    """Whatever the interleaving: received = taken + replaced + waiting, at most one
    payload per node waits, and each node's taken payload is the newest it sent."""
    inbox = TelemetryInbox(TOPICS)
    sent: dict[int, int] = {}
    taken = 0
    clock = 0.0
    for op, arg in ops:
        clock += 1.0
        if op == "put":
            sent[arg] = sent.get(arg, 0) + 1
            inbox.put(TOPICS[arg], f"{arg}:{sent[arg]}".encode(), clock)
        else:
            for w in inbox.take(arg):
                assert w.payload == f"{w.server}:{sent[w.server]}".encode()
                taken += 1
        assert len(inbox) <= len(TOPICS)
        assert inbox.received == taken + inbox.replaced + len(inbox)
    servers, _ = inbox.waiting_arrivals()
    assert len(np.unique(servers)) == len(servers)
