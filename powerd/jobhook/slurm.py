"""Slurm's PrologSlurmctld and EpilogSlurmctld: the scheduler announces a job's ``startup``
and ``shutdown`` for it (``powerd job prolog`` / ``powerd job epilog``; docs/JOBHOOK.md,
"With Slurm").

slurmctld runs them once per job, as SlurmUser on its own host, with the job in ``SLURM_*``
variables and no search path; it holds the job until the prolog exits (indefinitely unless
``PrologEpilogTimeout`` is set). What is announced:

* job ``slurm-$SLURM_JOB_ID``: the name ``PhaseReporter.from_env`` gives the job inside it,
  so the job's own announcements, if it makes any, continue the same job;
* owner ``$SLURM_JOB_USER``: the topic's owner level, ``jobs/{user}/{job}/phase``; the
  controller holds the job to that user's priority allowance (``jobs.priority_max``);
* nodes ``$SLURM_JOB_NODELIST`` (the prolog only);
* priority: the config file's ``[priority]`` mapping of ``$SLURM_JOB_QOS``, else of
  ``$SLURM_JOB_PARTITION``, else its default.

Exit codes (``run_hook``): 0 when announced and when not (broker down, silent, refusing
the login; a job whose variables cannot be announced): logged, because a failing
PrologSlurmctld requeues a batch job and cancels an interactive one, and the broker must
not decide that. 1 for a configuration that cannot be used: every job then fails alike,
which an operator notices and fixes (``powerd job check`` finds it beforehand).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import secrets
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from powerd.configfile import BROKER_KEYS, ConfigError, Getter, broker_from_table, read_toml, shown
from powerd.hostlist import expand_hostlist
from powerd.jobhook.reporter import PhaseReporter
from powerd.mqtt.url import BrokerSettings
from powerd.protocol import ProtocolError, Topics, check_name
from powerd.vocabulary import PRIORITIES

__all__ = [
    "EXIT_CONFIG",
    "EXIT_OK",
    "HookConfig",
    "JobEnvError",
    "PriorityMap",
    "SlurmJob",
    "describe",
    "job_from_env",
    "load_config",
    "run_hook",
    "start_watchdog",
]

log = logging.getLogger("powerd.jobhook.slurm")

Hook = Literal["prolog", "epilog"]

EXIT_OK = 0
EXIT_CONFIG = 1
DEFAULT_TIMEOUT_S = 5.0
TIMEOUT_RANGE_S = (0.5, 60.0)
# Past timeout_s the hook has given up on the broker and is tearing its client down, which
# takes at most about a second (PhaseReporter.close); past this much more it exits 0 at once.
WATCHDOG_GRACE_S = 2.0
RECONNECT_MAX_S = 1.0  # a hook lives seconds: retry a refused connection often

PHASE_OF: dict[Hook, str] = {"prolog": "startup", "epilog": "shutdown"}
SLURM_ON_FAILURE: dict[Hook, str] = {
    "prolog": "Slurm requeues a batch job and cancels an interactive one",
    "epilog": "Slurm only logs it",
}

_KNOWN: dict[str, Any] = {
    "broker": BROKER_KEYS,
    "hook": frozenset({"cluster", "timeout_s"}),
    "priority": frozenset({"default", "qos", "partition"}),
}
_PRIORITY_WORDS = ", ".join(f'"{p}"' for p in PRIORITIES)


class JobEnvError(ValueError):
    """The job's variables cannot be announced; the message names the variable."""


# --- the config file ------------------------------------------------------------------


@dataclass(frozen=True)
class PriorityMap:
    """A job's priority from its QoS, else its partition, else ``default``."""

    default: str = "normal"
    qos: Mapping[str, str] = field(default_factory=dict)
    partition: Mapping[str, str] = field(default_factory=dict)

    def of(self, qos: str | None, partition: str | None) -> tuple[str, str]:
        """The priority and what chose it: ``"qos high"``, ``"partition debug"``, ``"default"``."""
        if qos and qos in self.qos:
            return self.qos[qos], f"qos {qos}"
        if partition and partition in self.partition:
            return self.partition[partition], f"partition {partition}"
        return self.default, "default"


@dataclass(frozen=True)
class HookConfig:
    broker_url: str
    broker: BrokerSettings  # what the URL cannot carry: login, password file, TLS files
    cluster: str = "default"
    timeout_s: float = DEFAULT_TIMEOUT_S
    priority: PriorityMap = field(default_factory=PriorityMap)


def load_config(path: str | Path) -> HookConfig:
    """The hook's config file; ConfigError naming the file and the key, and what to write."""
    where = str(path)
    raw = read_toml(path, _KNOWN)
    get = Getter(where)
    broker_table = raw.get("broker", {})
    if "url" not in broker_table:
        raise ConfigError(
            f"{where}: broker.url is required: the site broker, mqtt://LOGIN@HOST[:PORT] or "
            "mqtts://LOGIN@HOST[:PORT] (the password in broker.password_file)"
        )
    broker_url = get.text(broker_table, "broker.url", None)
    broker = broker_from_table(broker_table, where)
    _check_tls(broker, where)
    hook = raw.get("hook", {})
    cluster = get.text(hook, "hook.cluster", "default")
    try:
        check_name(cluster, "cluster")
    except ProtocolError as exc:
        raise ConfigError(f"{where}: hook.cluster: {exc}") from None
    timeout_s = get.number(hook, "hook.timeout_s", DEFAULT_TIMEOUT_S)
    low, high = TIMEOUT_RANGE_S
    if not low <= timeout_s <= high:
        raise ConfigError(
            f"{where}: hook.timeout_s must be in [{low:g}, {high:g}] s, not {timeout_s:g}: "
            "slurmctld holds the job while the prolog waits for the broker"
        )
    priority = _priority_map(raw.get("priority", {}), where)
    return HookConfig(broker_url, broker, cluster, float(timeout_s), priority)


def _check_tls(broker: BrokerSettings, where: str) -> None:
    """The TLS files load (the agent and controller find out when they connect; the hook
    must know before slurmctld runs it for a job)."""
    if not broker.tls:
        return
    try:
        context = ssl.create_default_context(cafile=broker.ca_file)
        if broker.cert_file:
            context.load_cert_chain(broker.cert_file, broker.key_file)
    except (ssl.SSLError, OSError) as exc:
        files = ", ".join(
            f"broker.{key} = {getattr(broker, key)}"
            for key in ("ca_file", "cert_file", "key_file")
            if getattr(broker, key)
        )
        raise ConfigError(f"{where}: {files}: cannot load: {exc}") from None


def _priority_map(table: dict[str, Any], where: str) -> PriorityMap:
    default = _priority(table.get("default", "normal"), "priority.default", where)
    maps: dict[str, dict[str, str]] = {}
    for kind in ("qos", "partition"):
        entries = table.get(kind, {})
        if not isinstance(entries, dict):
            raise ConfigError(
                f"{where}: priority.{kind} must be a table of {kind} names, "
                f'e.g. {kind}.NAME = "high", not {shown(entries)}'
            )
        maps[kind] = {
            name: _priority(value, f"priority.{kind}.{name}", where)
            for name, value in entries.items()
        }
    return PriorityMap(default, maps["qos"], maps["partition"])


def _priority(value: object, dotted: str, where: str) -> str:
    if isinstance(value, str) and value in PRIORITIES:
        return value
    raise ConfigError(f"{where}: {dotted} must be one of {_PRIORITY_WORDS}, not {shown(value)}")


def describe(config: HookConfig) -> list[str]:
    """What the hook will do, for ``powerd job check``."""
    login = config.broker.username or "(none: anonymous)"
    lines = [
        f"broker: {config.broker.display}, login {login}",
        f"topics: {Topics(config.cluster).phase('slurm-JOBID', 'USER')}",
        f"timeout: {config.timeout_s:g} s (exit 0 within {config.timeout_s + WATCHDOG_GRACE_S:g} s "
        "whatever the broker does)",
    ]
    priority = config.priority
    lines += [f"priority: qos {name} -> {p}" for name, p in sorted(priority.qos.items())]
    lines += [f"priority: partition {n} -> {p}" for n, p in sorted(priority.partition.items())]
    lines.append(f"priority: otherwise -> {priority.default}")
    return lines


# --- the job, from Slurm's variables -----------------------------------------------------


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    user: str
    nodes: list[str] | None  # the prolog's; None in the epilog
    qos: str | None = None
    partition: str | None = None
    slurm_name: str | None = None  # $SLURM_JOB_NAME, for the log

    @property
    def name(self) -> str:
        """The powerd job name: what ``PhaseReporter.from_env`` calls it inside the job."""
        return f"slurm-{self.job_id}"


def job_from_env(env: Mapping[str, str], need_nodes: bool) -> SlurmJob:
    """The job slurmctld describes in ``env``; JobEnvError naming the variable."""
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        raise JobEnvError(
            "SLURM_JOB_ID is not set: run by slurmctld as PrologSlurmctld/EpilogSlurmctld?"
        )
    try:
        check_name(f"slurm-{job_id}", "job")
    except ProtocolError:
        raise JobEnvError(f"SLURM_JOB_ID={shown(job_id)} is not a job id") from None
    user = env.get("SLURM_JOB_USER", "").strip() or _user_of(env.get("SLURM_JOB_UID", ""))
    try:
        check_name(user, "owner")
    except ProtocolError:
        raise JobEnvError(
            f"job {job_id}: user {shown(user)} (SLURM_JOB_USER) is no powerd owner name "
            "(1 to 64 of A-Z a-z 0-9 . _ -)"
        ) from None
    nodes = _nodes(env, job_id) if need_nodes else None

    def text(variable: str) -> str | None:
        return env.get(variable, "").strip() or None

    return SlurmJob(
        job_id,
        user,
        nodes,
        qos=text("SLURM_JOB_QOS"),
        partition=text("SLURM_JOB_PARTITION"),
        slurm_name=text("SLURM_JOB_NAME"),
    )


def _user_of(uid: str) -> str:
    """The name of ``$SLURM_JOB_UID`` (SLURM_JOB_USER unset), or "" if unknown."""
    try:
        return pwd.getpwuid(int(uid)).pw_name
    except (ValueError, KeyError):
        return ""


def _nodes(env: Mapping[str, str], job_id: str) -> list[str]:
    variable = next((v for v in ("SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(v)), None)
    if variable is None:
        raise JobEnvError(f"job {job_id}: SLURM_JOB_NODELIST is not set: no nodes to announce")
    try:
        nodes = expand_hostlist(env[variable])
        for node in nodes:
            check_name(node, "node")
    except (ValueError, ProtocolError) as exc:
        raise JobEnvError(f"job {job_id}: {variable}: {exc}") from None
    return nodes


# --- announcing -------------------------------------------------------------------------


def run_hook(
    hook: Hook,
    config_path: str | Path,
    environ: Mapping[str, str],
    started_mono: float,
    hard_exit: bool = True,
) -> int:
    """Announce the job of ``environ`` (``startup`` for the prolog, ``shutdown`` for the
    epilog); the exit code. Returns by ``started_mono`` + the config's ``timeout_s`` + about
    a second; with ``hard_exit``, a watchdog ends the process with 0 at
    ``WATCHDOG_GRACE_S`` past it, whatever is still running."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        _log_broken(hook, str(exc))
        return EXIT_CONFIG
    deadline_mono = started_mono + config.timeout_s
    if hard_exit:
        start_watchdog(hook, deadline_mono + WATCHDOG_GRACE_S, config.timeout_s)
    try:
        job = job_from_env(environ, need_nodes=(hook == "prolog"))
    except JobEnvError as exc:
        log.error("%s: %s not announced: %s; exit 0", hook, PHASE_OF[hook], exc)
        return EXIT_OK
    return _announce(hook, config, job, deadline_mono)


def _announce(hook: Hook, config: HookConfig, job: SlurmJob, deadline_mono: float) -> int:
    phase = PHASE_OF[hook]
    priority, chosen_by = config.priority.of(job.qos, job.partition)
    what = f"job {job.name} ({job.slurm_name or 'unnamed'}, user {job.user})"
    try:
        reporter = PhaseReporter(
            config.broker_url,
            job.name,
            job.nodes,
            priority=priority,
            cluster=config.cluster,
            owner=job.user,
            settings=config.broker,
            reconnect_max_s=RECONNECT_MAX_S,
            client_id=f"powerd-slurm-{hook}-{job.job_id}-{secrets.token_hex(3)}",
        )
    except ValueError as exc:  # a node list too long for one payload, say
        log.error("%s: %s: %s not announced: %s; exit 0", hook, what, phase, exc)
        return EXIT_OK
    if reporter.error is not None:  # a TLS file that does not load, a password file gone
        reporter.close(0.0)
        _log_broken(hook, reporter.error)
        return EXIT_CONFIG
    if hook == "prolog":
        reporter.startup()
    else:
        reporter.set_phase("shutdown")
    begun = time.monotonic()
    delivered = reporter.flush(max(0.0, deadline_mono - begun))
    took_s = time.monotonic() - begun
    reporter.close(0.0)
    where = f"{config.broker.display} on {reporter.topic}"
    nodes = "" if job.nodes is None else f"{len(job.nodes)} nodes, "
    if delivered:
        log.info(
            "%s: %s: %s announced to %s: %spriority %s (%s); acknowledged in %.3f s",
            hook, what, phase, where, nodes, priority, chosen_by, took_s,
        )  # fmt: skip
    else:
        log.error(
            "%s: %s: %s NOT acknowledged by %s within %.1f s (broker down, unreachable or "
            "refusing the login?): the job goes on unannounced; exit 0",
            hook, what, phase, where, config.timeout_s,
        )  # fmt: skip
    return EXIT_OK


def _log_broken(hook: Hook, why: str) -> None:
    log.error(
        "%s: broken configuration, exit %d (%s; `powerd job check` tests a config): %s",
        hook,
        EXIT_CONFIG,
        SLURM_ON_FAILURE[hook],
        why,
    )


def start_watchdog(hook: Hook, at_mono: float, timeout_s: float) -> None:
    """End the process with 0 at ``at_mono`` if it is still running then."""

    def fire() -> None:
        log.error(
            "%s: still running %.1f s past hook.timeout_s (%g s): exit 0 now",
            hook,
            WATCHDOG_GRACE_S,
            timeout_s,
        )
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(EXIT_OK)

    timer = threading.Timer(max(0.0, at_mono - time.monotonic()), fire)
    timer.daemon = True
    timer.start()
