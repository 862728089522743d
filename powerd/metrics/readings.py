"""What the daemons hand their metrics: plain values, no prometheus_client (the daemons
import this module; only the collectors import the client)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuReading:
    index: int
    power_w: float
    cap_w: float


@dataclass(frozen=True)
class AgentReading:
    """What one scrape shows; ``heartbeat_mono``: when the last live, verified controller
    heartbeat was received (monotonic clock), None before the first."""

    node: str
    mode: str
    heartbeat_mono: float | None
    gpus: tuple[GpuReading, ...]
    acks: Mapping[str, int]  # acks sent, by result
    rejected_signatures: int
    clock_alarms: int


@dataclass(frozen=True)
class LeaderReading:
    """What a controller or coordinator holds now, read at scrape time (plain attributes,
    safe to read from the server's thread). ``site_limit_w``: the operator's limit in
    force, None when none is."""

    leader: bool
    epoch: int
    rejected_signatures: int
    site_limit_w: float | None
    site_limits_refused: int
    clock_alarms: int = 0
