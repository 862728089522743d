"""Influx1Recorder against a real InfluxDB 1.x (Debian's ``influxdb``): ``/write?db=``.

InfluxDB 1.6 and 1.7 have no v2 write API, so ``influx1+http://HOST?db=DB``
writes to ``/write``. What is checked against the server: points arrive with
their tags, fields and timestamps; a database that does not exist yet (404)
is an outage, and nothing is lost once it is created; a point the server
refuses as invalid (400) is dropped and counted, not retried forever.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from powerd.recorder import Influx1Recorder, open_recorder
from powerd.telemetry_schema import gpu_line
from tests.support.servers import running
from tests.support.tsdb import InfluxDB1, wait_until

FAST: dict[str, Any] = {"flush_interval_s": 0.05, "retry_min_s": 0.02, "retry_max_s": 0.1}


@pytest.fixture
def influxd(tmp_path: Path) -> Iterator[InfluxDB1]:
    with running(InfluxDB1(tmp_path)) as server:
        yield server


def lines(t0: float, count: int) -> list[str]:
    out = []
    for i in range(count):
        line = gpu_line(t0 + i, cluster="c1", node="n 1", gpu=i % 4, power_w=100.0 + i)
        assert line is not None
        out.append(line)
    return out


def stored(server: InfluxDB1, database: str) -> list[list]:
    doc = server.query('SELECT "power_w", "node", "gpu" FROM "gpu"', database=database)
    series = doc["results"][0].get("series", [])
    return series[0]["values"] if series else []


def test_points_arrive_with_tags_fields_and_time(influxd: InfluxDB1) -> None:
    influxd.create_database("powerd")
    recorder = open_recorder(f"influx1+http://127.0.0.1:{influxd.port}?db=powerd", **FAST)
    assert isinstance(recorder, Influx1Recorder)
    t0 = float(round(time.time()) - 3600)
    with recorder:
        recorder.write(lines(t0, 250))
        assert recorder.flush(10.0)
    rows = stored(influxd, "powerd")
    assert len(rows) == 250 and recorder.written == 250 and recorder.dropped == 0
    assert rows[0] == [int(t0 * 1e9), 100.0, "n 1", "0"]  # the space in the tag survived
    assert rows[-1][1] == 349.0


def test_a_missing_database_is_an_outage_that_loses_nothing(influxd: InfluxDB1) -> None:
    recorder = open_recorder(f"influx1+http://127.0.0.1:{influxd.port}?db=later", **FAST)
    t0 = float(round(time.time()) - 600)
    with recorder:
        recorder.write(lines(t0, 40))
        wait_until(lambda: recorder.write_errors >= 2, what="failed writes to a missing database")
        assert recorder.written == 0 and recorder.buffered == 40 and recorder.dropped == 0
        influxd.create_database("later")
        assert recorder.flush(10.0)
    assert len(stored(influxd, "later")) == 40 and recorder.dropped == 0


def test_an_invalid_point_is_dropped_not_retried(influxd: InfluxDB1) -> None:
    influxd.create_database("powerd")
    recorder = open_recorder(f"influx1+http://127.0.0.1:{influxd.port}?db=powerd", **FAST)
    t0 = float(round(time.time()) - 600)
    with recorder:
        recorder.write(["gpu,cluster=c1 power_w= 1"])  # no value: the server answers 400
        assert isinstance(recorder, Influx1Recorder)
        wait_until(lambda: recorder.rejected == 1, what="the 400")
        recorder.write(lines(t0, 3))
        assert recorder.flush(10.0)
    assert recorder.written == 3 and recorder.dropped == 1 and len(stored(influxd, "powerd")) == 3


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("influx1+http://127.0.0.1:8086", "takes db"),
        ("influx1+http://127.0.0.1:8086?db=x&org=o", "takes db"),
        ("influx1+http://127.0.0.1:8086?db=x&bucket=b", "not org and bucket"),
        ("influx1+http://127.0.0.1:8086?db=x&batchsize=3", "unknown option 'batchsize'.*db, rp"),
    ],
)
def test_bad_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_recorder(url)


def test_a_token_must_be_user_and_password() -> None:
    with pytest.raises(ValueError, match="user:password"):
        open_recorder("influx1+http://127.0.0.1:8086?db=x", token="secret")
