"""load_config and AgentConfig.with_overrides: defaults, a full file, every error names file and key."""

from __future__ import annotations

import re
import socket
from importlib import resources
from pathlib import Path

import pytest

from powerd.agent import config as config_module
from powerd.agent.config import AgentConfig, FailsafeConfig, load_config
from powerd.configfile import ConfigError
from powerd.mqtt.url import BrokerSettings
from powerd.topology import load_budgets
from powerd.vocabulary import DEFAULT_FAILSAFE_FRACTION
from tests.support.config_files import with_broker_files


def write(tmp_path: Path, text: str, name: str = "agent.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_error(tmp_path: Path, text: str) -> tuple[Path, str]:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return path, str(info.value)


# --- defaults ------------------------------------------------------------------


def test_no_file_gives_defaults_with_short_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-node-7.dc1.example.com")
    config = load_config(None)
    assert config.node == "gpu-node-7"
    assert config.cluster == "default"
    assert config.mode == "controlled"
    assert config.period_s == 1.0
    assert config.failsafe_after_s == 10.0
    assert config.on_exit == "keep"
    assert config.simulate is None
    assert config.gpu_indices is None
    assert config.broker == BrokerSettings(host="localhost", port=1883)
    assert config.failsafe == FailsafeConfig()
    assert config.failsafe.fraction == DEFAULT_FAILSAFE_FRACTION == 0.8
    assert config.failsafe.cap_w is None
    assert config.source == "<defaults>"


def test_no_file_with_unusable_hostname_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "bad_host!name")
    with pytest.raises(ConfigError, match=r"agent\.node or --node"):
        load_config(None)


def test_empty_file_gives_defaults_and_records_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "n01")
    path = write(tmp_path, "")
    config = load_config(path)
    assert config.node == "n01"
    assert config.source == str(path)
    assert config.failsafe == FailsafeConfig()
    assert config.broker == BrokerSettings(host="localhost", port=1883)


def test_node_from_file_wins_over_hostname(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "bad_host!name")
    config = load_config(write(tmp_path, '[agent]\nnode = "r01-n03"\n'))
    assert config.node == "r01-n03"


# --- a full file ------------------------------------------------------------

FULL = """
[agent]
node = "r07-n12"
cluster = "prod.east"
mode = "local"
period_s = 0.5
failsafe_after_s = 4
on_exit = "restore"
simulate = "8xGB200"
gpu_indices = [0, 2, 5]

[broker]
url = "mqtts://ops@broker.example.com:18883"
password_file = "/etc/powerd/pw"
ca_file = "/etc/powerd/ca.pem"
cert_file = "/etc/powerd/agent.crt"
key_file = "/etc/powerd/agent.key"
keepalive_s = 15
reconnect_min_s = 0.25
reconnect_max_s = 12.5

[failsafe]
cap_w = 900
fraction = 0.7

[failsafe.caps_w]
0 = 850.5
5 = 1000
"""


def test_full_file(tmp_path: Path) -> None:
    path = write(tmp_path, with_broker_files(tmp_path, FULL))
    config = load_config(path)
    assert config == AgentConfig(
        node="r07-n12",
        cluster="prod.east",
        mode="local",
        period_s=0.5,
        failsafe_after_s=4.0,
        on_exit="restore",
        simulate="8xGB200",
        gpu_indices=(0, 2, 5),
        broker=BrokerSettings(
            host="broker.example.com",
            port=18883,
            tls=True,
            username="ops",
            password_file=f"{tmp_path}/pw",
            ca_file=f"{tmp_path}/ca.pem",
            cert_file=f"{tmp_path}/agent.crt",
            key_file=f"{tmp_path}/agent.key",
            keepalive_s=15.0,
            reconnect_min_s=0.25,
            reconnect_max_s=12.5,
        ),
        failsafe=FailsafeConfig(cap_w=900.0, caps_w={0: 850.5, 5: 1000.0}, fraction=0.7),
        source=str(path),
    )
    # ints in TOML come back as floats where the field is a number
    assert isinstance(config.failsafe_after_s, float)
    assert isinstance(config.failsafe.caps_w[5], float)
    # per-index caps win over cap_w, cap_w over the fraction
    assert config.failsafe.cap_for(0, 1200.0) == 850.5
    assert config.failsafe.cap_for(1, 1200.0) == 900.0


def test_username_key_overrides_url_user(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, '[agent]\nnode="n1"\n[broker]\nurl="mqtt://a@h"\nusername="b"\n')
    )
    assert config.broker.username == "b"
    config = load_config(write(tmp_path, '[agent]\nnode="n1"\n[broker]\nurl="mqtt://a@h"\n'))
    assert config.broker.username == "a"


def test_fraction_only_failsafe(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[agent]\nnode="n1"\n[failsafe]\nfraction = 0.5\n'))
    assert config.failsafe.cap_w is None
    assert config.failsafe.cap_for(3, 700.0) == 350.0


# --- the example shipped with the package ------------------------------------


def example_text() -> str:
    return resources.files("powerd.data").joinpath("agent.example.toml").read_text("utf-8")


def test_shipped_example_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, example_text()))
    assert config.mode == "controlled"
    # the failsafe cap the shipped budgets files plan for their H100s: one source of truth
    for budgets in ("demo.toml", "tiny.toml"):
        topology = load_budgets(str(resources.files("powerd.data").joinpath("budgets", budgets)))
        h100 = [n for n in topology.servers if topology.server(n).model == "H100"]
        assert {topology.failsafe_cap_w(n) for n in h100} >= {config.failsafe.cap_w}
    assert config.failsafe.cap_for(0, 700.0) == 500.0
    # the trusted key file is named relative to the config file
    assert config.controller_keys == (str(tmp_path / "controller.pub"),)
    assert config.period_s <= config.failsafe_after_s
    assert config.broker.display == "mqtt://localhost:1883"


def test_shipped_example_documents_every_key() -> None:
    text = example_text()
    for section, keys in config_module._KNOWN.items():
        assert re.search(rf"^\[{section}\]", text, re.M), f"section [{section}] missing"
        for key in keys:
            # set, shown commented out, or (a table) given its own section
            pattern = rf"^(# )?{key} = |^\[{section}\.{key}\]"
            assert re.search(pattern, text, re.M), f"{section}.{key} not documented"


# --- every error names the file and the key ----------------------------------

ERRORS = [
    # not TOML
    pytest.param("[agent\nnode = 1", "not valid TOML", id="not-toml"),
    pytest.param("node = = 2", "not valid TOML", id="not-toml-2"),
    # unknown section / key / section that is not a table
    pytest.param('[brokr]\nurl = "mqtt://h"', "brokr", id="unknown-section"),
    pytest.param('[agent]\nnode_name = "x"', "node_name", id="unknown-key"),
    pytest.param("[failsafe]\ncap = 500", "'cap'", id="unknown-failsafe-key"),
    pytest.param("agent = 1", "[agent]", id="section-not-table"),
    # wrong types
    pytest.param("[agent]\nnode = 3", "agent.node", id="node-int"),
    pytest.param('[agent]\nperiod_s = "fast"', "agent.period_s", id="period-str"),
    pytest.param("[agent]\nperiod_s = true", "agent.period_s", id="period-bool"),
    pytest.param("[agent]\nmode = 1", "agent.mode", id="mode-int"),
    pytest.param("[agent]\nsimulate = 4", "agent.simulate", id="simulate-int"),
    pytest.param('[failsafe]\nfraction = "0.8"', "failsafe.fraction", id="fraction-str"),
    pytest.param("[failsafe]\ncaps_w = 500", "failsafe.caps_w", id="caps-not-table"),
    pytest.param("[failsafe.caps_w]\ngpu0 = 500", "failsafe.caps_w", id="caps-key-not-index"),
    pytest.param('[failsafe.caps_w]\n1 = "500"', "failsafe.caps_w.1", id="caps-value-str"),
    pytest.param("[broker]\nkeepalive_s = [30]", "broker.keepalive_s", id="keepalive-list"),
    pytest.param("[broker]\nurl = 1883", "broker.url", id="url-int"),
    # non-finite
    pytest.param("[agent]\nperiod_s = inf", "agent.period_s", id="period-inf"),
    pytest.param("[agent]\nfailsafe_after_s = nan", "agent.failsafe_after_s", id="after-nan"),
    pytest.param("[failsafe]\ncap_w = inf", "failsafe.cap_w", id="cap-inf"),
    pytest.param("[failsafe.caps_w]\n0 = -inf", "failsafe.caps_w.0", id="caps-inf"),
    pytest.param("[broker]\nreconnect_max_s = nan", "broker.reconnect_max_s", id="reconn-nan"),
    # names
    pytest.param('[agent]\nnode = "bad name"', "agent.node", id="node-space"),
    pytest.param('[agent]\nnode = "-r01"', "agent.node", id="node-leading-dash"),
    pytest.param(f'[agent]\nnode = "{"n" * 65}"', "agent.node", id="node-too-long"),
    pytest.param('[agent]\nnode = ""', "agent.node", id="node-empty"),
    pytest.param('[agent]\ncluster = "a/b"', "cluster", id="cluster-slash"),
    # enums
    pytest.param('[agent]\nmode = "auto"', "agent.mode", id="bad-mode"),
    pytest.param('[agent]\non_exit = "reset"', "agent.on_exit", id="bad-on-exit"),
    # ranges
    pytest.param("[agent]\nperiod_s = 0.01", "agent.period_s", id="period-too-short"),
    pytest.param(
        "[agent]\nperiod_s = 7200\nfailsafe_after_s = 8000", "agent.period_s", id="period-too-long"
    ),
    pytest.param(
        "[agent]\nperiod_s = 5\nfailsafe_after_s = 2",
        "agent.failsafe_after_s",
        id="failsafe-after-below-period",
    ),
    pytest.param(
        "[agent]\nfailsafe_after_s = 100000", "agent.failsafe_after_s", id="failsafe-after-huge"
    ),
    pytest.param("[failsafe]\ncap_w = 560000", "failsafe.cap_w", id="cap-in-mW"),
    pytest.param("[failsafe]\ncap_w = 0.56", "failsafe.cap_w", id="cap-in-kW"),
    pytest.param("[failsafe]\ncap_w = -100", "failsafe.cap_w", id="cap-negative"),
    pytest.param("[failsafe.caps_w]\n3 = 560000", "failsafe.caps_w.3", id="caps-in-mW"),
    pytest.param("[failsafe.caps_w]\n3 = 0.56", "failsafe.caps_w.3", id="caps-in-kW"),
    pytest.param("[failsafe]\nfraction = 80", "failsafe.fraction", id="fraction-percent"),
    pytest.param("[failsafe]\nfraction = 0", "failsafe.fraction", id="fraction-zero"),
    pytest.param("[failsafe]\nfraction = 1.5", "failsafe.fraction", id="fraction-over-one"),
    pytest.param(
        '[trust]\ncontroller_keys = "ctl.pub"', "trust.controller_keys", id="keys-not-a-list"
    ),
    pytest.param("[broker]\nkeepalive_s = 0", "broker.keepalive_s", id="keepalive-zero"),
    pytest.param("[broker]\nkeepalive_s = 70000", "broker.keepalive_s", id="keepalive-huge"),
    pytest.param(
        "[broker]\nreconnect_min_s = 10\nreconnect_max_s = 1",
        "broker.reconnect_min_s",
        id="reconnect-min-over-max",
    ),
    pytest.param("[broker]\nreconnect_min_s = 0", "broker.reconnect_min_s", id="reconnect-zero"),
    # gpu_indices
    pytest.param("[agent]\ngpu_indices = 0", "agent.gpu_indices", id="indices-int"),
    pytest.param('[agent]\ngpu_indices = [0, "1"]', "agent.gpu_indices", id="indices-str"),
    pytest.param("[agent]\ngpu_indices = [0, -1]", "agent.gpu_indices", id="indices-negative"),
    pytest.param("[agent]\ngpu_indices = [true]", "agent.gpu_indices", id="indices-bool"),
    pytest.param("[agent]\ngpu_indices = [0.0, 1.0]", "agent.gpu_indices", id="indices-float"),
    # broker URL
    pytest.param('[broker]\nurl = "mqtt://u:hunter2@h"', "broker.url", id="url-password"),
    pytest.param('[broker]\nurl = "http://h"', "broker.url", id="url-scheme"),
    pytest.param('[broker]\nurl = "localhost:1883"', "broker.url", id="url-no-scheme"),
    pytest.param('[broker]\nurl = "mqtt://h:99999"', "broker.url", id="url-port-range"),
    pytest.param('[broker]\nurl = "mqtt://h:port"', "broker.url", id="url-port-text"),
    pytest.param('[broker]\nurl = "mqtt://"', "broker.url", id="url-no-host"),
    pytest.param('[broker]\nurl = "mqtt://h/topic"', "broker.url", id="url-path"),
]


@pytest.mark.parametrize(("text", "key"), ERRORS)
def test_error_names_file_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, key: str
) -> None:
    # a valid default node name, so that the error under test is the only one
    monkeypatch.setattr(socket, "gethostname", lambda: "n1")
    path, message = load_error(tmp_path, text)
    assert str(path) in message
    assert key in message


def test_password_in_url_is_not_echoed(tmp_path: Path) -> None:
    _, message = load_error(tmp_path, '[agent]\nnode="n1"\n[broker]\nurl = "mqtt://u:hunter2@h"')
    assert "hunter2" not in message
    assert "password_file" in message


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="no such file") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_bytes(b'[agent]\nnode = "\xff\xfe"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_broker_key_error_does_not_blame_the_url(tmp_path: Path) -> None:
    path, message = load_error(tmp_path, '[agent]\nnode="n1"\n[broker]\nkeepalive_s = "30"')
    assert "broker.keepalive_s" in message
    assert "broker.url" not in message
    assert message.count(str(path)) == 1


# --- with_overrides --------------------------------------------------------------


@pytest.fixture
def base(tmp_path: Path) -> AgentConfig:
    return load_config(write(tmp_path, with_broker_files(tmp_path, FULL)))


def test_override_broker_keeps_files_and_settings_from_base(
    base: AgentConfig, tmp_path: Path
) -> None:
    updated = base.with_overrides(broker="mqtt://other.example.com:1884")
    b = updated.broker
    assert (b.host, b.port, b.tls) == ("other.example.com", 1884, False)
    assert b.password_file == f"{tmp_path}/pw"
    assert b.ca_file == f"{tmp_path}/ca.pem"
    assert b.cert_file == f"{tmp_path}/agent.crt"
    assert b.key_file == f"{tmp_path}/agent.key"
    assert b.keepalive_s == 15.0
    assert (b.reconnect_min_s, b.reconnect_max_s) == (0.25, 12.5)
    assert b.username == "ops"  # the override URL names no user: the base one stays
    # the rest of the config is untouched, and the base is not modified
    assert updated.node == base.node and updated.failsafe == base.failsafe
    assert base.broker.host == "broker.example.com"


def test_override_broker_user_and_tls_default_port(base: AgentConfig, tmp_path: Path) -> None:
    b = base.with_overrides(broker="mqtts://svc@b2").broker
    assert (b.host, b.port, b.tls, b.username) == ("b2", 8883, True, "svc")
    assert b.password_file == f"{tmp_path}/pw"


def test_none_overrides_change_nothing(base: AgentConfig) -> None:
    assert base.with_overrides(node=None, broker=None, simulate=None) == base


def test_overrides_apply(base: AgentConfig) -> None:
    updated = base.with_overrides(node="r99-n01", simulate="2xA100", mode="controlled")
    assert (updated.node, updated.simulate, updated.mode) == ("r99-n01", "2xA100", "controlled")


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"broker": "mqtt://u:hunter2@h"}, "--broker"),
        ({"broker": "tcp://h"}, "--broker"),
        ({"broker": "mqtt://h:70000"}, "--broker"),
        ({"node": "no spaces allowed"}, "command line"),
        ({"period_s": 0.0}, "agent.period_s"),
        ({"failsafe_after_s": 0.1}, "agent.failsafe_after_s"),  # below base period 0.5
        ({"mode": "auto"}, "agent.mode"),
        ({"on_exit": "nothing"}, "agent.on_exit"),
    ],
)
def test_invalid_override_raises(base: AgentConfig, overrides: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        base.with_overrides(**overrides)
    assert fragment in str(info.value)
    assert "hunter2" not in str(info.value)


# --- the broker's files exist when the config loads (issue 12, point 6) -----------------

BROKER_FILE_KEYS = ("password_file", "ca_file", "cert_file", "key_file")


@pytest.mark.parametrize("key", BROKER_FILE_KEYS)
def test_a_missing_broker_file_is_an_error_at_load_time(tmp_path: Path, key: str) -> None:
    """A missing password_file was found only at connect time, then retried for ever."""
    missing = tmp_path / "no-such-file"
    text = f'[agent]\nnode="n1"\n[broker]\nurl="mqtts://u@h"\n{key} = "{missing}"\n'
    path, message = load_error(tmp_path, text)
    assert message.startswith(f"{path}: broker.{key}: "), message
    assert str(missing) in message and "No such file" in message


@pytest.mark.parametrize("key", BROKER_FILE_KEYS)
def test_a_broker_file_that_cannot_be_read_is_an_error_at_load_time(
    tmp_path: Path, key: str
) -> None:
    directory = tmp_path / "a-directory"
    directory.mkdir()
    text = f'[agent]\nnode="n1"\n[broker]\nurl="mqtts://u@h"\n{key} = "{directory}"\n'
    path, message = load_error(tmp_path, text)
    assert message.startswith(f"{path}: broker.{key}: "), message
    assert str(directory) in message


def test_the_broker_password_is_still_read_at_connect_time(tmp_path: Path) -> None:
    """Checked at load, read when connecting: a rotated password is picked up."""
    password = tmp_path / "pw"
    password.write_text("old\n")
    config = load_config(
        write(
            tmp_path, f'[agent]\nnode="n1"\n[broker]\nurl="mqtt://u@h"\npassword_file="{password}"'
        )
    )
    password.write_text("rotated\n")
    assert config.broker.client_kwargs()["password"] == "rotated"


def test_an_integer_past_a_floats_range_is_a_clear_error(tmp_path: Path) -> None:
    """Found by bench/fuzz.py: TOML integers have no size limit, and one past a float's range
    raised OverflowError out of the parser instead of a ConfigError."""
    _, message = load_error(tmp_path, "[agent]\nperiod_s = 2" + "0" * 308 + "\n")
    assert "agent.period_s must be finite" in message and "characters)" in message


# --- a tree of controllers ----------------------------------------------------------------


def test_controller_scope_sets_the_heartbeat_the_agent_follows(tmp_path: Path) -> None:
    from powerd.agent.core import AgentCore
    from powerd.gpu.simulated import open_simulated
    from tests.support.keys import VERIFIER

    config = load_config(write(tmp_path, '[agent]\nnode = "n1"\ncontroller_scope = "row07"\n'))
    assert config.controller_scope == "row07"
    assert load_config(write(tmp_path, '[agent]\nnode = "n1"\n')).controller_scope is None
    core = AgentCore(
        node="n1",
        gpus=open_simulated("1xH100"),
        failsafe=config.failsafe,
        failsafe_after_s=10.0,
        verifier=VERIFIER,
        scope=config.controller_scope,
    )
    assert core._heartbeat_topic == "powerd/v1/default/scopes/row07/heartbeat"


def test_a_bad_controller_scope_is_refused_with_the_key(tmp_path: Path) -> None:
    _, message = load_error(tmp_path, '[agent]\nnode = "n1"\ncontroller_scope = "row 7"\n')
    assert "agent.controller_scope 'row 7'" in message


# --- trusted keys (issue 34) ------------------------------------------------------------


@pytest.mark.parametrize("case", ["group-writable", "world-writable", "device", "huge"])
def test_a_controller_key_the_agent_cannot_trust_stops_it_naming_the_file(
    tmp_path: Path, case: str
) -> None:
    import os

    from powerd.signing import generate_key_files

    _, pub = generate_key_files(tmp_path / "controller")
    says = {
        "group-writable": f"mode 0664: whoever may write it may replace the key this side "
        f"trusts); chmod go-w {pub}",
        "world-writable": f"chmod go-w {pub}",
        "device": "/dev/zero: not a regular file (a character device)",
        "huge": "over 65536 bytes: not a key file",
    }[case]
    if case == "group-writable":
        os.chmod(pub, 0o664)
    elif case == "world-writable":
        os.chmod(pub, 0o646)
    elif case == "device":
        pub = Path("/dev/zero")
    else:
        with pub.open("ab") as out:
            out.truncate(1 << 30)
    config = load_config(write(tmp_path, f'[trust]\ncontroller_keys = ["{pub}"]\n'))
    with pytest.raises(ConfigError) as refused:
        config.verifier()
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'agent.toml'}: trust.controller_keys: {pub}: ")
    assert says in message
