"""The controller's configuration file: defaults, every key, errors that name file and key."""

from __future__ import annotations

import dataclasses
import re
import socket
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from policies import PolicySettings
from powerd.configfile import ConfigError
from powerd.controller.config import (
    _TIMING_KEYS,
    TAKEOVER_MARGIN_S,
    ControllerConfig,
    RecorderConfig,
    load_controller_config,
)
from powerd.controller.core import ControllerSettings
from tests.support.config_files import with_broker_files


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "controller.toml"
    path.write_text(text, encoding="utf-8")
    return path


# --- defaults and every key -------------------------------------------------------------


def test_no_file_means_the_defaults() -> None:
    config = load_controller_config(None)
    assert config == ControllerConfig(name=config.name)
    assert config.name == socket.gethostname().split(".")[0]
    assert config.cluster == "default"
    assert (config.cycle_s, config.stale_after_s, config.ack_timeout_s) == (1.0, 5.0, 3.0)
    assert config.broker.display == "mqtt://localhost:1883"
    assert config.policy == PolicySettings()
    assert config.recorder == RecorderConfig()


def test_an_empty_file_means_the_defaults(tmp_path: Path) -> None:
    config = load_controller_config(write(tmp_path, ""))
    assert dataclasses.replace(config, source="<defaults>") == load_controller_config(None)
    assert config.source == str(tmp_path / "controller.toml")


FULL = """
[controller]
name = "ctl-a"
cluster = "prod"
cycle_s = 0.5
heartbeat_s = 0.5
stale_after_s = 4
ack_timeout_s = 2
command_ttl_s = 20
takeover_after_s = 6
epoch_discovery_s = 2
infer_phases = false
infer_window_s = 60
agent_comm_clock = false
announced_live_s = 30
ingest_share = 0.25
max_raises_per_s = 300

[broker]
url = "mqtts://broker.example:8884"
username = "ctl"
password_file = "/etc/powerd/pw"
ca_file = "/etc/powerd/ca.pem"
cert_file = "/etc/powerd/c.crt"
key_file = "/etc/powerd/c.key"
keepalive_s = 15
reconnect_min_s = 1
reconnect_max_s = 10

[policy]
uncap_step_fraction = 0.5
startup_cap_fraction = 0.4
comm_clock_lock = false
hold_floor_w_per_gpu = 250
uncap_min_step_w = 10
stage_headroom_fraction = 0.1

[recorder]
url = "influx+http://db:8086?org=o&bucket=b"
token_file = "/etc/powerd/token"
"""


def test_every_key_is_read(tmp_path: Path) -> None:
    config = load_controller_config(write(tmp_path, with_broker_files(tmp_path, FULL)))
    assert (config.name, config.cluster) == ("ctl-a", "prod")
    assert config.cycle_s == 0.5 and isinstance(config.stale_after_s, float)
    assert (config.heartbeat_s, config.stale_after_s, config.ack_timeout_s) == (0.5, 4.0, 2.0)
    assert (config.command_ttl_s, config.takeover_after_s, config.epoch_discovery_s) == (
        20.0,
        6.0,
        2.0,
    )
    assert config.infer_phases is False and config.infer_window_s == 60.0
    assert config.agent_comm_clock is False and config.announced_live_s == 30.0
    b = config.broker
    assert (b.host, b.port, b.tls, b.username) == ("broker.example", 8884, True, "ctl")
    assert (b.password_file, b.ca_file, b.cert_file, b.key_file) == (
        f"{tmp_path}/pw",
        f"{tmp_path}/ca.pem",
        f"{tmp_path}/c.crt",
        f"{tmp_path}/c.key",
    )
    assert (b.keepalive_s, b.reconnect_min_s, b.reconnect_max_s) == (15.0, 1.0, 10.0)
    assert config.policy == PolicySettings(
        uncap_step_fraction=0.5,
        startup_cap_fraction=0.4,
        comm_clock_lock=False,
        hold_floor_w_per_gpu=250.0,
        uncap_min_step_w=10.0,
        stage_headroom_fraction=0.1,
    )
    assert config.recorder == RecorderConfig(
        url="influx+http://db:8086?org=o&bucket=b", token_file="/etc/powerd/token"
    )


def test_settings_hand_the_core_what_it_needs(tmp_path: Path) -> None:
    config = load_controller_config(write(tmp_path, with_broker_files(tmp_path, FULL)))
    assert config.settings() == ControllerSettings(
        cycle_s=0.5,
        stale_after_s=4.0,
        ack_timeout_s=2.0,
        command_ttl_s=20.0,
        infer_phases=False,
        infer_window_s=60.0,
        max_raises_per_cycle=150,  # 300 a second, 0.5 s cycles
        policy=config.policy,
        agent_comm_clock=False,
        announced_live_s=30.0,
    )
    assert config.ingest_share == 0.25


def test_recorder_file(tmp_path: Path) -> None:
    config = load_controller_config(write(tmp_path, '[recorder]\nfile = "/var/x.lp"\n'))
    assert config.recorder == RecorderConfig(file="/var/x.lp")


def test_recorder_file_rotation_reaches_the_file_recorder(tmp_path: Path) -> None:
    from powerd.controller.app import open_configured_recorder
    from powerd.recorder import FileRecorder

    lp = tmp_path / "t.lp"
    text = f'[recorder]\nfile = "{lp}"\nfile_max_mb = 2.5\nfile_keep = 7\n'
    config = load_controller_config(write(tmp_path, text))
    assert (config.recorder.file_max_mb, config.recorder.file_keep) == (2.5, 7)
    recorder = open_configured_recorder(config)
    assert isinstance(recorder, FileRecorder)
    assert (recorder.max_bytes, recorder.keep) == (2_500_000, 7)
    recorder.close()
    never = load_controller_config(write(tmp_path, f'[recorder]\nfile = "{lp}"\nfile_max_mb = 0\n'))
    recorder = open_configured_recorder(never)
    assert isinstance(recorder, FileRecorder) and recorder.max_bytes is None
    recorder.close()


# --- command-line overrides ---------------------------------------------------------------


def test_overrides_replace_what_is_given_and_keep_the_rest(tmp_path: Path) -> None:
    config = load_controller_config(write(tmp_path, with_broker_files(tmp_path, FULL)))
    changed = config.with_overrides(
        broker="mqtt://other:1999", cluster="lab", name=None, cycle_s=None
    )
    assert (changed.broker.host, changed.broker.port, changed.broker.tls) == ("other", 1999, False)
    assert changed.broker.username == "ctl"  # kept from the file
    assert changed.cluster == "lab" and changed.name == "ctl-a" and changed.cycle_s == 0.5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"broker": "http://h"}, "--broker"),
        ({"broker": "mqtt://user:secret@h"}, "--broker"),
        ({"cycle_s": 0.0}, "command line: controller.cycle_s"),
        ({"cycle_s": 10.0}, "command line: controller.stale_after_s"),  # now < 2 cycles
        ({"cluster": "no/slash"}, "command line: cluster name"),
        ({"name": ""}, "command line: controller name"),
    ],
)
def test_bad_overrides_say_command_line(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_controller_config(None).with_overrides(**overrides)


# --- every error names the file and the key -----------------------------------------------

ERRORS = [
    # not TOML, unknown sections and keys
    pytest.param("[controller\ncycle_s = 1", "not valid TOML", id="not-toml"),
    pytest.param("[controler]\ncycle_s = 1", "controler", id="unknown-section"),
    pytest.param("[controller]\ncycle = 1", "'cycle'", id="unknown-key"),
    pytest.param("[broker]\nhost = 'x'", "'host'", id="unknown-broker-key"),
    pytest.param("[policy]\nuncap_step = 0.1", "'uncap_step'", id="unknown-policy-key"),
    pytest.param("[recorder]\nbucket = 'b'", "'bucket'", id="unknown-recorder-key"),
    pytest.param("controller = 1", "[controller] must be a table", id="section-not-table"),
    # wrong types
    pytest.param('[controller]\ncycle_s = "1"', "controller.cycle_s", id="cycle-str"),
    pytest.param("[controller]\ncycle_s = true", "controller.cycle_s", id="cycle-bool"),
    pytest.param("[controller]\nname = 5", "controller.name", id="name-int"),
    pytest.param("[controller]\ncluster = []", "controller.cluster", id="cluster-list"),
    pytest.param('[controller]\ninfer_phases = "yes"', "controller.infer_phases", id="infer-str"),
    pytest.param("[policy]\ncomm_clock_lock = 1", "policy.comm_clock_lock", id="lock-int"),
    pytest.param('[policy]\nuncap_step_fraction = "x"', "policy.uncap_step_fraction", id="pol-str"),
    pytest.param("[recorder]\nurl = 8086", "recorder.url", id="url-int"),
    pytest.param("[recorder]\nfile_max_mb = -1", "recorder.file_max_mb", id="max-mb-negative"),
    pytest.param("[recorder]\nfile_keep = 1.5", "recorder.file_keep", id="keep-fraction"),
    pytest.param("[recorder]\nfile_keep = -1", "recorder.file_keep", id="keep-negative"),
    pytest.param("[broker]\nurl = 1883", "broker.url", id="broker-url-int"),
    # not finite
    pytest.param("[controller]\nstale_after_s = nan", "controller.stale_after_s", id="nan"),
    pytest.param("[controller]\ncommand_ttl_s = inf", "controller.command_ttl_s", id="inf"),
    pytest.param("[policy]\nuncap_min_step_w = inf", "policy.uncap_min_step_w", id="pol-inf"),
    # out of range
    pytest.param("[controller]\ncycle_s = 0.01", "controller.cycle_s", id="cycle-small"),
    pytest.param("[controller]\ncycle_s = 61", "controller.cycle_s", id="cycle-big"),
    pytest.param("[controller]\ncycle_s = -1", "controller.cycle_s", id="cycle-negative"),
    pytest.param("[controller]\nheartbeat_s = 0", "controller.heartbeat_s", id="heartbeat-0"),
    pytest.param("[controller]\nstale_after_s = 1.5", "controller.stale_after_s", id="stale"),
    pytest.param("[controller]\nack_timeout_s = 0", "controller.ack_timeout_s", id="ack-0"),
    pytest.param("[controller]\nack_timeout_s = -3", "controller.ack_timeout_s", id="ack-neg"),
    pytest.param("[controller]\ncommand_ttl_s = 3", "controller.command_ttl_s", id="ttl"),
    pytest.param(
        "[controller]\ntakeover_after_s = 2", "controller.takeover_after_s", id="takeover"
    ),
    pytest.param("[controller]\nepoch_discovery_s = 31", "controller.epoch_discovery_s", id="disc"),
    pytest.param("[controller]\ninfer_window_s = 1", "controller.infer_window_s", id="window"),
    pytest.param("[controller]\ningest_share = 0", "controller.ingest_share", id="share-0"),
    pytest.param("[controller]\ningest_share = 1.5", "controller.ingest_share", id="share-big"),
    pytest.param("[controller]\nmax_raises_per_s = 0", "controller.max_raises_per_s", id="raise"),
    pytest.param("[policy]\nuncap_step_fraction = 2", "uncap_step_fraction", id="pol-range"),
    pytest.param("[policy]\nhold_floor_w_per_gpu = -1", "hold_floor_w_per_gpu", id="floor"),
    pytest.param("[broker]\nkeepalive_s = 0", "broker.keepalive_s", id="keepalive"),
    pytest.param(
        "[broker]\nreconnect_min_s = 5\nreconnect_max_s = 1", "broker.reconnect_min_s", id="reconn"
    ),
    # names and combinations
    pytest.param('[controller]\nname = "ctl a"', "controller name", id="name-space"),
    pytest.param('[controller]\ncluster = "a/b"', "cluster name", id="cluster-slash"),
    pytest.param('[broker]\nurl = "mqtt://u:pw@h"', "broker.url", id="password-in-url"),
    pytest.param(
        '[recorder]\nurl = "http://db:8086?org=o&bucket=b"\nfile = "/x.lp"',
        "recorder.url or recorder.file",
        id="url-and-file",
    ),
]


@pytest.mark.parametrize(("text", "message"), ERRORS)
def test_error_names_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_controller_config(path)
    assert str(caught.value).startswith(f"{path}: "), caught.value
    assert message in str(caught.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_controller_config(tmp_path / "nope.toml")


# --- the example shipped with the package -----------------------------------------------


def example_text() -> str:
    return resources.files("powerd.data").joinpath("controller.example.toml").read_text("utf-8")


def test_shipped_example_loads_and_shows_the_defaults(tmp_path: Path) -> None:
    config = load_controller_config(write(tmp_path, example_text()))
    defaults = load_controller_config(None)
    # everything it sets is the default but the key it must name (relative to the file);
    # what it leaves commented out is unset
    assert config.signing_key == str(tmp_path / "controller.key")
    assert dataclasses.replace(config, source=defaults.source, signing_key=None) == defaults


def test_shipped_example_values_are_the_defaults_key_by_key() -> None:
    raw = tomllib.loads(example_text())
    defaults = ControllerConfig()
    for key, value in raw["controller"].items():
        assert getattr(defaults, key) == value, f"controller.{key}"
    for key, value in raw["policy"].items():
        assert getattr(defaults.policy, key) == value, f"policy.{key}"
    for key, value in raw["broker"].items():
        if key != "url":
            assert getattr(defaults.broker, key) == value, f"broker.{key}"
    assert raw.get("recorder", {}) == {}  # no recorder unless asked for
    assert raw["jobs"] == {
        "default_priority_max": defaults.default_job_priority_max,
        "accept_unowned": defaults.accept_unowned_jobs,
    }


def test_shipped_example_documents_every_key() -> None:
    text = example_text()
    policy_keys = [f.name for f in dataclasses.fields(PolicySettings)]
    known = {
        "controller": ["name", "cluster", "infer_phases", *_TIMING_KEYS],
        "broker": [
            "url",
            "username",
            "password_file",
            "ca_file",
            "cert_file",
            "key_file",
            "keepalive_s",
            "reconnect_min_s",
            "reconnect_max_s",
        ],
        "policy": policy_keys,
        "recorder": ["url", "token_file", "file", "file_max_mb", "file_keep"],
        "trust": ["signing_key", "controller_keys"],
        "jobs": ["priority_max", "default_priority_max", "accept_unowned"],
    }
    for section, keys in known.items():
        assert re.search(rf"^\[{section}\]", text, re.M), f"section [{section}] missing"
        for key in keys:
            assert re.search(rf"^(# )?{key} = ", text, re.M), f"{section}.{key} not documented"


def test_every_documented_key_is_known(tmp_path: Path) -> None:
    """Uncommenting any one example line gives a file that still loads."""
    lines = with_broker_files(tmp_path, example_text()).splitlines()
    for i, line in enumerate(lines):
        if not re.match(r"^# [a-z_]+ = ", line):
            continue
        text = "\n".join([*lines[:i], line[2:], *lines[i + 1 :]])
        load_controller_config(write(tmp_path, text))


def test_a_standby_must_take_over_before_the_agents_fall_to_failsafe(tmp_path: Path) -> None:
    """Issue 12, finding 6: a standby took over after 9.2-10.2 s, the agents' failsafe came
    at 10 s. Takeover + a cycle + a heartbeat must end TAKEOVER_MARGIN_S before it."""
    with pytest.raises(ConfigError, match="before the agents fall to failsafe"):
        load_controller_config(write(tmp_path, "[controller]\ntakeover_after_s = 9.0\n"))
    ok = load_controller_config(
        write(tmp_path, "[controller]\ntakeover_after_s = 9.0\nagent_failsafe_after_s = 12.0\n")
    )
    assert ok.takeover_after_s + ok.cycle_s + ok.heartbeat_s + TAKEOVER_MARGIN_S <= 12.0
    defaults = load_controller_config(None)
    assert (
        defaults.takeover_after_s + defaults.cycle_s + defaults.heartbeat_s + TAKEOVER_MARGIN_S
        <= defaults.agent_failsafe_after_s
    )


def test_jobs_section_sets_owners_allowances(tmp_path: Path) -> None:
    config = load_controller_config(
        write(
            tmp_path,
            '[jobs]\npriority_max = { alice = "high", batch = "low" }\n'
            'default_priority_max = "normal"\naccept_unowned = false\n',
        )
    )
    settings = config.settings()
    assert settings.job_priority_allowed("alice", "high")
    assert not settings.job_priority_allowed("bob", "high")
    assert settings.job_priority_allowed("bob", "normal")
    assert not settings.job_priority_allowed("batch", "normal")
    assert not settings.accept_unowned_jobs
    for text, says in (
        ('[jobs]\ndefault_priority_max = "urgent"\n', "jobs.default_priority_max"),
        ('[jobs]\npriority_max = { alice = "top" }\n', "jobs.priority_max.alice"),
        ('[jobs]\npriority_max = { "a/b" = "low" }\n', "not a valid owner"),
        ("[jobs]\npriority_max = 3\n", "jobs.priority_max must be a table"),
    ):
        with pytest.raises(ConfigError, match=re.escape(says)):
            load_controller_config(write(tmp_path, text))


# --- the broker's files exist when the config loads (issue 12, point 6) -----------------


@pytest.mark.parametrize("key", ["password_file", "ca_file", "cert_file", "key_file"])
def test_a_missing_broker_file_is_an_error_at_load_time(tmp_path: Path, key: str) -> None:
    """A missing password_file was found only at connect time, then retried for ever."""
    missing = tmp_path / "no-such-file"
    path = write(tmp_path, f'[broker]\nurl = "mqtts://ctl@h"\n{key} = "{missing}"\n')
    with pytest.raises(ConfigError) as caught:
        load_controller_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: broker.{key}: "), message
    assert str(missing) in message and "No such file" in message


def test_broker_files_that_exist_load_and_the_password_is_read_at_connect_time(
    tmp_path: Path,
) -> None:
    password = tmp_path / "pw"
    password.write_text("old\n")
    config = load_controller_config(
        write(tmp_path, f'[broker]\nurl = "mqtt://ctl@h"\npassword_file = "{password}"\n')
    )
    password.write_text("rotated\n")  # a rotated password is picked up when connecting
    assert config.broker.client_kwargs()["password"] == "rotated"


# --- keys by role (issue 34) ------------------------------------------------------------


def role_keys(tmp_path: Path) -> dict[str, Path]:
    """A controller pair, a peer controller's, a coordinator's and an operator's .pub."""
    from powerd.signing import generate_key_files

    own_key, own_pub = generate_key_files(tmp_path / "controller")
    paths = {"own.key": own_key, "own.pub": own_pub}
    for role in ("peer", "coordinator", "operator"):
        paths[f"{role}.pub"] = generate_key_files(tmp_path / role)[1]
    return paths


@pytest.mark.parametrize(
    ("trust", "first", "second"),
    [
        # our own key could sign site limits, or (a leaf's) its own grants
        ({"operator_keys": "own.pub"}, "trust.signing_key", "trust.operator_keys"),
        ({"coordinator_keys": "own.pub"}, "trust.signing_key", "trust.coordinator_keys"),
        # a peer controller's key as a leaf's coordinator key, or as an operator's
        (
            {"controller_keys": "peer.pub", "coordinator_keys": "peer.pub"},
            "trust.controller_keys",
            "trust.coordinator_keys",
        ),
        (
            {"controller_keys": "peer.pub", "operator_keys": "peer.pub"},
            "trust.controller_keys",
            "trust.operator_keys",
        ),
        (
            {"coordinator_keys": "coordinator.pub", "operator_keys": "coordinator.pub"},
            "trust.coordinator_keys",
            "trust.operator_keys",
        ),
    ],
)
def test_one_key_in_two_roles_stops_the_controller_naming_both(
    tmp_path: Path, trust: dict[str, str], first: str, second: str
) -> None:
    paths = role_keys(tmp_path)
    lines = [f'signing_key = "{paths["own.key"]}"']
    lines += [f'{key} = ["{paths[name]}"]' for key, name in trust.items()]
    config = load_controller_config(write(tmp_path, "[trust]\n" + "\n".join(lines) + "\n"))
    signer = config.signer()
    with pytest.raises(ConfigError) as refused:
        config.verifier(signer)  # what the service builds first: it stops there
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'controller.toml'}: one key (id ")
    assert f"{first} (" in message and f"{second} (" in message and "two roles" in message
    assert str(paths[list(trust.values())[-1]]) in message


def test_keys_each_in_its_own_role_load(tmp_path: Path) -> None:
    """Our own key among the peer controllers' is one role: fine."""
    paths = role_keys(tmp_path)
    config = load_controller_config(
        write(
            tmp_path,
            f'[trust]\nsigning_key = "{paths["own.key"]}"\n'
            f'controller_keys = ["{paths["own.pub"]}", "{paths["peer.pub"]}"]\n'
            f'coordinator_keys = ["{paths["coordinator.pub"]}"]\n'
            f'operator_keys = ["{paths["operator.pub"]}"]\n',
        )
    )
    verifier = config.verifier(config.signer())
    assert len(verifier.keys) == 2
    assert config.operator_verifier() is not None and config.grant_verifier() is not None


def test_a_trusted_key_others_may_write_stops_the_controller(tmp_path: Path) -> None:
    import os

    paths = role_keys(tmp_path)
    os.chmod(paths["operator.pub"], 0o666)
    config = load_controller_config(
        write(
            tmp_path,
            f'[trust]\nsigning_key = "{paths["own.key"]}"\n'
            f'operator_keys = ["{paths["operator.pub"]}"]\n',
        )
    )
    with pytest.raises(ConfigError, match=f"chmod go-w {re.escape(str(paths['operator.pub']))}"):
        config.operator_verifier()
    with pytest.raises(ConfigError, match=r"trust\.operator_keys: .*mode 0666"):
        config.verifier(config.signer())
