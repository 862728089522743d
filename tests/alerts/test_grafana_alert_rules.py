"""The Grafana-provisioned alert rules (grafana/provisioning/alerting/powerd-alerts.yaml):
each rule's InfluxQL queries run against a real InfluxDB holding controller records
(written in the schema's own lines, powerd/telemetry_schema.py) of three clusters: one
healthy, one where every condition holds, one whose controller stopped recording five
minutes ago; the rule's expressions then decide, as Grafana would (tests/alerts/
grafana_rules.py), which series fire. The file is checked for what Grafana's provisioning
requires, against Grafana's schema where grafana-foundation-sdk types it."""

from __future__ import annotations

import re
import time
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.models import alerting, expr

from powerd.telemetry_schema import decision_line, tree_line
from tests.alerts.alert_rules import ALERTS_DOC, SEVERITIES
from tests.alerts.grafana_rules import (
    DATASOURCES,
    EXPR_UID,
    Outcome,
    evaluate,
    load_grafana_rules,
    rules_of,
)
from tests.grafana.grafana_schema import _problems
from tests.support.servers import running
from tests.support.tsdb import InfluxDB1

DB = "powerd"
SPAN_S = 900  # 15 minutes of records, one point every STEP_S
STEP_S = 5
GONE_FOR_S = 300  # cluster "gone" recorded nothing for the last 5 minutes


def cluster_lines(cluster: str, now: float, bad: bool, until_s: float = 0.0) -> list[str]:
    """``decision`` and ``tree`` points every STEP_S over SPAN_S up to ``now - until_s``:
    healthy, or with every condition the rules watch (``bad``)."""
    lines: list[str | None] = []
    for i, ago in enumerate(range(SPAN_S, int(until_s), -STEP_S)):
        ts = now - ago
        lines.append(
            decision_line(
                ts,
                cluster=cluster,
                controller="ctl-b" if bad else "ctl-a",
                epoch=7,
                cycle_s=0.01,
                failsafe_nodes=3 if bad else 0,
                stale_nodes=2 if bad else 0,
                telemetry_dropped=5 if bad else 0,
                nodes_skewed=1 if bad else 0,
                clock_alarms=i // 40 if bad else 3,  # rises every 200 s when bad
                site_limit_w=100e6,
            )
        )
        site_w = 110e6 if bad else 90e6
        lines.append(
            tree_line(
                ts,
                cluster=cluster,
                level="site",
                name="lab",
                power_w=site_w,
                limit_w=150e6,
                cap_threshold_w=98e6,
            )
        )
        racks = {"k1": 6300.0, "k2": 4200.0} if bad else {"k1": 3000.0, "k2": 3500.0}
        for rack, power_w in racks.items():
            lines.append(
                tree_line(
                    ts,
                    cluster=cluster,
                    level="rack",
                    name=rack,
                    site="lab",
                    row="r1",
                    power_w=power_w,
                    limit_w=6200.0,
                    cap_threshold_w=3920.0,
                )
            )
            # a node over its own numbers: node points are not what these rules judge
            lines.append(
                tree_line(
                    ts,
                    cluster=cluster,
                    level="node",
                    name=f"{rack}-n1",
                    power_w=9000.0,
                    limit_w=2000.0,
                    cap_threshold_w=1500.0,
                )
            )
    return [line for line in lines if line is not None]


@dataclass
class Recorded:
    server: InfluxDB1
    now_ms: int

    def run(self, query: str, database: str = DB) -> list[dict[str, Any]]:
        result = self.server.query(query, database=database)["results"][0]
        assert "error" not in result, f"{query}\n-> {result['error']}"
        return list(result.get("series", []))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    with running(InfluxDB1(tmp_path_factory.mktemp("grafana-alerts"))) as server:
        server.create_database(DB)
        server.create_database("empty")
        now = time.time()
        lines = (
            cluster_lines("good", now, bad=False)
            + cluster_lines("bad", now, bad=True)
            + cluster_lines("gone", now, bad=False, until_s=GONE_FOR_S)
        )
        server.write(DB, "\n".join(lines).encode())
        yield Recorded(server, int(now * 1000))


RULES = {rule["title"]: rule for rule in rules_of(load_grafana_rules())}


def site(cluster: str) -> dict[str, str]:
    return {"cluster": cluster}


def level(cluster: str, kind: str, name: str) -> dict[str, str]:
    return {"cluster": cluster, "level": kind, "name": name}


# each rule: the series it fires for, and some it must not (over the three clusters)
EXPECTED: dict[str, tuple[list[dict[str, str]], list[dict[str, str]]]] = {
    "PowerdNoDecisionsRecorded": ([site("gone")], [site("good"), site("bad")]),
    "PowerdLevelOverLimitRecorded": (
        [level("bad", "rack", "k1")],
        [level("bad", "rack", "k2"), level("bad", "site", "lab"), level("good", "rack", "k1")],
    ),
    "PowerdLevelOverBudgetRecorded": (
        [level("bad", "rack", "k1"), level("bad", "rack", "k2"), level("bad", "site", "lab")],
        [level("good", "rack", "k1"), level("good", "rack", "k2"), level("good", "site", "lab")],
    ),
    "PowerdSiteLimitNotAppliedRecorded": ([site("bad")], [site("good")]),
    "PowerdNodesFailsafeRecorded": ([site("bad")], [site("good")]),
    "PowerdNodesStaleRecorded": ([site("bad")], [site("good")]),
    "PowerdIngestDropsRecorded": ([site("bad")], [site("good")]),
    "PowerdNodesClockSkewedRecorded": ([site("bad")], [site("good")]),
    "PowerdClockAlarmsRecorded": (
        [{"cluster": "bad", "controller": "ctl-b"}],
        [{"cluster": "good", "controller": "ctl-a"}],
    ),
}


def test_every_rule_has_its_cases() -> None:
    assert set(EXPECTED) == set(RULES)


def by_key(labels: list[dict[str, str]]) -> list[str]:
    return sorted(str(sorted(x.items())) for x in labels)


@pytest.mark.parametrize("title", sorted(EXPECTED))
def test_rule_fires_where_it_should_on_recorded_data(recorded: Recorded, title: str) -> None:
    outcome = evaluate(RULES[title], recorded.run, recorded.now_ms)
    fires, quiet = EXPECTED[title]
    assert not outcome.no_data
    assert by_key(outcome.firing()) == by_key(fires)
    assert set(by_key(quiet)) <= set(by_key(outcome.quiet()))


def test_nothing_recorded_alerts_only_as_no_decisions(recorded: Recorded) -> None:
    """With no controller recording anything, every query finds nothing (NoData): the
    no-decisions rule alerts on NoData, the others stay OK."""
    for title, rule in RULES.items():
        outcome: Outcome = evaluate(
            rule, lambda q: recorded.run(q, database="empty"), recorded.now_ms
        )
        assert outcome.no_data, title
        expected = "Alerting" if title == "PowerdNoDecisionsRecorded" else "OK"
        assert rule["noDataState"] == expected, title


DURATION = re.compile(r"^\d+[smh]$")
UID = re.compile(r"^[a-zA-Z0-9_-]{1,40}$")
TEMPLATE = re.compile(r"\{\{\s*(.*?)\s*\}\}")
EXPR_MODELS: dict[str, Any] = {
    "reduce": expr.TypeReduce,
    "math": expr.TypeMath,
    "threshold": expr.TypeThreshold,
}


def test_the_file_is_what_grafana_provisions() -> None:
    doc = load_grafana_rules()
    assert doc["apiVersion"] == 1
    hints = typing.get_type_hints(alerting.Rule)
    no_data_states = typing.get_args(hints["no_data_state"])
    exec_err_states = typing.get_args(hints["exec_err_state"])
    datasource_uid = yaml.safe_load(DATASOURCES.read_text())["datasources"][0]["uid"]
    docs = ALERTS_DOC.read_text().lower()
    problems: list[str] = []
    uids: set[str] = set()
    for group in doc["groups"]:
        assert {"orgId", "name", "folder", "interval", "rules"} <= set(group)
        assert DURATION.match(group["interval"])
        for rule in group["rules"]:
            where = rule.get("uid", "?")
            assert {"uid", "title", "condition", "data", "for"} <= set(rule), where
            assert UID.match(rule["uid"]) and rule["uid"] not in uids, where
            uids.add(rule["uid"])
            assert rule["noDataState"] in no_data_states, where
            assert rule["execErrState"] in exec_err_states, where
            assert DURATION.match(rule["for"]), where
            assert rule["labels"]["severity"] in SEVERITIES, where
            assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), where
            anchor = rule["annotations"]["runbook_url"].partition("#")[2]
            assert anchor and f"### {anchor}" in docs.replace("`", ""), where
            assert rule["title"].lower() in docs, f"{rule['title']} is not in docs/ALERTS.md"
            refs = [node["refId"] for node in rule["data"]]
            assert rule["condition"] in refs and len(set(refs)) == len(refs), where
            grouped_by: set[str] = set()
            for node in rule["data"]:
                model = node["model"]
                assert model["refId"] == node["refId"], where
                if node["datasourceUid"] == EXPR_UID:
                    assert model["expression"].replace("$", "").split()[0] in refs, where
                    cls = EXPR_MODELS[model["type"]]
                    problems += _problems(cls.from_json(model), model, f"{where}.{node['refId']}")
                else:
                    assert node["datasourceUid"] == datasource_uid, where
                    assert model["rawQuery"] is True and "$timeFilter" in model["query"], where
                    assert set(node["relativeTimeRange"]) == {"from", "to"}, where
                    grouped_by |= set(
                        re.findall(r"GROUP BY (.*)$", model["query"])[0]
                        .replace('"', "")
                        .replace(" ", "")
                        .split(",")
                    )
            for template in TEMPLATE.findall(" ".join(rule["annotations"].values())):
                if template.startswith("$labels."):
                    assert template.removeprefix("$labels.") in grouped_by, (where, template)
                else:
                    assert template.removeprefix("$values.") in refs, (where, template)
    assert problems == []
