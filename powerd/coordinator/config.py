"""The coordinator's configuration: a TOML file, then command-line overrides."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
from powerd.mqtt.url import BrokerSettings, parse_broker_url
from powerd.protocol import NAME_PATTERN, ProtocolError, check_name
from powerd.signing import Signer, Verifier
from powerd.topology import Topology
from powerd.topology.scope import Scope, parse_scope


@dataclass(frozen=True)
class CoordinatorConfig:
    name: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    cluster: str = "default"
    # Dynamo's upper levels re-budget slower than the leaves cycle (docs/DOMAIN.md)
    period_s: float = 5.0
    # a grant holds this long after it is received; then min(grant, file) as long again,
    # then the file's budget (powerd.controller.scoping)
    grant_ttl_s: float = 15.0
    heartbeat_s: float = 1.0
    # a standby leads once the leader is silent this long: before the leaves' grants expire
    takeover_after_s: float = 8.0
    epoch_discovery_s: float = 1.0
    # a heartbeat, summary or site limit whose ts runs further ahead of this clock is
    # refused (a clock alarm; powerd.clock_skew)
    max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S
    # the leaves: "ROW" or "NAME:ROW,ROW,..." each; empty: one leaf per row of the file
    scopes: tuple[str, ...] = ()
    broker: BrokerSettings = field(default_factory=lambda: parse_broker_url("mqtt://localhost"))
    signing_key: str | None = None  # grants and heartbeats are signed with it
    # public keys of the leaf controllers: the only ones whose summaries count
    controller_keys: tuple[str, ...] = ()
    # public keys of the other coordinators whose heartbeats count (ours always does)
    coordinator_keys: tuple[str, ...] = ()
    # operators' public keys: a temporary site limit (demand response) counts only when
    # signed by one of these
    operator_keys: tuple[str, ...] = ()
    # "HOST:PORT" where /metrics is served (powerd.metrics); None: no endpoint
    metrics_listen: str | None = None
    source: str = "<defaults>"

    def parsed_scopes(self, topology: Topology) -> list[Scope]:
        if not self.scopes:
            return [Scope(row, (row,)) for row in topology.rows]
        return [parse_scope(text) for text in self.scopes]

    def signer(self) -> Signer:
        return signer_from(
            self.signing_key,
            self.source,
            "the coordinator signs its grants and heartbeats: set trust.signing_key (or "
            "--signing-key FILE); `powerd keys generate PREFIX` makes a pair, and the leaf "
            "controllers list PREFIX.pub in trust.coordinator_keys",
        )

    def summary_verifier(self) -> Verifier:
        """Whose summaries count: the leaves' keys (ours signs none)."""
        if not self.controller_keys:
            raise ConfigError(
                f"{self.source}: the coordinator needs the leaf controllers' public keys to "
                "verify their summaries: set trust.controller_keys (or --trust FILE)"
            )
        return verifier_from(self.controller_keys, self.source, "trust.controller_keys")

    def heartbeat_verifier(self, signer: Signer) -> Verifier:
        """Whose coordinator heartbeats count: ours and ``coordinator_keys``; ConfigError
        when a key is configured in two roles (``check_key_roles``)."""
        self.check_key_roles(signer)
        return verifier_from(
            self.coordinator_keys, self.source, "trust.coordinator_keys", signer.trusted()
        )

    def operator_verifier(self) -> Verifier | None:
        """Whose site limits count: ``operator_keys`` only; None when none is configured."""
        return verifier_or_none(self.operator_keys, self.source, "trust.operator_keys")

    def check_key_roles(self, signer: Signer) -> None:
        """ConfigError when one key is in two roles: our own or a coordinator key trusted
        as a leaf's or an operator's, or a leaf's key as an operator's."""
        check_key_roles(
            self.source,
            signer,
            "coordinator",
            [
                ("coordinator", "trust.coordinator_keys", self.coordinator_keys),
                ("controller", "trust.controller_keys", self.controller_keys),
                ("operator", "trust.operator_keys", self.operator_keys),
            ],
        )

    def with_overrides(self, **overrides: Any) -> CoordinatorConfig:
        return with_overrides(self, overrides, validate)


_TIMING = (
    "period_s",
    "grant_ttl_s",
    "heartbeat_s",
    "takeover_after_s",
    "epoch_discovery_s",
    "max_clock_skew_s",
)


def load_coordinator_config(path: str | Path | None) -> CoordinatorConfig:
    if path is None:
        config = CoordinatorConfig()
        validate(config, "defaults")
        return config
    where = str(path)
    known = {
        "coordinator": {"name", "cluster", "scopes", *_TIMING},
        "broker": BROKER_KEYS,
        "trust": {"signing_key", "controller_keys", "coordinator_keys", "operator_keys"},
        "metrics": {"listen"},
    }
    raw = read_toml(path, known)
    get = Getter(where)
    section = raw.get("coordinator", {})
    defaults = CoordinatorConfig()
    scopes = section.get("scopes", [])
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        raise ConfigError(
            f'{where}: coordinator.scopes must be a list of "ROW" or "NAME:ROW,ROW" strings'
        )
    trust = raw.get("trust", {})
    config = CoordinatorConfig(
        name=get.text(section, "coordinator.name", defaults.name),
        cluster=get.text(section, "coordinator.cluster", "default"),
        scopes=tuple(scopes),
        broker=broker_from_table(raw.get("broker", {}), where),
        signing_key=get.path(trust, "trust.signing_key"),
        controller_keys=get.paths(trust, "trust.controller_keys"),
        coordinator_keys=get.paths(trust, "trust.coordinator_keys"),
        operator_keys=get.paths(trust, "trust.operator_keys"),
        metrics_listen=get.opt_str(raw.get("metrics", {}), "metrics.listen", None),
        source=where,
        **{k: get.number(section, f"coordinator.{k}", getattr(defaults, k)) for k in _TIMING},
    )
    validate(config, where)
    return config


def validate(config: CoordinatorConfig, where: str) -> None:
    check_metrics_listen(where, config.metrics_listen)
    for what, name in (("coordinator", config.name), ("cluster", config.cluster)):
        try:
            check_name(name, what)
        except ProtocolError:
            raise ConfigError(f"{where}: {what} name {name!r} must match {NAME_PATTERN}") from None
    for text in config.scopes:
        try:
            parse_scope(text)
        except ValueError as exc:
            raise ConfigError(f"{where}: coordinator.scopes: {text!r}: {exc}") from None
    if not 0.1 <= config.period_s <= 600:
        raise ConfigError(f"{where}: coordinator.period_s must be in [0.1, 600] s")
    if config.grant_ttl_s < 2 * config.period_s:
        raise ConfigError(
            f"{where}: coordinator.grant_ttl_s ({config.grant_ttl_s:g} s) must be at least two "
            f"periods ({2 * config.period_s:g} s): one lost grant must not expire a leaf's"
        )
    if not 0.05 <= config.heartbeat_s <= 60:
        raise ConfigError(f"{where}: coordinator.heartbeat_s must be in [0.05, 60] s")
    if config.takeover_after_s <= 2 * config.heartbeat_s:
        raise ConfigError(f"{where}: coordinator.takeover_after_s must exceed 2 heartbeats")
    if config.takeover_after_s + config.period_s >= config.grant_ttl_s:
        raise ConfigError(
            f"{where}: a standby coordinator grants after takeover_after_s + a period "
            f"({config.takeover_after_s + config.period_s:g} s), which must be under "
            f"grant_ttl_s ({config.grant_ttl_s:g} s): the leaves keep their grants meanwhile"
        )
    if not 0 <= config.epoch_discovery_s <= 30:
        raise ConfigError(f"{where}: coordinator.epoch_discovery_s must be in [0, 30] s")
    if not 0 < config.max_clock_skew_s <= 86400:
        raise ConfigError(f"{where}: coordinator.max_clock_skew_s must be in (0, 86400] s")
