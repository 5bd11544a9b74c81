"""Metric names in PromQL expressions, and the names services/common/metrics.py exports."""

from __future__ import annotations

import re

from prometheus_client import Counter, Gauge, Histogram

from services.common import metrics

# Series Prometheus makes itself for every scrape target.
SCRAPE_SERIES = frozenset({"up"})

_KEYWORDS = frozenset(
    {
        # aggregations, set and logical operators, modifiers
        "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
        "count_values", "group", "and", "or", "unless", "by", "without", "on", "ignoring",
        "group_left", "group_right", "bool", "offset", "atan2",
    }
)  # fmt: skip
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_LABEL_LISTS = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", re.IGNORECASE
)
_IDENTIFIER = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(\s*\()?")


def metric_names(expression: str) -> set[str]:
    """The metric names an expression selects (functions, keywords and labels left out)."""
    text = _STRINGS.sub('""', expression)
    text = _MATCHERS.sub("{}", text)
    text = _RANGES.sub("", text)
    text = _LABEL_LISTS.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def exported_names() -> set[str]:
    """Every series name the metric objects of services/common/metrics.py expose."""
    names: set[str] = set()
    for attribute in vars(metrics).values():
        if isinstance(attribute, Counter):
            base = attribute._name  # without the _total suffix
            names |= {f"{base}_total", f"{base}_created"}
        elif isinstance(attribute, Histogram):
            base = attribute._name
            names |= {f"{base}_{suffix}" for suffix in ("bucket", "count", "sum", "created")}
        elif isinstance(attribute, Gauge):
            names.add(attribute._name)
    return names
