"""The Slurm prolog and epilog run as slurmctld runs them: the shipped wrappers
(powerd/data/slurm/prolog.sh, epilog.sh) executed with the job's SLURM_* variables, no
search path and no terminal, against a real Mosquitto and a real controller.

The controller counts the job on the nodes of SLURM_JOB_NODELIST, for its user, at the
priority the config maps its QoS or partition to, after the prolog; it forgets the job
after the epilog. A broker down or silent never fails the job (exit 0, a log line, within
the hook's timeout); a config that cannot be used does (exit 1, what to fix).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from policies.tree import PRIORITY_CODES
from powerd.jobhook.slurm import WATCHDOG_GRACE_S
from powerd.topology import parse_budgets
from tests.support.brokers import TEST_PASSWORD, Mosquitto, free_port
from tests.support.controller_harness import CLUSTER, budgets_toml, running_controller
from tests.support.paths import REPO

WRAPPERS = REPO / "powerd" / "data" / "slurm"
POWERD_BIN = Path(sys.executable).parent / "powerd"  # the install's entry point
# Interpreter start-up and the broker client's teardown on a loaded 2-core machine: what a
# run may take beyond hook.timeout_s and the watchdog's grace before the bound is broken.
START_SLACK_S = 3.0

ALICE = {  # a batch job of alice's in the high QoS: nodes of both racks
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_USER": "alice",
    "SLURM_JOB_UID": "1001",
    "SLURM_JOB_NAME": "llama-70b",
    "SLURM_JOB_NODELIST": "r1-k1-n[1-2],r1-k2-n1",
    "SLURM_JOB_NUM_NODES": "3",
    "SLURM_JOB_QOS": "high",
    "SLURM_JOB_PARTITION": "gpu",
}
ALICE_NODES = ("r1-k1-n1", "r1-k1-n2", "r1-k2-n1")
BOB = {  # bob's job in the debug partition, normal QoS (not mapped): the partition decides
    "SLURM_JOB_ID": "4243",
    "SLURM_JOB_USER": "bob",
    "SLURM_JOB_UID": "1002",
    "SLURM_JOB_NAME": "sweep",
    "SLURM_JOB_NODELIST": "r1-k2-n2",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_JOB_QOS": "normal",
    "SLURM_JOB_PARTITION": "debug",
}


def write_config(tmp_path: Path, broker_url: str, timeout_s: float = 10.0, extra: str = "") -> Path:
    """The hook's config: the broker's password in a file (slurmctld passes no
    $POWERD_MQTT_PASSWORD), the test cluster, QoS high -> high, partition debug -> low."""
    password = tmp_path / "slurm.password"
    password.write_text(TEST_PASSWORD + "\n")
    password.chmod(0o600)
    config = tmp_path / "slurm.toml"
    config.write_text(
        f"""
[broker]
url = "{broker_url}"
password_file = "{password}"

[hook]
cluster = "{CLUSTER}"
timeout_s = {timeout_s}

[priority]
default = "normal"
qos.high = "high"
partition.debug = "low"
{extra}"""
    )
    return config


def slurmctld_env(hook: str, config: Path, job: dict[str, str]) -> dict[str, str]:
    """What slurmctld gives a PrologSlurmctld/EpilogSlurmctld: the job's variables and no
    PATH. POWERD_BIN and POWERD_SLURM_CONFIG stand for the lines a site edits in the wrapper
    (its install and its config), pointing at this checkout's."""
    assert POWERD_BIN.is_file(), f"no {POWERD_BIN}: install the package (pip install -e .)"
    return {
        "SLURM_SCRIPT_CONTEXT": f"{hook}_slurmctld",
        "SLURM_CLUSTER_NAME": "lab",
        "SLURM_JOBID": job["SLURM_JOB_ID"],
        "SLURM_JOB_ACCOUNT": "research",
        "SLURM_JOB_GID": job["SLURM_JOB_UID"],
        "SLURM_JOB_GROUP": job["SLURM_JOB_USER"],
        "SLURM_JOB_WORK_DIR": "/tmp",
        **job,
        "POWERD_BIN": str(POWERD_BIN),
        "POWERD_SLURM_CONFIG": str(config),
    }


@dataclass
class Ran:
    code: int
    stderr: str
    took_s: float


async def run_wrapper(hook: str, env: dict[str, str], cwd: Path) -> Ran:
    """``powerd/data/slurm/{hook}.sh`` as slurmctld runs it: its own session (no terminal),
    stdin from /dev/null, the environment ``env`` only."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        str(WRAPPERS / f"{hook}.sh"),
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60.0)
    assert proc.returncode is not None
    return Ran(proc.returncode, err.decode(errors="replace"), time.monotonic() - started)


def run_wrapper_sync(hook: str, env: dict[str, str], cwd: Path) -> Ran:
    return asyncio.run(run_wrapper(hook, env, cwd))


async def test_the_prolog_announces_the_job_and_the_epilog_ends_it(mosquitto: Mosquitto, tmp_path):
    config = write_config(tmp_path, mosquitto.url)
    topology = parse_budgets(budgets_toml(), source="<test budgets>")
    async with running_controller(mosquitto, topology) as ctl:
        core = ctl.core
        for job in (ALICE, BOB):
            ran = await run_wrapper("prolog", slurmctld_env("prolog", config, job), tmp_path)
            assert ran.code == 0, ran.stderr
            assert f"job slurm-{job['SLURM_JOB_ID']}" in ran.stderr
            assert "startup announced" in ran.stderr, ran.stderr
        await ctl.wait_for(lambda: {"slurm-4242", "slurm-4243"} <= set(core.jobs))

        alice, bob = core.jobs["slurm-4242"], core.jobs["slurm-4243"]
        assert (alice.owner, alice.priority, alice.phase) == ("alice", "high", "startup")
        assert alice.nodes == list(ALICE_NODES)
        assert (bob.owner, bob.priority, bob.nodes) == ("bob", "low", ["r1-k2-n2"])
        # what the policy is given, node by node
        ordinal = core.tree.server_ordinal
        priority = core.registry.server_arrays(time.monotonic()).priority
        for node in alice.nodes:
            assert core.job_of(node) == "slurm-4242"
            assert priority[ordinal[node]] == PRIORITY_CODES["high"]
        assert core.job_of("r1-k2-n2") == "slurm-4243"
        assert priority[ordinal["r1-k2-n2"]] == PRIORITY_CODES["low"]

        ran = await run_wrapper("epilog", slurmctld_env("epilog", config, ALICE), tmp_path)
        assert ran.code == 0, ran.stderr
        assert "shutdown announced" in ran.stderr, ran.stderr
        await ctl.wait_for(lambda: "slurm-4242" not in core.jobs)
        assert all(core.job_of(node) is None for node in ALICE_NODES)
        assert "slurm-4243" in core.jobs  # bob's job is not alice's epilog's
        priority = core.registry.server_arrays(time.monotonic()).priority
        assert all(priority[ordinal[n]] == PRIORITY_CODES["normal"] for n in ALICE_NODES)


def test_the_priority_names_what_chose_it(mosquitto: Mosquitto, tmp_path):
    """The log line says why a job got its priority: its QoS, its partition, the default."""
    config = write_config(tmp_path, mosquitto.url)
    cases = [
        (ALICE, "priority high (qos high)"),
        (BOB, "priority low (partition debug)"),
        (
            {**BOB, "SLURM_JOB_ID": "4244", "SLURM_JOB_PARTITION": "gpu"},
            "priority normal (default)",
        ),
    ]
    for job, said in cases:
        ran = run_wrapper_sync("prolog", slurmctld_env("prolog", config, job), tmp_path)
        assert ran.code == 0, ran.stderr
        assert said in ran.stderr, ran.stderr
        assert "acknowledged in" in ran.stderr, ran.stderr


# --- a broker down or silent: exit 0, within the timeout, and a log line ------------------


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_a_broker_down_never_fails_the_job(hook: str, tmp_path):
    timeout_s = 2.0
    url = f"mqtt://powerd-slurm@127.0.0.1:{free_port()}"  # nothing listens there
    config = write_config(tmp_path, url, timeout_s=timeout_s)
    ran = run_wrapper_sync(hook, slurmctld_env(hook, config, ALICE), tmp_path)
    assert ran.code == 0, ran.stderr
    phase = "startup" if hook == "prolog" else "shutdown"
    assert f"job slurm-4242 (llama-70b, user alice): {phase} NOT acknowledged" in ran.stderr
    assert "exit 0" in ran.stderr
    assert ran.took_s < timeout_s + WATCHDOG_GRACE_S + START_SLACK_S, ran


def test_a_silent_broker_never_holds_the_job(tmp_path):
    """A host that takes the TCP connection and never answers (a hung broker): the prolog
    gives up at its timeout, exit 0."""
    timeout_s = 2.0
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"mqtt://powerd-slurm@127.0.0.1:{silent.getsockname()[1]}"
        config = write_config(tmp_path, url, timeout_s=timeout_s)
        ran = run_wrapper_sync("prolog", slurmctld_env("prolog", config, ALICE), tmp_path)
    assert ran.code == 0, ran.stderr
    assert "startup NOT acknowledged" in ran.stderr
    assert ran.took_s < timeout_s + WATCHDOG_GRACE_S + START_SLACK_S, ran


# --- a broken install or config: non-zero, and what to fix -------------------------------


BROKER = '[broker]\nurl = "mqtt://powerd-slurm@127.0.0.1"\n'
BROKEN = {
    "unknown priority": (
        BROKER + '[priority]\nqos.high = "urgent"\n',
        'priority.qos.high must be one of "high", "normal", "low", not \'urgent\'',
    ),
    "misspelt key": (BROKER + "[hook]\ntimeout = 5\n", "unknown key(s) ['timeout'] in [hook]"),
    "timeout out of range": (
        BROKER + "[hook]\ntimeout_s = 600\n",
        "hook.timeout_s must be in [0.5, 60] s",
    ),
    "no broker": ('[hook]\ncluster = "prod"\n', "broker.url is required"),
    "password file gone": (
        '[broker]\nurl = "mqtt://powerd-slurm@127.0.0.1"\npassword_file = "/nonexistent/pw"\n',
        "broker.password_file: cannot read /nonexistent/pw",
    ),
    "not TOML": ("[priority\n", "not valid TOML"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_config_fails_the_prolog_saying_what_to_fix(case: str, tmp_path):
    text, says = BROKEN[case]
    config = tmp_path / "slurm.toml"
    config.write_text(text)
    ran = run_wrapper_sync("prolog", slurmctld_env("prolog", config, ALICE), tmp_path)
    assert ran.code == 1, ran.stderr
    assert says in ran.stderr, ran.stderr
    assert str(config) in ran.stderr
    assert "broken configuration, exit 1 (Slurm requeues a batch job" in ran.stderr


def test_a_missing_config_fails_the_epilog_too(tmp_path):
    missing = tmp_path / "nowhere.toml"
    ran = run_wrapper_sync("epilog", slurmctld_env("epilog", missing, ALICE), tmp_path)
    assert ran.code == 1, ran.stderr
    assert f"{missing}: no such file" in ran.stderr
    assert "(Slurm only logs it;" in ran.stderr


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_a_wrapper_without_powerd_says_where_it_looked(hook: str, tmp_path):
    env = {**slurmctld_env(hook, tmp_path / "slurm.toml", ALICE), "POWERD_BIN": "/opt/none/powerd"}
    ran = run_wrapper_sync(hook, env, tmp_path)
    assert ran.code == 1
    assert "no powerd at /opt/none/powerd (set POWERD_BIN in" in ran.stderr
    assert "job 4242 not announced" in ran.stderr


def test_the_watchdog_ends_a_hook_that_hangs_with_0(tmp_path):
    """Whatever holds the hook past its timeout (a resolver, a teardown that never ends),
    the watchdog ends the process with 0 and says so; here the hang is a sleep."""
    hung = (
        "import logging, sys, time\n"
        "logging.basicConfig(level='INFO')\n"
        "from powerd.jobhook.slurm import start_watchdog\n"
        "start_watchdog('prolog', time.monotonic() + 0.5, 1.0)\n"
        "time.sleep(120)\n"
        "sys.exit(3)\n"
    )
    started = time.monotonic()
    ran = subprocess.run(
        [sys.executable, "-c", hung], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert ran.returncode == 0, ran.stderr
    assert "prolog: still running 2.0 s past hook.timeout_s (1 s): exit 0 now" in ran.stderr
    assert time.monotonic() - started < 60.0


def test_a_ca_file_that_does_not_load_fails_the_prolog(tmp_path):
    """Read and parsed with the config, before any job."""
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    config = tmp_path / "slurm.toml"
    config.write_text(f'[broker]\nurl = "mqtts://powerd-slurm@127.0.0.1"\nca_file = "{ca}"\n')
    ran = run_wrapper_sync("prolog", slurmctld_env("prolog", config, ALICE), tmp_path)
    assert ran.code == 1, ran.stderr
    assert "prolog: broken configuration, exit 1" in ran.stderr
    assert f"broker.ca_file = {ca}: cannot load" in ran.stderr, ran.stderr
