"""The jobs and phases dashboard: the phases jobs announce, their power, the capping they
take, and what held their GPUs (cause and level)."""

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
)
from powerd.telemetry_schema import GPU, JOB_HELD, PHASE_EVENT


def jobs_and_phases() -> Json:
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
            "timeseries",
            "Why the job's GPUs were held",
            "Per job, the most GPUs held below what they would draw in the interval, by cause"
            " (policies.causes: capping, priority shift, staged phase, failsafe start, clock"
            " lock) and, for capping, the level whose budget cut (rack, row, site, or the"
            " operator's site limit or the coordinator's grant). Held: at its cap below its"
            ' max limit, or clock locked, while its job computes (docs/CONTROLLER.md, "Why'
            ' was my job slowed?").',
            [
                target(
                    Query(
                        JOB_HELD,
                        (("max({gpus})", "gpus"),),
                        job,
                        ("job", "cause", "level"),
                        fill="0",
                    ),
                    "A",
                    alias="$tag_job: $tag_cause $tag_level",
                )
            ],
            w=24,
            min=0,
            custom={"drawStyle": "bars", "stacking": {"mode": "normal", "group": "A"}},
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
        [datasource_variable(), cluster_variable(), job_var],
        [phase_annotation(job)],
    )
