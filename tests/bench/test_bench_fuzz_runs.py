"""The fuzz harness (bench/fuzz.py, issue 12) runs, counts what it sends, and can fail.

The quick run here is 2,000 payloads; the 100,000-payload run and its numbers are in
bench/RESULTS.md. Nothing here asserts how fast it goes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import fuzz
from powerd.agent.core import AgentCore
from powerd.controller.core import ControllerCore, CycleResult
from powerd.protocol import Ack, Command, GpuCommand


@pytest.mark.parametrize("seed", [1, 7])
def test_fuzz_harness_runs_clean(tmp_path: Path, seed: int):
    out = tmp_path / "fuzz.json"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "bench.fuzz"),
            *("--payloads", "2000", "--seed", str(seed), "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(out.read_text())
    problems = {
        name: (t["problems"], t["examples"][:2])
        for name, t in report["targets"].items()
        if t["violations"]
    }
    assert report["totals"]["violations"] == 0, json.dumps(problems, indent=1)
    assert result.returncode == 0, result.stderr[-3000:]
    targets = report["targets"]
    assert set(targets) == set(fuzz.TARGETS)
    assert sum(t["sent"] for t in targets.values()) == 2000 == report["totals"]["sent"]
    for name, t in targets.items():
        assert t["sent"] > 0, name
        assert t["accepted"] + t["rejected"] == t["sent"], name
        assert sum(g["sent"] for g in t["generators"].values()) == t["sent"], name
    # the signed, schema-valid commands get past the signature and the schema: the ordering
    # and clamping behind them run, not only the rejection
    assert targets["agent.command"]["outcomes"].get("applied", 0) > 0
    assert targets["agent.command"]["generators"]["signed_valid_wild"]["accepted"] > 0
    assert report["controller_cycles"]["cycles"] > 0
    for parser in fuzz.CONFIG_TARGETS:
        assert targets[parser]["accepted"] > 0, parser  # valid configs among them
        assert targets[parser]["slowest_s"] >= 0
    assert report["command"].startswith("python -m bench.fuzz")
    assert report["machine"]
    assert "violations" in result.stdout  # the table


def test_payloads_are_spread_over_every_target_and_add_up():
    for total in (9, 10, 2000, 100_000, 100_003):
        counts = fuzz.split(total, fuzz.TARGETS)
        assert sum(counts.values()) == total
        assert all(n > 0 for n in counts.values())
    counts = fuzz.split(100_000, fuzz.TARGETS)
    assert counts["agent.command"] == 40_000 and counts["config.budgets"] == 5_000
    assert fuzz.split(10, ["agent.command"]) == {"agent.command": 10}


def test_the_same_seed_sends_the_same_payloads():
    def counts(result: dict) -> dict:
        return {
            name: (t["sent"], t["accepted"], t["outcomes"], t["generators"])
            for name, t in result["targets"].items()
        }

    first = fuzz.run(300, seed=3)
    assert counts(fuzz.run(300, seed=3)) == counts(first)
    assert counts(fuzz.run(300, seed=4)) != counts(first)


class ExplodingAgentCore(AgentCore):
    """Breaks rule 6: a command that sets a cap raises out of ``on_command``."""

    def on_command(self, payload: bytes) -> Ack:
        if b'"cap_w"' in payload:
            raise RuntimeError("injected")
        return super().on_command(payload)


def test_an_exception_out_of_the_agent_core_is_a_violation():
    result = fuzz.run(400, seed=5, targets=["agent.command"], agent_core=ExplodingAgentCore)
    commands = result["targets"]["agent.command"]
    assert commands["sent"] == 400
    assert commands["violations"] > 0
    assert commands["problems"]["exception: RuntimeError"] == commands["outcomes"]["exception"]
    example = commands["examples"][0]
    assert example["problem"] == "exception: RuntimeError: injected"
    assert "cap_w" in example["input"]
    assert len(commands["examples"]) == fuzz.MAX_EXAMPLES


class OverreachingControllerCore(ControllerCore):
    """Commands a GPU far above its range, and a node the tree does not have."""

    def cycle(self, waiting=None) -> CycleResult:
        result = super().cycle(waiting)
        node = self.tree.server_names[0]
        over = float(self.tree.cap_max_w[0]) * 10
        result.commands.append((node, self._command(GpuCommand(index=0, cap_w=over))))
        result.commands.append(("not-a-node", self._command(GpuCommand(index=0, cap_w=300.0))))
        return result

    def _command(self, gpu: GpuCommand) -> Command:
        return Command(v=1, epoch=self.epoch, seq=1, ts=0.0, ttl_s=30.0, gpus=[gpu])


def test_a_controller_command_out_of_range_is_a_violation():
    result = fuzz.run(
        200,
        seed=5,
        targets=["controller.telemetry", "controller.status"],
        controller_core=OverreachingControllerCore,
    )
    cycles = result["controller_cycles"]
    assert cycles["cycles"] > 0
    assert cycles["violations"] == 2 * cycles["cycles"]
    assert result["totals"]["violations"] == cycles["violations"]
    problems = {p for t in result["targets"].values() for p in t["problems"]}
    assert problems == {"command cap out of range", "command to a node not in the tree"}
