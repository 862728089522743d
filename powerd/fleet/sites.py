"""The shipped 150 MW site, cut down: the same racks, rows and thresholds, fewer of them.

Scale tests and the scale benchmark run the real site file at its full size
and at whole-row fractions of it; the tests use a few racks. Cutting the
generator counts keeps every other figure (budgets, limits, failsafe caps,
overheads) as shipped.
"""

from __future__ import annotations

import re
from importlib import resources

SITE_FILE = "budgets/site-150mw.toml"
ROWS, RACKS_PER_ROW, NODES_PER_RACK = 16, 72, 18


def site_text() -> str:
    return resources.files("powerd.data").joinpath(SITE_FILE).read_text()


def cut_site(rows: int = ROWS, racks_per_row: int = RACKS_PER_ROW) -> str:
    """The site's budgets file with ``rows`` rows of ``racks_per_row`` racks each."""
    text = site_text()
    for table, shipped, wanted in (
        ("rows", ROWS, rows),
        ("rows.racks", RACKS_PER_ROW, racks_per_row),
    ):
        pattern = rf"(\[{re.escape(table)}\][^\[]*?count = ){shipped}\b"
        text, n = re.subn(pattern, rf"\g<1>{wanted}", text, count=1)
        if n != 1:
            raise RuntimeError(f"{SITE_FILE}: no `count = {shipped}` under [{table}]")
    return text
