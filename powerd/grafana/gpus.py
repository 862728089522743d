"""The GPUs dashboard: each GPU's power, cap, clocks, utilisation and smoothing."""

from __future__ import annotations

from powerd.grafana.build import (
    Json,
    Panel,
    Query,
    dashboard,
    datasource_variable,
    query_variable,
    subquery,
    tag_values,
    target,
)
from powerd.grafana.common import (
    W,
    cluster_variable,
    phase_annotation,
    rack_variable,
    row_variable,
)
from powerd.telemetry_schema import GPU


def gpus() -> Json:
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
            cluster_variable(),
            row_variable(),
            rack_variable(),
            node_var,
            gpu_var,
        ],
        [phase_annotation()],
    )
