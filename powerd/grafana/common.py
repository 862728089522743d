"""What several dashboards share: the power unit, the cluster, row and rack variables,
the tree-level filter and the phase-change annotation."""

from __future__ import annotations

from powerd.grafana.build import (
    Json,
    Query,
    annotation,
    query_variable,
    tag_values,
)
from powerd.telemetry_schema import PHASE_EVENT, TREE

W = "watt"


def cluster_variable() -> Json:
    query = f'SHOW TAG VALUES FROM "{TREE.name}" WITH KEY = "cluster"'
    return query_variable("cluster", "Cluster", query, multi=False, include_all=False)


def row_variable() -> Json:
    return query_variable("row", "Row", tag_values(TREE, "name", ("\"level\" = 'row'",)))


def rack_variable() -> Json:
    where = ("\"level\" = 'rack'", '"row" =~ /^$row$/')
    return query_variable("rack", "Rack", tag_values(TREE, "name", where))


def at_level(level: str, *more: str) -> tuple[str, ...]:
    """An InfluxQL condition: the tree nodes of ``level``, and ``more``."""
    return (f"{{level}} = '{level}'", *more)


def phase_annotation(where: tuple[str, ...] = ()) -> Json:
    q = Query(
        PHASE_EVENT,
        (("{events}", ""), ("{phase}", ""), ("{job}", "")),
        where=where,
        every=False,
    )
    return annotation("Phase changes", q.text(), "#8F3BB8", text="phase", tags="job")
