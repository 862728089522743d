#!/bin/sh
# PrologSlurmctld for powerd: announces each job's startup, nodes and priority to the
# controller (docs/JOBHOOK.md, "With Slurm"). In slurm.conf:
#   PrologSlurmctld=/etc/powerd/slurm/prolog.sh
# slurmctld runs it once per job, as SlurmUser, with the job in SLURM_* variables and no
# search path, and holds the job until it exits: within hook.timeout_s + 2 s, exit 0 even
# when the broker is down; 1 only for a broken install or config (Slurm then requeues a
# batch job and cancels an interactive one).
# POWERD_BIN: the powerd command; the config: /etc/powerd/slurm.toml ($POWERD_SLURM_CONFIG).
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
POWERD_BIN="${POWERD_BIN:-/opt/powerd/bin/powerd}"
if [ ! -x "$POWERD_BIN" ]; then
    msg="prolog: broken install, exit 1: no powerd at $POWERD_BIN (set POWERD_BIN in $0); job ${SLURM_JOB_ID:-?} not announced"
    echo "powerd-slurm: $msg" >&2
    logger -t powerd-slurm -p daemon.err "$msg" 2>/dev/null
    exit 1
fi
exec "$POWERD_BIN" job prolog
