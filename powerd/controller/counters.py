"""What happened since the last control cycle, counted: the cycle's records and logs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from powerd.protocol import ProtocolError


@dataclass
class CycleCounters:
    commands_sent: int = 0
    resends: int = 0
    acks_received: int = 0
    acks_missing: int = 0
    acks_stale: int = 0  # our newest command acked stale: not applied, asked again
    # commands sent while the node's previous one was still unacknowledged (and not yet
    # overdue): the newer one replaces it, and the older one's ack, when it comes, is ignored
    superseded: int = 0
    stale_nodes: int = 0
    failsafe_nodes: int = 0
    offline_nodes: int = 0
    rejected_payloads: int = 0
    # telemetry (docs/CONTROLLER.md, "Scale"): received into the inbox, replaced there by a
    # newer sample before it was decoded (dropped), missing from agents' sequence numbers
    # (lost: never reached the controller), and nodes still waiting to be decoded
    telemetry_received: int = 0
    telemetry_dropped: int = 0
    telemetry_lost: int = 0
    telemetry_waiting: int = 0
    ingest_s: float = 0.0  # CPU time spent decoding telemetry since the last cycle
    # nodes whose raise (watts handed back) or clock lock waits for a later cycle
    # (max_raises_per_cycle, less the commands in flight)
    raises_deferred: int = 0
    # commands sent and not yet answered (nor overdue) when the cycle decided
    commands_in_flight: int = 0
    # acks of a node's newest command that came after the node went stale (its pending
    # command dropped): taken, so what it holds is known when it is back
    acks_late: int = 0
    # nodes holding caps below their maximum whose turn to be handed watts back is a later
    # cycle (``ControllerCore._uncap_in_turn``)
    uncap_waiting: int = 0
    # nodes under a node over its capping threshold (not its limit) whose turn to be cut
    # for it is a later cycle (``ControllerCore._cut_in_turn``)
    cut_waiting: int = 0
    # nodes found holding other caps or clock locks than commanded (commanded again)
    nodes_drifted: int = 0
    # nodes whose agents hold a failsafe cap above the budgets file's: the limits were
    # proven for the file's caps, so such a node is counted at its own when silent
    failsafe_over_plan: int = 0
    # nodes whose telemetry is implausible (seq going back, power above cap, caps outside
    # their range): counted at their caps, not commanded (POWER_OVER_CAP_RATIO ...)
    nodes_implausible: int = 0
    # GPUs whose clock lock follows their job's own announcements (a clock policy in force)
    clock_policy_gpus: int = 0
    # hostile or broken input, dropped unread since the last cycle (docs/CONTROLLER.md,
    # "Inputs"): telemetry frames over the stream's MAX_FRAME_BYTES; retained telemetry
    # and phase messages (no agent or job hook retains them); telemetry decoded no faster
    # than the site's telemetry period allows (a node flooding); phase announcements over
    # JobLimits' rates; new jobs beyond its bounds; announcements naming nodes another
    # owner's live job holds; and jobs forgotten, silent for JobLimits.expiry_s
    telemetry_oversized: int = 0
    telemetry_retained: int = 0
    telemetry_over_rate: int = 0
    phases_retained: int = 0
    phases_rate_limited: int = 0
    jobs_refused: int = 0
    job_claims_refused: int = 0
    jobs_expired: int = 0
    jobs_live: int = 0  # jobs kept, at the decision

    @property
    def inputs_refused(self) -> int:
        """Every message dropped for its size, retain flag or rate, or refused a claim."""
        return (
            self.telemetry_oversized
            + self.telemetry_retained
            + self.telemetry_over_rate
            + self.phases_retained
            + self.phases_rate_limited
            + self.jobs_refused
            + self.job_claims_refused
        )


class Reject(Protocol):
    """Refuse a payload from ``sender``: count it and log it (once a minute per ``key``,
    by default ``sender``)."""

    def __call__(self, sender: str, exc: ProtocolError, key: str | None = None) -> None: ...
