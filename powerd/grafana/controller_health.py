"""The controller health dashboard: cycle time, commands and acks, stale telemetry,
failovers."""

from __future__ import annotations

from powerd.grafana.build import (
    GOOD,
    STATED,
    WARNING,
    Colours,
    Json,
    Panel,
    Query,
    annotation,
    dashboard,
    datasource_variable,
    stat,
    target,
)
from powerd.grafana.common import (
    cluster_variable,
)
from powerd.telemetry_schema import DECISION


def controller_health() -> Json:
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
        [datasource_variable(), cluster_variable()],
        [annotation("Epoch changes", epoch_change, "#F2495C", text="change")],
    )
