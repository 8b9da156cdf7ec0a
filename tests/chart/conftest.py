"""Fixtures of the chart tests: each value set of chartkit.VALUE_SETS rendered once per session."""

from __future__ import annotations

import helm_python
import pytest
from chartkit import CHART_DIR, VALUE_SETS, Manifest, render


@pytest.fixture(scope="session")
def chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART_DIR)


@pytest.fixture(scope="session")
def rendered(chart: helm_python.Chart) -> dict[str, list[Manifest]]:
    return {name: render(chart, values) for name, values in VALUE_SETS.items()}


@pytest.fixture(params=sorted(VALUE_SETS))
def manifests(request: pytest.FixtureRequest, rendered: dict[str, list[Manifest]]) -> list[Manifest]:
    return rendered[request.param]


@pytest.fixture
def chart_defaults(rendered: dict[str, list[Manifest]]) -> list[Manifest]:
    return rendered["defaults"]


@pytest.fixture
def chart_full(rendered: dict[str, list[Manifest]]) -> list[Manifest]:
    """Namespaced install (operator.watchNamespace set) with GPUs, ServiceMonitor and dashboard on."""
    return rendered["full"]
