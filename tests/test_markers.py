"""The ``broker`` and ``tsdb`` markers select what they say: tests/conftest.py gives them from
what a test uses (tests/support/markers.py), and a server refuses to start in a test whose
markers do not name it."""

from __future__ import annotations

import subprocess
import sys
from contextlib import suppress
from pathlib import Path

import pytest

from tests.support.markers import ServerFinder
from tests.support.paths import REPO
from tests.support.servers import ALLOWED_ENV, ServerProcess, check_allowed

# --- what the finder follows -----------------------------------------------------------
# Looked up by name (``sample``), so that these tests themselves use no server.


def starts_mosquitto(tmp_path: Path) -> None:
    from tests.support.brokers import Mosquitto  # imported here: a local name is followed too

    Mosquitto(tmp_path).start()


def _helper_that_starts_victoria_metrics(tmp_path: Path) -> None:
    from tests.support import tsdb

    with suppress(RuntimeError):
        tsdb.VictoriaMetrics(tmp_path).start()


def calls_a_helper_that_starts_a_tsdb(tmp_path: Path) -> None:
    _helper_that_starts_victoria_metrics(tmp_path)


def runs_the_agent_benchmark() -> None:
    subprocess.run([sys.executable, "-m", "bench.bench_agent", "--seconds", "2"], check=True)


def runs_the_controller_benchmark() -> None:
    subprocess.run([sys.executable, "-m", "bench.bench_controller", "--cycles", "3"], check=True)


def pure(x: float) -> float:
    return 2 * x


def sample(name: str) -> object:
    return globals()[name]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("starts_mosquitto", {"broker"}),
        ("calls_a_helper_that_starts_a_tsdb", {"tsdb"}),
        ("runs_the_agent_benchmark", {"broker"}),  # bench/bench_agent.py starts Mosquitto
        ("runs_the_controller_benchmark", set()),  # bench/bench_controller.py starts nothing
        ("pure", set()),
    ],
)
def test_the_finder_follows_names_helpers_and_benchmarks(name: str, expected: set[str]) -> None:
    assert ServerFinder().markers_of(sample(name)) == expected


def test_a_harness_that_takes_a_broker_starts_none() -> None:
    """``running_cluster(broker)`` runs agents and a controller against the broker it is given."""
    from tests.support import controller_harness

    finder = ServerFinder()
    assert finder.markers_of(controller_harness.running_cluster) == set()
    assert finder.markers_of(controller_harness.probe) == set()


# --- what collection marks -------------------------------------------------------------


def collected(marker: str, *files: str) -> set[str]:
    """The test ids ``pytest -m marker --collect-only`` selects among ``files``."""
    pytest_collect = [
        sys.executable,
        "-m",
        "pytest",
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    result = subprocess.run(
        [*pytest_collect, "-m", marker, *files],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode in (0, 5), result.stdout + result.stderr  # 5: none selected
    return {line for line in result.stdout.splitlines() if "::" in line}


def test_collection_marks_broker_tests_by_fixture_helper_and_benchmark() -> None:
    broker = collected(
        "broker",
        "tests/mqtt/test_mqtt_stream.py",
        "tests/bench/test_bench_runs.py",
        "tests/bench/test_bench_controller_runs.py",
        "tests/agent/test_agent_core_clamp.py",
    )
    assert broker == {
        # the mosquitto fixture
        "tests/mqtt/test_mqtt_stream.py::test_against_mosquitto_retained_and_many",
        # a Mosquitto built in the test's body
        "tests/mqtt/test_mqtt_stream.py::test_a_refused_login_is_an_error_that_says_so",
        # python -m bench.bench_agent, which starts one
        "tests/bench/test_bench_runs.py::test_agent_benchmark_runs",
    }


def test_collection_marks_tsdb_tests_by_fixture() -> None:
    tsdb = collected("tsdb", "tests/recorder/test_recorder_influx.py")
    assert (
        "tests/recorder/test_recorder_influx.py::test_batches_arrive_with_their_tags_and_values"
        in tsdb
    )
    # the scripted endpoint is a thread in the test process, not a time-series server
    assert "tests/recorder/test_recorder_influx.py::test_write_never_raises" not in tsdb
    assert not collected("broker", "tests/recorder/test_recorder_influx.py")


# --- what a test without the marker may start ------------------------------------------


def test_a_server_refuses_to_start_in_a_test_not_marked_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Unstartable(ServerProcess):  # local: its marker does not mark this test
        name = "unstartable"
        marker = "broker"

        def command(self) -> list[str]:
            raise AssertionError("the guard let it start")

    monkeypatch.setenv(ALLOWED_ENV, "tsdb")
    with pytest.raises(RuntimeError, match="not marked 'broker'"):
        Unstartable(tmp_path).start()
    monkeypatch.setenv(ALLOWED_ENV, "tsdb,broker")
    check_allowed(Unstartable(tmp_path))  # allowed: no error
    monkeypatch.delenv(ALLOWED_ENV)
    check_allowed(Unstartable(tmp_path))  # outside pytest (make bench): no check


def test_this_test_runs_with_no_server_allowed() -> None:
    import os

    assert os.environ[ALLOWED_ENV] == ""
