from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.brokers import Mosquitto

REPO = Path(__file__).resolve().parent.parent
TEST_DATA = REPO / "tests" / "data"


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    """A real Mosquitto on a free port, for this test only."""
    broker = Mosquitto(tmp_path)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


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
