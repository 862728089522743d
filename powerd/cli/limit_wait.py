"""``powerd limit``'s confirmation: publish an operator's signed message, then wait for
the leader state that holds it (or refused it), and say what came of it."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from powerd.cli.leader_states import PublishRefused, Seen, Session, states, verdict, who
from powerd.protocol import SiteLimit, Topics
from powerd.signing import Verifier


@dataclass(frozen=True)
class Outcome:
    """What came of one operator message: ``kind`` confirmed, refused (by the leader),
    denied (by the broker), timeout, or sent (no wait asked)."""

    kind: str
    detail: str = ""
    seen: Seen | None = None  # the leader state that answered, else the newest seen
    waited_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.kind in ("confirmed", "sent")

    def text(self, what: str, broker: str, topic: str, key_id: str) -> str:
        """The operator's answer, in words (``what``: the message, e.g. "site limit of ...")."""
        if self.kind == "sent":
            return f"{what} sent, not confirmed (--wait-s 0): `powerd status` shows what is held"
        if self.kind == "denied":
            return (
                f"{what} NOT taken: broker {broker} refused the publish on {topic} "
                f"({self.detail}): this login may not publish there (the ACL's powerd-operator "
                "lines, docs/BROKERS.md)"
            )
        if self.kind == "timeout":
            last = "no leader state seen at all"
            if self.seen is not None:
                state = self.seen.state
                last = f"the last state seen is {who(state)}'s, of ts {state.ts:.0f}"
            return (
                f"{what} NOT confirmed within {self.waited_s:g} s ({last}). Likely: no leader "
                "is running for this cluster (`powerd status`); this login may not publish on "
                f"{topic} or read the leaders' states (broker ACL); or the key {key_id} is not "
                "in the leaders' trust.operator_keys (their logs say 'site limit refused')"
                + (f". Unreadable states: {self.detail}" if self.detail else "")
            )
        assert self.seen is not None
        leader = who(self.seen.state)
        if self.kind == "refused":
            return f"{what} REFUSED by {leader}: {self.detail}"
        unverified = (
            "" if self.seen.verified else " (unverified: give --trust to check its signature)"
        )
        return f"{what} confirmed by {leader}{unverified}: holds {self.detail}"


async def send_and_wait(
    client_kwargs: dict[str, Any],
    topics: Topics,
    payload: bytes,
    message: SiteLimit,
    wait_s: float,
    verifier: Verifier | None,
) -> Outcome:
    """Subscribe to the states of whoever takes site limits (a site's controller, a tree's
    coordinator) first, publish ``payload`` (retained, QoS 1), then wait up to ``wait_s``."""
    session = Session(client_kwargs)
    subscriptions = [topics.controller_state, topics.coordinator_state] if wait_s > 0 else []
    async with session.connect(subscriptions) as client:
        try:
            await session.publish(topics.site_limit, payload, retain=True)
        except PublishRefused as exc:
            return Outcome("denied", str(exc))
        if wait_s <= 0:
            return Outcome("sent")
        return await wait_for_verdict(client, message, wait_s, verifier)


async def wait_for_verdict(
    client: Any, message: SiteLimit, wait_s: float, verifier: Verifier | None
) -> Outcome:
    """The first leader state on ``client`` that holds or refused ``message``'s (ts, seq)."""
    newest: Seen | None = None
    errors: list[str] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(wait_s):
            async for seen in states(client, verifier, errors):
                found = verdict(seen.state, message.ts, message.seq)
                if found is not None:
                    return Outcome(found[0], found[1], seen, wait_s)
                if newest is None or seen.state.ts >= newest.state.ts:
                    newest = seen
    detail = "; ".join(errors[-3:])
    return Outcome("timeout", detail, newest, wait_s)
