"""Grafana's evaluation of the provisioned alert rules, for the subset they use: InfluxQL
queries over the rule's relative time range, then ``reduce`` (last, min, max, sum, mean),
``math`` (``$X op $Y`` on reduced numbers, joined by labels) and ``threshold`` (gt, lt)
expressions. The queries run against a real InfluxDB; the expressions are evaluated here
as Grafana's server-side expressions evaluate them on numbers."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.grafana_queries import Selection, interpolate
from tests.support.paths import REPO

GRAFANA_RULES = REPO / "grafana" / "provisioning" / "alerting" / "powerd-alerts.yaml"
DATASOURCES = REPO / "grafana" / "provisioning" / "datasources" / "powerd.yaml"
EXPR_UID = "__expr__"

Labels = frozenset[tuple[str, str]]
Numbers = dict[Labels, float]
RunQuery = Callable[[str], list[dict[str, Any]]]  # InfluxQL -> the result's series

_REDUCERS: dict[str, Callable[[list[float]], float]] = {
    "last": lambda vs: vs[-1],
    "min": min,
    "max": max,
    "sum": sum,
    "mean": lambda vs: sum(vs) / len(vs),
}
_OPS: dict[str, Callable[[float, float], Any]] = {
    "-": operator.sub,
    "+": operator.add,
    ">": operator.gt,
    "<": operator.lt,
}
_MATH = re.compile(r"^\$(\w+)\s*([-+<>])\s*\$(\w+)$")


@dataclass(frozen=True)
class Outcome:
    """A rule's evaluation: NoData (no series at all), or each series and whether it fires."""

    no_data: bool
    series: dict[Labels, bool]

    def firing(self) -> list[dict[str, str]]:
        return sorted((dict(k) for k, fires in self.series.items() if fires), key=str)

    def quiet(self) -> list[dict[str, str]]:
        return sorted((dict(k) for k, fires in self.series.items() if not fires), key=str)


def load_grafana_rules(path: Path = GRAFANA_RULES) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def rules_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in doc["groups"] for rule in group["rules"]]


def query_numbers(series: list[dict[str, Any]]) -> dict[Labels, list[float]]:
    """An InfluxQL result as Grafana's data source frames it: one series per tag set, the
    values of its one field (nulls dropped)."""
    out: dict[Labels, list[float]] = {}
    for s in series:
        key = frozenset(s.get("tags", {}).items())
        out[key] = [row[1] for row in s["values"] if row[1] is not None]
    return {k: v for k, v in out.items() if v}


def evaluate(rule: dict[str, Any], run: RunQuery, now_ms: int) -> Outcome:
    results: dict[str, Any] = {}
    for node in rule["data"]:
        model = node["model"]
        ref = node["refId"]
        if node["datasourceUid"] != EXPR_UID:
            span = node["relativeTimeRange"]
            start_ms = now_ms - span["from"] * 1000
            end_ms = now_ms - span["to"] * 1000
            text = interpolate(model["query"], Selection({}, {}), start_ms, end_ms)
            results[ref] = query_numbers(run(text))
        elif model["type"] == "reduce":
            reduce = _REDUCERS[model["reducer"]]
            results[ref] = {k: reduce(vs) for k, vs in results[model["expression"]].items()}
        elif model["type"] == "math":
            match = _MATH.match(model["expression"].strip())
            assert match, f"math {model['expression']!r}: only $X op $Y is evaluated here"
            left, op, right = results[match[1]], _OPS[match[2]], results[match[3]]
            results[ref] = {k: float(op(v, right[k])) for k, v in left.items() if k in right}
        elif model["type"] == "threshold":
            (condition,) = model["conditions"]
            evaluator = condition["evaluator"]
            compare = {"gt": operator.gt, "lt": operator.lt}[evaluator["type"]]
            (bound,) = evaluator["params"]
            results[ref] = {
                k: float(compare(v, bound)) for k, v in results[model["expression"]].items()
            }
        else:
            raise AssertionError(f"expression type {model['type']!r} is not evaluated here")
    final: Numbers = results[rule["condition"]]
    return Outcome(not final, {k: v != 0 for k, v in final.items()})
