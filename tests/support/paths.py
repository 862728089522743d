"""Where things are, whatever the depth of the test module that asks."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository's root (``pyproject.toml``, ``docs/``, ``powerd/``)."""

TEST_DATA = REPO / "tests" / "data"
"""Measured and recorded inputs the tests read (``tests/data/``)."""
