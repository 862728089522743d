"""ControllerCore's commands: what is sent, when, and what the acks do to it."""

from __future__ import annotations

import numpy as np
import pytest
from msgspec import UNSET

from policies import ClusterState, PolicySettings, decide
from policies.tree import PHASE_CODES
from powerd.controller.core import CAP_TOLERANCE_W
from powerd.protocol import Command, decode, encode
from tests.controller.test_controller_core import (
    BANDS,
    CAP_MAX_W,
    COMM_CLOCK_MHZ,
    FAILSAFE_W,
    K1_TARGET_W,
    NODES,
    WALL0,
    Bench,
    ack_payload,
    budgets,
    make_bench,
)


@pytest.fixture
def bench() -> Bench:
    return make_bench(ack_timeout_s=3.0, command_ttl_s=30.0)


def bands_bench() -> Bench:
    """``bench`` under the bands (``BANDS``), for the tests whose numbers are theirs."""
    return make_bench(ack_timeout_s=3.0, command_ttl_s=30.0, policy=BANDS)


def caps_of(command: Command) -> list[float]:
    return [g.cap_w for g in command.gpus]  # type: ignore[misc]


# --- what is commanded -------------------------------------------------------------


def test_rack_over_budget_gets_lower_caps_the_others_their_maximum() -> None:
    bench = bands_bench()
    bench.report_all(650.0)
    result = bench.cycle()
    commands = dict(result.commands)
    assert sorted(commands) == sorted(NODES)  # a new controller commands every node once
    # rack k1: 4 x 650 W + 100 W is over 1470 W; it comes down to its 1425 W target
    k1_caps = caps_of(commands["k1-n1"]) + caps_of(commands["k1-n2"])
    assert k1_caps == pytest.approx([(K1_TARGET_W - 100.0) / 4] * 4)
    assert max(k1_caps) < 650.0
    for node in ("k2-n1", "k2-n2", "k3-n1"):
        assert caps_of(commands[node]) == [CAP_MAX_W, CAP_MAX_W]
    assert result.counters.commands_sent == len(NODES)
    assert result.decision.node_capping[bench.topology.node_index("k1")]


def test_command_fields_follow_the_protocol(bench: Bench) -> None:
    bench.core.new_epoch(7)
    bench.report_all(650.0)
    result = bench.cycle()
    seqs = [c.seq for _, c in result.commands]
    assert seqs == list(range(1, len(NODES) + 1))  # one seq per command, from 1 in an epoch
    for _, command in result.commands:
        assert command.epoch == 7
        assert command.ttl_s == 30.0
        assert command.ts == WALL0 + bench.clock.t
        assert [g.index for g in command.gpus] == [0, 1]  # the node's own (NVML) indices
        assert decode(Command, encode(command)) == command  # valid on the wire


def test_no_command_when_nothing_changed(bench: Bench) -> None:
    bench.report_all(650.0)
    bench.apply(bench.cycle())
    for _ in range(10):
        bench.clock.advance(1.0)
        bench.report_all(650.0)
        result = bench.cycle()
        assert result.commands == []
        assert result.counters.commands_sent == 0
        assert bench.core.pending == {}


def test_a_change_within_the_tolerance_sends_nothing_beyond_it_sends(bench: Bench) -> None:
    bench.report_all(650.0)
    commands = bench.apply(bench.cycle())
    cap = caps_of(commands["k1-n1"])[0]  # rack k1 capped: well inside the GPU's range
    bench.core.commanded_cap_w[0] = cap - 0.9 * CAP_TOLERANCE_W
    bench.report_all(650.0)
    assert bench.cycle(advance_s=1.0).commands == []
    bench.core.commanded_cap_w[0] = cap - 1.5 * CAP_TOLERANCE_W
    bench.report_all(650.0)
    result = bench.cycle(advance_s=1.0)
    assert [n for n, _ in result.commands] == ["k1-n1"]
    assert caps_of(result.commands[0][1]) == [cap, cap]  # the whole node


def test_the_last_fraction_of_a_watt_back_to_the_maximum_is_sent(bench: Bench) -> None:
    """Else the GPU would stay a fraction of a watt under cap_max: "capped" for ever."""
    bench.report_all(300.0)
    bench.apply(bench.cycle())
    gpus = bench.gpus("k2-n1")
    bench.core.commanded_cap_w[gpus.start] = CAP_MAX_W - 0.3
    bench.report_all(300.0)
    result = bench.cycle(advance_s=1.0)
    assert [n for n, _ in result.commands] == ["k2-n1"]
    assert caps_of(result.commands[0][1]) == [CAP_MAX_W, CAP_MAX_W]


def test_only_the_node_whose_caps_change_is_commanded() -> None:
    bench = bands_bench()
    bench.report_all(300.0)
    bench.apply(bench.cycle())
    bench.clock.advance(1.0)
    bench.report_all({"k1-n1": 650.0, "k1-n2": 300.0})  # k1: 1300 + 600 + 100 > 1470 W
    result = bench.cycle()
    assert [n for n, _ in result.commands] == ["k1-n1"]  # the GPUs drawing most give first
    assert all(c < 650.0 for c in caps_of(result.commands[0][1]))


def test_commanded_caps_are_remembered_not_read_back(bench: Bench) -> None:
    """Telemetry still showing the old cap does not trigger a command of the same cap again."""
    bench.report_all(650.0)
    bench.apply(bench.cycle())
    bench.caps.clear()  # the agents have not applied anything yet: telemetry says 700 W
    bench.report_all(650.0)
    assert bench.cycle(advance_s=1.0).commands == []


# --- acks and resends ---------------------------------------------------------------


def test_resend_after_the_ack_timeout_with_counters(bench: Bench) -> None:
    bench.report_all(650.0)
    first = bench.apply(bench.cycle(), ack=False)
    for _ in range(3):  # 3 s: not yet overdue (ack_timeout_s is 3)
        bench.clock.advance(1.0)
        bench.report_all(650.0)
        result = bench.cycle()
        assert result.commands == [] and result.counters.resends == 0
    bench.clock.advance(0.5)
    bench.report_all(650.0)
    result = bench.cycle()
    c = result.counters
    assert (c.resends, c.acks_missing, c.commands_sent) == (len(NODES),) * 3
    for node, command in result.commands:
        assert caps_of(command) == caps_of(first[node])  # the same caps again ...
        assert command.seq > first[node].seq  # ... under a new seq
        # a resend says everything, the clock too (null: no lock)
        assert all(g.max_sm_clock_mhz is None for g in command.gpus)
    assert {bench.core.tree.server_names[s]: seq for s, (seq, _) in bench.core.pending.items()} == {
        n: c.seq for n, c in result.commands
    }


def resend_times(bench: Bench, seconds: int, sent: dict[str, Command]) -> list[float]:
    """When (s from now) cycles 1 s apart resent k1-n1's command, no ack coming; ``sent``
    gets the last command of each node."""
    start, times = bench.clock.t, []
    for _ in range(seconds):
        bench.clock.advance(1.0)
        bench.report_all(650.0)
        result = bench.cycle()
        if "k1-n1" in dict(result.commands) and result.counters.resends:
            times.append(bench.clock.t - start)
        sent.update(bench.apply(result, ack=False))
    return times


def test_each_resend_without_an_ack_doubles_the_wait_and_an_ack_resets_it(bench: Bench) -> None:
    """Agents (or a broker) slow to answer are not sent everything again every 3 s."""
    bench.report_all(650.0)
    first = bench.apply(bench.cycle(), ack=False)
    assert "k1-n1" in first
    sent = dict(first)
    # sent at 0: resent after 3 s, then 6, 12, and every 24 s after that
    assert resend_times(bench, 70, sent) == [4.0, 11.0, 24.0, 49.0]
    bench.core.on_ack("k1-n1", ack_payload("k1-n1", sent["k1-n1"]))
    gpus = bench.gpus("k1-n1")
    bench.core.commanded_cap_w[gpus.start : gpus.stop] = 600.0  # its caps must change again
    bench.report_all(650.0)
    assert "k1-n1" in bench.apply(bench.cycle(advance_s=1.0), ack=False)
    assert resend_times(bench, 5, sent) == [4.0]  # back to 3 s after an ack
    assert resend_times(bench, 10, sent) == [6.0]  # (then 6 s)
    # a node that falls silent loses its pending command and, back, starts afresh (3 s)
    server = list(bench.core.tree.server_names).index("k1-n1")
    assert bench.core._resends_unacked[server] == 2
    others = [n for n in NODES if n != "k1-n1"]
    for _ in range(6):  # past stale_after_s (5 s) without a word from k1-n1
        bench.clock.advance(1.0)
        for node in others:
            bench.report(node, 650.0)
        bench.apply(bench.cycle(), ack=False)
    assert server not in bench.core.pending and bench.core._resends_unacked[server] == 0


def test_a_new_epoch_starts_every_backoff_afresh(bench: Bench) -> None:
    """A new leader's commands are its first: none waits out the old epoch's backoff, and
    each counts in the window of commands in flight."""
    bench.report_all(650.0)
    sent = dict(bench.apply(bench.cycle(), ack=False))
    assert resend_times(bench, 12, sent) == [4.0, 11.0]  # two resends unanswered
    bench.core.new_epoch(2)
    bench.report_all(650.0)
    result = bench.cycle(advance_s=1.0)
    assert "k1-n1" in dict(result.commands)
    assert result.counters.resends == 0
    sent.update(bench.apply(result, ack=False))
    bench.report_all(650.0)
    assert bench.cycle(advance_s=1.0).counters.commands_in_flight == len(result.commands)
    assert resend_times(bench, 5, sent) == [3.0]  # after 3 s, not 12


def test_resends_wait_their_turn_with_the_raises() -> None:
    """Twenty thousand unanswered commands are not sent again in one cycle: resends go
    first among the commands that can wait, at most max_raises_per_cycle of them."""
    bench = make_bench(ack_timeout_s=3.0, command_ttl_s=30.0, max_raises_per_cycle=2)
    bench.report_all(650.0)
    first = bench.apply(bench.cycle(), ack=False)
    assert len(first) > 2  # cuts go out at once, whatever the bound
    resent: list[str] = []
    for _ in range(8):
        bench.clock.advance(1.0)
        bench.report_all(650.0)
        result = bench.cycle()
        assert len(result.commands) <= 2
        resent += [node for node, _ in result.commands if result.counters.resends]
        bench.apply(result, ack=False)
    assert set(first) <= set(resent)  # every one in its turn


def test_raises_wait_for_the_commands_in_flight() -> None:
    """max_raises_per_cycle is a window: a fleet slow to answer gets raises at the pace
    it answers, not a cycle's bound every cycle on top of those it has not answered."""
    bench = make_bench(ack_timeout_s=3.0, command_ttl_s=30.0, max_raises_per_cycle=2)
    bench.report_all(300.0, cap_w=FAILSAFE_W)  # held low, room everywhere: raises only
    first = bench.apply(bench.cycle(), ack=False)
    assert len(first) == 2
    bench.report_all(300.0, cap_w=FAILSAFE_W)
    result = bench.cycle(advance_s=1.0)
    assert result.commands == [] and result.counters.commands_in_flight == 2
    assert result.counters.raises_deferred == len(NODES) - 2
    node, command = next(iter(first.items()))
    bench.core.on_ack(node, ack_payload(node, command))
    result = bench.cycle(advance_s=1.0)
    assert len(result.commands) == 1 and result.counters.commands_in_flight == 1


def test_ack_clears_the_pending_command_and_is_counted(bench: Bench) -> None:
    bench.report_all(650.0)
    bench.apply(bench.cycle())  # every command acked
    result = bench.cycle(advance_s=10.0 - 5.0)
    assert result.counters.acks_received == len(NODES)
    assert result.counters.acks_missing == 0
    assert bench.core.pending == {}
    bench.report_all(650.0)
    assert bench.cycle(advance_s=10.0).commands == []  # nothing to resend


def test_ack_from_an_old_epoch_is_ignored(bench: Bench) -> None:
    bench.core.new_epoch(5)
    bench.report_all(650.0)
    commands = bench.apply(bench.cycle(), ack=False)
    bench.core.on_ack("k1-n1", ack_payload("k1-n1", commands["k1-n1"], epoch=4, cap_w={0: 222.0}))
    assert 0 in bench.core.pending  # still waiting
    assert bench.core.cap_w[0] == CAP_MAX_W  # its read-back values were not taken
    result = bench.cycle(advance_s=1.0)
    assert result.counters.acks_received == 0
    bench.report_all(650.0)
    assert "k1-n1" in dict(bench.cycle(advance_s=3.0).commands)  # resent


def test_ack_of_an_older_seq_is_ignored(bench: Bench) -> None:
    bench.report_all(650.0)
    old = bench.apply(bench.cycle(), ack=False)
    bench.report_all(650.0)
    new = bench.apply(bench.cycle(advance_s=4.0), ack=False)  # resent, new seqs
    assert new["k2-n1"].seq > old["k2-n1"].seq
    bench.core.on_ack("k2-n1", ack_payload("k2-n1", old["k2-n1"]))
    assert bench.core.pending[2][0] == new["k2-n1"].seq
    bench.core.on_ack("k2-n1", ack_payload("k2-n1", new["k2-n1"]))
    assert 2 not in bench.core.pending
    assert bench.cycle(advance_s=1.0).counters.acks_received == 1


def test_ack_naming_another_node_is_rejected(bench: Bench) -> None:
    bench.report_all(650.0)
    commands = bench.apply(bench.cycle(), ack=False)
    bench.core.on_ack("k1-n1", ack_payload("k1-n2", commands["k1-n2"]))
    assert 0 in bench.core.pending and 1 in bench.core.pending
    assert bench.core.rejected_total == 1


def test_rejected_ack_means_command_again_next_cycle(bench: Bench) -> None:
    bench.report_all(650.0)
    commands = bench.apply(bench.cycle(), ack=False)
    for node in NODES:
        if node != "k3-n1":
            bench.core.on_ack(node, ack_payload(node, commands[node]))
    bench.core.on_ack(
        "k3-n1", ack_payload("k3-n1", commands["k3-n1"], "rejected", errors=["no live controller"])
    )
    bench.report_all(650.0)
    result = bench.cycle(advance_s=1.0)  # well before the ack timeout
    assert [n for n, _ in result.commands] == ["k3-n1"]
    assert result.counters.resends == 0 and result.counters.acks_received == len(NODES)
    assert caps_of(result.commands[0][1]) == caps_of(commands["k3-n1"])


def test_partial_ack_takes_the_read_back_caps_and_is_not_resent() -> None:
    bench = bands_bench()
    bench.report_all(650.0)
    commands = bench.apply(bench.cycle(), ack=False)
    for node in NODES:
        bench.core.on_ack(node, ack_payload(node, commands[node]))
    gpus = bench.gpus("k2-n2")
    bench.core.on_ack(  # a second ack for the same command: not pending any more, ignored
        "k2-n2", ack_payload("k2-n2", commands["k2-n2"], cap_w={1: 555.0})
    )
    assert bench.core.cap_w[gpus.start + 1] == CAP_MAX_W
    bench.report_all(650.0)
    bench.core.commanded_cap_w[gpus.start : gpus.stop] = 600.0  # make k2-n2 commanded again
    command = dict(bench.cycle(advance_s=1.0).commands)["k2-n2"]
    bench.core.on_ack(
        "k2-n2", ack_payload("k2-n2", command, "partial", cap_w={1: 555.0}, errors=["gpu 1: lost"])
    )
    assert list(bench.core.cap_w[gpus.start : gpus.stop]) == [CAP_MAX_W, 555.0]
    assert bench.core.pending == {}
    bench.caps["k2-n2"] = [CAP_MAX_W, 555.0]  # what its telemetry shows from now on
    acks = 0
    holds_w = 555.0
    for _ in range(5):  # long past the ack timeout
        bench.report_all(650.0)
        result = bench.cycle(advance_s=1.0)
        acks += result.counters.acks_received
        assert result.counters.resends == result.counters.acks_missing == 0
        # the decision starts from what the GPU holds: node k2-n2 is between its bands and
        # the GPU draws at its cap, so it is handed one uncapping step from there
        step = BANDS.uncap_step_fraction * (CAP_MAX_W - holds_w)
        assert result.decision.cap_w[gpus.start + 1] == pytest.approx(holds_w + step)
        holds_w = float(result.decision.cap_w[gpus.start + 1])
        bench.apply(result)
    assert acks >= 1


def test_acked_caps_are_the_new_read_back(bench: Bench) -> None:
    bench.report_all(650.0)
    commands = bench.apply(bench.cycle(), ack=False)
    bench.core.on_ack("k1-n1", ack_payload("k1-n1", commands["k1-n1"], cap_w={0: 250.0}))
    assert list(bench.core.cap_w[0:2]) == [250.0, caps_of(commands["k1-n1"])[1]]


# --- epochs ---------------------------------------------------------------------------


def test_new_epoch_commands_every_node_afresh(bench: Bench) -> None:
    bench.core.new_epoch(3)
    bench.report_all(650.0)
    first = bench.apply(bench.cycle(), ack=False)
    bench.core.new_epoch(4)
    assert bench.core.pending == {}
    bench.report_all(650.0)
    result = bench.cycle(advance_s=1.0)
    assert sorted(dict(result.commands)) == sorted(NODES)
    assert [c.seq for _, c in result.commands] == list(range(1, len(NODES) + 1))
    assert all(c.epoch == 4 for _, c in result.commands)
    assert result.counters.resends == 0
    for node, command in result.commands:
        assert caps_of(command) == caps_of(first[node])
    # an ack of the old epoch's command is not an ack of the new one
    bench.core.on_ack("k1-n1", ack_payload("k1-n1", first["k1-n1"]))
    assert 0 in bench.core.pending


def test_first_command_of_an_epoch_removes_an_old_clock_lock(bench: Bench) -> None:
    """A lock left by an earlier leader is removed: the clock is said (null), not left out."""
    bench.core.new_epoch(2)
    bench.report_all(650.0, clock_mhz=1100)  # still locked by the previous leader
    result = bench.cycle()
    for _, command in result.commands:
        assert all(g.max_sm_clock_mhz is None for g in command.gpus)
        assert b'"max_sm_clock_mhz":null' in encode(command)
    bench.apply(result)
    bench.report_all(650.0)
    bench.core.commanded_cap_w[0] = 500.0  # a cap change alone says nothing about clocks
    (node, command), *rest = bench.cycle(advance_s=1.0).commands
    assert node == "k1-n1" and not rest
    assert all(g.max_sm_clock_mhz is UNSET for g in command.gpus)


def test_communication_phase_locks_clocks_and_compute_unlocks_them(bench: Bench) -> None:
    bench.report_all(300.0)
    bench.phase("j", "startup", ["k2-n1", "k2-n2"])
    bench.phase("j", "compute")
    bench.apply(bench.cycle())
    bench.phase("j", "communication")
    bench.report_all(300.0)
    commands = bench.apply(bench.cycle(advance_s=1.0))
    assert sorted(commands) == ["k2-n1", "k2-n2"]
    for command in commands.values():
        assert [g.max_sm_clock_mhz for g in command.gpus] == [COMM_CLOCK_MHZ] * 2
    bench.report_all(300.0)
    assert bench.cycle(advance_s=1.0).commands == []  # locked already: nothing new
    bench.phase("j", "compute")
    bench.report_all(300.0)
    commands = bench.apply(bench.cycle(advance_s=1.0))
    assert sorted(commands) == ["k2-n1", "k2-n2"]
    for command in commands.values():
        assert [g.max_sm_clock_mhz for g in command.gpus] == [None, None]  # unlock, explicitly


def test_uncapping_is_gradual_one_command_per_step() -> None:
    bench = bands_bench()
    bench.report_all(650.0)
    bench.apply(bench.cycle())
    caps = []
    for _ in range(40):  # the load goes away: caps climb back, a step per cycle
        bench.clock.advance(1.0)
        bench.report_all(100.0)
        commands = bench.apply(bench.cycle())
        if "k1-n1" in commands:
            caps.append(caps_of(commands["k1-n1"])[0])
    assert caps == sorted(caps) and len(caps) > 3
    # back up to where the 4 GPUs' caps fill rack k1's 2,600 W limit (100 W overhead):
    # uncapping never lifts a node's cap sum above its limit
    assert caps[-1] == pytest.approx(min(CAP_MAX_W, (2600.0 - 100.0) / 4))
    assert np.all(np.diff(caps[:-1]) > CAP_TOLERANCE_W)  # each step worth a command


def test_a_raise_in_flight_is_neither_undone_nor_stepped_on_until_answered() -> None:
    """Acks slower than a cycle: the node's telemetry still shows the caps it held before
    the command. Deciding from them sent the old caps back as a "cut" (bench_scale lost
    ~400 commands a second so); stepping on from the asked caps would pile raises on it."""
    bench = bands_bench()
    bench.report_all(650.0)
    cut = bench.apply(bench.cycle())  # rack k1 cut to its target, acked
    bench.report_all(200.0)  # k1 now far below its uncapping threshold
    first = bench.apply(bench.cycle(advance_s=1.0), ack=False)
    assert caps_of(first["k1-n1"])[0] > caps_of(cut["k1-n1"])[0]  # a raise, in flight
    for _ in range(4):  # within the 3 s ack timeout; the read-back predates the command
        bench.report("k1-n1", 200.0, cap_w=caps_of(cut["k1-n1"]))
        result = bench.cycle(advance_s=0.5)  # early cycles: half a step from the old caps
        assert "k1-n1" not in dict(result.commands)
        assert result.counters.superseded == 0
    bench.core.on_ack("k1-n1", ack_payload("k1-n1", first["k1-n1"]))
    bench.report_all(200.0)
    later = dict(bench.cycle(advance_s=1.0).commands)  # answered: the next step
    assert caps_of(later["k1-n1"])[0] > caps_of(first["k1-n1"])[0]


def test_a_command_replacing_an_unacknowledged_one_is_counted_as_superseded(bench: Bench) -> None:
    bench.report_all(650.0)
    first = bench.apply(bench.cycle(), ack=False)
    bench.phase("job", "startup", ["k2-n2"])  # staged caps: its caps must change again
    bench.report_all(650.0)
    result = bench.cycle(advance_s=0.5)  # well before the ack timeout
    assert "k2-n2" in dict(result.commands)
    assert result.counters.superseded == 1 and result.counters.resends == 0
    # the first command's late ack is ignored: the newer one is what is pending
    bench.core.on_ack("k2-n2", ack_payload("k2-n2", first["k2-n2"]))
    server = list(bench.core.tree.server_names).index("k2-n2")
    assert bench.core.pending[server][0] == dict(result.commands)["k2-n2"].seq


def settle(bench: Bench, cycles: int = 10) -> None:
    """Cycles (telemetry at 300 W each) until nothing more is commanded."""
    for _ in range(cycles):
        bench.report_all(300.0)
        if not bench.apply(bench.cycle(advance_s=1.0)):
            return
    raise AssertionError(f"still commanding after {cycles} cycles")


def test_clock_locks_wait_their_turn_and_unlocks_go_at_once() -> None:
    """Agents that take no clock policy are locked by the controller itself: a job of
    10,000 nodes entering communication would be 10,000 commands in one cycle (found by
    `bench_scale --jobs 2` on the 150 MW site). A lock saves energy and can wait its turn
    with the raises (here one a cycle); an unlock is what compute waits for: at once."""
    bench = make_bench(ack_timeout_s=3.0, command_ttl_s=30.0, max_raises_per_cycle=1)
    job_nodes = ["k2-n1", "k2-n2", "k3-n1"]
    bench.report_all(300.0)
    bench.phase("j", "startup", job_nodes)
    bench.phase("j", "compute")
    settle(bench)
    bench.phase("j", "communication")
    locked: list[str] = []
    for _ in range(3):
        bench.report_all(300.0)
        result = bench.cycle(advance_s=1.0)
        commands = bench.apply(result)
        assert len(commands) == 1  # one lock a cycle
        ((node, command),) = commands.items()
        assert [g.max_sm_clock_mhz for g in command.gpus] == [COMM_CLOCK_MHZ] * 2
        locked.append(node)
        assert result.counters.raises_deferred == 3 - len(locked)
    assert sorted(locked) == job_nodes
    bench.phase("j", "compute")
    bench.report_all(300.0)
    commands = bench.apply(bench.cycle(advance_s=1.0))
    assert sorted(commands) == job_nodes  # every unlock in the same cycle
    for command in commands.values():
        assert [g.max_sm_clock_mhz for g in command.gpus] == [None, None]
    bench.phase("j", "communication")  # a wait that ends before its turn comes ...
    bench.report_all(300.0)
    first = bench.apply(bench.cycle(advance_s=1.0))
    bench.phase("j", "compute")
    bench.report_all(300.0)
    assert sorted(bench.apply(bench.cycle(advance_s=1.0))) == sorted(first)  # ... unlocks one


def climb_back(max_raises_per_cycle: int) -> tuple[list[dict[str, Command]], np.ndarray]:
    """A job starts on every node (caps staged), then computes drawing little: the caps
    climb back. Every cycle's commands until nothing more is sent, and the caps then."""
    bench = make_bench(  # the bands: their staged caps and uncapping steps
        ack_timeout_s=3.0,
        command_ttl_s=30.0,
        max_raises_per_cycle=max_raises_per_cycle,
        policy=BANDS,
    )
    bench.report_all(150.0)
    bench.phase("j", "startup", list(NODES))
    bench.apply(bench.cycle())
    bench.phase("j", "compute")
    cycles: list[dict[str, Command]] = []
    quiet = 0  # a turn may find nothing to hand back (its rack full): a round of quiet
    for _ in range(60):
        bench.report_all(150.0)
        commands = bench.apply(bench.cycle(advance_s=1.0))
        quiet = 0 if commands else quiet + 1
        if quiet > len(NODES):
            return cycles, bench.core.cap_w.copy()
        cycles.append(commands)
    raise AssertionError("still commanding after 60 cycles")


def test_nodes_wanting_watts_back_take_turns_each_with_the_watts_of_its_wait() -> None:
    """More nodes below their maximum than raises may go out a cycle: the policy hands
    watts back under a few racks a cycle, round robin, each node what the cycles until its
    next turn would give (found by `bench_scale --jobs 2`: after two 10,368-node jobs started, 2,000
    raises a second for a minute, each node climbing back in ten commands or more). The
    caps end where they end when every node is served every cycle, in fewer commands."""
    free, free_caps = climb_back(max_raises_per_cycle=100)
    turns, turn_caps = climb_back(max_raises_per_cycle=2)  # one rack's turn a cycle
    assert turn_caps == pytest.approx(free_caps, abs=CAP_TOLERANCE_W)
    assert all(len(commands) <= 2 for commands in turns)  # never over the bound
    # a rack's nodes share its breaker: their turn is the same
    assert all(("k1-n1" in commands) == ("k1-n2" in commands) for commands in turns)
    served = [node for commands in turns for node in commands]
    assert set(served) == set(NODES)  # round robin: every node's turn came
    per_node = {node: served.count(node) for node in NODES}
    free_per_node = {node: sum(node in c for c in free) for node in NODES}
    assert sum(per_node.values()) < sum(free_per_node.values()) / 2
    assert max(free_per_node.values()) > 3  # served every cycle: a step a cycle


SITE_GPUS = 10  # BUDGETS: 5 nodes x 2 GPUs


def decide_in_turn(cap_w: np.ndarray, uncap_cycles: list[int], settings: PolicySettings):
    """``decide`` on BUDGETS' site, every GPU computing at 100 W under ``cap_w``, with the
    controller's turns (``ClusterState.uncap_cycles``); the decided caps."""
    tree = budgets().tree
    n = tree.n_gpus
    assert n == SITE_GPUS
    state = ClusterState(
        power_w=np.full(n, 100.0),
        cap_w=cap_w,
        priority=np.full(n, 1, dtype=np.int8),
        floor_w=tree.cap_min_w.astype(float),
        phase=np.full(n, PHASE_CODES["compute"], dtype=np.int8),
        controllable=np.ones(n, dtype=bool),
        uncap_cycles=np.array(uncap_cycles, dtype=float),
    )
    return decide(tree, state, 1.0, settings).cap_w


def test_a_turn_asks_for_what_its_cycles_would_give() -> None:
    """Rule 4 of the bands with ``uncap_cycles``: 0 asks nothing, k asks what k steps would
    give."""
    cap = np.full(SITE_GPUS, 300.0)
    settings = BANDS
    cap_w = decide_in_turn(cap, [0, 0, 3, 3, 1, 1, 0, 0, 0, 0], settings)
    gap = CAP_MAX_W - 300.0
    assert cap_w[:2] == pytest.approx([300.0, 300.0])  # not their turn
    assert cap_w[2:4] == pytest.approx(300.0 + (1 - (1 - settings.uncap_step_fraction) ** 3) * gap)
    assert cap_w[4:6] == pytest.approx(300.0 + settings.uncap_step_fraction * gap)


def test_a_turn_takes_only_its_share_of_the_room_above_it() -> None:
    """Rack k1's breaker leaves 100 W of room over its caps; of its two nodes, one's turn
    has come: it takes its half (the other's turn comes later), not all of it. (The bands'
    rule 4: safety by caps hands nothing to GPUs drawing far below their caps.)"""
    cap = np.full(SITE_GPUS, 300.0)
    cap[:4] = 600.0  # k1: 4 x 600 + 100 W overhead = 2,500 W of its 2,600 W limit
    cap_w = decide_in_turn(cap, [4, 4] + [0] * (SITE_GPUS - 2), BANDS)
    # 2 x 25 W: half of the 100 W (alone, it would take it all: 2 x 50 W of 2 x 59 W asked)
    assert cap_w[:2] == pytest.approx([625.0, 625.0])
    assert cap_w[2:] == pytest.approx(cap[2:])  # the others wait their turn


def test_a_late_ack_of_a_stale_nodes_newest_command_is_taken() -> None:
    """A node falls silent with a command in flight (dropped with it); the ack of that
    command comes late. Its read-back caps are what the node holds, and a sample taken
    before it, arriving after, does not overwrite them (found by `bench_scale --jobs 2` on
    a machine too small for it: nodes back from stale taken at samples older than a raise
    they had applied were cut, then handed the watts back again)."""
    bench = make_bench(ack_timeout_s=3.0, command_ttl_s=30.0)
    bench.report_all(650.0)
    sent = bench.apply(bench.cycle(), ack=False)
    command = sent["k1-n1"]
    others = [n for n in NODES if n != "k1-n1"]
    for _ in range(6):  # past stale_after_s: its pending command is dropped
        bench.clock.advance(1.0)
        for node in others:
            bench.report(node, 650.0)
        for node, sent_now in bench.apply(bench.cycle(), ack=False).items():
            if node == "k1-n1":
                command = sent_now  # a resend (3 s without an ack): its newest
            else:
                bench.core.on_ack(node, ack_payload(node, sent_now))
    server = list(bench.core.tree.server_names).index("k1-n1")
    assert server not in bench.core.pending and command.seq > sent["k1-n1"].seq
    bench.core.on_ack("k1-n1", ack_payload("k1-n1", command))
    assert bench.core.counters.acks_late == 1
    gpus = bench.gpus("k1-n1")
    held = list(bench.core.cap_w[gpus.start : gpus.stop])
    assert held == pytest.approx(caps_of(command))
    bench.report("k1-n1", 650.0, cap_w=CAP_MAX_W, ts=WALL0 - 1.0)  # taken before the ack
    assert list(bench.core.cap_w[gpus.start : gpus.stop]) == pytest.approx(held)
    # an ack of an older command than the node's newest is still ignored
    bench.core.on_ack("k1-n1", ack_payload("k1-n1", sent["k1-n1"]))
    assert bench.core.counters.acks_late == 1
