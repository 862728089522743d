"""InfluxRecorder against a real VictoriaMetrics (v2 write API), and against scripted answers.

VictoriaMetrics: points arrive, batched, with their tags and values; an
outage loses nothing that fits in the buffer; overflow drops the oldest.
The scripted endpoint gives what VictoriaMetrics never does: a 400, a 413,
a 503, a server that never answers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from powerd.recorder import InfluxRecorder, open_recorder
from powerd.telemetry_schema import decision_line, gpu_line, tree_line
from tests.support.tsdb import ScriptedWriteServer, VictoriaMetrics, wait_until

# quick retries, so a test does not wait out a production backoff
FAST: dict[str, Any] = {"flush_interval_s": 0.05, "retry_min_s": 0.02, "retry_max_s": 0.1}


@pytest.fixture
def vm(tmp_path: Path) -> Iterator[VictoriaMetrics]:
    server = VictoriaMetrics(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def scripted() -> Iterator[ScriptedWriteServer]:
    server = ScriptedWriteServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def power_lines(t0: float, count: int, first: int = 0, node: str = "n1") -> list[str]:
    """``count`` gpu points of one GPU, 10 ms apart, power_w = their number."""
    lines = []
    for i in range(first, first + count):
        line = gpu_line(t0 + i * 0.01, cluster="c1", node=node, gpu=0, power_w=float(i))
        assert line is not None
        lines.append(line)
    return lines


def test_batches_arrive_with_their_tags_and_values(vm: VictoriaMetrics) -> None:
    t0 = round(time.time()) - 600.0
    lines = []
    for i in range(1500):
        for g in range(8):
            lines.append(
                gpu_line(
                    t0 + i * 0.01,
                    cluster="c1",
                    site="s1",
                    row="row-a",
                    rack="rack 1,b=2",  # escaped on the way, intact on arrival
                    node=f"n{g // 4}",
                    gpu=g % 4,
                    job="llama-70b",
                    phase="compute",
                    mode="controlled",
                    power_w=500.0 + g + i / 1000,
                    cap_w=650,
                    cap_max_w=700,
                    capped=True,
                    seq=i,
                )
            )
    lines.append(tree_line(t0, cluster="c1", level="rack", name="rack 1,b=2", power_w=9e4))
    lines.append(decision_line(t0, cluster="c1", cycle_s=0.012, commands_sent=3, epoch=7))
    with open_recorder(vm.recorder_url(batch_size=5000, **FAST)) as recorder:
        for k in range(0, len(lines), 1000):
            recorder.write(lines[k : k + 1000])
        assert recorder.flush(10)
        assert (recorder.written, recorder.dropped, recorder.write_errors) == (12002, 0, 0)
        assert recorder.buffered == 0

    power = vm.wait_for_samples('{__name__="gpu_power_w"}', 12000)
    assert len(power) == 8
    one = next(s for s in power if s.labels["node"] == "n1" and s.labels["gpu"] == "3")
    assert one.labels == {
        "cluster": "c1",
        "site": "s1",
        "row": "row-a",
        "rack": "rack 1,b=2",
        "node": "n1",
        "gpu": "3",
        "job": "llama-70b",
        "phase": "compute",
        "mode": "controlled",
    }
    got = sorted(zip(one.timestamps_ms, one.values, strict=True))
    assert got[0] == (round(t0 * 1000), 507.0)  # the point's own time, not its arrival's
    assert got[-1] == (round((t0 + 14.99) * 1000), pytest.approx(507.0 + 1.499))
    # integers arrive as numbers; every field is its own metric: measurement_field
    capped = vm.wait_for_samples('{__name__="gpu_capped"}', 12000)
    assert {v for s in capped for v in s.values} == {1}
    names = {s.name for s in vm.export('{__name__=~"(gpu|tree|decision)_.*"}')}
    assert names == {
        "gpu_power_w",
        "gpu_cap_w",
        "gpu_cap_max_w",
        "gpu_capped",
        "gpu_seq",
        "tree_power_w",
        "decision_cycle_s",
        "decision_commands_sent",
        "decision_epoch",
    }
    (tree,) = vm.export('{__name__="tree_power_w"}')
    assert tree.labels == {"cluster": "c1", "level": "rack", "name": "rack 1,b=2"}


def test_lines_go_in_batches_of_batch_size(scripted: ScriptedWriteServer) -> None:
    with InfluxRecorder(scripted.url, None, "o", "b", batch_size=100, **FAST) as recorder:
        recorder.write(power_lines(1.8e9, 250))
        assert recorder.flush(10)
        assert recorder.written == 250
    assert [len(r.body.decode().splitlines()) for r in scripted.requests] == [100, 100, 50]
    request = scripted.requests[0]
    assert request.path == "/api/v2/write?org=o&bucket=b&precision=ns"
    assert scripted.lines() == power_lines(1.8e9, 250)  # in order, unchanged


def test_an_outage_that_fits_in_the_buffer_loses_nothing(vm: VictoriaMetrics) -> None:
    t0 = round(time.time()) - 600.0
    match = '{__name__="gpu_power_w"}'
    with open_recorder(vm.recorder_url(max_buffer_points=10_000, **FAST)) as recorder:
        recorder.write(power_lines(t0, 100))
        assert recorder.flush(10)
        vm.wait_for_samples(match, 100)

        vm.stop()
        for k in range(5):  # written while the server is down
            recorder.write(power_lines(t0, 200, first=100 + 200 * k))
        wait_until(lambda: recorder.write_errors >= 2, what="failed attempts while down")
        assert recorder.buffered == 1000
        assert recorder.written == 100 and recorder.dropped == 0

        vm.start()
        assert recorder.flush(10)
        assert (recorder.written, recorder.buffered, recorder.dropped) == (1100, 0, 0)

    (series,) = vm.wait_for_samples(match, 1100)
    got = sorted(zip(series.timestamps_ms, series.values, strict=True))
    assert [v for _, v in got] == [float(i) for i in range(1100)]
    assert [t for t, _ in got] == [round((t0 + i * 0.01) * 1000) for i in range(1100)]


def test_overflow_drops_the_oldest_counts_them_and_logs_once(
    vm: VictoriaMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    t0 = round(time.time()) - 600.0
    vm.stop()  # down from the start
    caplog.set_level(logging.WARNING, logger="powerd.recorder")
    with open_recorder(vm.recorder_url(batch_size=10, max_buffer_points=100, **FAST)) as recorder:
        for k in range(25):
            recorder.write(power_lines(t0, 10, first=10 * k))
        assert (recorder.buffered, recorder.dropped, recorder.written) == (100, 150, 0)
        full = [r for r in caplog.records if "buffer full" in r.getMessage()]
        assert len(full) == 1  # once per minute, not once per drop

        vm.start()
        assert recorder.flush(10)
        assert (recorder.buffered, recorder.dropped, recorder.written) == (0, 150, 100)

    (series,) = vm.wait_for_samples('{__name__="gpu_power_w"}', 100)
    assert sorted(series.values) == [float(i) for i in range(150, 250)]  # the newest 100


def test_overflow_while_a_batch_is_in_flight_counts_what_arrived(
    scripted: ScriptedWriteServer,
) -> None:
    scripted.hold = threading.Event()
    lines = power_lines(1.8e9, 40)
    with InfluxRecorder(
        scripted.url, None, "o", "b", batch_size=10, max_buffer_points=20, **FAST
    ) as recorder:
        recorder.write(lines[:10])
        scripted.wait_requests(1)  # lines 0-9 in flight, held by the server
        recorder.write(lines[10:])  # 40 waiting: the 20 oldest dropped, 0-9 among them
        assert recorder.dropped == 20
        scripted.hold.set()
        assert recorder.flush(10)
        assert (recorder.written, recorder.dropped, recorder.buffered) == (30, 10, 0)
    assert scripted.lines() == lines[:10] + lines[20:]


def test_a_batch_the_server_rejects_is_dropped_and_the_rest_goes_on(
    scripted: ScriptedWriteServer, caplog: pytest.LogCaptureFixture
) -> None:
    scripted.answers = [(400, {"Content-Type": "application/json"}, b'{"code":"invalid"}')]
    with InfluxRecorder(scripted.url, None, "o", "b", batch_size=10, **FAST) as recorder:
        recorder.write(power_lines(1.8e9, 10))
        assert recorder.flush(10)
        assert (recorder.rejected, recorder.dropped, recorder.write_errors) == (10, 10, 1)
        recorder.write(power_lines(1.8e9, 10, first=10))
        assert recorder.flush(10)
        assert recorder.written == 10
    assert len(scripted.requests) == 2  # the rejected batch was not sent again
    assert any("rejected 10 points" in r.getMessage() for r in caplog.records)


def test_server_errors_are_retried_until_written(scripted: ScriptedWriteServer) -> None:
    scripted.answers = [503, 500, (429, {"Retry-After": "0"}, b"")]
    with InfluxRecorder(scripted.url, None, "o", "b", batch_size=10, **FAST) as recorder:
        recorder.write(power_lines(1.8e9, 10))
        wait_until(lambda: recorder.written == 10, what="written after 3 errors")
        assert (recorder.write_errors, recorder.dropped) == (3, 0)
    assert len(scripted.requests) == 4
    assert {r.body for r in scripted.requests} == {scripted.requests[0].body}


def test_a_batch_too_large_is_split(scripted: ScriptedWriteServer) -> None:
    scripted.answers = [413]
    lines = power_lines(1.8e9, 100)
    with InfluxRecorder(scripted.url, None, "o", "b", batch_size=100, **FAST) as recorder:
        recorder.write(lines)
        assert recorder.flush(10)
        assert (recorder.written, recorder.dropped) == (100, 0)
    assert [len(r.body.splitlines()) for r in scripted.requests] == [100, 50, 50]
    assert scripted.lines() == lines + lines  # the first, refused, then both halves


def test_a_server_that_never_answers_does_not_block_the_caller(
    scripted: ScriptedWriteServer,
) -> None:
    scripted.hold = threading.Event()  # accepts, reads, never answers
    recorder = InfluxRecorder(
        scripted.url, None, "o", "b", batch_size=100, timeout_s=30, close_timeout_s=0.3, **FAST
    )
    slowest = 0.0
    for k in range(50):
        started = time.perf_counter()
        recorder.write(power_lines(1.8e9, 1000, first=1000 * k))
        slowest = max(slowest, time.perf_counter() - started)
    assert slowest < 0.1
    assert recorder.flush(timeout_s=0.1) is False
    started = time.monotonic()
    recorder.close()
    assert time.monotonic() - started < 1.0
    assert recorder.dropped == 50_000 - recorder.written
    recorder.write(power_lines(1.8e9, 5))  # after close: counted, not raised
    assert recorder.dropped == 50_005 - recorder.written


def test_write_never_raises(scripted: ScriptedWriteServer) -> None:
    def broken():
        yield power_lines(1.8e9, 1)[0]
        raise RuntimeError("a bug in the caller's generator")

    with InfluxRecorder(scripted.url, None, "o", "b", batch_size=10, **FAST) as recorder:
        recorder.write([None, "", 42, b"bytes", object()])  # type: ignore[list-item]
        recorder.write(broken())
        recorder.write(None)  # type: ignore[arg-type]
        recorder.write(["a,b=1 v=1 1\na,b=2 v=2 2"])  # a document: two points
        assert recorder.flush(10)
        assert recorder.written == 2
    assert scripted.lines() == ["a,b=1 v=1 1", "a,b=2 v=2 2"]


def test_unreachable_server_from_the_start(tmp_path: Path) -> None:
    from tests.support.brokers import free_port

    port = free_port()  # nothing listens there
    recorder = InfluxRecorder(
        f"http://127.0.0.1:{port}", "tok", "o", "b", close_timeout_s=0.2, **FAST
    )
    recorder.write(power_lines(1.8e9, 10))
    wait_until(lambda: recorder.write_errors >= 2)
    assert recorder.buffered == 10
    recorder.close()
    assert (recorder.dropped, recorder.buffered, recorder.written) == (10, 0, 0)
