"""`powerd demo` under safety by caps (the default, `--safety caps`): the whole loop with real
processes (embedded broker, controller, 64 agents on simulated H100s, two jobs): no rack,
row, node or the site over its limit, and the jobs run nearer full speed than under the
bands (the same 20 s run measured 0.909 against 0.685 of uncapped on 2026-11-29: the caps
fill the tight limits instead of holding the site at its capping target). The suite's one
shortest demo run (``shortest_demo``, tests/conftest.py) is that default run."""

from __future__ import annotations

import json

import pytest

from powerd.cli.demo import command as demo_command
from tests.support.demo_process import DemoRun

# wall-clock pacing of many processes: run apart from the other tests (pyproject.toml, markers)
pytestmark = pytest.mark.realtime


def test_the_demo_under_safety_by_caps_keeps_every_limit(shortest_demo: DemoRun) -> None:
    (safety,) = [p.default for p in demo_command.params if p.name == "safety"]
    assert safety == "caps"  # the shared run (no --safety) is the one this test is about
    result = shortest_demo.result
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((shortest_demo.where / "summary.json").read_text())
    assert summary["over_limit_s"]["any"] == 0.0
    assert summary["limit_violated"] is False
    assert summary["commands"]["sent"] > 0  # it did command the agents
    # the bands' run of the same scenario: 0.685 (bench note above); the caps fill the
    # limits: well above it even on a loaded machine
    assert summary["throughput_rel"] > 0.8
