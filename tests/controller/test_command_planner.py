"""CommandPlanner on its own: decisions, acks and read-backs in, commands out."""

from __future__ import annotations

import numpy as np

from policies import Decision
from policies.turns import Turns
from powerd.controller.commands import DRIFT_RETRY_S, CommandPlanner
from powerd.controller.counters import CycleCounters
from powerd.controller.jobs import JobRegistry
from powerd.controller.node_views import CAP_SETTLE_S, NodeViews
from powerd.protocol import Ack, Command, decode
from tests.controller.controller_parts import Parts, parts
from tests.controller.test_controller_core import CAP_MAX_W, WALL0, ack_payload, caps_w


class Planner:
    """A planner with the views and registry it reads, all heard from and live."""

    def __init__(self, p: Parts) -> None:
        self.p = p
        self.views = NodeViews(p.tree, p.settings, p.clock, p.log_once, p.reject)
        self.registry = JobRegistry(p.tree, p.settings, p.clock, p.log_once, p.reject)
        self.planner = CommandPlanner(
            p.tree, p.settings, self.views, Turns.of(p.tree), (p.clock, p.wall), p.log_once
        )
        self.planner.new_epoch(1)
        self.live = np.ones(p.tree.n_servers, dtype=bool)

    def send(self, cap_w: float | np.ndarray, counters: CycleCounters | None = None) -> dict:
        n = self.p.tree.n_gpus
        decision = Decision(
            cap_w=np.broadcast_to(np.asarray(cap_w, dtype=float), (n,)).copy(),
            max_sm_clock_mhz=np.full(n, np.nan),
            node_power_w=np.zeros(0),
            node_predicted_w=np.zeros(0),
            node_capping=np.zeros(0, dtype=bool),
            floor_hold_energy_j=0.0,
        )
        counters = counters or CycleCounters()
        out = self.planner.commands(decision, self.live, self.p.clock.t, counters, self.registry)
        return dict(out)

    def ack(self, node: str, command: Command, **kw: object) -> None:
        ack = decode(Ack, ack_payload(node, command, **kw), node)  # type: ignore[arg-type]
        self.planner.on_ack(self.p.tree.server_ordinal[node], node, ack, CycleCounters())


def test_a_new_epoch_commands_every_node_and_then_only_changes() -> None:
    b = Planner(parts())
    first = b.send(500.0)
    assert sorted(first) == sorted(b.p.tree.server_names)
    assert all(caps_w(c) == [500.0, 500.0] and c.epoch == 1 for c in first.values())
    for node, command in first.items():
        b.ack(node, command)
    assert b.planner.pending == {} and b.send(500.0) == {}
    changed = np.full(b.p.tree.n_gpus, 500.0)
    changed[0] = 450.0
    assert list(b.send(changed)) == ["k1-n1"]


def test_an_unanswered_command_is_resent_with_a_doubling_wait() -> None:
    b = Planner(parts(ack_timeout_s=3.0))
    b.send(500.0)
    counters = CycleCounters()
    b.p.clock.advance(3.1)
    assert len(b.send(500.0, counters)) == b.p.tree.n_servers and counters.resends == 5
    b.p.clock.advance(3.1)  # a second resend waits twice as long
    assert b.send(500.0) == {}
    b.p.clock.advance(3.1)
    assert len(b.send(500.0)) == b.p.tree.n_servers
    assert list(b.planner.resends_unacked) == [2] * b.p.tree.n_servers


def test_a_stale_ack_forgets_what_was_commanded() -> None:
    b = Planner(parts())
    command = b.send(500.0)["k2-n1"]
    b.ack("k2-n1", command, result="stale")
    gpus = b.p.tree.server_gpus[b.p.tree.server_ordinal["k2-n1"]]
    assert np.isnan(b.planner.commanded_cap_w[gpus.start : gpus.stop]).all()
    assert b.p.tree.server_ordinal["k2-n1"] not in b.planner.pending


def test_a_node_holding_other_caps_than_commanded_is_commanded_back() -> None:
    b = Planner(parts())
    for node, command in b.send(500.0).items():
        b.ack(node, command, ts=WALL0)
    b.views.cap_w[:] = 500.0
    b.views.cap_w[b.p.tree.server_gpus[4].start] = CAP_MAX_W  # k3-n1's first: raised by hand
    b.views.sample_ts[:] = WALL0 + CAP_SETTLE_S
    b.views.last_seen[:] = b.p.clock.t
    counters = CycleCounters()
    live = b.live.copy()
    b.planner.track_holdings(b.p.clock.t, live, counters)
    assert counters.nodes_drifted == 1
    assert list(b.send(500.0)) == ["k3-n1"]
    b.planner.track_holdings(b.p.clock.t + 1.0, b.live.copy(), counters)
    assert counters.nodes_drifted == 1  # not again before DRIFT_RETRY_S
    assert DRIFT_RETRY_S > 1.0
