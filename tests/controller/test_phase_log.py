"""Phase changes are logged at DEBUG; INFO gets one summary a minute, not a line each."""

from __future__ import annotations

import logging

import pytest

from powerd.controller.counters import CycleCounters
from powerd.controller.phase_log import NAMES_SHOWN, SUMMARY_INTERVAL_S, PhaseLog
from tests.controller.controller_parts import parts
from tests.controller.test_controller_core import phase_payload
from tests.controller.test_job_registry import registry_of


def info_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "powerd.controller" and r.levelno == logging.INFO
    ]


def test_a_jobs_phases_are_debug_lines_and_one_info_summary_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="powerd.controller")
    p = parts()
    jobs = registry_of(p)
    counters = CycleCounters()
    jobs.on_phase("llm", phase_payload("llm", "startup", ["k1-n1"], "high"), "a", counters)
    announced, start = 1, p.clock.t
    while p.clock.t - start < SUMMARY_INTERVAL_S - 1.0:  # two phase changes a second
        p.clock.advance(0.5)
        phase = "communication" if announced % 2 else "compute"
        assert jobs.on_phase("llm", phase_payload("llm", phase, priority="high"), "a", counters)
        announced += 1
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG and "job llm:" in r.message]
    assert len(debug) == announced  # every change is still there, at DEBUG
    assert info_lines(caplog) == []  # a site's journal gets none of them at INFO
    p.clock.advance(2.0)
    jobs.expire(p.clock.t, counters)  # the controller's cycle: the minute has passed
    (summary,) = info_lines(caplog)
    assert summary.startswith(f"phases in the last {SUMMARY_INTERVAL_S + 1:.0f} s: ")
    assert f"{announced} announced by 1 jobs" in summary
    assert "communication 59" in summary and "compute 59" in summary and "startup 1" in summary
    assert "1 started (llm)" in summary
    jobs.expire(p.clock.t + SUMMARY_INTERVAL_S * 2, counters)  # nothing since: no line
    assert len(info_lines(caplog)) == 1


def test_the_summary_names_a_few_jobs_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="powerd.test")
    phase_log = PhaseLog(logging.getLogger("powerd.test"))
    for k in range(NAMES_SHOWN + 3):
        phase_log.announced(float(k), f"j{k}", "startup", 1, "normal", new=True)
        phase_log.announced(float(k), f"j{k}", "shutdown", 1, "normal", new=False)
    phase_log.inferred(9.0, "j0", "communication")
    assert caplog.records == []
    phase_log.flush(SUMMARY_INTERVAL_S)
    (record,) = caplog.records
    shown = ", ".join(f"j{k}" for k in range(NAMES_SHOWN))
    assert record.getMessage() == (
        f"phases in the last {SUMMARY_INTERVAL_S:.0f} s: 16 announced by 8 jobs"
        " (startup 8, shutdown 8); "
        f"8 started ({shown} and 3 more); 8 shut down ({shown} and 3 more); "
        "1 phase changes inferred from power"
    )
