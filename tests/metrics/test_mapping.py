"""State to series: the pure mappings of powerd.metrics, and the [metrics] key and flag."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from policies.tree import RACK, ROW, SITE
from powerd.agent.config import load_config
from powerd.cli import main
from powerd.configfile import ConfigError
from powerd.controller.config import load_controller_config
from powerd.coordinator.config import load_coordinator_config
from powerd.metrics.address import parse_listen
from powerd.metrics.agent import AgentCollector
from powerd.metrics.controller import ControllerCycle, ControllerMetrics
from powerd.metrics.readings import AgentReading, GpuReading, LeaderReading


def exposed(collector: object) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def agent_reading(**changes: object) -> AgentReading:
    fields: dict[str, object] = {
        "node": "n1", "mode": "controlled", "heartbeat_mono": 100.0,
        "gpus": (GpuReading(0, 350.0, 500.0), GpuReading(1, 90.0, 700.0)),
        "acks": {"applied": 3, "rejected": 1}, "rejected_signatures": 2, "clock_alarms": 1,
    }  # fmt: skip
    return AgentReading(**{**fields, **changes})  # type: ignore[arg-type]


def test_agent_series_from_its_reading():
    series = exposed(AgentCollector(agent_reading, monotonic=lambda: 102.5))
    get = lambda metric, /, **labels: series[(metric, frozenset({"node": "n1", **labels}.items()))]  # noqa: E731
    assert [get("powerd_agent_mode", mode=m) for m in ("controlled", "failsafe", "local")] == [
        1, 0, 0,
    ]  # fmt: skip
    assert get("powerd_agent_failsafe") == 0
    assert get("powerd_agent_heartbeat_age_seconds") == 2.5
    assert get("powerd_agent_gpu_cap_watts", gpu="1") == 700.0
    assert get("powerd_agent_gpu_power_watts", gpu="0") == 350.0
    assert get("powerd_agent_commands_total", result="applied") == 3
    assert get("powerd_agent_commands_total", result="stale") == 0
    assert get("powerd_agent_rejected_signatures_total") == 2
    assert get("powerd_agent_clock_alarms_total") == 1
    before = exposed(AgentCollector(lambda: agent_reading(mode="failsafe", heartbeat_mono=None)))
    assert math.isnan(
        before[("powerd_agent_heartbeat_age_seconds", frozenset({"node": "n1"}.items()))]
    )
    assert before[("powerd_agent_failsafe", frozenset({"node": "n1"}.items()))] == 1


def controller_cycle() -> ControllerCycle:
    return ControllerCycle(
        nodes_by_mode={"controlled": 3, "failsafe": 1, "local": 0, "stale": 2},
        level=np.array([SITE, ROW, RACK, RACK]),
        name=("lab", "r1", "k1", "k2"),
        power_w=np.array([9000.0, 9000.0, 6500.0, 2500.0]),
        limit_w=np.array([12500.0, 12500.0, 6200.0, 6200.0]),
        budget_w=np.array([8800.0, 8800.0, 3920.0, 3920.0]),
        cycle_s=0.004,
        ingest_dropped_total=7,
        clock_skew_s=-1.5,
        nodes_skewed=1,
    )


def test_controller_series_while_leading_and_only_its_counts_when_not():
    live = LeaderReading(True, 4, 5, 8000.0, 1, 2)
    metrics = ControllerMetrics("ctl-a", "site", lambda: live)
    metrics.on_cycle(controller_cycle())
    series = exposed(metrics)
    labels = {"controller": "ctl-a", "scope": "site"}
    get = lambda metric, /, **more: series[(metric, frozenset({**labels, **more}.items()))]  # noqa: E731
    assert get("powerd_controller_leader") == 1 and get("powerd_controller_epoch") == 4
    assert get("powerd_controller_site_limit_watts") == 8000
    assert get("powerd_controller_nodes", mode="failsafe") == 1
    assert get("powerd_controller_nodes_stale") == 2
    assert get("powerd_controller_level_power_watts", level="rack", name="k1") == 6500
    assert get("powerd_controller_level_budget_watts", level="rack", name="k2") == 3920
    assert get("powerd_controller_levels_over_limit", level="rack") == 1
    assert get("powerd_controller_levels_over_limit", level="site") == 0
    assert get("powerd_controller_ingest_dropped_total") == 7
    assert get("powerd_controller_clock_skew_seconds") == -1.5
    assert get("powerd_controller_rejected_signatures_total") == 5
    assert get("powerd_controller_site_limits_refused_total") == 1
    standby = ControllerMetrics("ctl-a", "site", lambda: LeaderReading(False, 4, 0, None, 0))
    standby.on_cycle(controller_cycle())  # a cycle from before it stepped down
    shown = {name for name, _ in exposed(standby)}
    assert "powerd_controller_leader" in shown and "powerd_controller_nodes" not in shown
    assert "powerd_controller_level_power_watts" not in shown


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("9471", "is not HOST:PORT"),
        ("localhost:http", "the port must be a number in 1..65535"),
        ("0.0.0.0:70000", "the port must be a number in 1..65535"),
        ("::1:9471", "IPv6 address in brackets"),
    ],
)
def test_listen_addresses_refused_with_the_reason(text: str, message: str):
    with pytest.raises(ValueError, match=message):
        parse_listen(text)
    assert parse_listen("[::1]:9471") == ("::1", 9471)


@pytest.mark.parametrize("load", [load_config, load_controller_config, load_coordinator_config])
def test_every_daemon_reads_metrics_listen_and_names_a_bad_one(tmp_path: Path, load):
    path = tmp_path / "daemon.toml"
    path.write_text('[metrics]\nlisten = "127.0.0.1:9471"\n')
    assert load(path).metrics_listen == "127.0.0.1:9471"
    assert load(None).metrics_listen is None  # off by default
    path.write_text('[metrics]\nlisten = "9471"\n')
    with pytest.raises(ConfigError, match=r"daemon.toml: metrics.listen \(--metrics-listen\)"):
        load(path)


def test_the_flag_replaces_the_file_and_is_checked(tmp_path: Path):
    path = tmp_path / "agent.toml"
    path.write_text('[agent]\nnode = "n1"\n[metrics]\nlisten = "127.0.0.1:9470"\n')
    config = load_config(path).with_overrides(metrics_listen="0.0.0.0:19470")
    assert config.metrics_listen == "0.0.0.0:19470"
    result = CliRunner().invoke(
        main, ["agent", "--config", str(path), "--local", "--metrics-listen", "nowhere"]
    )
    assert result.exit_code != 0
    assert "metrics.listen (--metrics-listen): 'nowhere' is not HOST:PORT" in result.output
