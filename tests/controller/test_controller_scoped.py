"""A scoped (leaf) controller in process, with real agents and a real Mosquitto: it leads its
own scope only, hears only its nodes, reports a signed summary, and holds the budget of a
grant only when the coordinator's key signed it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from powerd.protocol import Grant, LeaderState, NodeCounts, Summary, Topics, encode
from powerd.signing import Signer, generate_key_files, load_signer
from powerd.topology import parse_budgets
from tests.support.brokers import MqttProbe, Received
from tests.support.controller_harness import (
    CLUSTER,
    controller_config,
    running_agents,
    running_controller,
    until,
)
from tests.support.keys import SIGNER, STRANGER, VERIFIER
from tests.support.tree_sites import three_rows

SCOPED = Topics(CLUSTER, scope="r1")


def grant(signer: Signer, budget_w: float, seq: int) -> bytes:
    body = encode(
        Grant(
            v=1,
            scope="r1",
            coordinator="co",
            epoch=7,
            seq=seq,
            ts=time.time(),
            ttl_s=30.0,
            budget_w=budget_w,
            ramp_w_per_s=1000.0,
        )
    )
    return signer.sign(SCOPED.grant("r1"), body)


def summary_of(message) -> Summary:
    return VERIFIER.decode(Summary, message.topic, message.payload)


@pytest.mark.asyncio
async def test_a_leaf_leads_its_scope_only_and_takes_only_signed_grants(mosquitto, tmp_path: Path):
    coordinator_key_path, coordinator_pub = generate_key_files(tmp_path / "coordinator")
    coordinator = load_signer(coordinator_key_path)
    site = parse_budgets(three_rows())
    config = controller_config(mosquitto, scope="r1", coordinator_keys=(str(coordinator_pub),))
    async with (
        MqttProbe(mosquitto.port, [f"{SCOPED.prefix}/#"]) as probe,
        running_agents(mosquitto, site, scope_of_row=lambda row: row) as agents,
        running_controller(mosquitto, site, config) as leaf,
    ):
        r1 = [n for n in site.servers if site.server(n).row == "r1"]
        others = [n for n in site.servers if n not in r1]
        assert leaf.core.tree.server_names == tuple(r1)  # its scope, nothing else
        beat = await probe.expect(SCOPED.heartbeat)
        assert beat.topic == f"{SCOPED.prefix}/scopes/r1/heartbeat"
        # r1's agents follow it; the other rows' agents have no leaf and stay in failsafe
        await until(lambda: all(agents.daemons[n].core.mode == "controlled" for n in r1))
        assert all(agents.daemons[n].core.mode == "failsafe" for n in others)
        await leaf.wait_for(
            lambda: bool(leaf.cycles) and leaf.cycles[-1].result.counters.stale_nodes == 0
        )
        # its telemetry subscription is its nodes' topics: the broker sent nothing else
        assert leaf.service.inbox.unknown == 0
        assert leaf.service.telemetry.received > 0

        # its state, for `powerd status`, on its scope's topic, signed, counting its nodes
        def nodes_of(m: Received) -> NodeCounts | None:
            return VERIFIER.decode(LeaderState, m.topic, m.payload).nodes

        state = await probe.expect(
            SCOPED.scope_state("r1"), lambda m: getattr(nodes_of(m), "controlled", 0) == 2
        )
        told = VERIFIER.decode(LeaderState, state.topic, state.payload)
        assert told.nodes is not None and (told.role, told.scope) == ("controller", "r1")
        assert told.nodes.stale == 0
        async with MqttProbe(mosquitto.port, [SCOPED.scope_state("r1")]) as late:
            assert (await late.expect(SCOPED.scope_state("r1"))).retain  # kept for a late reader
        first = summary_of(await probe.expect(SCOPED.summary("r1")))
        assert (first.budget_w, first.grant_seq, first.nodes) == (12_000.0, None, 2)
        assert first.file_budget_w == 12_000.0 and first.limit_w == 14_000.0

        # a stranger's grant moves nothing, nor one signed with the controllers' own key
        # (a stolen leaf key signs no grant); the coordinator's does
        await probe.publish(SCOPED.grant("r1"), grant(STRANGER, 13_500.0, 1))
        await probe.publish(SCOPED.grant("r1"), grant(SIGNER, 13_500.0, 1))
        mark = probe.mark()
        await probe.publish(SCOPED.grant("r1"), grant(coordinator, 9_000.0, 2))
        got = await probe.expect(
            SCOPED.summary("r1"), lambda m: summary_of(m).grant_seq is not None, after=mark
        )
        assert (summary_of(got).budget_w, summary_of(got).grant_seq) == (9_000.0, 2)
        assert leaf.service.leaf is not None and leaf.service.leaf.grants_taken == 1
        await leaf.wait_for(lambda: leaf.core.tree.budget_w[0] == 9_000.0)
        assert leaf.core.tree.cap_threshold_w[0] == pytest.approx(9_000.0 * 0.98)
        assert leaf.core.rejected_total >= 2  # the two forged grants, counted
