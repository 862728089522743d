"""What a finished demo run leaves behind: the PNG, the JSON report, the printed outcome."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from policies.causes import largest_causes
from powerd.demo.runner import DemoOptions, DemoRun
from powerd.demo.summary import VERDICT_FAILED, VERDICT_WARNED, RunRecord, Summary
from powerd.demo.view import grid_breach_line, print_summary


def save_plot(trace: RunRecord, path: Path) -> Path:
    """The PNG at ``path``, or under the same name in the temp dir if ``path`` cannot be
    written; returns where it went."""
    from powerd.demo.plot import plot_trace  # matplotlib: once the run is over

    try:
        return plot_trace(trace, path)
    except OSError:
        return plot_trace(trace, Path(tempfile.gettempdir()) / path.name)


def summary_report(run: DemoRun, options: DemoOptions, plot: Path) -> dict[str, Any]:
    """``--summary-json``: the summary, the run's timings and topology, where the PNG went
    and, with ``--record``, the recorder's counters."""
    top = run.topology
    report = run.summary.to_dict() | {
        "setup_s": run.setup_s,
        "wall_s": run.wall_s,
        "budgets": top.source,
        "topology": {
            "rows": len(top.rows),
            "racks": len(top.racks),
            "nodes": len(top.servers),
            "gpus": top.n_gpus,
        },
        "agent_period_s": options.agent_period_s,
        "cycle_s": options.cycle_s,
        "sample_s": options.sample_s,
        "smoothing": options.smoothing,
        "compute_s": options.compute_s,  # the jobs' rhythm (the low-priority job's is longer)
        "comm_s": options.comm_s,
        "checkpoint_s": options.checkpoint_s,
    }
    report["plot"] = str(plot.resolve())
    if run.recorded is not None:
        report["recorded"] = run.recorded
    return report


def write_summary_json(path: Path, run: DemoRun, options: DemoOptions, plot: Path) -> None:
    report = summary_report(run, options, plot)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def lost_line(summary: Summary) -> str | None:
    """'throughput lost 31.0 % of uncapped: staged phase 20.1 %, capping 8.0 %, ...' (the
    causes that cost anything, largest first; they add up), or None without work done."""
    if summary.throughput_rel is None:
        return None
    parts = largest_causes(summary.throughput_lost_by_cause)
    causes = ", ".join(f"{cause} {share:.1%}" for cause, share in parts)
    return f"throughput lost {1 - summary.throughput_rel:.1%} of uncapped: {causes or 'nothing'}"


def cap_ramp_breach_line(summary: Summary) -> str | None:
    """'the sum of caps rose +21.5 kW/s, above the site's 20 kW/s ramp limit', or None."""
    limit = summary.site_ramp_limit_w_per_s
    rise = summary.peak_site_cap_ramp_up_w_per_s
    if limit is None or rise <= limit:
        return None
    return (
        f"the sum of caps rose +{rise / 1e3:.1f} kW/s over 1 s, above the site's "
        f"{limit / 1e3:g} kW/s ramp limit (a staged job's caps stand a headroom over its draw "
        "beyond the ramp: compute that begins under them takes it at once)"
    )


def print_outcome(console: Console, run: DemoRun, plot: Path, record: str | None) -> None:
    """The summary table, what was recorded, every grid limit the site's power broke and a
    cap ramp over its limit (warnings), every limit violated, then one verdict that agrees
    with all of them and with the exit code (``Summary.verdict``)."""
    summary = run.summary
    console.print()
    print_summary(console, summary, str(plot.resolve()))
    if run.recorded is not None:
        r = run.recorded
        console.print(
            f"telemetry: {r['written']:,} points recorded to {record}"
            + (
                f", {r['dropped']:,} dropped ({r['write_errors']} write errors)"
                if r["dropped"]
                else ""
            ),
            highlight=False,
        )
    lost = lost_line(summary)
    if lost:
        console.print(lost, highlight=False)
    ramp = cap_ramp_breach_line(summary)
    if ramp:
        console.print(f"[bold yellow]RAMP (warning)[/]: {ramp}", highlight=False)
    breach = grid_breach_line(summary)
    if breach:
        console.print(
            f"[bold yellow]GRID (warning)[/]: {breach} ({summary.grid['spec']})", highlight=False
        )
    for v in summary.limit_violations:
        console.print(
            f"[bold red]LIMIT VIOLATED[/]: {v['level']} {v['name']} drew up to "
            f"{v['peak_w'] / 1e3:.1f} kW, above its {v['limit_w'] / 1e3:g} kW limit, "
            f"for {v['seconds']:.1f} s (first at {v['first_at_s']:.1f} s)",
            highlight=False,
        )
    console.print(verdict_line(summary), highlight=False)


def verdict_line(summary: Summary) -> str:
    """The outcome's last line (rich markup): failed on a limit (exit 1), ok with the
    warnings named (exit 0: the grid spec and the ramp limit are about the grid, the exit
    code about breakers), or ok."""
    if summary.verdict == VERDICT_FAILED:
        n = len(summary.limit_violations)
        nodes = "a tree node" if n == 1 else f"{n} tree nodes"
        return (
            f"[bold red]failed[/]: {nodes} went over a limit (LIMIT VIOLATED above); "
            f"exit {summary.exit_code}"
        )
    safe = "no rack, row, node or the site went over its limit"
    if summary.verdict == VERDICT_WARNED:
        above = " and ".join(
            {
                "grid spec": "the site's power broke the grid spec (GRID above)",
                "ramp limit": "the sum of caps rose faster than the site's ramp limit (RAMP above)",
            }[w]
            for w in summary.warnings
        )
        return (
            f"[bold yellow]ok, with warnings[/]: {safe}, but {above}: the grid's limits, not "
            f"the breakers', so exit {summary.exit_code}"
        )
    return f"[green]ok[/]: {safe}; exit {summary.exit_code}"
