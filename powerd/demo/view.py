"""What the demo shows on the terminal: the live view, the event log, the final summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, JustifyMethod, RenderResult
from rich.table import Table
from rich.text import Text

from policies.causes import largest_causes
from policies.tree import RACK, ROW, SITE, Tree
from powerd.demo.runner import LiveState
from powerd.demo.summary import Summary
from powerd.topology.grid import NO_GRID_SPEC
from powerd.units import fmt_kw_per_s as _kw

BAR_WIDTH = 24  # the power bar in a wide terminal
NARROW_BAR_WIDTH = 14  # in one narrower than the wide layout (an 80-column one)
CAPPING_SHOWN_S = 3.0  # how long the view keeps showing that a node capped
MAX_RACKS_SHOWN = 16
STATUS_EVERY_S = 5.0
MAX_EVENTS_SHOWN = 6


class _TreeView:
    """Per-topology constants: which tree nodes to show and which job runs under each."""

    def __init__(self, state: LiveState) -> None:
        top = state.topology
        self.tree = top.tree
        self.gpus_under = np.maximum(self.tree.node_sum(np.ones(top.n_gpus)), 1.0)
        shown = [0]
        racks_shown = 0
        for row in top.rows:
            shown.append(top.node_index(row))
            for rack in top.racks:
                if top.parent_of(rack) == row and racks_shown < MAX_RACKS_SHOWN:
                    shown.append(top.node_index(rack))
                    racks_shown += 1
        self.shown = shown
        self.names = top.names
        self.level = top.level
        # GPU -> job index, for the job column
        self.gpu_job = np.full(top.n_gpus, -1)
        for k, job in enumerate(state.jobs):
            for node in job.plan.nodes:
                gpus = top.server_gpus(node)
                self.gpu_job[gpus.start : gpus.stop] = k

    def jobs_under(self, node: int) -> list[int]:
        mask = self.tree.gpu_ancestor[int(self.level[node])] == node
        return sorted({int(j) for j in np.unique(self.gpu_job[mask]) if j >= 0})


def _bar(
    power_w: float, budget_w: float, threshold_w: float, limit_w: float, width: int = BAR_WIDTH
) -> Text:
    """Power as a bar on a scale up to the limit; ┃ marks the budget."""
    frac = max(0.0, power_w / limit_w)
    filled = min(width, round(frac * width))
    mark = min(width - 1, round(budget_w / limit_w * width))
    style = "green" if power_w <= threshold_w else "yellow" if power_w <= limit_w else "bold red"
    text = Text()
    for i in range(width):
        if i == mark:
            text.append("┃", style="bold white" if i < filled else "white")
        elif i < filled:
            text.append("█", style=style)
        else:
            text.append("·", style="grey42")
    return text


@dataclass(frozen=True)
class Column:
    """One column of the live table: its header, alignment and least width in cells."""

    header: str
    justify: JustifyMethod
    width: int


@dataclass(frozen=True)
class Layout:
    """The live table's columns for a terminal width: all of them in full where they fit,
    shorter headers, a shorter bar and the job's name alone (its phase is in the jobs
    line above) in an 80-column terminal."""

    columns: tuple[Column, ...]
    bar_width: int
    job_phase: bool  # the job column shows "name: phase", not the name alone

    @property
    def width(self) -> int:
        """The table's width: its columns and one space between each two."""
        return sum(c.width for c in self.columns) + len(self.columns) - 1


WIDE = Layout(
    (
        Column("", "left", 12),
        Column("kW", "right", 6),
        Column("budget", "right", 6),
        Column("limit", "right", 5),
        Column("0 ── power ── limit", "left", BAR_WIDTH),
        Column("capping", "center", 7),
        Column("mean cap W", "right", 10),
        Column("clock-locked", "right", 12),
        Column("job: phase", "left", 24),
    ),
    BAR_WIDTH,
    job_phase=True,
)
NARROW = Layout(
    (
        Column("", "left", 11),
        Column("kW", "right", 6),
        Column("budget", "right", 6),
        Column("limit", "right", 5),
        Column("power", "left", NARROW_BAR_WIDTH),
        Column("capping", "center", 7),
        Column("cap W", "right", 5),
        Column("locked", "right", 7),
        Column("job", "left", 8),
    ),
    NARROW_BAR_WIDTH,
    job_phase=False,
)


def layout_for(width: int) -> Layout:
    return WIDE if width >= WIDE.width else NARROW


def pack(items: Sequence[Text], sep: str, width: int) -> list[Text]:
    """``items`` joined by ``sep`` into lines of at most ``width`` cells, a line broken
    only between two items (an item wider than the line gets a line of its own)."""
    lines: list[Text] = []
    line = Text()
    for item in items:
        if line.plain and cell_len(line.plain + sep + item.plain) > width:
            lines.append(line)
            line = Text()
        if line.plain:
            line.append(sep)
        line.append_text(item)
    if line.plain:
        lines.append(line)
    return lines


def legend_entries(threshold_share: float) -> list[str]:
    """What the bar's characters and colours and the capping marks mean, one entry each."""
    return [
        "bar: power up to the limit",
        "┃ the budget",
        f"green below the capping threshold ({threshold_share * 100:.0f} % of budget)",
        "yellow above it",
        "red above the limit",
        "capping: ● the controller takes watts under the node now",
        f"○ it did in the last {CAPPING_SHOWN_S:g} s",
    ]


class LiveView:
    """Renders the state as a table of site, rows and racks (``rich.live.Live`` updates it),
    laid out for the console's width and height when it is drawn."""

    def __init__(self) -> None:
        self._tree: _TreeView | None = None

    def render(self, state: LiveState) -> _Screen:
        if self._tree is None:
            self._tree = _TreeView(state)
        return _Screen(self, state)

    def screen(self, state: LiveState, width: int, height: int) -> Group:
        """The view within ``width`` columns and ``height`` lines: the events above the
        legend are what a short terminal drops first."""
        if self._tree is None:
            self._tree = _TreeView(state)
        layout = layout_for(width)
        header = pack(_header_items(state), " · ", width)
        header[0].stylize("bold", 0, len("powerd demo"))
        jobs = pack(_job_items(state), "   ", width)
        table = self._table(state, layout)
        tree = self._tree.tree
        threshold = float(tree.cap_threshold_w[SITE] / tree.budget_w[SITE])
        entries = [Text(e) for e in legend_entries(threshold)]
        legend = pack(entries, "; ", width)
        for line in legend:
            line.stylize("grey50")
        table_lines = len(self._tree.shown) + 1
        spare = height - len(header) - len(jobs) - table_lines - len(legend)
        gaps = 2 if spare >= 3 else 0
        shown = max(0, min(MAX_EVENTS_SHOWN, spare - gaps))
        events = [
            Text(e, style="grey70", no_wrap=True, overflow="ellipsis")
            for e in (state.events[-shown:] if shown else [])
        ]
        gap = [Text("")] if gaps else []
        return Group(*header, *jobs, *gap, table, *gap, *events, *legend)

    def _table(self, state: LiveState, layout: Layout) -> Table:
        assert self._tree is not None
        tv = self._tree
        tree = tv.tree
        table = Table(box=None, pad_edge=False, header_style="bold", collapse_padding=True)
        for column in layout.columns:
            table.add_column(
                column.header,
                justify=column.justify,
                no_wrap=True,
                min_width=column.width,
                overflow="ellipsis",
            )
        power = state.node_power_w
        cap_sum = tree.node_sum(state.gpu_cap_w) if state.gpu_cap_w is not None else None
        locked = (
            tree.node_sum(state.gpu_locked.astype(float)) if state.gpu_locked is not None else None
        )
        now_s = state.elapsed_s()
        for node in tv.shown:
            lvl = int(tv.level[node])
            indent = {SITE: "", ROW: " ", RACK: "  "}.get(lvl, "   ")
            p = float(power[node]) if power is not None else float("nan")
            since = now_s - state.last_capping_s[node] if state.last_capping_s is not None else 1e9
            if since <= 0.01 + (state.cycle_s or 0.5):
                capping = Text("●", style="bold yellow")
            elif since <= CAPPING_SHOWN_S:
                capping = Text("○", style="yellow")
            else:
                capping = Text("·", style="grey42")
            table.add_row(
                indent + tv.names[node],
                f"{p / 1e3:6.1f}",
                f"{tree.budget_w[node] / 1e3:g}",
                f"{tree.limit_w[node] / 1e3:g}",
                _bar(
                    p,
                    tree.budget_w[node],
                    tree.cap_threshold_w[node],
                    tree.limit_w[node],
                    layout.bar_width,
                )
                if power is not None
                else "",
                capping,
                f"{cap_sum[node] / tv.gpus_under[node]:4.0f}" if cap_sum is not None else "",
                f"{int(locked[node])}/{int(tv.gpus_under[node])}" if locked is not None else "",
                _job_cell(state, tv.jobs_under(node), layout.job_phase),
            )
        return table


class _Screen:
    """The live view as rich draws it: laid out for the width and height it is given."""

    def __init__(self, view: LiveView, state: LiveState) -> None:
        self.view = view
        self.state = state

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # one line short of the terminal: the cursor's line after the last one
        height = (options.height or options.max_height or console.height) - 1
        yield self.view.screen(self.state, options.max_width, height)


def _header_items(state: LiveState) -> list[Text]:
    return [
        Text("powerd demo"),
        Text(f"{state.elapsed_s():4.1f} / {state.duration_s:g} s"),
        Text(f"controller epoch {state.epoch}"),
        Text(f"{state.cycles} cycles"),
        Text(f"commands {state.commands_sent} sent, {state.acks_received} acked"),
    ]


def _job_items(state: LiveState) -> list[Text]:
    items = []
    for job in state.jobs:
        phase = job.phase or "waiting"
        item = Text()
        item.append(job.plan.name, style="bold")
        item.append(f" ({job.plan.priority}, {len(job.gpus)} GPUs): ")
        item.append(phase, style=_PHASE_STYLE.get(phase, ""))
        items.append(item)
    return items


def _job_cell(state: LiveState, jobs_here: list[int], with_phase: bool) -> Text:
    text = Text()
    if len(jobs_here) == 1:
        job = state.jobs[jobs_here[0]]
        text.append(job.plan.name)
        if with_phase:
            text.append(": ")
            text.append(job.phase or "-", style=_PHASE_STYLE.get(job.phase or "", ""))
    elif jobs_here:
        text.append(f"{len(jobs_here)} jobs")
    return text


_PHASE_STYLE = {
    "startup": "cyan",
    "compute": "green",
    "communication": "magenta",
    "checkpoint": "yellow",
    "shutdown": "grey50",
}


class EventLog:
    """Without a live view: each job phase change as it happens and a status line every 5 s."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._printed = 0
        self._next_status_s = STATUS_EVERY_S
        self._tree: Tree | None = None

    def __call__(self, state: LiveState) -> None:
        # a line each, as long as it is: into a log or a pipe, not wrapped mid-phrase
        for line in state.events[self._printed :]:
            self.console.print(line, highlight=False, soft_wrap=True)
        self._printed = len(state.events)
        elapsed = state.elapsed_s()
        if elapsed >= self._next_status_s and state.node_power_w is not None:
            self._next_status_s += STATUS_EVERY_S
            if self._tree is None:
                self._tree = state.topology.tree
            line = status_line(state, elapsed, self._tree)
            self.console.print(line, highlight=False, soft_wrap=True)


def status_line(state: LiveState, elapsed_s: float, tree: Tree) -> str:
    """One line: site and row power, who is capping, how many GPUs are clock-locked."""
    top = state.topology
    power = state.node_power_w
    assert power is not None
    rows = ", ".join(f"{r} {power[top.node_index(r)] / 1e3:.1f}" for r in top.rows[:4])
    capping: list[str] = []
    if state.last_capping_s is not None:
        recent = elapsed_s - state.last_capping_s <= STATUS_EVERY_S
        capping = [top.names[k] for k in np.flatnonzero(recent)]
    shown = ", ".join(capping[:4]) + ("…" if len(capping) > 4 else "") if capping else "none"
    locked = int(state.gpu_locked.sum()) if state.gpu_locked is not None else 0
    return (
        f"{elapsed_s:5.1f} s  site {power[0] / 1e3:.1f} kW (budget {tree.budget_w[0] / 1e3:g}, "
        f"limit {tree.limit_w[0] / 1e3:g}) · rows {rows} kW · capped: {shown} · "
        f"{locked} GPUs locked"
    )


def print_summary(console: Console, summary: Summary, plot_path: str | None) -> None:
    """The end-of-run numbers, as a table."""
    s = summary
    table = Table(title="powerd demo: summary", show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()

    def per_level(values: dict[str, float]) -> str:
        return ", ".join(f"{k} {v:.1f}" for k, v in values.items() if k != "any")

    table.add_row("run", f"{s.duration_s:.1f} s, {s.samples} samples, {s.cycles} controller cycles")
    table.add_row(
        "seconds over a budget", f"{s.over_budget_s['any']:.1f} s ({per_level(s.over_budget_s)})"
    )
    over_limit = s.over_limit_s["any"]
    table.add_row(
        "seconds over a limit",
        Text(
            f"{over_limit:.1f} s ({per_level(s.over_limit_s)})",
            style="bold red" if over_limit > 0 else "green",
        ),
    )
    table.add_row(
        "closest to a limit",
        ", ".join(f"{k} {v:.0%}" for k, v in s.peak_fraction_of_limit.items()),
    )
    for label, value, style in grid_rows(s):
        table.add_row(label, Text(value, style=style) if style else value)
    table.add_row(
        "energy", f"{s.energy_site_wh / 1e3:.3f} kWh at the site, {s.energy_gpu_wh:.0f} Wh in GPUs"
    )
    thr = "n/a" if s.throughput_rel is None else f"{s.throughput_rel:.3f}"
    per_job = ", ".join(
        f"{name} ({j['priority']}) "
        + ("n/a" if j["throughput_rel"] is None else f"{j['throughput_rel']:.3f}")
        for name, j in s.jobs.items()
    )
    table.add_row("throughput vs uncapped", f"{thr} ({per_job})" + rise_first_note(s))
    table.add_row("what held each job", held_line(s))
    c = s.commands
    table.add_row(
        "commands",
        f"{c['sent']} sent, {c['acked']} acked, {c['pending_at_end']} in flight at the end, "
        f"{c['resent']} resent after a missing ack, {c['superseded']} replaced before their ack",
    )
    cap = s.capping
    capped = ", ".join(f"{k} {len(v)}" for k, v in cap["nodes_capping"].items() if v)
    table.add_row(
        "capping",
        f"{cap['cycles_capping']} cycle{'' if cap['cycles_capping'] == 1 else 's'} with a tree "
        "node over its capping threshold (nodes: "
        f"{capped or 'none'}); {cap['gpus_cut']} GPUs cut; caps "
        + (
            f"{cap['min_cap_w']:.0f}-{cap['max_cap_w']:.0f} W"
            if cap["min_cap_w"] is not None
            else "n/a"
        ),
    )
    table.add_row("clock locks", clock_locks_line(s))
    table.add_row("phases seen", ", ".join(s.phases_seen))
    if plot_path:
        table.add_row("plot", plot_path)
    console.print(table)


def grid_bounds_line(g: dict[str, Any]) -> str:
    """'floor 2.18x the causal bound, 1.20x the least with each job's fixed share; lost
    0.041 kWh of work, 1.37x the least at its floors (0.030 kWh), 0.000 kWh the least at
    that energy': ``grid_report``'s lost-work part."""

    def times(ratio: float | None) -> str:
        return "n/a" if ratio is None else f"{ratio:.2f}x"

    floor = f"floor {times(g['floor_ratio_to_causal'])} the causal bound"
    bound_outside_s = g.get("floor_ready_s_outside_oscillation")
    if bound_outside_s:
        floor += f" (a ramps-only bound: outside the oscillation limit {bound_outside_s:.0f} s)"
    if g.get("floor_ratio_to_shared") is not None:
        floor += f", {times(g['floor_ratio_to_shared'])} the least with each job's fixed share"
    lost = f"lost {g['lost_work_kwh']:.3f} kWh of work"
    at_floors = g.get("lost_at_floors_kwh")
    if at_floors is not None:
        lost += f", {times(g.get('lost_ratio_at_floors'))} the least at its floors"
        lost += f" ({at_floors:.3f} kWh)"
    if not g["lost_least_kwh"] and g["lost_work_kwh"]:  # the ratio is infinite
        return f"{floor}; {lost}; burning as much, none need be lost"
    return f"{floor}; {lost}; {g['lost_least_kwh']:.3f} kWh the least at that energy"


def rise_first_note(summary: Summary) -> str:
    """'; compute waited 2.9 s to fill back up after long waits (llm-high 1.5 s, ...)': time
    out of the jobs' compute that throughput vs uncapped, over progress phases, leaves out."""
    waited = {name: j.get("rise_first_s", 0.0) for name, j in summary.jobs.items()}
    if not any(v > 0 for v in waited.values()):
        return ""
    each = ", ".join(f"{name} {v:.1f} s" for name, v in waited.items())
    return (
        f"; compute waited {sum(waited.values()):.1f} s to fill back up after long waits ({each})"
    )


def held_line(summary: Summary) -> str:
    """'llm-high lost 7.6 % of its throughput: capping 6.0 %, failsafe start 1.5 %; llm-low
    ...': what held each job below full speed, by cause, largest first (the causes add up
    to what it lost; the share of its GPU-time held at all is in the JSON, ``held_share``:
    under tight budgets it is every sample, which says nothing)."""
    parts = []
    for name, job in summary.jobs.items():
        if job["throughput_rel"] is None:
            continue
        causes = largest_causes(job["throughput_lost_by_cause"])
        lost = 1.0 - job["throughput_rel"]
        if not causes:
            parts.append(f"{name} lost nothing")
            continue
        split = ", ".join(f"{cause} {share:.1%}" for cause, share in causes)
        parts.append(f"{name} lost {lost:.1%} of its throughput: {split}")
    return "; ".join(parts) or "n/a"


def clock_locks_line(summary: Summary) -> str:
    """'783 GPU-s locked; 99% of communication GPU-time locked; in compute 24 GPU-s sampled,
    5.6 exactly (0.5% of throughput lost); 23.7 Wh in communication'."""
    lk = summary.clock_locks
    line = (
        f"{lk['gpu_s']:.0f} GPU-s locked; {lk['communication_locked_share']:.0%} of "
        "communication GPU-time locked"
    )
    sampled, exact = lk.get("progress_gpu_s"), lk.get("exact_progress_gpu_s")
    if sampled is not None:
        line += f"; in compute {sampled:.0f} GPU-s sampled"
        line += "" if exact is None else f", {exact:.1f} exactly"
        lost = lk.get("progress_throughput_lost")
        line += "" if lost is None else f" ({lost:.1%} of throughput lost)"
    energy_wh = lk.get("communication_energy_wh")
    if energy_wh is not None:
        line += f"; {energy_wh:.1f} Wh in communication"
    return line


def grid_breach_line(summary: Summary) -> str | None:
    """'outside the grid spec: ramp up 12.0 s, ramp down 3.1 s', or None (no breach, or
    no grid spec)."""
    breaches = summary.grid_breaches
    return f"outside the grid spec: {', '.join(breaches)}" if breaches else None


def _rms(g: dict[str, Any]) -> str:
    rms, least = g.get("oscillation_band_rms_max_w"), g.get("oscillation_min_rms_w")
    shown = "n/a" if rms is None else f"{rms / 1e3:.1f} kW"
    return shown + (f" (counts from {least / 1e3:g} kW)" if least else "")


def grid_rows(summary: Summary) -> list[tuple[str, str, str]]:
    """The summary table's rows on the site's power as the grid sees it: (label, value,
    style). The measured ramp and oscillation (policies.grid), the sum of caps' ramp the
    controller limits beside them, and what is outside the spec."""
    s, g = summary, summary.grid
    cap_limit = (
        f" (the controller's limit {_kw(s.site_ramp_limit_w_per_s)})"
        if s.site_ramp_limit_w_per_s
        else ""
    )
    cap = f"sum of caps +{_kw(s.peak_site_cap_ramp_up_w_per_s)}{cap_limit}"
    has_spec = g["spec"] != NO_GRID_SPEC
    spec = (
        g["spec"]
        if has_spec
        else f"{NO_GRID_SPEC} in the budgets file ([site.grid]): measured with the defaults"
    )
    rows = [("grid spec", spec, "")]
    if not g.get("measured"):
        rows.append(("site ramp", f"not measured (too few samples); {cap}", ""))
        return rows

    def limit(key: str) -> str:
        value = g.get(key)
        return f" (limit {_kw(value)})" if value else ""

    rows.append(
        (
            f"site ramp ({g['ramp_window_s']:g} s)",
            f"up max +{_kw(g['ramp_up_max_w_per_s'])}, p99 +{_kw(g['ramp_up_p99_w_per_s'])}"
            f"{limit('ramp_up_limit_w_per_s')}; down max -{_kw(g['ramp_down_max_w_per_s'])}, "
            f"p99 -{_kw(g['ramp_down_p99_w_per_s'])}{limit('ramp_down_limit_w_per_s')}; {cap}",
            "",
        )
    )
    seen = g["oscillation_band_seen_hz"]
    band = f"{seen[0]:g}-{seen[1]:g} Hz" if seen else "no part of the band"
    share = g["oscillation_share"]
    worst = g["oscillation_share_max"]
    max_share = g.get("oscillation_max_share")
    osc = (
        f"{'n/a' if share is None else f'{share:.1%}'} of the variance in {band}"
        f" ({g['oscillation_note'] or 'the whole band'}); worst "
        f"{g['oscillation_window_s']:g} s window {'n/a' if worst is None else f'{worst:.1%}'}"
        + (f" (limit {max_share:.0%})" if max_share is not None else "")
        + f"; band RMS {_rms(g)}"
        + f"; peak-to-peak {g['peak_to_peak_max_w'] / 1e3:.1f} kW"
    )
    rows.append(("site oscillation", osc, ""))
    floor = []
    if "floor_energy_kwh" in g:
        share_floor = g["floor_energy_share_of_jobs"]
        of_gpus = "" if share_floor is None else f" ({share_floor:.1%} of the GPUs' energy)"
        if g["floor_source"] == "burnt by smoothing":
            what = f"smoothing burnt {g['floor_energy_kwh']:.3f} kWh holding floors and ramps"
        else:
            what = (
                f"holding {g['floor_fraction']:.0%} of the recent peak would burn "
                f"{g['floor_energy_kwh']:.3f} kWh"
            )
        floor.append(what + of_gpus)
    for key, what in (
        ("least", "the least any floor within the ramp limits burns"),
        ("ready", "one that cannot know when waits end"),
    ):
        if f"floor_{key}_kwh" in g:
            share = g[f"floor_{key}_share_of_jobs"]
            floor.append(
                f"{what}: {g[f'floor_{key}_kwh']:.3f} kWh"
                + ("" if share is None else f" ({share:.1%})")
            )
    if floor:
        rows.append(("grid floor", "; ".join(floor), ""))
    if "lost_work_kwh" in g:
        rows.append(("grid cost vs bounds", grid_bounds_line(g), ""))
    if not has_spec:  # nothing to be outside of
        return rows
    outside = (
        f"ramp up {g['s_outside_ramp_up']:.1f} s, ramp down {g['s_outside_ramp_down']:.1f} s, "
        f"oscillation {g['s_outside_oscillation']:.1f} s"
    )
    breach = grid_breach_line(s)
    rows.append(("outside the grid spec", outside, "bold yellow" if breach else "green"))
    return rows
