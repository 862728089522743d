"""Bad arguments raise ValueError at once, with a message that says what to fix;
configuration from the environment, and the module-level convenience."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

import powerd.jobhook as jobhook
from powerd.jobhook import PhaseReporter, expand_hostlist
from powerd.protocol import PhaseEvent, Topics, decode
from tests.support.brokers import TEST_USER, MqttProbe


def off(**kwargs: object) -> PhaseReporter:
    """A reporter that checks its arguments but never touches the network."""
    kwargs.setdefault("job", "job-1")
    return PhaseReporter(None, enabled=False, **kwargs)  # type: ignore[arg-type]


# --- constructor arguments --------------------------------------------------------


@pytest.mark.parametrize("job", ["", "has space", "-leading-dash", "a/b", "x" * 65, "job\n"])
def test_invalid_job_name(job):
    with pytest.raises(ValueError, match=r"invalid job name .*1 to 64 characters"):
        PhaseReporter("mqtt://127.0.0.1:1", job)


@pytest.mark.parametrize("job", [None, 42, b"job"])
def test_job_name_must_be_a_string(job):
    with pytest.raises(ValueError, match="job name must be a string"):
        PhaseReporter("mqtt://127.0.0.1:1", job)


def test_invalid_priority():
    with pytest.raises(ValueError, match="priority must be one of high, normal, low, not 'urgent'"):
        off(priority="urgent")
    with pytest.raises(ValueError, match="priority must be one of"):
        off(priority=None)


def test_invalid_cluster_and_nodes():
    with pytest.raises(ValueError, match="invalid cluster name 'lab/a'"):
        off(cluster="lab/a")
    with pytest.raises(ValueError, match="invalid node name 'r01 n04'"):
        off(nodes=["r01-n03", "r01 n04"])
    with pytest.raises(ValueError, match="nodes must be a list of node names, not the string"):
        off(nodes="r01-n03")
    with pytest.raises(ValueError, match="nodes must be a list"):
        off(nodes=7)
    with pytest.raises(ValueError, match="do not fit in one phase payload"):
        off(nodes=[f"n{i:06d}x" for i in range(10_000)])  # not even as a host list


def test_a_long_node_list_is_announced_as_a_host_list():
    """A 150 MW job's 10,368 nodes are 176 KB as a list, over the 64 KiB a payload may be:
    the reporter sends them as a Slurm-style host list, which decodes to the same names."""
    nodes = [
        f"row{r:02d}-k{k:02d}-n{i:02d}"
        for r in range(1, 9)
        for k in range(1, 73)
        for i in range(1, 19)
    ]
    reporter = off(nodes=nodes)
    event = decode(PhaseEvent, reporter._encode("startup", None, reporter.nodes))
    assert event.nodes is None and event.hostlist is not None
    assert event.node_names() == nodes
    short = off(nodes=nodes[:100])  # a short list stays a list, as every controller reads it
    event = decode(PhaseEvent, short._encode("startup", None, short.nodes))
    assert event.nodes == nodes[:100] and event.hostlist is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"queue_size": 0}, "queue_size must be an integer >= 1"),
        ({"queue_size": 2.5}, "queue_size must be an integer >= 1"),
        ({"flush_timeout_s": -1}, "flush_timeout_s must be a finite number >= 0"),
        ({"flush_timeout_s": "2"}, "flush_timeout_s must be a number of seconds"),
        ({"reconnect_max_s": 0}, "reconnect_max_s must be > 0"),
        ({"client_id": 5}, "client_id must be a string"),
    ],
)
def test_invalid_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        off(**kwargs)


def test_bad_arguments_raise_before_any_thread_starts(monkeypatch):
    started = []
    monkeypatch.setattr(jobhook.threading.Thread, "start", lambda self: started.append(self))
    with pytest.raises(ValueError):
        PhaseReporter("mqtt://127.0.0.1:1", "job 1")
    assert started == []


# --- call arguments, checked whether or not this process publishes ------------------


@pytest.mark.parametrize("enabled", [True, False])
def test_unknown_phase(enabled):
    reporter = PhaseReporter("mqtt://127.0.0.1:9", "job-1", enabled=enabled, flush_timeout_s=0)
    try:
        with pytest.raises(ValueError, match=r"unknown phase 'training': use one of startup, "):
            reporter.set_phase("training")
        with pytest.raises(ValueError, match=r"unknown phase 'Compute'"):
            reporter.set_phase("Compute")
        # raised when the block is made, before it is entered
        with pytest.raises(ValueError, match=r"unknown phase 'saving': use one of compute, "):
            reporter.phase("saving")
        with pytest.raises(ValueError, match="cannot be a `with` block: use startup"):
            reporter.phase("startup")
        with pytest.raises(ValueError, match="cannot be a `with` block"):
            reporter.phase("shutdown")
        with pytest.raises(ValueError, match="unknown phase 'later'"):
            reporter.phase("eval", then="later")
        assert reporter.current_phase is None  # nothing was announced
    finally:
        reporter.close()


@pytest.mark.parametrize("expected_s", [-1, float("nan"), float("inf"), "45", True])
def test_invalid_expected_duration(expected_s):
    reporter = off()
    with pytest.raises(ValueError, match="expected_s must be"):
        reporter.set_phase("checkpoint", expected_s=expected_s)
    with pytest.raises(ValueError, match="expected_s must be"):
        reporter.phase("checkpoint", expected_s=expected_s)
    with pytest.raises(ValueError, match="expected_s must be"):
        reporter.startup(expected_s=expected_s)


def test_startup_with_invalid_nodes():
    reporter = off(nodes=["r01-n03"])
    with pytest.raises(ValueError, match="invalid node name"):
        reporter.startup(nodes=["ok", "not ok"])
    assert reporter.nodes == ["r01-n03"]


def test_disabled_reporter_tracks_the_phase_and_sends_nothing():
    reporter = off()
    reporter.startup()
    with reporter.phase("checkpoint"):
        assert reporter.current_phase == "checkpoint"
    assert reporter.current_phase == "compute"
    stats = reporter.stats()
    assert not stats.enabled and not reporter.enabled
    assert (stats.queued, stats.sent, stats.dropped) == (0, 0, 0)
    assert reporter.flush(0)
    reporter.shutdown()
    assert reporter.current_phase == "shutdown"


# --- the environment ------------------------------------------------------------------


def test_from_env_reads_every_variable():
    reporter = PhaseReporter.from_env(
        {
            "POWERD_BROKER": "mqtt://127.0.0.1:1",
            "POWERD_JOB": "llama-70b-pretrain",
            "POWERD_CLUSTER": "lab-a",
            "POWERD_PRIORITY": "high",
            "POWERD_NODES": "r01-n[03-04],r02-n01",
            "RANK": "1",  # not rank 0: checked, but silent
        }
    )
    assert (reporter.job, reporter.cluster, reporter.priority) == (
        "llama-70b-pretrain",
        "lab-a",
        "high",
    )
    assert reporter.nodes == ["r01-n03", "r01-n04", "r02-n01"]
    assert reporter.topic == "powerd/v1/lab-a/jobs/llama-70b-pretrain/phase"
    assert not reporter.enabled


def test_from_env_rank_zero_publishes_and_overrides_win():
    env = {"POWERD_BROKER": "mqtt://127.0.0.1:9", "POWERD_JOB": "j", "SLURM_PROCID": "0"}
    reporter = PhaseReporter.from_env(env, flush_timeout_s=0)
    try:
        assert reporter.enabled
    finally:
        reporter.close()
    assert not PhaseReporter.from_env(env, enabled=False).enabled
    assert not PhaseReporter.from_env({**env, "RANK": "3", "SLURM_PROCID": "0"}).enabled


def test_from_env_without_a_broker_is_off():
    reporter = PhaseReporter.from_env({})
    assert not reporter.enabled
    assert reporter.job == "unnamed-job"
    reporter.set_phase("compute")  # a no-op, so the hook can stay in a script
    with pytest.raises(ValueError):
        reporter.set_phase("nonsense")  # still checked


def test_from_env_job_defaults_to_the_slurm_job():
    reporter = PhaseReporter.from_env(
        {"POWERD_BROKER": "mqtt://h", "SLURM_JOB_ID": "81234"}, enabled=False
    )
    assert reporter.job == "slurm-81234"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"POWERD_BROKER": "mqtt://h"}, "POWERD_BROKER is set but POWERD_JOB is not"),
        ({"POWERD_JOB": "a job"}, "POWERD_JOB: invalid job name 'a job'"),
        ({"POWERD_PRIORITY": "urgent"}, "POWERD_PRIORITY: priority must be one of"),
        ({"POWERD_CLUSTER": "x/y"}, "POWERD_CLUSTER: invalid cluster name"),
        ({"POWERD_NODES": "r01-n[03-"}, "POWERD_NODES: unbalanced"),
        ({"POWERD_NODES": "r01 n03,bad!"}, "POWERD_NODES: invalid node name 'bad!'"),
        ({"RANK": "zero"}, "RANK='zero' is not an integer rank"),
    ],
)
def test_from_env_rejects_bad_values_naming_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        PhaseReporter.from_env(env)


def test_node_defaults():
    slurm = PhaseReporter.from_env({"SLURM_JOB_NODELIST": "gpu[1-2,10]", "RANK": "1"})
    assert slurm.nodes == ["gpu1", "gpu2", "gpu10"]
    host = socket.gethostname().split(".")[0]
    single = PhaseReporter.from_env({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"})
    assert single.nodes == [host]
    # several nodes and no list: omitted, the controller infers them from telemetry
    multi = PhaseReporter.from_env({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"})
    assert multi.nodes is None


@pytest.mark.parametrize(
    ("spec", "hosts"),
    [
        ("r01-n03", ["r01-n03"]),
        ("a,b c", ["a", "b", "c"]),
        ("r01-n[03-05,07]", ["r01-n03", "r01-n04", "r01-n05", "r01-n07"]),
        ("r[1-2]-n[08-09]", ["r1-n08", "r1-n09", "r2-n08", "r2-n09"]),
        ("gpu[9-10],login", ["gpu9", "gpu10", "login"]),
    ],
)
def test_expand_hostlist(spec, hosts):
    assert expand_hostlist(spec) == hosts


@pytest.mark.parametrize("spec", ["n[1-", "n]1", "n[a-b]", "n[5-3]", "n[[1]]"])
def test_expand_hostlist_rejects(spec):
    with pytest.raises(ValueError):
        expand_hostlist(spec)


# --- the module-level convenience -------------------------------------------------------


@pytest.fixture
def default_reporter() -> Iterator[None]:
    jobhook.set_default_reporter(None)
    yield
    previous = jobhook.set_default_reporter(None)
    if previous is not None:
        previous.close(timeout_s=1.0)


async def test_module_level_phase_configured_from_the_environment(
    mosquitto, monkeypatch, default_reporter
):
    monkeypatch.setenv("POWERD_BROKER", mosquitto.url)
    monkeypatch.setenv("POWERD_JOB", "env-job")
    monkeypatch.setenv("POWERD_CLUSTER", "lab-b")
    monkeypatch.setenv("POWERD_PRIORITY", "low")
    monkeypatch.setenv("POWERD_NODES", "r07-n[1-2]")
    monkeypatch.setenv("RANK", "0")
    from powerd.jobhook import phase, set_phase, shutdown, startup

    topic = Topics("lab-b").phase("env-job", owner=TEST_USER)
    async with MqttProbe(mosquitto.port, [topic]) as probe:
        startup()
        with phase("checkpoint", expected_s=5):
            pass
        set_phase("eval")
        await asyncio.to_thread(shutdown)
        events = []
        position = 0
        for _ in range(5):
            message = await probe.expect(topic, after=position)
            position = probe.messages.index(message) + 1
            events.append(decode(PhaseEvent, message.payload, "env-job"))
    assert [e.phase for e in events] == ["startup", "checkpoint", "compute", "eval", "shutdown"]
    assert events[0].nodes == ["r07-n1", "r07-n2"]
    assert all(e.priority == "low" for e in events)
    assert jobhook.get_reporter().stats().closed


def test_module_level_phase_on_other_ranks_is_silent_but_checked(monkeypatch, default_reporter):
    monkeypatch.setenv("POWERD_BROKER", "mqtt://127.0.0.1:1")
    monkeypatch.setenv("POWERD_JOB", "env-job")
    monkeypatch.setenv("RANK", "3")
    with jobhook.phase("checkpoint"):
        pass
    assert not jobhook.get_reporter().enabled
    assert jobhook.get_reporter().current_phase == "compute"
    with pytest.raises(ValueError, match="unknown phase"):
        jobhook.phase("bogus")


def test_module_level_config_error_is_raised_on_first_use(monkeypatch, default_reporter):
    monkeypatch.setenv("POWERD_BROKER", "mqtt://127.0.0.1:1")
    monkeypatch.delenv("POWERD_JOB", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ValueError, match="POWERD_JOB"):
        jobhook.set_phase("compute")


# --- owners ---------------------------------------------------------------------------


def test_the_broker_login_owns_the_job_and_picks_the_owned_topic():
    """Issue 12: phases go to jobs/{owner}/{job}/phase, which the shipped ACL binds to the
    login, so another login cannot speak for this job."""
    reporter = PhaseReporter("mqtt://alice@127.0.0.1:1", "job-1", cluster="lab")
    try:
        assert reporter.owner == "alice"
        assert reporter.topic == "powerd/v1/lab/jobs/alice/job-1/phase"
        assert Topics("lab").job_of(reporter.topic) == ("alice", "job-1")
    finally:
        reporter.close()
    named = off(owner="team-b")
    assert named.topic == "powerd/v1/default/jobs/team-b/job-1/phase"
    assert off().topic == "powerd/v1/default/jobs/job-1/phase"  # no login, no owner: unowned
    with pytest.raises(ValueError, match="owner"):
        off(owner="a/b")


def test_the_owner_may_come_from_the_environment():
    env = {"POWERD_BROKER": "mqtt://127.0.0.1:1", "POWERD_JOB": "j", "POWERD_JOB_OWNER": "bob"}
    reporter = PhaseReporter.from_env(env, enabled=False)
    assert reporter.topic == "powerd/v1/default/jobs/bob/j/phase"
    with pytest.raises(ValueError, match="POWERD_JOB_OWNER"):
        PhaseReporter.from_env({**env, "POWERD_JOB_OWNER": "no spaces"}, enabled=False)
