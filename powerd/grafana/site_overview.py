"""The site overview dashboard: power against budget and limit, headroom, ramps, the tree's
tightest levels."""

from __future__ import annotations

from powerd.grafana.build import (
    BAD,
    GOOD,
    STATED,
    WARNING,
    Colours,
    Json,
    Panel,
    Query,
    bands,
    by_name,
    dashboard,
    datasource_variable,
    drawn_as_limit,
    ratio_panel,
    row_panel,
    stat,
    subquery,
    target,
)
from powerd.grafana.common import (
    W,
    at_level,
    cluster_variable,
    phase_annotation,
)
from powerd.telemetry_schema import DECISION, GPU, TREE

MW_PER_S = "suffix:MW/s"
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
SITE_STATE = bands(
    (None, GOOD, "under budget"), (0.0, WARNING, "over budget"), (1.0, BAD, "over the limit")
)


def _tightest(level: str, over: str) -> str:
    """Per interval, the highest power / ``over`` among the tree nodes of ``level``."""
    inner = Query(
        TREE, ((f"mean({{power_w}}) / mean({{{over}}})", "share"),), at_level(level), ("name",)
    )
    return subquery("max", inner, "share")


def site_overview() -> Json:
    site = at_level("site")
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
                        at_level("row"),
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
        [datasource_variable(), cluster_variable()],
        [phase_annotation()],
    )
