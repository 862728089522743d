"""Every topic of a cluster, and reading one back into its kind and name."""

from __future__ import annotations

from dataclasses import dataclass

from powerd.protocol.constraints import ProtocolError, check_name

TOPIC_ROOT = "powerd/v1"


@dataclass(frozen=True, slots=True)
class Topics:
    """Every topic of one cluster; with ``scope``, as seen by that scope's controllers and
    agents (a tree of controllers: their heartbeat is the scope's, docs/PROTOCOL.md)."""

    cluster: str = "default"
    scope: str | None = None

    def __post_init__(self) -> None:
        check_name(self.cluster, "cluster")
        if self.scope is not None:
            check_name(self.scope, "scope")

    @property
    def prefix(self) -> str:
        return f"{TOPIC_ROOT}/{self.cluster}"

    def telemetry(self, node: str) -> str:
        return f"{self.prefix}/nodes/{check_name(node, 'node')}/telemetry"

    def command(self, node: str) -> str:
        return f"{self.prefix}/nodes/{check_name(node, 'node')}/command"

    def ack(self, node: str) -> str:
        return f"{self.prefix}/nodes/{check_name(node, 'node')}/ack"

    def status(self, node: str) -> str:
        return f"{self.prefix}/nodes/{check_name(node, 'node')}/status"

    def fill(self, node: str) -> str:
        """The agent's software-smoothing fill targets for the jobs on ``node``."""
        return f"{self.prefix}/nodes/{check_name(node, 'node')}/fill"

    def phase(self, job: str, owner: str | None = None) -> str:
        """A job's phase topic; with ``owner``, the owned form ``jobs/{owner}/{job}/phase``
        that a broker ACL binds to the owner's login (``pattern write .../jobs/%u/+/phase``)."""
        if owner is None:
            return f"{self.prefix}/jobs/{check_name(job, 'job')}/phase"
        return f"{self.prefix}/jobs/{check_name(owner, 'owner')}/{check_name(job, 'job')}/phase"

    @property
    def heartbeat(self) -> str:
        """The heartbeat of the controllers these agents follow: the site's single
        controller's, or with ``scope`` the scope's leaf controllers'."""
        if self.scope is None:
            return f"{self.prefix}/controller/heartbeat"
        return f"{self.prefix}/scopes/{self.scope}/heartbeat"

    def summary(self, scope: str) -> str:
        return f"{self.prefix}/scopes/{check_name(scope, 'scope')}/summary"

    def grant(self, scope: str) -> str:
        return f"{self.prefix}/scopes/{check_name(scope, 'scope')}/grant"

    @property
    def coordinator_heartbeat(self) -> str:
        return f"{self.prefix}/coordinator/heartbeat"

    @property
    def site_limit(self) -> str:
        """An operator's temporary site limit (retained, signed): ``SiteLimit``."""
        return f"{self.prefix}/operator/site-limit"

    @property
    def site_limit_record(self) -> str:
        """The site limit a leading controller holds, republished under its own key
        (retained): a restarted controller's floor for the limits' ``(ts, seq)`` order."""
        return f"{self.prefix}/controller/site-limit"

    @property
    def coordinator_site_limit_record(self) -> str:
        """The same, of a tree's leading coordinator (which applies site limits there)."""
        return f"{self.prefix}/coordinator/site-limit"

    @property
    def controller_state(self) -> str:
        """The leading site controller's state, for people (retained, signed): ``LeaderState``."""
        return f"{self.prefix}/controller/state"

    def scope_state(self, scope: str) -> str:
        """A scope's leading leaf controller's state (retained, signed): ``LeaderState``."""
        return f"{self.prefix}/scopes/{check_name(scope, 'scope')}/state"

    @property
    def coordinator_state(self) -> str:
        """A tree's leading coordinator's state (retained, signed): ``LeaderState``."""
        return f"{self.prefix}/coordinator/state"

    @property
    def all_scope_states(self) -> str:
        return f"{self.prefix}/scopes/+/state"

    def state_of(self, scope: str | None) -> str:
        """The state topic of the controllers that agents of ``scope`` follow."""
        return self.controller_state if scope is None else self.scope_state(scope)

    @property
    def all_summaries(self) -> str:
        return f"{self.prefix}/scopes/+/summary"

    # wildcards for subscribers
    @property
    def all_telemetry(self) -> str:
        return f"{self.prefix}/nodes/+/telemetry"

    @property
    def all_acks(self) -> str:
        return f"{self.prefix}/nodes/+/ack"

    @property
    def all_status(self) -> str:
        return f"{self.prefix}/nodes/+/status"

    @property
    def all_phases(self) -> str:
        return f"{self.prefix}/jobs/+/phase"

    @property
    def all_owned_phases(self) -> str:
        return f"{self.prefix}/jobs/+/+/phase"

    def job_of(self, topic: str) -> tuple[str | None, str]:
        """(owner, job) of a phase topic, owned or not; ProtocolError for any other topic."""
        parts = topic.split("/")
        if topic.startswith(self.prefix + "/jobs/") and parts[-1] == "phase":
            tail = parts[len(self.prefix.split("/")) + 1 : -1]
            if len(tail) == 1:
                return None, check_name(tail[0], "job")
            if len(tail) == 2:
                return check_name(tail[0], "owner"), check_name(tail[1], "job")
        raise ProtocolError(f"topic {topic!r} is not a phase topic of {self.prefix!r}")

    def parse(self, topic: str) -> tuple[str, str | None]:
        """Split a topic of this cluster into (kind, name).

        kind is one of telemetry, command, ack, status, fill, phase, heartbeat, summary,
        grant, state, coordinator, site_limit, site_limit_record, coordinator_site_limit_record,
        controller_state, coordinator_state;
        name is the node, job or scope
        (None for the site controller's heartbeat, the coordinator's and the site limits).
        Raises ProtocolError otherwise.
        """
        head = self.prefix + "/"
        if not topic.startswith(head):
            raise ProtocolError(f"topic {topic!r} is not under {self.prefix!r}")
        parts = topic[len(head) :].split("/")
        if parts == ["controller", "heartbeat"]:
            return "heartbeat", None
        if parts == ["coordinator", "heartbeat"]:
            return "coordinator", None
        if parts == ["operator", "site-limit"]:
            return "site_limit", None
        if parts == ["controller", "site-limit"]:
            return "site_limit_record", None
        if parts == ["coordinator", "site-limit"]:
            return "coordinator_site_limit_record", None
        if parts == ["controller", "state"]:
            return "controller_state", None
        if parts == ["coordinator", "state"]:
            return "coordinator_state", None
        if len(parts) == 3 and parts[0] == "scopes" and parts[2] in _SCOPE_KINDS:
            return parts[2], check_name(parts[1], "scope")
        if len(parts) == 3 and parts[0] == "nodes" and parts[2] in _NODE_KINDS:
            return parts[2], check_name(parts[1], "node")
        if len(parts) in (3, 4) and parts[0] == "jobs" and parts[-1] == "phase":
            return "phase", self.job_of(topic)[1]  # owned or not
        raise ProtocolError(f"topic {topic!r} is not a powerd v1 topic")


_NODE_KINDS = frozenset({"telemetry", "command", "ack", "status", "fill"})
_SCOPE_KINDS = frozenset({"heartbeat", "summary", "grant", "state"})
