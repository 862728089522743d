"""The agent's configuration: a TOML file, then command-line overrides.

Every error names the file and the key, and nothing is half-loaded: either a
complete, validated ``AgentConfig`` comes back or ``ConfigError`` is raised.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from powerd.clock_skew import DEFAULT_MAX_CLOCK_SKEW_S
from powerd.configfile import (
    BROKER_KEYS,
    ConfigError,
    Getter,
    broker_from_table,
    check_metrics_listen,
    read_toml,
    with_overrides,
)
from powerd.gpu.base import PowerScope
from powerd.mqtt.url import BrokerSettings, parse_broker_url
from powerd.protocol import MAX_TTL_S, NAME_PATTERN, ProtocolError, check_name
from powerd.signing import KeyFileError, Verifier, load_verifier
from powerd.vocabulary import DEFAULT_FAILSAFE_FRACTION

# A command holds at most this long without a newer one (docs/PROTOCOL.md): a leaked or
# mistaken ttl_s cannot pin a node's caps for longer.
DEFAULT_MAX_COMMAND_TTL_S = 120.0

OnExit = Literal["keep", "restore"]
AgentMode = Literal["controlled", "local"]

# With no planner output yet, the failsafe cap defaults to DEFAULT_FAILSAFE_FRACTION
# (80 %, as Meta plans a GB200) of the device maximum: powerd.vocabulary.


@dataclass(frozen=True)
class FailsafeConfig:
    cap_w: float | None = None  # one cap for every GPU
    caps_w: dict[int, float] = field(default_factory=dict)  # per GPU index, wins over cap_w
    fraction: float = DEFAULT_FAILSAFE_FRACTION  # of cap_max_w, when no cap is given

    def cap_for(self, index: int, cap_max_w: float) -> float:
        if index in self.caps_w:
            return self.caps_w[index]
        if self.cap_w is not None:
            return self.cap_w
        return self.fraction * cap_max_w


@dataclass(frozen=True)
class AgentConfig:
    node: str
    cluster: str = "default"
    # the scope whose leaf controllers this node follows (a tree of controllers: their
    # heartbeat topic is the scope's); None: the site's single controller
    controller_scope: str | None = None
    mode: AgentMode = "controlled"
    period_s: float = 1.0
    failsafe_after_s: float = 10.0
    on_exit: OnExit = "keep"
    # GPUs without hardware power smoothing take a smoothing profile all the same, and the
    # jobs on the node carry it out: they fill their waits as the agent's FillRequest says
    # (powerd.gpu.software_smoothing, powerd.jobhook.FillFollower)
    software_smoothing: bool = False
    # "module": caps are applied as the module-scope power limit where a GPU has one (GB200),
    # the rest of the module keeping its default allowance; the GPU limit elsewhere
    # (powerd.gpu.module_scope)
    power_limit_scope: PowerScope = PowerScope.GPU
    simulate: str | None = None  # "4xH100": simulated GPUs instead of NVML
    gpu_indices: tuple[int, ...] | None = None  # None: every GPU NVML finds
    broker: BrokerSettings = field(default_factory=lambda: parse_broker_url("mqtt://localhost"))
    failsafe: FailsafeConfig = field(default_factory=FailsafeConfig)
    # public keys (PEM files) of the controllers this node obeys: commands and heartbeats
    # signed by any other key are rejected (powerd.signing; two keys while one rotates)
    controller_keys: tuple[str, ...] = ()
    max_command_ttl_s: float = DEFAULT_MAX_COMMAND_TTL_S  # a command holds at most this long
    # a heartbeat whose ts runs further ahead of this node's clock is refused (a clock alarm)
    max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S
    # "HOST:PORT" where /metrics is served (powerd.metrics); None: no endpoint
    metrics_listen: str | None = None
    source: str = "<defaults>"

    def verifier(self) -> Verifier | None:
        """The trusted controller keys, loaded; None in local mode (no commands taken).

        Raises ConfigError naming the file when a key cannot be used, or when a
        controlled agent has none: it could never obey anyone.
        """
        if self.mode == "local":
            return None
        if not self.controller_keys:
            raise ConfigError(
                f"{self.source}: a controlled agent needs the controllers' public keys: set "
                "trust.controller_keys (or --trust FILE); make a pair with "
                "`powerd keys generate PREFIX`, or run with --local"
            )
        try:
            return load_verifier(self.controller_keys)
        except KeyFileError as exc:
            raise ConfigError(f"{self.source}: trust.controller_keys: {exc}") from None

    def with_overrides(self, **overrides: Any) -> AgentConfig:
        """Apply command-line overrides (None means not given) and validate again."""
        return with_overrides(self, overrides, _validate)


_KNOWN = {
    "agent": {
        "node",
        "cluster",
        "controller_scope",
        "mode",
        "period_s",
        "failsafe_after_s",
        "on_exit",
        "software_smoothing",
        "power_limit_scope",
        "simulate",
        "gpu_indices",
        "max_command_ttl_s",
        "max_clock_skew_s",
    },
    "broker": BROKER_KEYS,
    "failsafe": {"cap_w", "caps_w", "fraction"},
    "trust": {"controller_keys"},
    "metrics": {"listen"},
}


def default_node_name() -> str:
    return socket.gethostname().split(".")[0]


def load_config(path: str | Path | None) -> AgentConfig:
    """Read a TOML config; ``None`` gives the defaults (node name: the short hostname)."""
    if path is None:
        config = AgentConfig(node=default_node_name())
        _validate(config, "defaults")
        return config
    where = str(path)
    raw = read_toml(path, _KNOWN)
    agent = raw.get("agent", {})
    failsafe_raw = raw.get("failsafe", {})
    get = Getter(where)
    broker = broker_from_table(raw.get("broker", {}), where)

    caps_raw = failsafe_raw.get("caps_w", {})
    if not isinstance(caps_raw, dict):
        raise ConfigError(f"{where}: failsafe.caps_w must be a table of GPU index = watts")
    caps_w: dict[int, float] = {}
    for key, value in caps_raw.items():
        try:
            index = int(key)
        except ValueError:
            index = -1
        if not 0 <= index <= 1023:
            raise ConfigError(f"{where}: failsafe.caps_w key {key!r} is not a GPU index (0..1023)")
        caps_w[index] = get.number({key: value}, f"failsafe.caps_w.{key}", None, key=key)

    indices = agent.get("gpu_indices")
    if indices is not None and (
        not isinstance(indices, list)
        or not all(type(i) is int and i >= 0 for i in indices)
        or len(set(indices)) != len(indices)
    ):
        raise ConfigError(
            f"{where}: agent.gpu_indices must be a list of distinct GPU indices (ints ≥ 0)"
        )

    config = AgentConfig(
        node=get.text(agent, "agent.node", default_node_name()),
        cluster=get.text(agent, "agent.cluster", "default"),
        controller_scope=get.opt_str(agent, "agent.controller_scope", None),
        mode=get.text(agent, "agent.mode", "controlled"),
        period_s=get.number(agent, "agent.period_s", 1.0),
        failsafe_after_s=get.number(agent, "agent.failsafe_after_s", 10.0),
        on_exit=get.text(agent, "agent.on_exit", "keep"),
        software_smoothing=get.flag(agent, "agent.software_smoothing", False),
        power_limit_scope=power_scope(
            get.text(agent, "agent.power_limit_scope", PowerScope.GPU.value), where
        ),
        simulate=get.opt_str(agent, "agent.simulate", None),
        gpu_indices=tuple(indices) if indices is not None else None,
        broker=broker,
        failsafe=FailsafeConfig(
            cap_w=get.number(failsafe_raw, "failsafe.cap_w", None),
            caps_w=caps_w,
            fraction=get.number(failsafe_raw, "failsafe.fraction", DEFAULT_FAILSAFE_FRACTION),
        ),
        controller_keys=get.paths(raw.get("trust", {}), "trust.controller_keys"),
        max_command_ttl_s=get.number(agent, "agent.max_command_ttl_s", DEFAULT_MAX_COMMAND_TTL_S),
        max_clock_skew_s=get.number(agent, "agent.max_clock_skew_s", DEFAULT_MAX_CLOCK_SKEW_S),
        metrics_listen=get.opt_str(raw.get("metrics", {}), "metrics.listen", None),
        source=where,
    )
    _validate(config, where)
    return config


def power_scope(value: str, where: str) -> PowerScope:
    """``agent.power_limit_scope`` as a ``PowerScope``; ``ConfigError`` naming the choices."""
    try:
        return PowerScope(value)
    except ValueError:
        choices = " or ".join(repr(scope.value) for scope in PowerScope)
        raise ConfigError(
            f"{where}: agent.power_limit_scope must be {choices}, not {value!r}"
        ) from None


def _validate(config: AgentConfig, where: str) -> None:
    try:
        check_name(config.node, "node")
    except ProtocolError:
        raise ConfigError(
            f"{where}: node name {config.node!r} must match {NAME_PATTERN}; "
            "set agent.node or --node"
        ) from None
    try:
        check_name(config.cluster, "cluster")
    except ProtocolError:
        raise ConfigError(
            f"{where}: cluster name {config.cluster!r} must match {NAME_PATTERN}"
        ) from None
    if config.controller_scope is not None:
        try:
            check_name(config.controller_scope, "scope")
        except ProtocolError:
            raise ConfigError(
                f"{where}: agent.controller_scope {config.controller_scope!r} must be a scope "
                f"name ({NAME_PATTERN}): the NAME of the leaf controllers' --scope NAME:ROWS, or "
                "their row"
            ) from None
    if config.mode not in ("controlled", "local"):
        raise ConfigError(
            f"{where}: agent.mode must be 'controlled' or 'local', not {config.mode!r}"
        )
    power_scope(config.power_limit_scope, where)
    if config.on_exit not in ("keep", "restore"):
        raise ConfigError(
            f"{where}: agent.on_exit must be 'keep' or 'restore', not {config.on_exit!r}"
        )
    if not 0.05 <= config.period_s <= 3600:
        raise ConfigError(
            f"{where}: agent.period_s must be in [0.05, 3600] s, got {config.period_s}"
        )
    if not config.period_s <= config.failsafe_after_s <= 86400:
        raise ConfigError(
            f"{where}: agent.failsafe_after_s must be at least period_s ({config.period_s} s) "
            f"and at most a day, got {config.failsafe_after_s}"
        )
    if not config.period_s <= config.max_command_ttl_s <= MAX_TTL_S:
        raise ConfigError(
            f"{where}: agent.max_command_ttl_s must be at least period_s and at most "
            f"{MAX_TTL_S:g} s, got {config.max_command_ttl_s}"
        )
    if not 0 < config.max_clock_skew_s <= 86400:
        raise ConfigError(
            f"{where}: agent.max_clock_skew_s must be in (0, 86400] s, got "
            f"{config.max_clock_skew_s}"
        )
    fs = config.failsafe
    for label, cap in [("failsafe.cap_w", fs.cap_w)] + [
        (f"failsafe.caps_w.{i}", c) for i, c in fs.caps_w.items()
    ]:
        if cap is not None and not 1.0 <= cap <= 5000.0:
            raise ConfigError(
                f"{where}: {label} = {cap} W is not a per-GPU cap in watts "
                "(expected 1..5000 W; a value in mW or kW?)"
            )
    if not 0.05 <= fs.fraction <= 1.0:
        raise ConfigError(f"{where}: failsafe.fraction must be in [0.05, 1.0], got {fs.fraction}")
    check_metrics_listen(where, config.metrics_listen)
    b = config.broker
    if not 0 < b.reconnect_min_s <= b.reconnect_max_s:
        raise ConfigError(f"{where}: need 0 < broker.reconnect_min_s <= broker.reconnect_max_s")
    if not 1 <= b.keepalive_s <= 65535:
        raise ConfigError(f"{where}: broker.keepalive_s must be in [1, 65535] s")
