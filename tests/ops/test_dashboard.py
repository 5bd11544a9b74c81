"""The Grafana dashboard: valid PromQL over the metrics the metrics modules define."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.ops.promql import (
    SCRAPE_SERIES,
    deprecated_names,
    exported_names,
    metric_names,
    metric_objects,
)
from tests.ops.test_prometheus_rules import alerting_rules
from tests.support.tools import ROOT, promtool, run

DASHBOARD = ROOT / "deploy/grafana/runifold.json"


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def expressions() -> list[str]:
    document = json.loads(DASHBOARD.read_text())
    return [
        target["expr"]
        for panel in panels(document["panels"])
        for target in panel.get("targets", [])
        if "expr" in target
    ]


def test_dashboard_is_grafana_json_with_targets() -> None:
    document = json.loads(DASHBOARD.read_text())
    assert document["uid"] and document["title"]
    variables = {v["name"] for v in document["templating"]["list"]}
    assert {"datasource", "service"} <= variables
    for panel in panels(document["panels"]):
        if panel["type"] != "row":
            assert panel["targets"], f"panel {panel['title']!r} has no query"
            assert panel["datasource"]["uid"] == "${datasource}"


def test_expressions_reference_only_metrics_of_metrics_py() -> None:
    known = exported_names() | SCRAPE_SERIES
    for expression in expressions():
        unknown = metric_names(expression) - known
        assert not unknown, f"unknown metrics {unknown} in {expression}"


def test_every_metric_and_every_alerted_signal_has_a_panel() -> None:
    used = set().union(*(metric_names(e) for e in expressions()))
    bases = {name.removesuffix("_total").removesuffix("_bucket") for name in used}
    bases |= {name.removesuffix("_count") for name in used}
    deprecated = deprecated_names()
    for attribute in metric_objects():
        name = attribute._name
        if name in deprecated:
            assert name not in bases, f"a panel still shows the deprecated {name}"
            continue
        assert name in bases, f"no panel shows {name}"
    for rule in alerting_rules():
        missing = metric_names(rule["expr"]) - used
        assert not missing, f"{rule['alert']} watches {missing}, which no panel shows"


def test_expressions_parse(tmp_path: Path) -> None:
    # promtool parses each expression as a recording rule, Grafana variables filled in.
    rules = [
        {
            "record": f"dashboard:expression_{i}",
            "expr": e.replace("$__rate_interval", "5m").replace("$service", ".*"),
        }
        for i, e in enumerate(expressions())
    ]
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = run(promtool(), "check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
