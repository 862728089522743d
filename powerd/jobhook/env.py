"""A ``PhaseReporter`` configured from the environment (``POWERD_BROKER``,
``POWERD_JOB``, ...; Slurm's and torchrun's variables for nodes and rank)."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

from powerd.hostlist import expand_hostlist
from powerd.jobhook.reporter import PhaseReporter, _check_name, _check_nodes, _check_priority

__all__ = ["ENV_BROKER", "ENV_CLUSTER", "ENV_JOB", "ENV_NODES", "ENV_PRIORITY", "RANK_VARIABLES"]

log = logging.getLogger("powerd.jobhook")

ENV_BROKER = "POWERD_BROKER"
ENV_JOB = "POWERD_JOB"
ENV_CLUSTER = "POWERD_CLUSTER"
ENV_PRIORITY = "POWERD_PRIORITY"
ENV_NODES = "POWERD_NODES"
ENV_OWNER = "POWERD_JOB_OWNER"
# the first of these that is set gives this process's rank; only rank 0 publishes
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def _env_rank(env: Mapping[str, str]) -> int:
    for variable in RANK_VARIABLES:
        value = env.get(variable, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{variable}={value!r} is not an integer rank") from None
    return 0


def _env_nodes(env: Mapping[str, str]) -> list[str] | None:
    spec = env.get(ENV_NODES, "").strip()
    if spec:
        try:
            return _check_nodes(expand_hostlist(spec))
        except ValueError as exc:
            raise ValueError(f"{ENV_NODES}: {exc}") from None
    slurm = env.get("SLURM_JOB_NODELIST", "").strip()
    if slurm:
        try:
            return _check_nodes(expand_hostlist(slurm))
        except ValueError as exc:
            log.warning("SLURM_JOB_NODELIST not used for the phase reporter's nodes: %s", exc)
            return None
    world, local = env.get("WORLD_SIZE"), env.get("LOCAL_WORLD_SIZE")
    if world is None or world == local:  # one node: this one
        host = socket.gethostname().split(".")[0]
        try:
            return [_check_name(host, "node")]
        except ValueError:
            return None
    return None  # several nodes and no list: the controller infers them from telemetry


def _reporter_from_env(environ: Mapping[str, str] | None = None, **overrides: Any) -> PhaseReporter:
    """A reporter configured from the environment; ``overrides`` go to ``PhaseReporter``.

    ``POWERD_BROKER``: broker URL; unset, the reporter is off (every call is a no-op).
    ``POWERD_JOB``: job name (else ``slurm-$SLURM_JOB_ID``); required when a broker is set.
    ``POWERD_CLUSTER`` (``default``), ``POWERD_PRIORITY`` (``normal``).
    ``POWERD_JOB_OWNER``: who speaks for the job (else the broker URL's user, else none).
    ``POWERD_NODES``: node names, comma separated, Slurm ranges allowed
    (``r01-n[03-06]``); else ``$SLURM_JOB_NODELIST``; else this host in a
    single-node job; else omitted.
    Only rank 0 (``$RANK``, else ``$SLURM_PROCID``, ``$OMPI_COMM_WORLD_RANK``,
    ``$PMI_RANK``; 0 when none is set) publishes.
    A malformed value raises ValueError naming its variable.
    """
    env = os.environ if environ is None else environ
    broker = env.get(ENV_BROKER, "").strip() or None
    job = env.get(ENV_JOB, "").strip()
    if not job and env.get("SLURM_JOB_ID", "").strip():
        job = f"slurm-{env['SLURM_JOB_ID'].strip()}"
    if not job:
        if broker:
            raise ValueError(f"{ENV_BROKER} is set but {ENV_JOB} is not: name the job in {ENV_JOB}")
        job = "unnamed-job"  # reporting is off anyway
    kwargs: dict[str, Any] = {}
    for variable, key, default, check in (
        (ENV_JOB, "job", job, lambda v: _check_name(v, "job")),
        (ENV_CLUSTER, "cluster", "default", lambda v: _check_name(v, "cluster")),
        (ENV_PRIORITY, "priority", "normal", _check_priority),
    ):
        value = env.get(variable, "").strip() or default
        try:
            kwargs[key] = check(value)
        except ValueError as exc:
            raise ValueError(f"{variable}: {exc}") from None
    owner = env.get(ENV_OWNER, "").strip()
    if owner:
        try:
            kwargs["owner"] = _check_name(owner, "owner")
        except ValueError as exc:
            raise ValueError(f"{ENV_OWNER}: {exc}") from None
    kwargs["nodes"] = _env_nodes(env)
    kwargs["enabled"] = _env_rank(env) == 0
    kwargs.update(overrides)
    return PhaseReporter(broker, **kwargs)
