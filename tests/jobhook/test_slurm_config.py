"""The Slurm hook's config file, the job it reads from slurmctld's variables, and
``powerd job check``: what a site writes, what it is told when it is wrong."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from powerd.cli import main as powerd
from powerd.configfile import ConfigError
from powerd.jobhook import PhaseReporter
from powerd.jobhook.slurm import (
    EXIT_OK,
    JobEnvError,
    PriorityMap,
    job_from_env,
    load_config,
    run_hook,
)
from tests.support.paths import REPO

EXAMPLE = REPO / "powerd" / "data" / "slurm" / "slurm.example.toml"


def example_config(tmp_path: Path) -> Path:
    """The shipped example, its password file made here."""
    password = tmp_path / "slurm.password"
    password.write_text("secret\n")
    text = EXAMPLE.read_text().replace("/etc/powerd/slurm.password", str(password))
    assert str(password) in text
    path = tmp_path / "slurm.toml"
    path.write_text(text)
    return path


def test_the_shipped_example_is_a_usable_config(tmp_path: Path):
    config = load_config(example_config(tmp_path))
    assert config.broker.username == "powerd-slurm" and config.broker.tls
    assert config.broker.password() == "secret"
    assert (config.cluster, config.timeout_s) == ("default", 5.0)
    assert config.priority == PriorityMap(
        "normal", {"high": "high", "scavenger": "low"}, {"debug": "low"}
    )


def test_the_qos_decides_before_the_partition_before_the_default():
    priorities = PriorityMap("normal", {"high": "high"}, {"debug": "low", "gpu": "high"})
    assert priorities.of("high", "debug") == ("high", "qos high")
    assert priorities.of("normal", "debug") == ("low", "partition debug")
    assert priorities.of(None, "gpu") == ("high", "partition gpu")
    assert priorities.of("normal", "cpu") == ("normal", "default")
    assert priorities.of(None, None) == ("normal", "default")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[priority]\ndefault = "top"\n', 'priority.default must be one of "high"'),
        (
            "[priority]\nqos = 3\n",
            'priority.qos must be a table of qos names, e.g. qos.NAME = "high"',
        ),
        ("[priority]\npartition.debug = 1\n", "priority.partition.debug must be one of"),
        ('[hook]\ncluster = "a b"\n', "hook.cluster: cluster name 'a b' must match"),
        ('[hook]\ntimeout_s = "5s"\n', "hook.timeout_s must be a number"),
        ('[slurm]\ncluster = "x"\n', "unknown section [slurm]"),
    ],
)
def test_a_wrong_config_names_the_file_the_key_and_what_to_write(
    text: str, says: str, tmp_path: Path
):
    path = tmp_path / "slurm.toml"
    path.write_text('[broker]\nurl = "mqtt://powerd-slurm@localhost"\n' + text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: "), caught.value
    assert says in str(caught.value)


def test_a_password_in_the_url_is_refused(tmp_path: Path):
    path = tmp_path / "slurm.toml"
    path.write_text('[broker]\nurl = "mqtt://powerd-slurm:hunter2@localhost"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "put the broker password in broker.password_file" in str(caught.value)
    assert "hunter2" not in str(caught.value)


# --- the job, from slurmctld's variables ------------------------------------------------

PROLOG_ENV = {
    "SLURM_JOB_ID": "981",
    "SLURM_JOB_USER": "alice",
    "SLURM_JOB_NODELIST": "r01-n[03-05],r02-n01",
    "SLURM_JOB_QOS": "high",
    "SLURM_JOB_PARTITION": "gpu",
    "SLURM_JOB_NAME": "llama",
}


def test_the_job_is_what_slurmctld_describes():
    job = job_from_env(PROLOG_ENV, need_nodes=True)
    assert (job.name, job.user, job.qos, job.partition) == ("slurm-981", "alice", "high", "gpu")
    assert job.nodes == ["r01-n03", "r01-n04", "r01-n05", "r02-n01"]
    # the epilog needs no nodes, and the prolog takes SLURM_NODELIST when that is what it has
    assert job_from_env({"SLURM_JOB_ID": "981", "SLURM_JOB_USER": "alice"}, False).nodes is None
    older = {k: v for k, v in PROLOG_ENV.items() if k != "SLURM_JOB_NODELIST"}
    assert job_from_env({**older, "SLURM_NODELIST": "gpu7"}, True).nodes == ["gpu7"]


def test_the_job_keeps_the_name_its_own_hook_gives_it():
    """Inside the job, PhaseReporter.from_env names it slurm-$SLURM_JOB_ID too: the job's
    own announcements continue the job the prolog announced."""
    inside = PhaseReporter.from_env({"SLURM_JOB_ID": "981", "SLURM_PROCID": "0"})
    assert job_from_env(PROLOG_ENV, need_nodes=True).name == inside.job


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"SLURM_JOB_ID": ""}, "SLURM_JOB_ID is not set"),
        ({"SLURM_JOB_ID": "12 3"}, "SLURM_JOB_ID='12 3' is not a job id"),
        ({"SLURM_JOB_USER": "alice@corp"}, "user 'alice@corp' (SLURM_JOB_USER) is no powerd owner"),
        ({"SLURM_JOB_NODELIST": ""}, "SLURM_JOB_NODELIST is not set"),
        ({"SLURM_JOB_NODELIST": "r01-n[03-"}, "SLURM_JOB_NODELIST: "),
    ],
)
def test_variables_that_cannot_be_announced_are_named(change: dict[str, str], says: str):
    with pytest.raises(JobEnvError) as caught:
        job_from_env({**PROLOG_ENV, **change}, need_nodes=True)
    assert says in str(caught.value)


def test_a_job_that_cannot_be_announced_does_not_fail(tmp_path: Path, caplog):
    """The job's variables are the job's: logged, exit 0 (the broker is never tried)."""
    env = {**PROLOG_ENV, "SLURM_JOB_USER": "alice@corp"}
    with caplog.at_level(logging.ERROR, "powerd.jobhook.slurm"):
        code = run_hook("prolog", example_config(tmp_path), env, 0.0, hard_exit=False)
    assert code == EXIT_OK
    assert "prolog: startup not announced: job 981: user 'alice@corp'" in caplog.text


# --- powerd job check --------------------------------------------------------------------


def test_check_says_what_the_hook_will_announce(tmp_path: Path):
    path = example_config(tmp_path)
    result = CliRunner().invoke(powerd, ["job", "check", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert f"{path}: usable" in result.output
    assert (
        "broker: mqtts://powerd-broker.cluster.internal:8883, login powerd-slurm" in result.output
    )
    assert "topics: powerd/v1/default/jobs/USER/slurm-JOBID/phase" in result.output
    assert "priority: qos high -> high" in result.output
    assert "priority: partition debug -> low" in result.output
    assert "priority: otherwise -> normal" in result.output


def test_check_of_a_wrong_config_exits_1_with_what_to_fix(tmp_path: Path):
    path = tmp_path / "slurm.toml"
    path.write_text('[broker]\nurl = "mqtt://x@localhost"\n[priority]\nqos.high = "urgent"\n')
    result = CliRunner().invoke(powerd, ["job", "check"], env={"POWERD_SLURM_CONFIG": str(path)})
    assert result.exit_code == 1
    assert f"Error: {path}: priority.qos.high must be one of" in result.output
