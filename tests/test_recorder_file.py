"""FileRecorder: line protocol appended to a local file, read back by the schema's parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerd.recorder import FileRecorder
from powerd.telemetry_schema import gpu_line, iter_lines, phase_event_line, tree_line
from tests.clocks import ManualClock


def sample_lines(n: int, first: int = 0) -> list[str]:
    lines = []
    for i in range(first, first + n):
        line = gpu_line(1.8e9 + i, cluster="c1", node="n 1", gpu=i % 4, power_w=float(i))
        assert line is not None
        lines.append(line)
    return lines


def test_lines_are_appended_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.lp"
    lines = [
        *sample_lines(3),
        tree_line(1.8e9, cluster="c1", level="site", name="s1", power_w=1e6),
        phase_event_line(1.8e9, cluster="c1", job="j", phase="checkpoint", expected_s=30),
    ]
    with FileRecorder(path) as recorder:
        recorder.write(lines)
        assert (recorder.written, recorder.buffered, recorder.dropped) == (5, 0, 0)
    assert path.read_text() == "\n".join(lines) + "\n"
    points = list(iter_lines(path.read_text()))
    assert [p.measurement for p in points] == ["gpu", "gpu", "gpu", "tree", "phase_event"]
    assert points[1].tags["node"] == "n 1" and points[1].fields["power_w"] == 1.0

    with FileRecorder(path) as recorder:  # a second run appends
        recorder.write(sample_lines(2, first=3))
    assert path.read_text().splitlines() == [*lines, *sample_lines(2, first=3)]


def test_close_flushes_and_flush_interval_flushes_without_close(tmp_path: Path) -> None:
    path = tmp_path / "t.lp"
    clock = ManualClock()
    recorder = FileRecorder(path, flush_interval_s=1.0, clock=clock)
    recorder.write(sample_lines(1))
    assert path.read_text() == ""  # buffered in the process
    clock.advance(1.0)
    recorder.write(sample_lines(1, first=1))
    assert path.read_text().splitlines() == sample_lines(2)  # the interval passed
    recorder.write(sample_lines(1, first=2))
    assert recorder.flush() is True
    assert len(path.read_text().splitlines()) == 3
    recorder.write(sample_lines(1, first=3))
    recorder.close()
    assert path.read_text().splitlines() == sample_lines(4)
    recorder.close()  # idempotent


def test_a_missing_directory_is_a_clear_error_at_construction(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    with pytest.raises(FileNotFoundError, match=rf"directory {missing} does not exist"):
        FileRecorder(missing / "telemetry.lp")
    with pytest.raises(IsADirectoryError):
        FileRecorder(tmp_path)


def test_write_errors_are_counted_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    # /dev/full: every write fails with ENOSPC, the disk-full case
    clock = ManualClock()
    recorder = FileRecorder("/dev/full", flush_interval_s=0.0, clock=clock)
    for _ in range(5):
        recorder.write(sample_lines(10))
    assert (recorder.write_errors, recorder.dropped, recorder.written) == (5, 50, 0)
    full = [r for r in caplog.records if "cannot write to /dev/full" in r.getMessage()]
    assert len(full) == 1  # once per minute
    recorder.close()


def test_bad_input_and_writes_after_close_never_raise(tmp_path: Path) -> None:
    path = tmp_path / "t.lp"
    recorder = FileRecorder(path)

    def broken():
        yield sample_lines(1)[0]
        raise RuntimeError("a bug in the caller's generator")

    recorder.write([None, "", 42, b"x"])  # type: ignore[list-item]
    recorder.write(broken())  # logged, with its traceback
    recorder.write(None)  # type: ignore[arg-type]
    recorder.close()
    recorder.write(sample_lines(3))
    assert recorder.dropped == 3
    assert path.read_text() == ""  # the generator failed before its lines were handed over
