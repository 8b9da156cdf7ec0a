"""Helpers of the chart tests: the chart rendered by the real Helm engine (helm_python), parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "batchpilot"
KSERVE_CRDS = (
    REPO / ".tools" / "kserve" / "config" / "crd" / "full"
)  # the pinned KServe module source (make controlplane)
RELEASE, NAMESPACE, WATCHED = "bp", "batchpilot-system", "ml-team"

Manifest = dict[str, Any]

#: Everything optional switched on, GPUs, and a namespaced install.
FULL_VALUES: dict[str, Any] = {
    "imagePullSecrets": [{"name": "regcred"}],
    "operator": {"watchNamespace": WATCHED, "podAnnotations": {"a": "b"}, "nodeSelector": {"pool": "system"}},
    "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}},
    "servingRuntime": {
        "gpus": 1,
        "env": [{"name": "BATCHPILOT_LOG_LEVEL", "value": "debug"}],
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}, "matchLabels": {"team": "ml"}},
        "dashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "BatchPilot"}},
    },
}
VALUE_SETS = {"defaults": {}, "full": FULL_VALUES}


def render(chart: helm_python.Chart, values: dict[str, Any]) -> list[Manifest]:
    """All objects the chart's templates render (NOTES.txt excluded)."""
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [
        doc
        for path, text in sorted(rendered.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def only(manifests: list[Manifest], *kinds: str) -> Manifest:
    """The single object of one of `kinds`."""
    found = [m for m in manifests if m["kind"] in kinds]
    assert len(found) == 1, f"expected one of {kinds}, got {[m['kind'] for m in found]}"
    return found[0]
