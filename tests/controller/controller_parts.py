"""Builders for the unit tests of the controller core's parts, each on its own: the test
tree of ``test_controller_core`` (``BUDGETS``), a fake clock, a shared log limiter and a
``reject`` that records what it was given."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from policies import Tree
from powerd.controller.settings import ControllerSettings
from powerd.protocol import ProtocolError
from powerd.ratelimit import LogOncePer
from tests.controller.test_controller_core import WALL0, budgets
from tests.support.clock import ManualClock


@dataclass
class Parts:
    """What a part's constructor takes."""

    tree: Tree
    settings: ControllerSettings
    clock: ManualClock
    log_once: LogOncePer
    rejected: list[tuple[str, str | None]] = field(default_factory=list)

    def reject(self, sender: str, exc: ProtocolError, key: str | None = None) -> None:
        self.rejected.append((sender, key))

    def wall(self) -> float:
        return WALL0 + self.clock.t


def parts(**settings: object) -> Parts:
    return Parts(
        budgets().tree,
        ControllerSettings(**settings),  # type: ignore[arg-type]
        ManualClock(100.0),
        LogOncePer(logging.getLogger("powerd.controller")),
    )
