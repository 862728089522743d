"""The five powerd dashboards: site, rows and racks, GPUs, jobs and phases, controller health.

``DASHBOARDS`` maps each file name in ``grafana/dashboards/`` to the function
that builds it (one module per dashboard; ``common`` holds what they share);
``powerd dashboards`` writes them, and a test checks the committed files are
exactly what these functions build.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from powerd.grafana.build import Json
from powerd.grafana.controller_health import controller_health
from powerd.grafana.gpus import gpus
from powerd.grafana.jobs_and_phases import jobs_and_phases
from powerd.grafana.rows_and_racks import rows_and_racks
from powerd.grafana.site_overview import site_overview

__all__ = [
    "DASHBOARDS",
    "controller_health",
    "gpus",
    "jobs_and_phases",
    "render",
    "rows_and_racks",
    "site_overview",
    "stale",
    "write_all",
]

DASHBOARDS: dict[str, Callable[[], Json]] = {
    "site-overview.json": site_overview,
    "rows-and-racks.json": rows_and_racks,
    "gpus.json": gpus,
    "jobs-and-phases.json": jobs_and_phases,
    "controller-health.json": controller_health,
}


def render(build: Callable[[], Json]) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def write_all(directory: Path) -> list[Path]:
    """Write every dashboard into ``directory``; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in DASHBOARDS.items():
        path = directory / name
        path.write_text(render(build), encoding="utf-8")
        written.append(path)
    return written


def stale(directory: Path) -> list[str]:
    """Dashboard files in ``directory`` that differ from what the code builds (or are missing)."""
    out = []
    for name, build in DASHBOARDS.items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != render(build):
            out.append(name)
    return out
