"""FileRecorder: line protocol appended to a local file, read back by the schema's parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerd.recorder import FileRecorder
from powerd.telemetry_schema import gpu_line, iter_lines, phase_event_line, tree_line
from tests.support.clock import ManualClock


def sample_lines(n: int, first: int = 0) -> list[str]:
    lines = []
    for i in range(first, first + n):
        line = gpu_line(1.8e9 + i, cluster="c1", node="n 1", gpu=i % 4, power_w=float(i))
        assert line is not None
        lines.append(line)
    return lines


def test_lines_are_appended_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.lp"
    extra = [
        tree_line(1.8e9, cluster="c1", level="site", name="s1", power_w=1e6),
        phase_event_line(1.8e9, cluster="c1", job="j", phase="checkpoint", expected_s=30),
    ]
    lines = [*sample_lines(3), *(line for line in extra if line is not None)]
    assert len(lines) == 5
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


def test_each_write_is_in_the_file_when_it_returns(tmp_path: Path) -> None:
    """No buffer in the process (a point counted as written is in the file: issue 12),
    whatever the flush interval."""
    path = tmp_path / "t.lp"
    clock = ManualClock()
    recorder = FileRecorder(path, flush_interval_s=1.0, clock=clock)
    recorder.write(sample_lines(1))
    assert path.read_text().splitlines() == sample_lines(1)
    clock.advance(1.0)
    recorder.write(sample_lines(1, first=1))
    assert path.read_text().splitlines() == sample_lines(2)
    recorder.write(sample_lines(1, first=2))
    assert recorder.flush() is True
    assert len(path.read_text().splitlines()) == 3
    recorder.write(sample_lines(1, first=3))
    assert recorder.close() == 0
    assert path.read_text().splitlines() == sample_lines(4)
    assert recorder.stats() == {"written": 4, "buffered": 0, "dropped": 0, "write_errors": 0}
    assert recorder.close() == 0  # idempotent


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


def test_the_file_rotates_at_its_size_and_keeps_a_bounded_number(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.lp"
    line_chars = len(sample_lines(1)[0]) + 1
    with FileRecorder(path, max_bytes=10 * line_chars, keep=2) as recorder:
        for i in range(45):  # 4.5 files' worth, one line at a time
            recorder.write(sample_lines(1, first=i))
        assert recorder.rotations == 4 and recorder.written == 45 and recorder.dropped == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["telemetry.1.lp", "telemetry.2.lp", "telemetry.lp"]  # the oldest two gone
    # newest lines in the current file, the rotated ones before them, nothing reordered
    kept = [
        *(tmp_path / "telemetry.2.lp").read_text().splitlines(),
        *(tmp_path / "telemetry.1.lp").read_text().splitlines(),
        *path.read_text().splitlines(),
    ]
    assert kept == sample_lines(25, first=20)


def test_rotated_files_are_read_by_the_planner_as_line_protocol(tmp_path: Path) -> None:
    from planner.profiles import read_profiles

    path = tmp_path / "telemetry.lp"
    lines = [
        line
        for i in range(12)
        if (line := gpu_line(1.8e9 + i, cluster="c1", node="n1", gpu=0, job="j", power_w=300.0 + i))
    ]
    assert len(lines) == 12
    with FileRecorder(path, max_bytes=5 * (len(lines[0]) + 1), keep=3) as recorder:
        for line in lines:
            recorder.write([line])
    files = sorted(tmp_path.glob("telemetry*.lp"))
    assert len(files) == 3
    table = read_profiles(files)
    assert table["power_w"].tolist() == [300.0 + i for i in range(12)]


def test_keep_zero_starts_over_and_none_never_rotates(tmp_path: Path) -> None:
    line_chars = len(sample_lines(1)[0]) + 1
    one = tmp_path / "one.lp"
    with FileRecorder(one, max_bytes=3 * line_chars, keep=0) as recorder:
        recorder.write(sample_lines(7))  # one batch of 7: rotates once, after it
        recorder.write(sample_lines(2, first=7))
    assert [p.name for p in tmp_path.iterdir()] == ["one.lp"]
    assert one.read_text().splitlines() == sample_lines(2, first=7)
    never = tmp_path / "never.lp"
    with FileRecorder(never, max_bytes=None) as recorder:
        recorder.write(sample_lines(100))
        assert recorder.rotations == 0
    with pytest.raises(ValueError, match="max_bytes"):
        FileRecorder(tmp_path / "x.lp", max_bytes=0)
    with pytest.raises(ValueError, match="keep"):
        FileRecorder(tmp_path / "x.lp", keep=-1)


def test_a_full_disk_counts_every_point_as_not_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 12, point 6: on a full disk the file recorder lost 14 s of points while it
    logged '4 points dropped': lines the process buffered counted as written, the error
    at the flush was charged to the one batch that triggered it, and close() said
    nothing. /dev/full is a real full disk: every write(2) fails with ENOSPC."""
    path = tmp_path / "telemetry.lp"
    path.symlink_to("/dev/full")
    clock = ManualClock()
    recorder = FileRecorder(path, clock=clock)  # the default flush interval: 1 s
    for i in range(56):  # 14 s at 4 writes a second, one point each
        recorder.write(sample_lines(1, first=i))
        clock.advance(0.25)
    assert (recorder.written, recorder.buffered, recorder.dropped) == (0, 0, 56)
    with caplog.at_level("ERROR", logger="powerd.recorder"):
        not_written = recorder.close()
    assert not_written == 56
    assert recorder.stats() == {"written": 0, "buffered": 0, "dropped": 56, "write_errors": 56}
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("56 points not written" in m and str(path) in m for m in errors), errors
    assert recorder.close() == 56  # idempotent: says it again, logs nothing more
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == len(errors)


_PARTIAL_WRITE = """
import json, resource, signal, sys
from powerd.recorder import FileRecorder
path, limit, first, second = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: EFBIG, not a signal
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
recorder = FileRecorder(path, flush_interval_s=0.0)
recorder.write(json.loads(first))
recorder.write(json.loads(second))  # the disk fills half-way through this batch
not_written = recorder.close()
print(json.dumps([recorder.written, recorder.dropped, not_written]))
"""


def test_a_batch_the_disk_took_only_part_of_leaves_no_partial_line(tmp_path: Path) -> None:
    """A disk that fills in the middle of a write takes part of the batch (a short
    write), then refuses the rest: the file keeps whole lines only, and the counts
    say which points are in it. RLIMIT_FSIZE makes the short write on a real file."""
    import json
    import subprocess
    import sys

    path = tmp_path / "telemetry.lp"
    first, second = sample_lines(2), sample_lines(2, first=2)
    limit = len("\n".join(first)) + 1 + len(second[0]) // 2  # half-way into the 3rd line
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _PARTIAL_WRITE,
            str(path),
            str(limit),
            *map(json.dumps, [first, second]),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    written, dropped, not_written = json.loads(done.stdout)
    assert path.read_text().splitlines() == first  # no half line left behind
    assert (written, dropped, not_written) == (2, 2, 2)
