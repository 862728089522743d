"""``powerd status``: what the cluster's leaders say they hold, from their retained states."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import click

from powerd.cli.options import (
    broker_option,
    cluster_option,
    log_level_option,
    setup_logging,
    trust_option,
)
from powerd.click_types import Quantity

SETTLE_S = 0.5  # after the first state: the other retained ones come with it


@click.command("status", short_help="Leaders, epochs, site limit in force, nodes by mode.")
@click.option(
    "--wait-s",
    type=Quantity("s", min=0.1),
    default=5.0,
    show_default=True,
    help="How long to wait for a leader's state before giving up (exit 1).",
)
@trust_option("only states it signed count", "any state, shown as unverified")
@click.option("--json", "as_json", is_flag=True, help="Print the states as JSON.")
@broker_option("mqtt://localhost")
@cluster_option("default")
@log_level_option()
def command(
    wait_s: float,
    trust_paths: tuple[Path, ...],
    as_json: bool,
    broker: str | None,
    cluster: str | None,
    log_level: str,
) -> None:
    """Show what the cluster's leaders hold: each leader (the site's controller, a tree's
    coordinator and leaf controllers), its epoch and scope, the operator site limit it
    holds and whether it is in force, the last limit it refused, nodes by mode and
    levels over their limits. Read from the leaders' retained, signed states
    (docs/PROTOCOL.md, "Leader state"), which a leader refreshes every few seconds: an
    old AGE_S means that leader is gone. Exits 1 when no state arrives within --wait-s.
    The broker login needs read access to the state topics (the shipped ACL's
    powerd-operator and powerd-reader have it).

    \b
    Examples:
      powerd status --broker mqtts://powerd-operator@site-broker --cluster prod
      powerd status --json --trust /etc/powerd/controller.pub
    """
    setup_logging(log_level)
    from powerd.mqtt.url import parse_broker_url
    from powerd.protocol import Topics
    from powerd.signing import KeyFileError, load_verifier

    try:
        verifier = load_verifier(trust_paths) if trust_paths else None
        topics = Topics(cluster or "default")
        settings = parse_broker_url(broker or "mqtt://localhost")
        kwargs = settings.client_kwargs()
    except (KeyFileError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    subscriptions = [topics.controller_state, topics.all_scope_states, topics.coordinator_state]
    errors: list[str] = []
    try:
        seen = asyncio.run(_read(kwargs, subscriptions, verifier, wait_s, errors))
    except Exception as exc:  # any failure to reach the broker: say which and why
        raise click.ClickException(f"broker {settings.display}: {exc}") from None
    if not seen:
        unreadable = f" (unreadable: {'; '.join(errors[-3:])})" if errors else ""
        raise click.ClickException(
            f"no leader state on {settings.display} for cluster {topics.cluster} within "
            f"{wait_s:g} s{unreadable}: no controller or coordinator leads there, or this "
            "login may not read powerd/v1/+/controller/state (broker ACL)"
        )
    now = time.time()
    if as_json:
        import msgspec

        rows = [
            {"topic": s.topic, "verified": s.verified, "age_s": round(now - s.state.ts, 3),
             "state": msgspec.to_builtins(s.state)}
            for s in seen
        ]  # fmt: skip
        click.echo(json.dumps({"cluster": topics.cluster, "leaders": rows}, indent=2))
        return
    click.echo(_table(seen, now))
    if any(not s.verified for s in seen):
        click.echo("(unverified: give --trust with the leaders' public keys to check them)")


async def _read(
    kwargs: dict[str, Any],
    subscriptions: list[str],
    verifier: Any,
    wait_s: float,
    errors: list[str],
) -> list[Any]:
    from powerd.cli.leader_states import Seen, Session, states

    got: dict[str, Seen] = {}
    async with Session(kwargs).connect(subscriptions) as client:
        loop = asyncio.get_running_loop()
        until = loop.time() + wait_s
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(until) as deadline:
                async for seen in states(client, verifier, errors):
                    got[seen.topic] = seen
                    deadline.reschedule(min(until, loop.time() + SETTLE_S))
    order = {"coordinator": 0, "controller": 1}
    return sorted(got.values(), key=lambda s: (order[s.state.role], s.state.scope or ""))


def _table(seen: list[Any], now: float) -> str:
    from powerd.cli.leader_states import describe_held

    header = ("ROLE", "SCOPE", "LEADER", "EPOCH", "AGE_S", "NODES c/f/l/stale", "OVER s/r/r")
    rows = [header]
    notes: list[str] = []
    for s in seen:
        st = s.state
        nodes = (
            "-"
            if st.nodes is None
            else "/".join(
                str(n)
                for n in (st.nodes.controlled, st.nodes.failsafe, st.nodes.local, st.nodes.stale)
            )
        )
        over = (
            "-"
            if st.over_limit is None
            else "/".join(
                str(n) for n in (st.over_limit.site, st.over_limit.row, st.over_limit.rack)
            )
        )
        rows.append((st.role, st.scope or "site", st.name, str(st.epoch),
                     f"{now - st.ts:.1f}", nodes, over))  # fmt: skip
        if st.limit is not None:
            notes.append(f"{st.role} {st.name}: site limit {describe_held(st)}")
        if st.refused is not None:
            notes.append(f"{st.role} {st.name}: last refused limit (ts {st.refused.ts:.3f}, "
                         f"seq {st.refused.seq}): {st.refused.reason}")  # fmt: skip
        if st.leaves_silent:
            notes.append(f"{st.role} {st.name}: {st.leaves_silent} leaves silent")
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if not any(s.state.limit is not None and s.state.limit.in_force for s in seen):
        notes.append("no site limit in force")
    return "\n".join(lines + notes)
