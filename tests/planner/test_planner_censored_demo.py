"""Capped samples end to end (issue 38): `powerd demo --record` on simulated GPUs, then
`powerplan profiles` and `powerplan size` on what it recorded. The demo's budgets are tight,
so its jobs compute held at their caps: the planner must say so and plan from the estimated
demand, and against the simulator's own demand (`--record-demand`) the estimate must not
understate it where the capped draw does (docs/PLANNER.md, "Capped samples")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from planner.cli import main
from planner.profiles import read_profiles
from tests.support.demo_process import run_demo
from tests.support.paths import REPO

# The demo runs in real time: how far the drawn p99 falls under the truth depends on its
# pacing (under the parallel stage's load 627 W drawn against a 631 W truth).
pytestmark = pytest.mark.realtime

TOPOLOGY = REPO / "powerd/data/budgets/tree-3rows.toml"  # 96 H100
MIX = '[[jobs]]\nworkload = "llm-high"\nshare = 0.5\n[[jobs]]\nworkload = "llm-low"\nshare = 0.5\n'
JOBS = ("llm-high", "llm-low")


def powerplan(*args: str) -> tuple[Any, str]:
    """Run powerplan with --format json: (its JSON, its stderr)."""
    result = CliRunner().invoke(main, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


def site_demand_w(tmp_path: Path, profile: Path, *flags: str) -> tuple[float, Any, str]:
    mix = tmp_path / "mix.toml"
    mix.write_text(MIX)
    out = tmp_path / f"{profile.stem}-{len(flags)}.toml"
    doc, said = powerplan(
        *("size", str(TOPOLOGY), str(profile), "--mix", str(mix), "-o", str(out)),
        *("--samples", "5000", "--allow-over-limit", *flags),
    )
    site = next(n for n in doc["nodes"] if n["level"] == "site")
    return float(site["demand_q_w"]), doc, said


def draws_only(recorded: Path, path: Path) -> Path:
    """The recording's draws as a CSV without its caps: the planner cannot tell them capped."""
    table = read_profiles([recorded], workload="idle")
    table = table.sort_values(["node", "gpu", "time_s"])  # each GPU's samples in time order
    table.drop(columns=["cap_w", "cap_max_w"], errors="ignore").to_csv(path, index=False)
    return path


def by_workload(doc: Any) -> dict[str, dict[str, float]]:
    return {row["workload"]: row for row in doc["profiles"]}


@pytest.fixture(scope="module")
def demo_with_demand(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("demand")
    result = run_demo(
        where, "--record", str(where / "telemetry.lp"), "--record-demand", str(where / "demand.csv")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "samples written to" in result.stdout
    return where


def test_a_recorded_demo_is_planned_from_estimated_demand_with_a_warning(
    demo_with_demand: Path, tmp_path: Path
) -> None:
    recorded = demo_with_demand / "telemetry.lp"
    plain = draws_only(recorded, tmp_path / "draws.csv")

    doc, said = powerplan("profiles", str(recorded), "--workload", "idle")
    table = read_profiles([recorded], workload="idle")
    for job in JOBS:
        # the share the recording holds, counted here: the demo's caps are tight, but how
        # many samples a high job spends handed back to its maximum depends on the pacing
        # (100 % in most runs, 94 % in one)
        rows = table[table["workload"] == job]
        capped = float((rows["cap_w"] < rows["cap_max_w"] - 1.0).mean())
        assert capped > 0.5
        assert f"warning: {job}: {capped:.0%} of its {len(rows):,} samples capped" in said, said
        assert "held at the cap" in said and "their demand estimated" in said
    drawn, _ = powerplan("profiles", str(plain))
    estimated = by_workload(doc)
    for job in JOBS:
        assert estimated[job]["censored_share"] > 0.3
        assert estimated[job]["p99_w"] > by_workload(drawn)[job]["p99_w"] + 30

    sized_w, sized, said = site_demand_w(tmp_path, recorded, "--workload", "idle")
    assert "warning: profiles" in said and "held at the cap" in said
    assert {row["workload"] for row in sized["capped_samples"] if row["censored"]} == set(JOBS)
    drawn_w, _, _ = site_demand_w(tmp_path, plain)
    assert sized_w > drawn_w * 1.05  # not the capped draw: the estimate lies above it


def test_the_estimate_does_not_understate_the_simulators_demand(
    demo_with_demand: Path, tmp_path: Path
) -> None:
    """The truth: what each GPU would have drawn uncapped (SimulatedGpu.demand_w). The
    capped draw sizes below it; the estimate at or above it (every compute sample of the
    demo is held, so the estimate falls back to the H100's highest cap, 700 W)."""
    recorded, truth = demo_with_demand / "telemetry.lp", demo_with_demand / "demand.csv"
    truth_doc, said = powerplan("profiles", str(truth))
    assert "warning" not in said  # the truth is uncapped
    estimated, _ = powerplan("profiles", str(recorded), "--workload", "idle")
    as_is, _ = powerplan(
        "profiles", str(recorded), "--workload", "idle", "--capped-demand", "as-is"
    )
    for job in JOBS:
        true_p99_w = by_workload(truth_doc)[job]["p99_w"]
        # held at its caps for most of its compute: its p90 under the truth (its p99, 565 W
        # on a quiet machine, reached the uncapped 631 W +-1.5 % noise once under CI's
        # load, when more than 1 % of the samples came before the caps bit)
        assert by_workload(as_is)[job]["p90_w"] < 0.97 * true_p99_w
        assert true_p99_w <= by_workload(estimated)[job]["p99_w"] <= 700.0

    truth_w, _, _ = site_demand_w(tmp_path, truth)
    estimated_w, _, _ = site_demand_w(tmp_path, recorded, "--workload", "idle")
    as_is_w, _, _ = site_demand_w(
        tmp_path, recorded, "--workload", "idle", "--capped-demand", "as-is"
    )
    assert as_is_w < 0.97 * truth_w
    assert truth_w <= estimated_w <= 1.10 * truth_w
