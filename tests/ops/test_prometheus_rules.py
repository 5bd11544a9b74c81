"""The alert rules: promtool check and unit tests, coverage of each alert, names, runbooks."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.ops.promql import SCRAPE_SERIES, exported_names, metric_names
from tests.support.tools import ROOT, promtool, run

RULES = ROOT / "deploy/prometheus/rules/runifold.rules.yml"
TESTS = sorted((ROOT / "deploy/prometheus/tests").glob("*.test.yml"))
RUNBOOK = ROOT / "docs/operations.md"


def alerting_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def test_promtool_check_rules_with_every_lint() -> None:
    checked = run(promtool(), "check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_unit_tests_pass() -> None:
    assert TESTS, "no promtool unit tests in deploy/prometheus/tests"
    tested = run(promtool(), "test", "rules", *map(str, TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_is_shown_to_fire_and_not_to_fire() -> None:
    fires: set[str] = set()
    stays_quiet: set[str] = set()
    for path in TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else stays_quiet).add(check["alertname"])
    for rule in alerting_rules():
        assert rule["alert"] in fires, f"no test shows {rule['alert']} firing"
        assert rule["alert"] in stays_quiet, f"no test shows {rule['alert']} not firing"


def test_alerts_use_only_exported_metrics() -> None:
    known = exported_names() | SCRAPE_SERIES
    for rule in alerting_rules():
        unknown = metric_names(rule["expr"]) - known
        assert not unknown, f"{rule['alert']} uses metrics no metrics module defines: {unknown}"


def test_alerts_have_severity_and_a_runbook_section() -> None:
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("#")
    }
    for rule in alerting_rules():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= annotations.keys(), rule["alert"]
        path, _, anchor = annotations["runbook_url"].partition("#")
        assert Path(ROOT / path) == RUNBOOK and anchor in headings, (
            f"{rule['alert']}: docs/operations.md has no section #{anchor}"
        )
