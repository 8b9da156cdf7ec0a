"""The chart ships the generated BatchedModel CRD unchanged (charts/batchpilot/crds/, see the chart's README)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from chartkit import CHART_DIR, REPO

GENERATED = REPO / "crds" / "batchpilot.io_batchedmodels.yaml"
CHART_CRDS = CHART_DIR / "crds"


@pytest.fixture(scope="module")
def generated() -> Path:
    if not GENERATED.exists():
        pytest.skip(f"{GENERATED.relative_to(REPO)} is not generated yet (python -m batchpilot.operator.crdgen)")
    return GENERATED


def test_chart_copy_is_byte_identical(generated: Path) -> None:
    copy = CHART_CRDS / generated.name
    assert copy.exists() and copy.read_bytes() == generated.read_bytes(), (
        "run python -m batchpilot.operator.crdgen (it writes both copies)"
    )


def test_chart_ships_no_hand_written_crd() -> None:
    shipped = {p.name for p in CHART_CRDS.iterdir()} if CHART_CRDS.exists() else set()
    assert shipped <= {p.name for p in (REPO / "crds").glob("*.yaml")}


def test_helm_installs_a_valid_crd_with_what_the_rbac_names(chart: helm_python.Chart, generated: Path) -> None:
    docs: list[dict[str, Any]] = [yaml.safe_load(c["data"]) for c in chart.crds]
    (crd,) = [d for d in docs if d["metadata"]["name"] == "batchedmodels.batchpilot.io"]
    kubernetes_validate.validate(crd, kubernetes_validate.utils.latest_version(), strict=True)
    spec = crd["spec"]
    assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"], spec["scope"]) == (
        "batchpilot.io",
        "BatchedModel",
        "batchedmodels",
        "Namespaced",
    )
    (version,) = [v for v in spec["versions"] if v["name"] == "v1alpha1"]
    assert "status" in version.get("subresources", {}), "the chart's RBAC grants batchedmodels/status"
