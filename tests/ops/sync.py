"""Generate k8s/base/prometheusrule.yaml from the one rules file: `make deploy-sync`.

The PrometheusRule's `spec` is the rules file itself, so compose (which mounts
the file) and Kubernetes alert on exactly the same rules;
tests/ops/test_k8s.py fails when the two drift apart.
"""

from __future__ import annotations

from typing import Any

import yaml

from tests.support.tools import ROOT

RULES = ROOT / "deploy/prometheus/rules/runifold.rules.yml"
PROMETHEUS_RULE = ROOT / "k8s/base/prometheusrule.yaml"

_HEADER = """\
# GENERATED from deploy/prometheus/rules/runifold.rules.yml by `make deploy-sync`:
# edit that file, not this one. Your Prometheus must select this PrometheusRule
# (e.g. kube-prometheus-stack: a `release: <name>` label, set in an overlay).
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL, descriptions) as literal blocks, as written by hand."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def prometheus_rule() -> dict[str, Any]:
    """The PrometheusRule resource carrying the rules file's groups."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "runifold", "labels": {"app.kubernetes.io/name": "runifold"}},
        "spec": yaml.safe_load(RULES.read_text()),
    }


def render() -> str:
    """The text of k8s/base/prometheusrule.yaml."""
    body = yaml.dump(prometheus_rule(), Dumper=_Dumper, sort_keys=False, width=4096)
    return _HEADER + body


if __name__ == "__main__":
    PROMETHEUS_RULE.write_text(render())
    print(f"wrote {PROMETHEUS_RULE.relative_to(ROOT)}")
