"""``powerd job``: Slurm's PrologSlurmctld and EpilogSlurmctld (powerd.jobhook.slurm does
the work), and a check of their config file."""

from __future__ import annotations

import logging
import logging.handlers
import os
import stat
import sys
import time
from pathlib import Path
from typing import Literal

import click

from powerd.cli.options import setup_logging

DEFAULT_CONFIG = "/etc/powerd/slurm.toml"
CONFIG_ENV = "POWERD_SLURM_CONFIG"
SYSLOG_SOCKET = "/dev/log"


_config = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_CONFIG,
    envvar=CONFIG_ENV,
    show_envvar=True,
    help="The hook's config file (TOML): broker, cluster, timeout, priority mapping "
    "(powerd/data/slurm/slurm.example.toml).",
)


@click.group("job", short_help="Slurm's prolog and epilog: announce each job's start and end.")
def group() -> None:
    """Announce Slurm jobs to the controller from slurmctld, once per job.

    In slurm.conf, PrologSlurmctld and EpilogSlurmctld point at the shipped
    wrappers (powerd/data/slurm/prolog.sh, epilog.sh), which run `powerd job
    prolog` and `powerd job epilog`: job slurm-$SLURM_JOB_ID, owner
    $SLURM_JOB_USER, nodes $SLURM_JOB_NODELIST, priority from its QoS or
    partition. docs/JOBHOOK.md, "With Slurm".

    \b
    Examples:
      powerd job check --config /etc/powerd/slurm.toml
      powerd job prolog --help
    """


def _run(hook: Literal["prolog", "epilog"], config_path: Path) -> None:
    from powerd.jobhook.slurm import run_hook

    started = time.monotonic()
    _setup_hook_logging()
    sys.exit(run_hook(hook, config_path, os.environ, started))


@group.command("prolog", short_help="PrologSlurmctld: announce the job's startup and nodes.")
@_config
def prolog(config_path: Path) -> None:
    """Announce a job's startup: run by slurmctld as PrologSlurmctld.

    Reads the job from slurmctld's variables (SLURM_JOB_ID, SLURM_JOB_USER,
    SLURM_JOB_NODELIST, SLURM_JOB_QOS, SLURM_JOB_PARTITION) and publishes
    `startup` for job slurm-$SLURM_JOB_ID, owner $SLURM_JOB_USER, with its nodes
    and the priority [priority] maps its QoS (else its partition) to. Waits for
    the broker's acknowledgement until hook.timeout_s.

    Exit 0 when announced and when not (broker down or silent: logged; the job
    starts unannounced); 1 for a config that cannot be used (Slurm then
    requeues a batch job and cancels an interactive one). Logs to stderr and
    syslog.

    \b
    Examples:
      powerd job check                      # the config, before slurm.conf points at it
      SLURM_JOB_ID=7 SLURM_JOB_USER=alice SLURM_JOB_NODELIST='r01-n[01-04]' \\
        powerd job prolog --config slurm.toml
    """
    _run("prolog", config_path)


@group.command("epilog", short_help="EpilogSlurmctld: announce the job's shutdown.")
@_config
def epilog(config_path: Path) -> None:
    """Announce a job's shutdown: run by slurmctld as EpilogSlurmctld.

    The controller forgets the job and its nodes compute at normal priority
    again. Exit codes as for `powerd job prolog` (a failing EpilogSlurmctld is
    only logged by Slurm).

    \b
    Examples:
      powerd job check --config slurm.toml
      SLURM_JOB_ID=7 SLURM_JOB_USER=alice powerd job epilog --config slurm.toml
    """
    _run("epilog", config_path)


@group.command("check", short_help="Read the hook's config file and say what it will announce.")
@_config
def check(config_path: Path) -> None:
    """Read the config file as the prolog would; print the broker, topics, timeout and
    priority mapping, or what to fix (exit 1). Connects nowhere.

    \b
    Examples:
      powerd job check --config /etc/powerd/slurm.toml
      sudo -u slurm powerd job check     # as SlurmUser: can it read the password file?
    """
    from powerd.configfile import ConfigError
    from powerd.jobhook.slurm import describe, load_config

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{config_path}: usable")
    for line in describe(config):
        click.echo(f"  {line}")


def _setup_hook_logging() -> None:
    """stderr (slurmctld does not keep it) and, where there is one, the syslog socket."""
    setup_logging("info")
    logging.getLogger("powerd.jobhook").setLevel(logging.INFO)
    try:
        if not stat.S_ISSOCK(os.stat(SYSLOG_SOCKET).st_mode):
            return
        handler = logging.handlers.SysLogHandler(
            SYSLOG_SOCKET, facility=logging.handlers.SysLogHandler.LOG_DAEMON
        )
    except OSError:
        return
    handler.setFormatter(logging.Formatter("powerd-slurm[%(process)d]: %(levelname)s %(message)s"))
    logging.getLogger().addHandler(handler)
