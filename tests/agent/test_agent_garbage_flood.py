"""10,000 garbage payloads on the command topic: the agent keeps publishing, every cap stays in range."""

from __future__ import annotations

import json
import random

from powerd.gpu.simulated import open_simulated
from powerd.protocol import GpuCommand
from tests.support.agent_harness import (
    NODE,
    TOPICS,
    become_controlled,
    command,
    probe,
    running_agent,
    send,
    telemetry,
)
from tests.support.keys import sign

FLOOD = 10_000


def garbage(rng: random.Random, i: int) -> bytes:
    """Random bytes, random JSON, and mangled commands with absurd values."""
    kind = i % 5
    if kind == 0:
        return rng.randbytes(rng.randint(0, 200))
    if kind == 1:
        values: list[object] = [None, True, -1, 0, 2**70, -1e308, 1e308, "x" * 50, [], {}, 3.5]
        return json.dumps(
            {
                rng.choice(["v", "epoch", "seq", "gpus", "ts"]): rng.choice(values)
                for _ in range(rng.randint(0, 6))
            }
        ).encode()
    if kind == 2:  # valid shape, wild values: must be clamped, never obeyed beyond limits
        cap = rng.choice([1e-9, 0.5, 1e6, 1e300, 199.9, 700.1, 5000.0])
        clock = rng.choice([1, 10**5 - 1, 0.001, 3000.5, None])
        return json.dumps(
            {
                "v": 1,
                "epoch": rng.randint(0, 3),
                "seq": rng.randint(0, 2**40),
                "ts": 1.0,
                "ttl_s": rng.choice([0.001, 1e9]),
                "gpus": [{"index": rng.randint(0, 5), "cap_w": cap, "max_sm_clock_mhz": clock}],
            }
        ).encode()
    if kind == 3:
        return b'{"v":1,"epoch":' + str(rng.random()).encode() + b',"gpus":[' * rng.randint(1, 50)
    return bytes(
        rng.choice(b'{}[]":,0123456789.eE+-truefalsenull') for _ in range(rng.randint(1, 80))
    )


async def test_garbage_flood_leaves_agent_publishing_and_caps_in_range(mosquitto):
    gpus = open_simulated("4xH100")
    rng = random.Random(20261122)
    async with probe(mosquitto) as p, running_agent(mosquitto, gpus) as daemon:
        await become_controlled(p)
        topic = TOPICS.command(NODE)
        for i in range(FLOOD):
            payload = garbage(rng, i)
            # half of them signed by the controller key where they can be (a JSON object):
            # wild values from a trusted controller must still be clamped, never obeyed
            if (
                i % 4 < 2
                and payload.startswith(b"{")
                and payload.endswith(b"}")
                and payload != b"{}"
            ):
                payload = sign(topic, payload)
            await p.publish(topic, payload, qos=0 if i % 2 else 1)
        # the flood's expired ttls and its length put the agent in failsafe: a live
        # leader again, then everything sent so far is handled before this ack
        await become_controlled(p, epoch=9)
        ack = await send(p, command(9, 2**50, [GpuCommand(index=3, cap_w=321.0)]))
        mark = p.mark()
        alive = telemetry((await p.expect(TOPICS.telemetry(NODE), after=mark)).payload)
        counters = daemon.core.counters

    assert ack.result == "applied"
    assert alive.gpus[3].cap_w == 321.0
    for gpu in gpus:
        limits = gpu.power_limit_range()
        assert limits.min_w <= gpu.enforced_cap_w() <= limits.max_w
        assert limits.min_w <= gpu.power_limit_w() <= limits.max_w
        lock = gpu.locked_max_sm_clock_mhz()
        clocks = gpu.sm_clock_range()
        assert lock is None or clocks.min_mhz <= lock <= clocks.max_mhz
    for g in alive.gpus:
        assert g.cap_min_w <= g.cap_w <= g.cap_max_w
    handled = (
        counters.payloads_rejected
        + counters.unverified
        + counters.commands_applied
        + counters.commands_partial
        + counters.commands_stale
        + counters.commands_refused
    )
    assert handled >= FLOOD  # every payload was looked at; QoS 0 ones may be dropped by no one
    assert counters.payloads_rejected + counters.unverified >= FLOOD * 3 // 5
    assert counters.unverified >= FLOOD // 2  # the unsigned half, at least
    assert counters.commands_applied + counters.commands_partial > 1  # signed wild ones obeyed
