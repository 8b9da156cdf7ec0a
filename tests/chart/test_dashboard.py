"""The Grafana dashboard parses, ships in the ConfigMap unchanged, and queries only metrics the runtime exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from chartkit import CHART_DIR, Manifest, only
from prometheus_client import CollectorRegistry

from batchpilot.runtime.metrics import RuntimeMetrics

DASHBOARD_FILE = CHART_DIR / "dashboards" / "batchpilot.json"

PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "and",
    "or",
    "unless",
    "inf",
    "nan",
}
#: Families each panel of the issue needs: throughput, latency vs SLO, batch sizes, release reasons, queue depth,
#: tuned parameters and padding efficiency.
REQUIRED = {
    "batchpilot_requests_total",
    "batchpilot_request_latency_seconds_bucket",
    "batchpilot_latency_slo_seconds",
    "batchpilot_batch_size_bucket",
    "batchpilot_batch_release_total",
    "batchpilot_queue_depth",
    "batchpilot_max_batch_size",
    "batchpilot_max_queue_delay_seconds",
    "batchpilot_tokens_useful_total",
    "batchpilot_tokens_computed_total",
}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: what is left once strings, label matchers, grouping label lists,
    range/subquery brackets, function names, keywords, numbers and $variables are taken out."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\$\{?\w+\}?", " ", expr)
    # Grafana's label_values(metric, label) / label_values(label): only `metric` is a metric name.
    expr = re.sub(r"\blabel_values\(\s*([\w:]+)\s*,\s*\w+\s*\)", r" \1 ", expr)
    expr = re.sub(r"\blabel_values\(\s*\w+\s*\)", " ", expr)
    idents = re.findall(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", expr)
    return {name for name, call in idents if not call and name.lower() not in PROMQL_KEYWORDS}


#: Sample-name suffixes of each metric type in the exposition format.
SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}


def exported_samples() -> set[str]:
    """Sample names the runtime exports. Labelled families have no samples until a label set is used, so the names
    come from each family's name and type (histograms: _bucket/_sum/_count, counters: _total)."""
    registry = CollectorRegistry()
    RuntimeMetrics(registry=registry)
    return {family.name + suffix for family in registry.collect() for suffix in SAMPLE_SUFFIXES[family.type]}


def queries(node: Any) -> Iterator[str]:
    """Every PromQL string in the dashboard: panel targets' `expr` and query variables' `query`."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, dict) and "query" in value:
                yield value["query"]
            else:
                yield from queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from queries(item)


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text())
    return loaded


def test_metric_name_extraction() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (model, le) (rate(a_bucket{model=~"$model", x="y{z}"}[5m]))) '
        "/ on (model) group_left max(b) and c offset 5m > bool 0 or label_values(d, model)"
    )
    assert metric_names(expr) == {"a_bucket", "b", "c", "d"}


def test_every_queried_metric_is_exported_by_the_runtime(dashboard: dict[str, Any]) -> None:
    used = {name for q in queries(dashboard) for name in metric_names(q)}
    assert used, "no queries found"
    assert used - exported_samples() == set()
    assert REQUIRED - used == set()


def test_panels_have_unique_ids_and_queries(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["targets"] for p in dashboard["panels"])
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "model"}


def test_configmap_carries_the_dashboard_unchanged(chart_full: list[Manifest], dashboard: dict[str, Any]) -> None:
    configmap = only(chart_full, "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert json.loads(configmap["data"]["batchpilot.json"]) == dashboard
