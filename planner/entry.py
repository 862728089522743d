"""The ``powerplan`` executable: the planner's extra checked before its commands import it."""

from __future__ import annotations

import sys

from powerd.extras import MissingExtra, require


def main() -> None:
    try:
        require("planner", "powerplan")
    except MissingExtra as exc:
        sys.exit(f"Error: {exc}")
    from planner.cli import main as cli

    cli()
