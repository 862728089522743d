"""parse_broker_url, BrokerSettings.display and where the password comes from."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from powerd.mqtt.url import NO_DELAY, PASSWORD_ENV, BrokerSettings, parse_broker_url

SECRET = "s3cr3t-Pa55"


@pytest.fixture(autouse=True)
def no_password_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)


@pytest.mark.parametrize(
    ("url", "host", "port", "tls", "username"),
    [
        ("mqtt://localhost", "localhost", 1883, False, None),
        ("mqtt://localhost/", "localhost", 1883, False, None),
        ("mqtts://broker.example.com", "broker.example.com", 8883, True, None),
        ("mqtt://10.0.0.5:1884", "10.0.0.5", 1884, False, None),
        ("mqtts://b:443", "b", 443, True, None),
        ("mqtt://agent@b", "b", 1883, False, "agent"),
        ("mqtts://svc.powerd@b:18883", "b", 18883, True, "svc.powerd"),
        ("mqtt://us%40er@b", "b", 1883, False, "us@er"),
        ("mqtt://[::1]:1999", "::1", 1999, False, None),
    ],
)
def test_parse(url: str, host: str, port: int, tls: bool, username: str | None) -> None:
    settings = parse_broker_url(url)
    assert (settings.host, settings.port, settings.tls, settings.username) == (
        host,
        port,
        tls,
        username,
    )
    assert settings.password_file is None
    assert settings.ca_file is None


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("http://b", "mqtt:// or mqtts://"),
        ("tcp://b:1883", "mqtt:// or mqtts://"),
        ("b:1883", "mqtt:// or mqtts://"),
        ("", "mqtt:// or mqtts://"),
        ("mqtt://", "no host"),
        ("mqtt://:1883", "no host"),
        ("mqtt://b:99999", "invalid port"),
        ("mqtt://b:port", "invalid port"),
        ("mqtt://b/powerd", "scheme://"),
        ("mqtt://b?x=1", "scheme://"),
        ("mqtt://b#frag", "scheme://"),
        (f"mqtt://user:{SECRET}@b", "password_file"),
        (f"mqtts://user:{SECRET}@b:8883", "POWERD_MQTT_PASSWORD"),
    ],
)
def test_parse_errors(url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        parse_broker_url(url)
    assert SECRET not in str(info.value)


def test_base_keeps_what_a_url_cannot_carry() -> None:
    base = BrokerSettings(
        host="old",
        port=1,
        username="base-user",
        password_file="/run/pw",
        ca_file="/ca.pem",
        cert_file="/c.crt",
        key_file="/c.key",
        keepalive_s=12.0,
        reconnect_min_s=0.1,
        reconnect_max_s=3.0,
    )
    s = parse_broker_url("mqtts://new:9000", base=base)
    assert (s.host, s.port, s.tls) == ("new", 9000, True)
    assert s.username == "base-user"
    assert (s.password_file, s.ca_file, s.cert_file, s.key_file) == (
        "/run/pw",
        "/ca.pem",
        "/c.crt",
        "/c.key",
    )
    assert (s.keepalive_s, s.reconnect_min_s, s.reconnect_max_s) == (12.0, 0.1, 3.0)
    # a user in the URL wins over the base's; TLS follows the new scheme
    s = parse_broker_url("mqtt://other-user@new", base=base)
    assert (s.username, s.tls, s.port) == ("other-user", False, 1883)
    assert base.host == "old"  # the base is not changed


def test_display_never_shows_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pw_file = tmp_path / "pw"
    pw_file.write_text(SECRET + "\n")
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    base = BrokerSettings(host="x", port=1, password_file=str(pw_file))
    s = parse_broker_url("mqtts://agent@broker.example.com:8884", base=base)
    assert s.password() == SECRET
    assert s.display == "mqtts://broker.example.com:8884"
    assert SECRET not in s.display
    assert "agent" not in s.display
    assert SECRET not in repr(s)
    assert parse_broker_url("mqtt://h").display == "mqtt://h:1883"


def test_password_from_file_stripped(tmp_path: Path) -> None:
    pw_file = tmp_path / "pw"
    pw_file.write_text(f"  {SECRET}\n\n")
    s = BrokerSettings(host="h", port=1883, username="u", password_file=str(pw_file))
    assert s.password() == SECRET


def test_password_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    s = BrokerSettings(host="h", port=1883, username="u")
    assert s.password() is None
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    assert s.password() == SECRET


def test_password_file_wins_over_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "from-env")
    pw_file = tmp_path / "pw"
    pw_file.write_text("from-file")
    s = BrokerSettings(host="h", port=1883, username="u", password_file=str(pw_file))
    assert s.password() == "from-file"


def test_unreadable_password_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing-pw"
    s = BrokerSettings(host="h", port=1883, username="u", password_file=str(missing))
    with pytest.raises(ValueError, match="password file") as info:
        s.password()
    assert str(missing) in str(info.value)


def test_client_kwargs_with_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    kwargs = parse_broker_url("mqtt://agent@b:1999").client_kwargs()
    assert kwargs == {
        "hostname": "b",
        "port": 1999,
        "keepalive": 30,
        "socket_options": NO_DELAY,
        "username": "agent",
        "password": SECRET,
    }


def test_client_kwargs_without_user_sends_no_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    kwargs = parse_broker_url("mqtt://b").client_kwargs()
    assert "username" not in kwargs
    assert "password" not in kwargs
    assert "tls_context" not in kwargs


def test_client_kwargs_tls() -> None:
    kwargs = parse_broker_url("mqtts://b").client_kwargs()
    assert isinstance(kwargs["tls_context"], ssl.SSLContext)
    assert kwargs["tls_context"].verify_mode == ssl.CERT_REQUIRED
    assert kwargs["port"] == 8883
