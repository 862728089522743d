"""The agent's series: mode, failsafe, heartbeat age, each GPU's power and cap, counts.

Read at scrape time from what the daemon already holds (its core's mode and counters,
the last telemetry sample it sent, the acks by result): nothing is done per message or
per period for the endpoint. No numpy here: the agent does not load it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from powerd.metrics.readings import AgentReading
from powerd.vocabulary import MODES

ACK_RESULTS = ("applied", "partial", "stale", "rejected")


class AgentCollector(Collector):
    def __init__(
        self, source: Callable[[], AgentReading], monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._source = source
        self._monotonic = monotonic

    def collect(self) -> Iterator[Metric]:
        return iter(agent_families(self._source(), self._monotonic()))


def agent_families(reading: AgentReading, now_mono: float) -> list[Metric]:
    """The contract's agent series (docs/OPERATIONS.md, "Metrics") for one reading."""
    node = [reading.node]
    mode = GaugeMetricFamily(
        "powerd_agent_mode", "1 for the agent's current mode", labels=["node", "mode"]
    )
    for name in MODES:
        mode.add_metric([reading.node, name], 1.0 if reading.mode == name else 0.0)
    failsafe = GaugeMetricFamily(
        "powerd_agent_failsafe", "1 while the agent holds its failsafe caps", labels=["node"]
    )
    failsafe.add_metric(node, 1.0 if reading.mode == "failsafe" else 0.0)
    age = GaugeMetricFamily(
        "powerd_agent_heartbeat_age_seconds",
        "Seconds since the last verified live controller heartbeat (NaN before the first)",
        labels=["node"],
    )
    heard = reading.heartbeat_mono
    age.add_metric(node, math.nan if heard is None else max(0.0, now_mono - heard))
    power = GaugeMetricFamily(
        "powerd_agent_gpu_power_watts", "Each GPU's power, last sample", labels=["node", "gpu"]
    )
    cap = GaugeMetricFamily(
        "powerd_agent_gpu_cap_watts", "Each GPU's enforced power cap", labels=["node", "gpu"]
    )
    for gpu in reading.gpus:
        power.add_metric([reading.node, str(gpu.index)], gpu.power_w)
        cap.add_metric([reading.node, str(gpu.index)], gpu.cap_w)
    commands = CounterMetricFamily(
        "powerd_agent_commands", "Commands acknowledged, by result", labels=["node", "result"]
    )
    for result in ACK_RESULTS:
        commands.add_metric([reading.node, result], float(reading.acks.get(result, 0)))
    rejected = CounterMetricFamily(
        "powerd_agent_rejected_signatures",
        "Commands and heartbeats not signed by a trusted controller key",
        labels=["node"],
    )
    rejected.add_metric(node, float(reading.rejected_signatures))
    alarms = CounterMetricFamily(
        "powerd_agent_clock_alarms",
        "Heartbeats refused because their ts ran ahead of this node's clock",
        labels=["node"],
    )
    alarms.add_metric(node, float(reading.clock_alarms))
    return [mode, failsafe, age, power, cap, commands, rejected, alarms]
