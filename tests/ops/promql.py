"""Metric names in PromQL expressions, and the names the metrics modules export: the
floor's (services/common/metrics.py), each service's (services/<name>/metrics.py) and the
model calls' (services/llm/metrics.py)."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from types import ModuleType

from prometheus_client import Counter, Gauge, Histogram

from tests.support.tools import ROOT

Metric = Counter | Gauge | Histogram

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


def metrics_modules(*packages: str) -> list[ModuleType]:
    """The metrics modules of `packages` ("common", "transcript", "llm", ...), or of every
    package under services/ that has one."""
    found = sorted(path.parent.name for path in (ROOT / "services").glob("*/metrics.py"))
    chosen = packages or tuple(found)
    assert set(chosen) <= set(found), f"no metrics module in {set(chosen) - set(found)}"
    return [importlib.import_module(f"services.{package}.metrics") for package in chosen]


def metric_objects(*packages: str) -> Iterator[Metric]:
    """The metric objects the metrics modules of `packages` (every one when none) define."""
    for module in metrics_modules(*packages):
        for attribute in vars(module).values():
            if isinstance(attribute, Counter | Gauge | Histogram):
                yield attribute


def deprecated_names() -> frozenset[str]:
    """The series every metrics module exports for compatibility only (its DEPRECATED)."""
    names: set[str] = set()
    for module in metrics_modules():
        names |= getattr(module, "DEPRECATED", frozenset())
    return frozenset(names)


def exported_names() -> set[str]:
    """Every series name the metric objects of the metrics modules expose."""
    names: set[str] = set()
    for attribute in metric_objects():
        if isinstance(attribute, Counter):
            base = attribute._name  # without the _total suffix
            names |= {f"{base}_total", f"{base}_created"}
        elif isinstance(attribute, Histogram):
            base = attribute._name
            names |= {f"{base}_{suffix}" for suffix in ("bucket", "count", "sum", "created")}
        elif isinstance(attribute, Gauge):
            names.add(attribute._name)
    return names
