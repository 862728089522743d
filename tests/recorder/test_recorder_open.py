"""open_recorder: the configured URL (or path, or nothing) to a recorder."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from powerd.recorder import FileRecorder, InfluxRecorder, default_file_path, open_recorder


def test_an_influx_url_gives_an_influx_recorder_with_its_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("INFLUX_TOKEN", raising=False)
    recorder = open_recorder(
        "influx+https://tsdb.example:8086/prefix/?org=ops&bucket=power"
        "&batch_size=100&flush_interval_s=0.5&max_buffer_points=1000&gzip=1",
        close_timeout_s=0,
    )
    try:
        assert isinstance(recorder, InfluxRecorder)
        assert recorder.url == "https://tsdb.example:8086/prefix"
        assert (recorder.org, recorder.bucket) == ("ops", "power")
        assert (recorder.batch_size, recorder.flush_interval_s) == (100, 0.5)
        assert recorder.max_buffer_points == 1000
    finally:
        recorder.close()


@pytest.mark.parametrize("scheme", ["influx+http", "http"])
def test_the_token_comes_from_the_argument_the_file_or_the_environment(
    scheme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{scheme}://127.0.0.1:9?org=o&bucket=b"

    def header(**kwargs: Any) -> str | None:
        recorder = open_recorder(url, close_timeout_s=0, **kwargs)
        assert isinstance(recorder, InfluxRecorder)
        try:
            return recorder.transport.client.auth_header_value  # what every request carries
        finally:
            recorder.close()

    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    monkeypatch.setenv("INFLUX_TOKEN", "from-env")
    assert header(token="explicit", token_file=token_file) == "Token explicit"
    assert header(token_file=token_file) == "Token from-file"
    assert header() == "Token from-env"
    monkeypatch.delenv("INFLUX_TOKEN")
    assert header() is None  # VictoriaMetrics needs none


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("influx+http://h:8086?bucket=b", "needs org and bucket"),
        ("influx+http://h:8086?org=o", "needs org and bucket"),
        ("influx+http://h:8086?org=o&bucket=b&token=secret", "do not put the token in the URL"),
        ("influx+http://user:pw@h:8086?org=o&bucket=b", "credentials go in the token"),
        ("influx+http://h:8086?org=o&bucket=b&batchsize=5", "unknown option 'batchsize'"),
        ("influx+http://h:8086?org=o&bucket=b&batch_size=many", "batch_size='many'"),
        ("influx+http://h:8086?org=o&bucket=b&batch_size=0", "batch_size must be at least 1"),
        ("influx+http://h:8086?org=o&org=p&bucket=b", "org given twice"),
        ("influx+http://?org=o&bucket=b", "has no host"),
        ("mqtt://h:1883", "scheme must be"),
        ("file://host/x.lp", "a file URL has no host"),
    ],
)
def test_configuration_errors_say_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        open_recorder(url)
    assert "pw" not in str(error.value) and "secret" not in str(error.value)


def test_a_missing_token_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="token file"):
        open_recorder("influx+http://h:1?org=o&bucket=b", token_file=tmp_path / "missing")


def test_a_path_or_file_url_gives_a_file_recorder(tmp_path: Path) -> None:
    for url in (str(tmp_path / "a.lp"), f"file://{tmp_path}/b.lp", tmp_path / "c.lp"):
        recorder = open_recorder(url)
        assert isinstance(recorder, FileRecorder)
        recorder.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.lp", "b.lp", "c.lp"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_recorder(str(tmp_path / "missing" / "x.lp"))


def test_nothing_configured_gives_a_file_in_the_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_file_path() == tmp_path / "xdg" / "powerd" / "telemetry.lp"
    for url in (None, ""):
        recorder = open_recorder(url)  # the directory is created
        assert isinstance(recorder, FileRecorder)
        assert recorder.path == tmp_path / "xdg" / "powerd" / "telemetry.lp"
        recorder.close()
    # under systemd with StateDirectory=powerd
    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path}/state:{tmp_path}/other")
    assert default_file_path() == tmp_path / "state" / "telemetry.lp"


def test_read_token_file_env_and_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from powerd.recorder import read_token

    monkeypatch.setenv("INFLUX_TOKEN", "from-env")
    assert read_token(None) == "from-env"
    monkeypatch.setenv("INFLUX_TOKEN", "")
    assert read_token(None) is None
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert read_token(empty) is None  # no token, not an empty one
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match=re.escape(f"token file {binary}: not UTF-8")):
        read_token(binary)
    with pytest.raises(ValueError, match=r"planner token .*missing: No such file"):
        read_token(tmp_path / "missing", "planner token")
