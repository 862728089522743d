"""Shared fixtures, and the ``broker`` and ``tsdb`` markers given by what each test uses.

A test that starts a real Mosquitto (the ``mosquitto`` fixture, a harness
that starts one, a benchmark run as a process that does) is marked
``broker``; one that starts VictoriaMetrics or InfluxDB is marked ``tsdb``
(``tests/support/markers.py`` says how they are found). Nothing is marked
by hand, and while a test runs a server its markers do not name refuses to
start, so ``pytest -m "not broker and not tsdb"`` runs the tests that need
no server, and ``pytest -m broker`` every one that starts Mosquitto.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from powerd.mqtt.url import PASSWORD_ENV
from tests.support.brokers import TEST_PASSWORD, Mosquitto
from tests.support.demo_process import DemoRun, run_recorded_demo
from tests.support.markers import SERVER_MARKERS, ServerFinder
from tests.support.servers import ALLOWED_ENV


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    """A real Mosquitto on a free port, for this test only; clients must log in
    (``TEST_USER``, in its ``url``; the password in $POWERD_MQTT_PASSWORD)."""
    broker = Mosquitto(tmp_path)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def anonymous_mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    """A real Mosquitto that lets anyone in: what a lab or a demo runs (forged traffic)."""
    broker = Mosquitto(tmp_path, allow_anonymous=True)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def shortest_demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """One shortest ``powerd demo --record FILE`` for the whole suite (tests/demo reads what
    it leaves, tests/grafana loads its records into a real InfluxDB): a run is 20 s."""
    return run_recorded_demo(tmp_path_factory.mktemp("demo"))


@pytest.fixture(autouse=True)
def _broker_password(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's broker password, where every powerd process of a test finds it (the
    environment is inherited by the processes a test starts); a test may set its own."""
    monkeypatch.setenv(PASSWORD_ENV, TEST_PASSWORD)


@pytest.fixture(autouse=True)
def _keep_root_logging() -> Iterator[None]:
    """A CLI run in-process (click's CliRunner) calls ``setup_logging``, which reconfigures
    the root logger (level, handlers): put it back, so later tests' caplog sees warnings."""
    import logging

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def used_by(item: pytest.Item) -> list[object]:
    """The test function, the fixtures it requests (directly or not) and the callables it
    is parametrized with: where to look for the servers it starts."""
    used: list[object] = []
    function = getattr(item, "function", None)
    if function is not None:
        used.append(function)
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    if fixtureinfo is not None:
        for name in fixtureinfo.names_closure:
            fixturedefs = fixtureinfo.name2fixturedefs.get(name, ())
            if fixturedefs:
                used.append(fixturedefs[-1].func)  # the one that applies here
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        used.extend(value for value in callspec.params.values() if callable(value))
    return used


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    finder = ServerFinder()
    for item in items:
        for marker in sorted(finder.markers_of(*used_by(item))):
            item.add_marker(marker)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """While ``item`` runs (set-up, call, tear-down), only servers of its markers start."""
    allowed = ",".join(m for m in SERVER_MARKERS if item.get_closest_marker(m) is not None)
    before = os.environ.get(ALLOWED_ENV)
    os.environ[ALLOWED_ENV] = allowed
    try:
        return (yield)
    finally:
        if before is None:
            os.environ.pop(ALLOWED_ENV, None)
        else:
            os.environ[ALLOWED_ENV] = before
