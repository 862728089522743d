"""The rows and racks dashboard: each row's and rack's power against its limit and budget."""

from __future__ import annotations

from powerd.grafana.build import (
    BAD,
    Json,
    Panel,
    Query,
    by_regexp,
    dashboard,
    datasource_variable,
    drawn_as_limit,
    ratio_panel,
    row_panel,
    target,
)
from powerd.grafana.common import (
    W,
    at_level,
    cluster_variable,
    phase_annotation,
    rack_variable,
    row_variable,
)
from powerd.telemetry_schema import TREE

NAME, LIMIT_SUFFIX = "$tag_name", " limit"  # a tree node's series, and its limit's


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


def rows_and_racks() -> Json:
    rows = at_level("row", "{name} =~ /^$row$/")
    racks = at_level("rack", "{name} =~ /^$rack$/")
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
            at_level("node", "{rack} =~ /^$rack$/"),
            w=24,
        ),
    ]
    return dashboard(
        "powerd-racks",
        "powerd: rows and racks",
        "Drill down: rows, then racks, then the servers in them.",
        panels,
        [datasource_variable(), cluster_variable(), row_variable(), rack_variable()],
        [phase_annotation()],
    )
