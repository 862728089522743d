"""The shipped Prometheus alert rules: `promtool test rules` fires and clears every one of
them (tests/alerts/promtool_cases.yml); each carries its severity, says what to check and
names its section of docs/ALERTS.md; each names only metrics the daemons export; and the
example scrape config is one Prometheus loads."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.alerts.alert_rules import (
    ALERTS_DOC,
    ANNOTATIONS,
    CONTRACT_METRICS,
    PROMETHEUS_OWN,
    RULES,
    SCRAPE_EXAMPLE,
    SEVERITIES,
    exported_by_code,
    load_rules,
    metrics_in,
    with_annotations,
)
from tests.support.servers import find_program

CASES = Path(__file__).with_name("promtool_cases.yml")


def promtool() -> str:
    return find_program(("promtool",), "prometheus")


def test_promtool_fires_and_clears_every_rule(tmp_path: Path) -> None:
    rules = load_rules()
    cases = with_annotations(yaml.safe_load(CASES.read_text()), rules)
    cases["rule_files"] = [str(RULES)]
    test_file = tmp_path / "powerd-alerts.test.yml"
    test_file.write_text(yaml.safe_dump(cases, sort_keys=False))
    done = subprocess.run(
        [promtool(), "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # every rule has a case where it fires and one where it does not
    fired: set[str] = set()
    quiet: set[str] = set()
    for test in cases["tests"]:
        for check in test["alert_rule_test"]:
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {r.alert for r in rules}
    assert names - fired == set(), "rules never seen firing"
    assert names - quiet == set(), "rules never seen quiet"


def test_promtool_checks_the_rules_file() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_rule_has_a_severity_and_says_what_to_check() -> None:
    doc = ALERTS_DOC.read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", doc, re.M)
    }
    rules = load_rules()
    assert len({r.alert for r in rules}) == len(rules), "two rules share a name"
    for rule in rules:
        assert rule.labels.get("severity") in SEVERITIES, rule.alert
        assert set(ANNOTATIONS) <= set(rule.annotations), rule.alert
        description = rule.annotations["description"]
        assert re.search(r"\b(check|fix)\b", description, re.I), f"{rule.alert}: what to check?"
        path, _, anchor = rule.annotations["runbook_url"].partition("#")
        assert path == "docs/ALERTS.md" and anchor in anchors, f"{rule.alert}: {anchor}"
        assert rule.alert in doc, f"{rule.alert} is not in docs/ALERTS.md"


def test_rules_name_only_metrics_the_daemons_export() -> None:
    named = set().union(*(metrics_in(r.expr) for r in load_rules()))
    assert "powerd_controller_leader" in named  # the parse finds names at all
    assert named - CONTRACT_METRICS - PROMETHEUS_OWN == set()
    not_in_code = {n for n in named - PROMETHEUS_OWN if not exported_by_code(n)}
    assert not_in_code == set(), "named by a rule, exported by no code in powerd/metrics"


def test_metrics_in_reads_selectors_not_labels() -> None:
    expr = 'max by (scope) (powerd_controller_leader{mode="x"}[5m]) and up == 0'
    assert metrics_in(expr) == {"powerd_controller_leader", "up"}


@pytest.mark.parametrize("example", [SCRAPE_EXAMPLE])
def test_the_example_scrape_config_loads(tmp_path: Path, example: Path) -> None:
    """`promtool check config` with the rules file beside it, as the example says."""
    shutil.copy(example, tmp_path / "prometheus.yml")
    shutil.copy(RULES, tmp_path / RULES.name)
    done = subprocess.run(
        [promtool(), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 rule files found" in done.stdout
    jobs = {j["job_name"] for j in yaml.safe_load(example.read_text())["scrape_configs"]}
    assert jobs == {"powerd-agent", "powerd-controller", "powerd-coordinator"}
