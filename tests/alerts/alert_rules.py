"""The shipped Prometheus alert rules as data: their metrics, their annotations rendered,
and a copy with shorter ``for:`` durations for a test that cannot wait minutes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import REPO

RULES = REPO / "powerd" / "data" / "prometheus" / "powerd-alerts.yml"
SCRAPE_EXAMPLE = REPO / "powerd" / "data" / "prometheus" / "prometheus.example.yml"
METRICS_CODE = REPO / "powerd" / "metrics"
ALERTS_DOC = REPO / "docs" / "ALERTS.md"

# The shared contract's metric names (issue 36): what agents, controllers and the
# coordinator export. A rule may name these, and Prometheus's own `up`.
CONTRACT_METRICS = frozenset(
    {
        "powerd_agent_mode",
        "powerd_agent_failsafe",
        "powerd_agent_heartbeat_age_seconds",
        "powerd_agent_gpu_power_watts",
        "powerd_agent_gpu_cap_watts",
        "powerd_agent_commands_total",
        "powerd_agent_rejected_signatures_total",
        "powerd_agent_clock_alarms_total",
        "powerd_controller_leader",
        "powerd_controller_epoch",
        "powerd_controller_nodes",
        "powerd_controller_nodes_stale",
        "powerd_controller_level_power_watts",
        "powerd_controller_level_limit_watts",
        "powerd_controller_level_budget_watts",
        "powerd_controller_levels_over_limit",
        "powerd_controller_ingest_dropped_total",
        "powerd_controller_rejected_signatures_total",
        "powerd_controller_clock_skew_seconds",
        "powerd_controller_nodes_skewed",
        "powerd_controller_clock_alarms_total",
        "powerd_controller_site_limit_watts",
        "powerd_controller_site_limits_refused_total",
        "powerd_controller_cycle_seconds",
        "powerd_coordinator_leader",
        "powerd_coordinator_epoch",
        "powerd_coordinator_site_power_watts",
        "powerd_coordinator_site_limit_watts",
        "powerd_coordinator_leaves_stale",
        "powerd_coordinator_rejected_signatures_total",
        "powerd_coordinator_site_limits_refused_total",
    }
)
PROMETHEUS_OWN = frozenset({"up"})
SEVERITIES = ("critical", "warning")
ANNOTATIONS = ("summary", "description", "runbook_url")

_METRIC = re.compile(r"\b(powerd_[a-z_]+|up)\b(?=\s*[{\[)\s]|$)")
_TEMPLATE = re.compile(r"\{\{\s*(.*?)\s*\}\}")


@dataclass(frozen=True)
class Rule:
    group: str
    alert: str
    expr: str
    for_: str | None
    labels: dict[str, str]
    annotations: dict[str, str]


def load_rules(path: Path = RULES) -> list[Rule]:
    doc = yaml.safe_load(path.read_text())
    return [
        Rule(
            group["name"],
            rule["alert"],
            rule["expr"],
            rule.get("for"),
            dict(rule.get("labels", {})),
            dict(rule.get("annotations", {})),
        )
        for group in doc["groups"]
        for rule in group["rules"]
    ]


def metrics_in(expr: str) -> set[str]:
    """The metric names an expression selects (not functions, labels or keywords)."""
    without_matchers = re.sub(r"\{[^}]*\}", "{}", expr)
    without_strings = re.sub(r'"[^"]*"', '""', without_matchers)
    return set(_METRIC.findall(without_strings))


def exported_by_code(name: str) -> bool:
    """Whether powerd/metrics names the family (prometheus-client adds a counter's
    ``_total``, so a counter is named without it)."""
    code = "\n".join(p.read_text() for p in METRICS_CODE.glob("*.py"))
    family = name.removesuffix("_total")
    return f'"{name}"' in code or f'"{family}"' in code


def render(template: str, labels: dict[str, str], value: str | None) -> str:
    """A rule's annotation as Prometheus renders it, for the templates these rules use
    (``{{ $labels.NAME }}``, ``{{ $value }}``); an error for a label the alert lacks."""

    def one(match: re.Match[str]) -> str:
        what = match.group(1)
        if what == "$value":
            if value is None:
                raise KeyError(f"the case gives no value for {template!r}")
            return value
        if what.startswith("$labels."):
            return labels[what.removeprefix("$labels.")]
        raise ValueError(f"template {what!r}: only $labels.NAME and $value are rendered here")

    return _TEMPLATE.sub(one, template)


def with_annotations(cases: dict[str, Any], rules: list[Rule]) -> dict[str, Any]:
    """The promtool cases with each expected alert's ``exp_annotations`` filled in (the
    rule's, rendered with the alert's labels and its ``value``)."""
    by_name = {r.alert: r for r in rules}
    for test in cases["tests"]:
        for check in test.get("alert_rule_test", []):
            rule = by_name[check["alertname"]]
            for alert in check.get("exp_alerts") or []:
                value = alert.pop("value", None)
                labels = {"alertname": rule.alert, **alert["exp_labels"]}
                alert["exp_annotations"] = {
                    key: render(text, labels, value) for key, text in rule.annotations.items()
                }
    return cases


def shortened(path: Path, to: str = "1s") -> str:
    """The rules file with every ``for:`` set to ``to``: a test sees what fires at once
    instead of minutes later (the expressions are the shipped ones)."""
    doc = yaml.safe_load(path.read_text())
    for group in doc["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = to
    return yaml.safe_dump(doc, sort_keys=False)
