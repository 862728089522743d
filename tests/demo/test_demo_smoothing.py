"""`powerd demo --smoothing` end to end: the controller asks for grid smoothing, the H100s'
agents carry it out in software, the jobs fill their waits and ramp down at their end."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.demo_process import run_demo

# the demo's measured site ramps under smoothing: run apart from the other tests (pyproject.toml, markers)
pytestmark = pytest.mark.realtime

RAMP_LIMIT_W_PER_S = 20_000.0  # demo.toml's [site.grid]


@pytest.fixture(scope="module")
def smoothing_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess, Path]:
    where = tmp_path_factory.mktemp("demo-smoothing")
    return run_demo(where, "--smoothing"), where


def test_the_jobs_fill_their_waits_and_the_site_falls_slowly(smoothing_run):
    result, where = smoothing_run
    assert result.returncode == 0, result.stdout + result.stderr
    s = json.loads((where / "summary.json").read_text())
    assert s["limit_violated"] is False and s["over_limit_s"]["any"] == 0
    g = s["grid"]
    assert g["floor_source"] == "burnt by smoothing"
    assert g["floor_energy_kwh"] > 0 and 0 < g["floor_energy_share_of_jobs"] < 1
    # without smoothing every communication phase drops the site by ~60 kW/s (README);
    # with it, the falls are the GPUs' share of the limit, plus noise and timing
    assert g["ramp_down_max_w_per_s"] < 1.5 * RAMP_LIMIT_W_PER_S
    # and the rises: every job starts filling up at the GPUs' ramp-up rate (FillFollower
    # .starting), so no first step of compute jumps (without it: ~+70 kW/s)
    assert g["ramp_up_max_w_per_s"] < 1.5 * RAMP_LIMIT_W_PER_S
    # the run went on past the jobs' 20 s while their GPUs ramped down
    assert s["duration_s"] > 20.0
    assert "smoothing burnt" in result.stdout
    # a checkpoint outlasts two 1 s windows: each job fills back up before it computes
    # (FillFollower.fill_back_up), but it announced how long it would last, so its GPUs
    # were back where compute resumes, a cap handed back as it began included, by its end
    # (FillFollower.waiting(expected_s)): compute waited 0-0.02 s a job on a quiet machine
    # (before: 0.4-0.55 s; without the announced end, the whole climb: 4.9 s for one job),
    # and under the realtime stage's load once 0.86 s; the summary says what it took
    waited = {name: job["rise_first_s"] for name, job in s["jobs"].items()}
    assert all(0 <= w < 1.5 for w in waited.values()), waited
    spans = [span for job in s["jobs"].values() for span in job["rise_first_spans"]]
    assert sum(b - a for a, b in spans) == pytest.approx(sum(waited.values()), abs=0.05)
    # what the grid held back, against its bounds (0-0.0014 kWh quiet; 0.014-0.022 before)
    assert 0 <= g["lost_work_kwh"] < 0.05 and g["lost_at_floors_kwh"] >= 0
    assert g["floor_ratio_to_causal"] > 0
    # each job's fixed share of the ramps: a bound at least the causal one, often above it
    assert g["floor_shared_kwh"] >= g["floor_ready_kwh"] * (1 - 1e-9)
    assert 0 < g["floor_ratio_to_shared"] <= g["floor_ratio_to_causal"] * (1 + 1e-9)
