"""The controller's configuration: a TOML file, then command-line overrides."""

from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from policies import PolicySettings
from policies.smoothing import grid_policy
from policies.turns import MAX_RAISES_PER_S
from powerd.clock_skew import DEFAULT_MAX_CLOCK_SKEW_S
from powerd.configfile import (
    BROKER_KEYS,
    ConfigError,
    Getter,
    broker_from_table,
    check_key_roles,
    check_metrics_listen,
    read_toml,
    signer_from,
    verifier_from,
    verifier_or_none,
    with_overrides,
)
from powerd.controller.core import ControllerSettings
from powerd.controller.job_limits import JobLimits
from powerd.mqtt.url import BrokerSettings, parse_broker_url
from powerd.protocol import NAME_PATTERN, ProtocolError, check_name
from powerd.recorder import DEFAULT_FILE_KEEP, DEFAULT_FILE_MAX_BYTES
from powerd.signing import Signer, Verifier
from powerd.topology.scope import Scope, parse_scope
from powerd.vocabulary import PRIORITIES

# A standby's takeover (its silence timer, then a cycle to notice and a heartbeat to say
# so) ends at least this long before the agents would fall to their failsafe caps.
TAKEOVER_MARGIN_S = 1.0

_TIMING_KEYS = (
    "cycle_s",
    "heartbeat_s",
    "stale_after_s",
    "ack_timeout_s",
    "command_ttl_s",
    "takeover_after_s",
    "epoch_discovery_s",
    "infer_window_s",
    "agent_failsafe_after_s",
    "summary_every_s",
    "announced_live_s",
    "max_clock_skew_s",
)


@dataclass(frozen=True)
class RecorderConfig:
    enabled: bool = True  # false: record nothing
    url: str | None = None  # influx v2 write API, see powerd.recorder.open_recorder
    token_file: str | None = None
    file: str | None = None  # line-protocol file when no url is given
    # Per-GPU and per-node (server) points at most this often per node; site, row,
    # rack and decision points every cycle. 0 keeps every sample; on an 83K-GPU
    # site 10 s cuts the recorder's work tenfold (bench/RESULTS.md).
    fine_every_s: float = 0.0
    # The line-protocol file is rotated at this size (telemetry.1.lp, ...), this many
    # rotated files kept: bounded disk. 0: never rotated.
    file_max_mb: float = DEFAULT_FILE_MAX_BYTES / 1e6
    file_keep: int = DEFAULT_FILE_KEEP


@dataclass(frozen=True)
class ControllerConfig:
    name: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    cluster: str = "default"
    cycle_s: float = 1.0
    heartbeat_s: float = 1.0
    stale_after_s: float = 5.0  # telemetry older than this: counted at failsafe power
    ack_timeout_s: float = 3.0  # resend a command not acknowledged within this
    command_ttl_s: float = 30.0  # agents fall back to failsafe if nothing newer comes
    # a standby leads once the leader is silent this long: well inside the agents' failsafe
    # (validate() holds takeover + a cycle + a heartbeat at least TAKEOVER_MARGIN_S below it)
    takeover_after_s: float = 6.0
    epoch_discovery_s: float = 1.0  # wait this long at start for the retained heartbeat
    # a heartbeat, grant or site limit whose ts runs further ahead of this clock is refused
    # (a clock alarm); peers' skews are measured on receipt (powerd.clock_skew)
    max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S
    agent_failsafe_after_s: float = 10.0  # the agents' failsafe_after_s (a silent node's grace)
    infer_phases: bool = True  # infer waits from power for jobs that do not announce them
    # ask every GPU with hardware power smoothing for its share of [site.grid]'s ramps and
    # floor (powerd.controller.smoothing), and uncap within the caps (policies.capping)
    grid_smoothing: bool = False
    infer_window_s: float = 30.0  # power history the inference looks at
    # grant the GPUs of a job that announces its phases its comm clock: their agents lock
    # and unlock on the job's own announcements, at once (docs/PROTOCOL.md, clock policies).
    # Not read from the config file yet (the shipped example must document every key first).
    agent_comm_clock: bool = True
    # a job's announcements are live (they, not the inference, say what it does, and move
    # granted clocks) while its last one is at most this old
    announced_live_s: float = 120.0
    # At most this share of the time goes to decoding telemetry; past it, samples wait in
    # the inbox and newer ones replace them (counted as dropped): docs/CONTROLLER.md, "Scale".
    ingest_share: float = 0.5
    # A node sending telemetry faster than twice the rate its status reports, or than this
    # before it reported one, is not believed (counted at its caps, not commanded): two
    # senders on one login, or a broken agent. Agents' fastest period is 0.05 s (20 Hz).
    telemetry_max_hz: float = 20.0
    # The site's agents' telemetry period (their agent.period_s; the fastest, if they
    # differ): a node is judged against it, whatever period its own status declares.
    # None: each node against its status (a node may then declare itself a fast sender).
    telemetry_period_s: float | None = None
    # Commands that only hand watts back or lock clocks, and resends, go to at most this many
    # nodes a second, less those still in flight; cuts and clock unlocks are never held back
    # (docs/CONTROLLER.md).
    max_raises_per_s: float = MAX_RAISES_PER_S
    broker: BrokerSettings = field(default_factory=lambda: parse_broker_url("mqtt://localhost"))
    policy: PolicySettings = field(default_factory=PolicySettings)
    recorder: RecorderConfig = field(default_factory=RecorderConfig)
    # the controller role's private key (PEM): every command and heartbeat is signed with it
    signing_key: str | None = None
    # public keys of the other controllers whose heartbeats count (ours always does)
    controller_keys: tuple[str, ...] = ()
    # a leaf of a tree of controllers: the site coordinator's public keys, the only ones
    # whose grants count (a controller's key, ours included, signs no grant)
    coordinator_keys: tuple[str, ...] = ()
    # operators' public keys: a temporary site limit (demand response) counts only when
    # signed by one of these (`powerd limit`); none: site limits are refused
    operator_keys: tuple[str, ...] = ()
    # [jobs]: the highest priority each job owner (its broker login) may announce, the
    # allowance of owners not listed, and whether the unowned phase topic is taken at all
    job_priority_max: dict[str, str] = field(default_factory=dict)
    default_job_priority_max: str = "high"
    accept_unowned_jobs: bool = True
    # [jobs]: announcement rates, jobs kept per owner, and when a silent job is forgotten
    job_limits: JobLimits = field(default_factory=JobLimits)
    # A leaf of a tree of controllers: "ROW" or "NAME:ROW,ROW,..." of the budgets file
    # (powerd.topology.scope); None: one controller for the whole site.
    scope: str | None = None
    # a leaf's summary to the coordinator after a cycle, at most this often (an early cycle
    # sends none sooner): the coordinator reads them every period (5 s by default)
    summary_every_s: float = 1.0
    # "HOST:PORT" where /metrics is served (powerd.metrics); None: no endpoint
    metrics_listen: str | None = None
    source: str = "<defaults>"

    def parsed_scope(self) -> Scope | None:
        return None if self.scope is None else parse_scope(self.scope)

    def signer(self) -> Signer:
        """The signing key, loaded; ConfigError naming the file if it cannot be used."""
        return signer_from(
            self.signing_key,
            self.source,
            "a controller signs its commands and heartbeats: set trust.signing_key (or "
            "--signing-key FILE); make a pair with `powerd keys generate PREFIX` and give the "
            "agents PREFIX.pub",
        )

    def verifier(self, signer: Signer) -> Verifier:
        """Whose heartbeats count: our own key and ``controller_keys``; ConfigError when a
        key is configured in two roles (``check_key_roles``)."""
        self.check_key_roles(signer)
        return verifier_from(
            self.controller_keys, self.source, "trust.controller_keys", signer.trusted()
        )

    def check_key_roles(self, signer: Signer) -> None:
        """ConfigError when one key is in two roles: our own or a controller key trusted
        as a coordinator's or an operator's (it could sign grants or site limits), or a
        coordinator key as an operator's."""
        check_key_roles(
            self.source,
            signer,
            "controller",
            [
                ("controller", "trust.controller_keys", self.controller_keys),
                ("coordinator", "trust.coordinator_keys", self.coordinator_keys),
                ("operator", "trust.operator_keys", self.operator_keys),
            ],
        )

    def grant_verifier(self) -> Verifier | None:
        """Whose grants count: ``coordinator_keys`` only; None when none is configured."""
        return verifier_or_none(self.coordinator_keys, self.source, "trust.coordinator_keys")

    def operator_verifier(self) -> Verifier | None:
        """Whose site limits count: ``operator_keys`` only; None when none is configured."""
        return verifier_or_none(self.operator_keys, self.source, "trust.operator_keys")

    def settings(self) -> ControllerSettings:
        """What the core needs of this configuration."""
        return ControllerSettings(
            cycle_s=self.cycle_s,
            stale_after_s=self.stale_after_s,
            ack_timeout_s=self.ack_timeout_s,
            command_ttl_s=self.command_ttl_s,
            agent_failsafe_after_s=self.agent_failsafe_after_s,
            infer_phases=self.infer_phases,
            infer_window_s=self.infer_window_s,
            agent_comm_clock=self.agent_comm_clock,
            announced_live_s=self.announced_live_s,
            max_raises_per_cycle=max(1, round(self.max_raises_per_s * self.cycle_s)),
            policy=grid_policy(self.policy) if self.grid_smoothing else self.policy,
            job_priority_max=dict(self.job_priority_max),
            default_job_priority_max=self.default_job_priority_max,
            accept_unowned_jobs=self.accept_unowned_jobs,
            telemetry_max_hz=self.telemetry_max_hz,
            telemetry_period_s=self.telemetry_period_s,
            max_clock_skew_s=self.max_clock_skew_s,
            jobs=self.job_limits,
            scoped=self.scope is not None,
        )

    def with_overrides(self, **overrides: Any) -> ControllerConfig:
        return with_overrides(self, overrides, validate)


# [jobs] keys of JobLimits: the file's name -> the field's
_JOB_LIMIT_KEYS = {
    "owner_announcements_per_s": "owner_announcements_per_s",
    "job_announcements_per_s": "job_announcements_per_s",
    "all_announcements_per_s": "all_announcements_per_s",
    "expiry_s": "expiry_s",
    "max_per_owner": "max_jobs_per_owner",
}


def _job_limits(jobs: dict[str, Any], get: Getter) -> JobLimits:
    defaults = JobLimits()
    values = {
        field_: get.number(jobs, f"jobs.{key}", getattr(defaults, field_))
        for key, field_ in _JOB_LIMIT_KEYS.items()
    }
    per_owner = values["max_jobs_per_owner"]
    if not float(per_owner).is_integer():
        raise ConfigError(f"{get.where}: jobs.max_per_owner must be a whole number")
    values["max_jobs_per_owner"] = int(per_owner)
    return JobLimits(**values)


def _validate_job_limits(config: ControllerConfig, where: str) -> None:
    limits = config.job_limits
    for key in ("owner_announcements_per_s", "job_announcements_per_s", "all_announcements_per_s"):
        if not 0.01 <= getattr(limits, key) <= 10**6:
            raise ConfigError(f"{where}: jobs.{key} must be in [0.01, 1e6]")
    if not 2 * config.announced_live_s <= limits.expiry_s <= 365 * 86400:
        raise ConfigError(
            f"{where}: jobs.expiry_s must be at least twice controller.announced_live_s "
            "(a job is forgotten only long after its announcements stop counting)"
        )
    if not 1 <= limits.max_jobs_per_owner <= 10**7:
        raise ConfigError(f"{where}: jobs.max_per_owner must be a whole number in [1, 1e7]")


def _policy_keys() -> set[str]:
    return {f.name for f in dataclasses.fields(PolicySettings)}


def _known_keys() -> dict[str, set[str] | frozenset[str]]:
    """The keys each table of a controller config may hold."""
    return {
        "controller": {
            "name",
            "cluster",
            "scope",
            "infer_phases",
            "grid_smoothing",
            "agent_comm_clock",
            "ingest_share",
            "max_raises_per_s",
            "telemetry_max_hz",
            "telemetry_period_s",
            *_TIMING_KEYS,
        },
        "broker": BROKER_KEYS,
        "policy": _policy_keys(),
        "trust": {"signing_key", "controller_keys", "coordinator_keys", "operator_keys"},
        "jobs": {"priority_max", "default_priority_max", "accept_unowned", *_JOB_LIMIT_KEYS},
        "recorder": {
            "enabled",
            "url",
            "token_file",
            "file",
            "fine_every_s",
            "file_max_mb",
            "file_keep",
        },
        "metrics": {"listen"},
    }


def _policy(policy_raw: dict[str, Any], get: Getter, where: str) -> PolicySettings:
    """The [policy] table over the policy's defaults."""
    policy_defaults = PolicySettings()
    policy_values: dict[str, Any] = {}
    for key in policy_raw:
        default = getattr(policy_defaults, key)
        if isinstance(default, bool):
            policy_values[key] = get.flag(policy_raw, f"policy.{key}", default)
        else:
            policy_values[key] = get.number(policy_raw, f"policy.{key}", default)
    try:
        return replace(policy_defaults, **policy_values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: [policy]: {exc}") from None


def _recorder(rec: dict[str, Any], get: Getter) -> RecorderConfig:
    return RecorderConfig(
        enabled=get.flag(rec, "recorder.enabled", True),
        url=get.opt_str(rec, "recorder.url", None),
        token_file=get.opt_str(rec, "recorder.token_file", None),
        file=get.opt_str(rec, "recorder.file", None),
        fine_every_s=get.number(rec, "recorder.fine_every_s", 0.0),
        file_max_mb=get.number(rec, "recorder.file_max_mb", DEFAULT_FILE_MAX_BYTES / 1e6),
        file_keep=get.number(rec, "recorder.file_keep", DEFAULT_FILE_KEEP),
    )


def _priority_max(jobs: dict[str, Any], where: str) -> dict[str, str]:
    priority_max = jobs.get("priority_max", {})
    if not isinstance(priority_max, dict) or not all(
        isinstance(v, str) for v in priority_max.values()
    ):
        raise ConfigError(
            f"{where}: jobs.priority_max must be a table of owner = priority "
            f"({', '.join(PRIORITIES)})"
        )
    return dict(priority_max)


def load_controller_config(path: str | Path | None) -> ControllerConfig:
    if path is None:
        config = ControllerConfig()
        validate(config, "defaults")
        return config
    where = str(path)
    raw = read_toml(path, _known_keys())
    get = Getter(where)
    section = raw.get("controller", {})
    defaults = ControllerConfig()
    timing = {k: get.number(section, f"controller.{k}", getattr(defaults, k)) for k in _TIMING_KEYS}
    policy = _policy(raw.get("policy", {}), get, where)
    rec = raw.get("recorder", {})
    trust = raw.get("trust", {})
    jobs = raw.get("jobs", {})
    priority_max = _priority_max(jobs, where)
    config = ControllerConfig(
        name=get.text(section, "controller.name", defaults.name),
        cluster=get.text(section, "controller.cluster", "default"),
        scope=get.opt_str(section, "controller.scope", None),
        broker=broker_from_table(raw.get("broker", {}), where),
        policy=policy,
        recorder=_recorder(rec, get),
        job_priority_max=priority_max,
        default_job_priority_max=get.text(jobs, "jobs.default_priority_max", "high"),
        accept_unowned_jobs=get.flag(jobs, "jobs.accept_unowned", True),
        job_limits=_job_limits(jobs, get),
        signing_key=get.path(trust, "trust.signing_key"),
        controller_keys=get.paths(trust, "trust.controller_keys"),
        coordinator_keys=get.paths(trust, "trust.coordinator_keys"),
        operator_keys=get.paths(trust, "trust.operator_keys"),
        metrics_listen=get.opt_str(raw.get("metrics", {}), "metrics.listen", None),
        source=where,
        infer_phases=get.flag(section, "controller.infer_phases", defaults.infer_phases),
        grid_smoothing=get.flag(section, "controller.grid_smoothing", defaults.grid_smoothing),
        agent_comm_clock=get.flag(
            section, "controller.agent_comm_clock", defaults.agent_comm_clock
        ),
        ingest_share=get.number(section, "controller.ingest_share", defaults.ingest_share),
        telemetry_max_hz=get.number(
            section, "controller.telemetry_max_hz", defaults.telemetry_max_hz
        ),
        telemetry_period_s=get.number(section, "controller.telemetry_period_s", None),
        max_raises_per_s=get.number(
            section, "controller.max_raises_per_s", defaults.max_raises_per_s
        ),
        **timing,
    )
    validate(config, where)
    return config


def validate(config: ControllerConfig, where: str) -> None:
    check_metrics_listen(where, config.metrics_listen)
    if config.scope is not None:
        try:
            parse_scope(config.scope)
        except ValueError as exc:
            raise ConfigError(
                f"{where}: controller.scope {config.scope!r}: {exc} (give ROW or NAME:ROW,ROW)"
            ) from None
    for what, name in (("controller", config.name), ("cluster", config.cluster)):
        try:
            check_name(name, what)
        except ProtocolError:
            raise ConfigError(f"{where}: {what} name {name!r} must match {NAME_PATTERN}") from None
    if not 0.05 <= config.cycle_s <= 60:
        raise ConfigError(f"{where}: controller.cycle_s must be in [0.05, 60] s")
    if not 0.05 <= config.heartbeat_s <= 60:
        raise ConfigError(f"{where}: controller.heartbeat_s must be in [0.05, 60] s")
    if config.stale_after_s < 2 * config.cycle_s:
        raise ConfigError(f"{where}: controller.stale_after_s must be at least 2 cycles")
    if config.ack_timeout_s <= 0:
        raise ConfigError(f"{where}: controller.ack_timeout_s must be > 0 s")
    if config.command_ttl_s <= config.ack_timeout_s:
        raise ConfigError(f"{where}: controller.command_ttl_s must exceed ack_timeout_s")
    if config.takeover_after_s <= 2 * config.heartbeat_s:
        raise ConfigError(f"{where}: controller.takeover_after_s must exceed 2 heartbeats")
    takeover_done_s = config.takeover_after_s + config.cycle_s + config.heartbeat_s
    if takeover_done_s + TAKEOVER_MARGIN_S > config.agent_failsafe_after_s:
        raise ConfigError(
            f"{where}: a standby takes over after takeover_after_s + a cycle + a heartbeat "
            f"({takeover_done_s:g} s), which must end {TAKEOVER_MARGIN_S:g} s before the agents "
            f"fall to failsafe (agent_failsafe_after_s = {config.agent_failsafe_after_s:g} s): "
            "lower controller.takeover_after_s or raise the agents' failsafe_after_s (and "
            "controller.agent_failsafe_after_s with it)"
        )
    if not 0 <= config.epoch_discovery_s <= 30:
        raise ConfigError(f"{where}: controller.epoch_discovery_s must be in [0, 30] s")
    if not 0 < config.max_clock_skew_s <= 86400:
        raise ConfigError(f"{where}: controller.max_clock_skew_s must be in (0, 86400] s")
    if not 0.05 <= config.summary_every_s <= 600:
        raise ConfigError(
            f"{where}: controller.summary_every_s must be in [0.05, 600] s (keep it under half "
            "the coordinator's period_s)"
        )
    if not 0 < config.agent_failsafe_after_s <= 86400:
        raise ConfigError(f"{where}: controller.agent_failsafe_after_s must be in (0, 86400] s")
    if not 2 * config.cycle_s <= config.infer_window_s <= 3600:
        raise ConfigError(f"{where}: controller.infer_window_s must be in [2 cycles, 3600] s")
    if not 2 * config.cycle_s <= config.announced_live_s <= 86400:
        raise ConfigError(f"{where}: controller.announced_live_s must be in [2 cycles, 86400] s")
    if not 0.1 <= config.telemetry_max_hz <= 1000:
        raise ConfigError(f"{where}: controller.telemetry_max_hz must be in [0.1, 1000]")
    period_s = config.telemetry_period_s
    if period_s is not None and not 0.05 <= period_s <= 3600:
        raise ConfigError(f"{where}: controller.telemetry_period_s must be in [0.05, 3600] s")
    _validate_job_limits(config, where)
    if not 0 < config.ingest_share <= 1:
        raise ConfigError(f"{where}: controller.ingest_share must be in (0, 1]")
    if not 1 <= config.max_raises_per_s <= 10**6:
        raise ConfigError(f"{where}: controller.max_raises_per_s must be in [1, 1e6]")
    if not 0 <= config.recorder.fine_every_s <= 3600:
        raise ConfigError(f"{where}: recorder.fine_every_s must be in [0, 3600] s")
    if not 0 <= config.recorder.file_max_mb <= 10**7:
        raise ConfigError(f"{where}: recorder.file_max_mb must be in [0, 1e7] MB (0: no rotation)")
    keep: float = config.recorder.file_keep  # a TOML number: 4 or 4.0, not 4.5
    if not float(keep).is_integer() or not 0 <= keep <= 1000:
        raise ConfigError(f"{where}: recorder.file_keep must be a whole number in [0, 1000]")
    for owner, priority in [
        ("", config.default_job_priority_max),
        *config.job_priority_max.items(),
    ]:
        key = f"jobs.priority_max.{owner}" if owner else "jobs.default_priority_max"
        if priority not in PRIORITIES:
            raise ConfigError(
                f"{where}: {key} must be one of {', '.join(PRIORITIES)}, not {priority!r}"
            )
        if owner:
            try:
                check_name(owner, "owner")
            except ProtocolError:
                raise ConfigError(f"{where}: {key}: {owner!r} is not a valid owner name") from None
    if config.recorder.url and config.recorder.file:
        raise ConfigError(f"{where}: give recorder.url or recorder.file, not both")
