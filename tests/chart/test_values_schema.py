"""values.schema.json: the defaults pass; unknown keys and wrong types fail with a message naming the key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import helm_python
import pytest
from chartkit import CHART_DIR, VALUE_SETS, render


def object_schemas(node: Any, path: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if "properties" in node:
            yield path, node
        for key, value in node.items():
            yield from object_schemas(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from object_schemas(item, f"{path}/{i}")


def test_every_object_with_fixed_keys_rejects_unknown_keys() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    open_objects = [path for path, node in object_schemas(schema) if node.get("additionalProperties") is not False]
    assert open_objects == []


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_value_sets_are_valid(chart: helm_python.Chart, values: dict[str, Any]) -> None:
    chart.validate_schema(chart.merge_values(values))


@pytest.mark.parametrize(
    ("values", "key", "problem"),
    [
        ({"operator": {"watchNamspace": "ml"}}, "watchNamspace", "not allowed"),
        ({"metrics": {"dashbord": {"enabled": True}}}, "dashbord", "not allowed"),
        ({"servingRuntime": {"gpus": "2"}}, "/servingRuntime/gpus", "want integer"),
        ({"metrics": {"serviceMonitor": {"enabled": "yes"}}}, "/metrics/serviceMonitor/enabled", "want boolean"),
        ({"operator": {"image": {"pullPolicy": "Sometimes"}}}, "/operator/image/pullPolicy", ""),
        (
            {"servingRuntime": {"resources": {"limits": {"memory": "8 GB"}}}},
            "/servingRuntime/resources/limits/memory",
            "",
        ),
    ],
)
def test_bad_values_are_rejected_naming_the_key(
    chart: helm_python.Chart, values: dict[str, Any], key: str, problem: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError) as caught:
        chart.validate_schema(chart.merge_values(values))
    assert key in str(caught.value) and problem in str(caught.value)
    with pytest.raises(helm_python.HelmValuesError, match=key):
        render(chart, values)
