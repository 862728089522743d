"""The five powerd dashboards: site, rows and racks, GPUs, jobs and phases, controller health.

``DASHBOARDS`` maps each file name in ``grafana/dashboards/`` to the function
that builds it; ``powerd dashboards`` writes them, and a test checks the
committed files are exactly what these functions build.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from powerd.grafana.build import (
    BAD,
    GOOD,
    STATED,
    WARNING,
    Colours,
    Panel,
    Query,
    annotation,
    bands,
    by_name,
    by_regexp,
    dashboard,
    datasource_variable,
    drawn_as_limit,
    query_variable,
    ratio_panel,
    row_panel,
    stat,
    subquery,
    tag_values,
    target,
)
from powerd.telemetry_schema import DECISION, GPU, PHASE_EVENT, TREE

W, MW_PER_S = "watt", "suffix:MW/s"
W_PER_S = "si:W/s"  # SI prefixes as the value needs: 20 kW/s, 1.5 MW/s

# Where the site's power stands between its budget (0) and its limit (1). Grafana cannot
# take a threshold from a query on every version that loads these dashboards (the
# config-from-query transformation made every step red until 2024, grafana/grafana#83366,
# and dropped the base colour until late 2024, #96781), so the budget and the limit are in
# the value and the steps are fixed.
# A budget equal to the limit leaves no band between them: InfluxQL divides by 0 as 0,
# amber, and the headroom turns red.
SITE_POSITION = "(last({power_w}) - last({budget_w})) / (last({limit_w}) - last({budget_w}))"
ABOVE_ZERO = 1e-6  # a step starts at its value: headroom of exactly 0 stays red
HEADROOM_AMPLE = 0.05  # assumed: under 5 % of the limit left is close enough to look at
NAME, LIMIT_SUFFIX = "$tag_name", " limit"  # a tree node's series, and its limit's
SITE_STATE = bands(
    (None, GOOD, "under budget"), (0.0, WARNING, "over budget"), (1.0, BAD, "over the limit")
)


def _cluster_variable() -> dict:
    query = f'SHOW TAG VALUES FROM "{TREE.name}" WITH KEY = "cluster"'
    return query_variable("cluster", "Cluster", query, multi=False, include_all=False)


def _row_variable() -> dict:
    return query_variable("row", "Row", tag_values(TREE, "name", ("\"level\" = 'row'",)))


def _rack_variable() -> dict:
    where = ("\"level\" = 'rack'", '"row" =~ /^$row$/')
    return query_variable("rack", "Rack", tag_values(TREE, "name", where))


def _level(level: str, *more: str) -> tuple[str, ...]:
    return (f"{{level}} = '{level}'", *more)


def _phase_annotation(where: tuple[str, ...] = ()) -> dict:
    q = Query(
        PHASE_EVENT,
        (("{events}", ""), ("{phase}", ""), ("{job}", "")),
        where=where,
        every=False,
    )
    return annotation("Phase changes", q.text(), "#8F3BB8", text="phase", tags="job")


def _tightest(level: str, over: str) -> str:
    """Per interval, the highest power / ``over`` among the tree nodes of ``level``."""
    inner = Query(
        TREE, ((f"mean({{power_w}}) / mean({{{over}}})", "share"),), _level(level), ("name",)
    )
    return subquery("max", inner, "share")


def _power_and_limits(title: str, description: str, where: tuple[str, ...], w: int = 12) -> Panel:
    """Measured power of each tree node ``where`` picks, and its limit: a dashed red line."""
    return Panel(
        "timeseries",
        title,
        description,
        [
            target(Query(TREE, (("mean({power_w})", "power"),), where, ("name",)), "A", alias=NAME),
            target(
                Query(TREE, (("mean({limit_w})", "limit"),), where, ("name",)),
                "B",
                alias=f"{NAME}{LIMIT_SUFFIX}",
            ),
        ],
        w=w,
        unit=W,
        overrides=[drawn_as_limit(by_regexp(f"/{LIMIT_SUFFIX}$/"), BAD)],
    )


def site_overview() -> dict:
    site = _level("site")
    panels = [
        row_panel("Site"),
        stat(
            "Site power",
            "Measured power of the whole site (GPUs and overheads), last control cycle. Stated,"
            " not judged: the next panel and the headroom judge it against the budget and the"
            " limit.",
            [target(Query(TREE, (("last({power_w})", "power"),), site, every=False), "A")],
            unit=W,
            colours=STATED,
            w=5,
        ),
        stat(
            "Site against budget and limit",
            "Where the site's power stands, last cycle: under its budget (green), between"
            " budget and limit (amber: over budget, the controller is capping), over the limit"
            " (red). The value is (power - budget) / (limit - budget): below 0 under the budget,"
            " 1 at the limit.",
            [target(Query(TREE, ((SITE_POSITION, "position"),), site, every=False), "A")],
            unit="none",
            colours=SITE_STATE[0],
            mappings=SITE_STATE[1],
            trend=False,
            w=5,
        ),
        stat(
            "Site budget",
            "The power the site is planned for; the controller caps above its capping threshold.",
            [target(Query(TREE, (("last({budget_w})", "budget"),), site, every=False), "A")],
            unit=W,
            colours=STATED,
            trend=False,
            w=4,
        ),
        stat(
            "Site limit",
            "The hard limit: the feed or breaker. Never to be crossed.",
            [target(Query(TREE, (("last({limit_w})", "limit"),), site, every=False), "A")],
            unit=W,
            colours=STATED,
            trend=False,
            w=4,
        ),
        stat(
            "Headroom to the limit",
            "The share of the site limit left above the site's power, last cycle: red at 0 or"
            f" below (at or over the limit), amber under {HEADROOM_AMPLE * 100:g} % of the limit,"
            " green otherwise.",
            [
                target(
                    Query(
                        TREE,
                        (("1 - last({power_w}) / last({limit_w})", "headroom"),),
                        site,
                        every=False,
                    ),
                    "A",
                )
            ],
            unit="percentunit",
            colours=Colours(((None, BAD), (ABOVE_ZERO, WARNING), (HEADROOM_AMPLE, GOOD))),
            w=6,
        ),
        Panel(
            "timeseries",
            "Site power against budget and limit",
            "Measured power, the power predicted under the new caps, the capping threshold,"
            " the budget and the limit of the site; and an operator's temporary site limit"
            " (demand response, `powerd limit`) while one is in force: the capping threshold"
            " glides down to it at the ramp-down limit.",
            [
                target(
                    Query(
                        TREE,
                        (
                            ("mean({power_w})", "power"),
                            ("mean({predicted_w})", "predicted"),
                            ("mean({cap_threshold_w})", "capping threshold"),
                            ("mean({budget_w})", "budget"),
                            ("mean({limit_w})", "limit"),
                        ),
                        site,
                    ),
                    "A",
                    alias="$col",
                ),
                target(
                    Query(DECISION, (("mean({site_limit_w})", "site limit (demand response)"),)),
                    "B",
                    alias="$col",
                ),
            ],
            w=16,
            unit=W,
            overrides=[
                drawn_as_limit(by_name("capping threshold"), "yellow"),
                drawn_as_limit(by_name("budget"), WARNING),
                drawn_as_limit(by_name("limit"), BAD),
                drawn_as_limit(by_name("site limit (demand response)"), "purple"),
            ],
        ),
        Panel(
            "timeseries",
            "Site ramp rate",
            "How fast the site's power moves (MW/s): measured, and the rate of change of the"
            " sum of the caps the controller set. Job starts, checkpoints and ends swing it.",
            [
                target(
                    Query(TREE, (("derivative(mean({power_w}), 1s) / 1000000", "measured"),), site),
                    "A",
                    alias="$col",
                ),
                target(
                    Query(DECISION, (("mean({site_ramp_w_per_s}) / 1000000", "caps"),)),
                    "B",
                    alias="$col",
                ),
            ],
            w=8,
            unit=MW_PER_S,
        ),
        row_panel("Grid"),
        Panel(
            "timeseries",
            "Site ramp against the grid",
            "How fast the site's measured power rose and fell (the fastest rise and the"
            " fastest fall in each interval) against the grid's ramp limits ([site.grid]:"
            " +ramp up, -ramp down), beside the ramp of the sum of the caps the controller"
            " set. Measured per controller cycle: the change of the site's power since the"
            " last cycle over the cycle's length, a cycle-long window, not the contract's"
            " window_s (powerplan whatif and the demo's summary measure that); a one-cycle"
            " swing can cross a line the contract's window averages out. The limits are"
            " absent without a grid spec. The energy grid smoothing burns holding the GPUs'"
            " floors cannot be measured online: only the simulator and the planner know what"
            " a GPU would draw without its busy work; see `powerd demo --smoothing` and"
            " `powerplan whatif --smoothing`.",
            [
                target(
                    Query(
                        DECISION,
                        (
                            ("max({site_power_ramp_w_per_s})", "measured, fastest rise"),
                            ("min({site_power_ramp_w_per_s})", "measured, fastest fall"),
                            ("mean({site_ramp_w_per_s})", "sum of caps"),
                        ),
                    ),
                    "A",
                    alias="$col",
                ),
                target(
                    Query(
                        DECISION,
                        (
                            ("mean({grid_ramp_up_w_per_s})", "grid ramp-up limit"),
                            ("mean({grid_ramp_down_w_per_s}) * -1", "grid ramp-down limit"),
                        ),
                    ),
                    "B",
                    alias="$col",
                ),
            ],
            w=16,
            unit=W_PER_S,
        ),
        Panel(
            "timeseries",
            "GPUs under grid smoothing",
            "GPUs with power smoothing switched on (the grid smoothing the controller asks"
            " for, controller.grid_smoothing): in hardware (the GPU ramps and holds its floor)"
            " or in software (GPUs without it: the job keeps them busy while it waits), by"
            " each GPU's last sample in the interval. With recorder.fine_every_s a GPU's"
            " points come once per window: set the panel's min interval to at least that.",
            [
                target(
                    subquery(
                        "sum",
                        Query(
                            GPU,
                            (("last({smoothing_enabled})", "gpus"),),
                            ("{smoothing_software} = 0",),
                            ("node", "gpu"),
                        ),
                        "gpus",
                    ),
                    "A",
                    alias="hardware",
                ),
                target(
                    subquery(
                        "sum",
                        Query(
                            GPU,
                            (("last({smoothing_enabled})", "gpus"),),
                            ("{smoothing_software} = 1",),
                            ("node", "gpu"),
                        ),
                        "gpus",
                    ),
                    "B",
                    alias="software",
                ),
            ],
            w=8,
            unit="short",
            min=0,
        ),
        row_panel("Every level"),
        ratio_panel(
            "Rows: power / budget",
            "Each row's power as a share of its budget; the dashed line is the budget.",
            [
                target(
                    Query(
                        TREE,
                        (("mean({power_w}) / mean({budget_w})", "share"),),
                        _level("row"),
                        ("name",),
                    ),
                    "A",
                    alias="$tag_name",
                )
            ],
            over="budget",
        ),
        ratio_panel(
            "Tightest node of each level: power / limit",
            "Per interval, the highest power / limit among the rows, the racks and the servers:"
            " 100 % (the dashed line) is a breaker at its rating.",
            [
                target(_tightest("row", "limit_w"), "A", alias="tightest row"),
                target(_tightest("rack", "limit_w"), "B", alias="tightest rack"),
                target(_tightest("node", "limit_w"), "C", alias="tightest server"),
            ],
            over="limit",
        ),
        row_panel("Capping"),
        Panel(
            "timeseries",
            "Tree nodes capping, by level",
            "How many sites, rows, racks and servers were capping (above their threshold) at"
            " some cycle of each interval.",
            [
                target(
                    subquery(
                        "sum",
                        Query(TREE, (("max({capping})", "capping"),), group=("name", "level")),
                        "capping",
                        ("level",),
                    ),
                    "A",
                    alias="$tag_level",
                )
            ],
            w=8,
            unit="short",
        ),
        Panel(
            "timeseries",
            "GPUs capped",
            "GPUs whose cap is below their maximum after the controller's cycle.",
            [target(Query(DECISION, (("max({gpus_capped})", "GPUs capped"),)), "A", alias="$col")],
            w=8,
            unit="short",
        ),
        Panel(
            "timeseries",
            "Failsafe, offline and stale nodes",
            "Nodes in failsafe (holding their failsafe cap on their own), offline (their"
            " last will), and with stale telemetry (counted at their caps).",
            [
                target(
                    Query(
                        DECISION,
                        (
                            ("max({failsafe_nodes})", "failsafe"),
                            ("max({offline_nodes})", "offline"),
                            ("max({stale_nodes})", "stale"),
                        ),
                    ),
                    "A",
                    alias="$col",
                )
            ],
            w=8,
            unit="short",
        ),
    ]
    return dashboard(
        "powerd-site",
        "powerd: site overview",
        "The site against its budget and limit at every level, its ramp rate against the"
        " grid's limits, GPUs under grid smoothing, capping and nodes the controller cannot"
        " steer.",
        panels,
        [datasource_variable(), _cluster_variable()],
        [_phase_annotation()],
    )


def rows_and_racks() -> dict:
    rows = _level("row", "{name} =~ /^$row$/")
    racks = _level("rack", "{name} =~ /^$rack$/")
    panels = [
        row_panel("Rows"),
        _power_and_limits(
            "Rows: power", "Measured power of each selected row; dashed, its limit.", rows
        ),
        ratio_panel(
            "Rows: power / budget",
            "Each selected row's power as a share of its budget (the dashed line); capping"
            " starts at the capping threshold (a share of the budget, docs/BUDGETS.md).",
            [
                target(
                    Query(
                        TREE, (("mean({power_w}) / mean({budget_w})", "share"),), rows, ("name",)
                    ),
                    "A",
                    alias="$tag_name",
                )
            ],
            over="budget",
        ),
        row_panel("Racks"),
        _power_and_limits(
            "Racks: power", "Measured power of each selected rack; dashed, its limit.", racks
        ),
        ratio_panel(
            "Racks: power / limit",
            "Each selected rack's power as a share of its limit (the rack breaker, the dashed"
            " line).",
            [
                target(
                    Query(
                        TREE, (("mean({power_w}) / mean({limit_w})", "share"),), racks, ("name",)
                    ),
                    "A",
                    alias="$tag_name",
                )
            ],
            over="limit",
        ),
        Panel(
            "table",
            "Racks now",
            "Last cycle's power, budget, limit and share of GPUs capped of each selected rack.",
            [
                target(
                    Query(
                        TREE,
                        (
                            ("last({power_w})", "power_w"),
                            ("last({budget_w})", "budget_w"),
                            ("last({limit_w})", "limit_w"),
                            ("last({capped_share})", "capped_share"),
                        ),
                        racks,
                        ("name",),
                        every=False,
                    ),
                    "A",
                    fmt="table",
                )
            ],
            w=12,
            h=10,
        ),
        Panel(
            "timeseries",
            "Racks: share of GPUs capped",
            "Share of each selected rack's GPUs with a cap below their maximum.",
            [
                target(
                    Query(TREE, (("mean({capped_share})", "capped"),), racks, ("name",)),
                    "A",
                    alias="$tag_name",
                )
            ],
            h=10,
            unit="percentunit",
            min=0,
            max=1,
        ),
        _power_and_limits(
            "Servers in the selected racks: power",
            "Measured power of each server (GPUs and its overhead) in the selected racks;"
            " dashed, its limit.",
            _level("node", "{rack} =~ /^$rack$/"),
            w=24,
        ),
    ]
    return dashboard(
        "powerd-racks",
        "powerd: rows and racks",
        "Drill down: rows, then racks, then the servers in them.",
        panels,
        [datasource_variable(), _cluster_variable(), _row_variable(), _rack_variable()],
        [_phase_annotation()],
    )


def gpus() -> dict:
    sel = ("{node} =~ /^$node$/", "{gpu} =~ /^$gpu$/")
    per_gpu = ("node", "gpu")
    name = "$tag_node/$tag_gpu"
    node_var = query_variable("node", "Node", tag_values(GPU, "node", ('"rack" =~ /^$rack$/',)))
    gpu_var = query_variable("gpu", "GPU", tag_values(GPU, "gpu", ('"node" =~ /^$node$/',)))
    by_mode = Query(GPU, (("last({power_w})", "gpus"),), sel, ("node", "gpu", "mode"))
    panels = [
        Panel(
            "timeseries",
            "GPU power",
            "Power each selected GPU draws.",
            [target(Query(GPU, (("mean({power_w})", "power"),), sel, per_gpu), "A", alias=name)],
            unit=W,
        ),
        Panel(
            "timeseries",
            "Power caps",
            "The power limit each GPU enforces (read back from it), and the range it accepts.",
            [
                target(Query(GPU, (("mean({cap_w})", "cap"),), sel, per_gpu), "A", alias=name),
                target(
                    Query(
                        GPU,
                        (("min({cap_min_w})", "lowest cap"), ("max({cap_max_w})", "highest cap")),
                        sel,
                    ),
                    "B",
                    alias="$col",
                ),
            ],
            unit=W,
        ),
        Panel(
            "heatmap",
            "GPU power heatmap",
            "How the selected GPUs' power is spread over time: one bucket row per power band.",
            [target(Query(GPU, (("mean({power_w})", "power"),), sel, per_gpu), "A", alias=name)],
            w=24,
            extra={
                "options": {
                    "calculate": True,
                    "yAxis": {"unit": W},
                    # Grafana's heatmap defaults, written out: the schema requires them
                    "color": {
                        "mode": "scheme",
                        "scheme": "Oranges",
                        "fill": "dark-orange",
                        "scale": "exponential",
                        "exponent": 0.5,
                        "steps": 64,
                        "reverse": False,
                    },
                    "cellGap": 1,
                    "showValue": "auto",
                    "legend": {"show": True},
                    "tooltip": {"mode": "single", "yHistogram": False},
                    "exemplars": {"color": "rgba(255,0,255,0.7)"},
                }
            },
        ),
        Panel(
            "timeseries",
            "SM clock and clock locks",
            "SM clock of each GPU; the lock the controller set during communication phases"
            " (absent when not locked).",
            [
                target(
                    Query(GPU, (("mean({sm_clock_mhz})", "clock"),), sel, per_gpu), "A", alias=name
                ),
                target(
                    Query(GPU, (("mean({max_sm_clock_mhz})", "lock"),), sel, per_gpu),
                    "B",
                    alias=f"{name} lock",
                ),
            ],
            unit="suffix: MHz",
        ),
        Panel(
            "timeseries",
            "GPUs by agent mode",
            "How many selected GPUs were controlled, in failsafe or in local mode.",
            [target(subquery("count", by_mode, "gpus", ("mode",)), "A", alias="$tag_mode")],
            unit="short",
        ),
        Panel(
            "timeseries",
            "Temperature",
            "GPU temperature.",
            [target(Query(GPU, (("mean({temp_c})", "temp"),), sel, per_gpu), "A", alias=name)],
            w=8,
            unit="celsius",
        ),
        Panel(
            "timeseries",
            "Utilisation",
            "GPU utilisation.",
            [target(Query(GPU, (("mean({util_pct})", "util"),), sel, per_gpu), "A", alias=name)],
            w=8,
            unit="percent",
        ),
        Panel(
            "table",
            "GPUs now",
            "Last sample of each selected GPU.",
            [
                target(
                    Query(
                        GPU,
                        (
                            ("last({power_w})", "power_w"),
                            ("last({cap_w})", "cap_w"),
                            ("last({sm_clock_mhz})", "sm_clock_mhz"),
                            ("last({temp_c})", "temp_c"),
                        ),
                        sel,
                        per_gpu,
                        every=False,
                    ),
                    "A",
                    fmt="table",
                )
            ],
            w=8,
        ),
    ]
    return dashboard(
        "powerd-gpus",
        "powerd: GPUs",
        "Per GPU: power, caps, clocks and clock locks, mode, temperature.",
        panels,
        [
            datasource_variable(),
            _cluster_variable(),
            _row_variable(),
            _rack_variable(),
            node_var,
            gpu_var,
        ],
        [_phase_annotation()],
    )


def jobs_and_phases() -> dict:
    job = ("{job} =~ /^$job$/",)
    job_var = query_variable("job", "Job", tag_values(PHASE_EVENT, "job"))
    per_gpu = Query(GPU, (("mean({power_w})", "power"),), job, ("node", "gpu", "job"))
    panels = [
        Panel(
            "state-timeline",
            "Phases",
            "The phases each job announced (powerd.jobhook): startup, compute,"
            " communication, checkpoint, shutdown.",
            [
                target(
                    Query(
                        PHASE_EVENT,
                        (("{phase}", "phase"), ("{events}", "")),
                        job,
                        every=False,
                        group=("job",),
                    ),
                    "A",
                    alias="$tag_job",
                    fmt="table",
                )
            ],
            w=24,
            h=6,
            extra={
                "options": {
                    "mergeValues": True,
                    "showValue": "auto",
                    "rowHeight": 0.8,
                    "legend": {
                        "showLegend": True,
                        "displayMode": "list",
                        "placement": "bottom",
                        "calcs": [],
                    },
                    "tooltip": {"mode": "single", "sort": "none"},
                },
                # one table (time, job, phase, events) -> one lane per job showing its phase
                "transformations": [
                    {"id": "organize", "options": {"excludeByName": {"events": True}}},
                    {"id": "partitionByValues", "options": {"fields": ["job"]}},
                ],
            },
        ),
        Panel(
            "timeseries",
            "Job power",
            "Power of each job's GPUs together (the sum of its GPUs' mean power).",
            [target(subquery("sum", per_gpu, "power", ("job",)), "A", alias="$tag_job")],
            unit=W,
        ),
        Panel(
            "timeseries",
            "Mean GPU power by phase",
            "What a GPU of the selected jobs draws in each phase the job is in.",
            [
                target(
                    Query(GPU, (("mean({power_w})", "power"),), job, ("phase",)),
                    "A",
                    alias="$tag_phase",
                )
            ],
            unit=W,
        ),
        Panel(
            "timeseries",
            "Share of the job's GPUs capped",
            "Share of each job's GPU samples with a cap below the GPU's maximum.",
            [
                target(
                    Query(GPU, (("mean({capped})", "capped"),), job, ("job",)),
                    "A",
                    alias="$tag_job",
                )
            ],
            unit="percentunit",
            min=0,
            max=1,
        ),
        Panel(
            "table",
            "Phase announcements",
            "The latest announcements: job, phase, priority, nodes named (empty: all), expected"
            " length.",
            [
                target(
                    Query(
                        PHASE_EVENT,
                        (
                            ("{job}", ""),
                            ("{phase}", ""),
                            ("{priority}", ""),
                            ("{events}", ""),
                            ("{nodes}", ""),
                            ("{expected_s}", ""),
                        ),
                        job,
                        every=False,
                        tail="ORDER BY time DESC LIMIT 200",
                    ),
                    "A",
                    fmt="table",
                )
            ],
        ),
    ]
    return dashboard(
        "powerd-jobs",
        "powerd: jobs and phases",
        "Training jobs: the phases they announce, their power, and how much capping they take.",
        panels,
        [datasource_variable(), _cluster_variable(), job_var],
        [_phase_annotation(job)],
    )


def controller_health() -> dict:
    # an annotation where the epoch grew: a failover (or a restart) in that interval
    epoch_change = (
        'SELECT "change" FROM ('
        + Query(DECISION, (("difference(max({epoch}))", "change"),)).text()
        + ') WHERE "change" > 0 AND $timeFilter'
    )
    panels = [
        Panel(
            "timeseries",
            "Cycle time",
            "How long the controller's cycle took (policy and commands); the cycle period is"
            " the budget for it.",
            [
                target(
                    Query(DECISION, (("mean({cycle_s})", "mean"), ("max({cycle_s})", "max"))),
                    "A",
                    alias="$col",
                )
            ],
            unit="s",
        ),
        Panel(
            "timeseries",
            "Commands and acknowledgements",
            "Commands published, acks received, commands re-sent for want of an ack,"
            " commands past their ack timeout, and commands acked stale (the node held one"
            " this controller did not send: investigate), per interval.",
            [
                target(
                    Query(
                        DECISION,
                        (
                            ("sum({commands_sent})", "sent"),
                            ("sum({acks_received})", "acked"),
                            ("sum({resends})", "resent"),
                            ("max({acks_missing})", "missing acks"),
                            ("sum({acks_stale})", "acked stale"),
                        ),
                    ),
                    "A",
                    alias="$col",
                )
            ],
            unit="short",
        ),
        Panel(
            "timeseries",
            "Stale telemetry, failsafe and offline nodes",
            "Nodes whose telemetry is older than stale_after_s, nodes in failsafe, nodes offline.",
            [
                target(
                    Query(
                        DECISION,
                        (
                            ("max({stale_nodes})", "stale"),
                            ("max({failsafe_nodes})", "failsafe"),
                            ("max({offline_nodes})", "offline"),
                        ),
                    ),
                    "A",
                    alias="$col",
                )
            ],
            unit="short",
        ),
        Panel(
            "timeseries",
            "Telemetry taken in",
            "Telemetry messages received, dropped (replaced in the inbox by a newer sample of"
            " the same node before the controller decoded them: over its decode budget) and"
            " lost (gaps in the agents' sequence numbers: never reached the controller), per"
            " interval; and the most nodes whose newest sample still waited at a decision.",
            [
                target(
                    Query(
                        DECISION,
                        (
                            ("sum({telemetry_received})", "received"),
                            ("sum({telemetry_dropped})", "dropped"),
                            ("sum({telemetry_lost})", "lost"),
                            ("max({telemetry_waiting})", "waiting"),
                        ),
                    ),
                    "A",
                    alias="$col",
                )
            ],
            unit="short",
        ),
        Panel(
            "timeseries",
            "Decode time and held-back commands",
            "CPU time spent decoding telemetry per cycle (the budget is ingest_share of the"
            " cycle); nodes whose raise waits for a later cycle (max_raises_per_s, less the"
            " commands in flight); commands sent and not yet answered (agents or the broker"
            " slow to answer hold hand-backs back); nodes whose cut for a budget waits its"
            " turn (a site or row gliding down to an operator's limit); nodes"
            " found holding other caps than commanded (drift); nodes whose agents fall back"
            " to a failsafe cap above the budgets file's (fix their agent config); nodes whose"
            " telemetry says what no GPU can do (counted at their caps, not commanded); messages"
            " refused as from the future (clock alarms), the largest peer controller's and"
            " node's clock skew (s) and nodes more than max_clock_skew_s off (the log names"
            " the worst).",
            [
                target(
                    Query(
                        DECISION,
                        (
                            ("max({ingest_s})", "decode s"),
                            ("max({peer_skew_s})", "peer skew s"),
                            ("max({node_skew_s})", "node skew s"),
                        ),
                    ),
                    "A",
                    alias="$col",
                ),
                target(
                    Query(
                        DECISION,
                        (
                            ("max({raises_deferred})", "raises deferred"),
                            ("max({commands_in_flight})", "commands in flight"),
                            ("max({cut_waiting})", "cuts waiting their turn"),
                            ("sum({nodes_drifted})", "drifted"),
                            ("max({failsafe_over_plan})", "failsafe over plan"),
                            ("max({nodes_implausible})", "implausible telemetry"),
                            ("max({clock_alarms})", "clock alarms"),
                            ("max({nodes_skewed})", "nodes' clocks off"),
                        ),
                    ),
                    "B",
                    alias="$col",
                ),
            ],
            unit="short",
        ),
        Panel(
            "timeseries",
            "Rejected payloads",
            "Invalid MQTT payloads the controller received and refused, per interval.",
            [
                target(
                    Query(
                        DECISION,
                        (("non_negative_difference(max({rejected_payloads}))", "rejected"),),
                    ),
                    "A",
                    alias="$col",
                )
            ],
            unit="short",
        ),
        Panel(
            "timeseries",
            "Epoch and leader",
            "The controller epoch (grows at every failover), per controller that led.",
            [
                target(
                    Query(DECISION, (("max({epoch})", "epoch"),), group=("controller",)),
                    "A",
                    alias="$tag_controller",
                )
            ],
            unit="short",
        ),
        stat(
            "Epoch changes in range",
            "How many times leadership changed hands in the time range (spread of the epoch):"
            " green for none, amber for one or more (a failover or a restart: find out why).",
            [target(Query(DECISION, (("spread({epoch})", "changes"),), every=False), "A")],
            unit="short",
            colours=Colours(((None, GOOD), (1.0, WARNING))),
            trend=False,
            w=6,
            h=8,
        ),
        stat(
            "Cycles led, by controller",
            "Control cycles each controller led in the time range. A count, not judged.",
            [
                target(
                    Query(
                        DECISION,
                        (("count({cycle_s})", "cycles"),),
                        group=("controller",),
                        every=False,
                    ),
                    "A",
                    alias="$tag_controller",
                )
            ],
            unit="short",
            colours=STATED,
            trend=False,
            w=6,
            h=8,
        ),
    ]
    return dashboard(
        "powerd-controller",
        "powerd: controller health",
        "The controller itself: cycle time, commands and acks, stale telemetry, failovers.",
        panels,
        [datasource_variable(), _cluster_variable()],
        [annotation("Epoch changes", epoch_change, "#F2495C", text="change")],
    )


DASHBOARDS: dict[str, Callable[[], dict]] = {
    "site-overview.json": site_overview,
    "rows-and-racks.json": rows_and_racks,
    "gpus.json": gpus,
    "jobs-and-phases.json": jobs_and_phases,
    "controller-health.json": controller_health,
}


def render(build: Callable[[], dict]) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def write_all(directory: Path) -> list[Path]:
    """Write every dashboard into ``directory``; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in DASHBOARDS.items():
        path = directory / name
        path.write_text(render(build), encoding="utf-8")
        written.append(path)
    return written


def stale(directory: Path) -> list[str]:
    """Dashboard files in ``directory`` that differ from what the code builds (or are missing)."""
    out = []
    for name, build in DASHBOARDS.items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != render(build):
            out.append(name)
    return out
