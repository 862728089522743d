"""In a tree the coordinator takes site limits, so its state confirms `powerd limit` (issue
36): a coordinator in process against a real Mosquitto, the CLI's wait in process."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest

from powerd.cli.limit_wait import send_and_wait
from powerd.mqtt.url import parse_broker_url
from powerd.protocol import SiteLimit, encode
from powerd.signing import generate_key_files, load_signer
from tests.coordinator.test_coordinator_service import GRANTS, TOPICS, config, running
from tests.support.brokers import TEST_PASSWORD, Mosquitto


@pytest.mark.asyncio
async def test_the_coordinators_state_confirms_a_limit_and_refuses_an_older_one(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    key, pub = generate_key_files(tmp_path / "operator")
    operator = load_signer(key)
    cfg = replace(config(mosquitto, tmp_path, "co-a"), operator_keys=(str(pub),))
    kwargs = {**parse_broker_url(mosquitto.url).client_kwargs(), "password": TEST_PASSWORD}

    async def send(limit_w: float | None, ts: float) -> tuple[str, str]:
        message = SiteLimit(v=1, operator="ops", seq=int(ts * 1000), ts=ts, limit_w=limit_w,
                            starts_ts=ts, expires_ts=ts + 600.0)  # fmt: skip
        payload = operator.sign(TOPICS.site_limit, encode(message))
        outcome = await send_and_wait(kwargs, TOPICS, payload, message, 5.0, GRANTS)
        assert outcome.seen is not None and outcome.seen.verified, outcome
        assert outcome.seen.state.role == "coordinator" and outcome.seen.state.name == "co-a"
        return outcome.kind, outcome.detail

    async with running(cfg) as coordinator:
        await asyncio.wait_for(coordinator.leading.wait(), 5)
        now = time.time()
        kind, held = await send(30_000.0, now)
        assert kind == "confirmed" and "30.0 kW" in held and ", in force" in held
        kind, why = await send(20_000.0, now - 10.0)
        assert kind == "refused" and "not newer" in why
        kind, held = await send(None, time.time())
        assert kind == "confirmed" and "cleared" in held
