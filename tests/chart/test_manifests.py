"""Rendered manifests: valid for the Kubernetes API and KServe's CRDs, secure, and wired to each other."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chartkit import CHART_DIR, KSERVE_CRDS, NAMESPACE, WATCHED, Manifest, only

from batchpilot.operator.mapping import OWNER_LABEL

#: Groups of custom resources: kubernetes-validate knows only built-in kinds.
KSERVE, PROM_OPERATOR = "serving.kserve.io", "monitoring.coreos.com"
RUNTIME_KINDS = ("ClusterServingRuntime", "ServingRuntime")
CLUSTER_SCOPED_KINDS = {"ClusterRole", "ClusterRoleBinding", "ClusterServingRuntime"}


def kube_versions() -> list[str]:
    """The oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest kubernetes-validate knows."""
    floor = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["kubeVersion"]
    match = re.fullmatch(r">=\s*(\d+\.\d+\.\d+)(-0)?", floor)
    assert match, f"unexpected kubeVersion {floor!r}"
    return [match.group(1), kubernetes_validate.utils.latest_version()]


def group(manifest: Manifest) -> str:
    api_version: str = manifest["apiVersion"]
    return api_version.rpartition("/")[0]


def strict(schema: Any) -> Any:
    """A CRD schema that, like the API server's strict field validation (kubectl's default), rejects unknown fields."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def kserve_schema(kind: str) -> dict[str, Any]:
    plural = kind.lower() + "s"
    crd = yaml.safe_load((KSERVE_CRDS / f"{KSERVE}_{plural}.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return strict(version["schema"]["openAPIV3Schema"])


def containers(manifests: list[Manifest]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod-level spec, container) of every container the chart defines: the operator's and the runtime's."""
    deployment = only(manifests, "Deployment")["spec"]["template"]["spec"]
    pairs = [(deployment, c) for c in deployment["containers"]]
    runtimes = [m for m in manifests if m["kind"] in RUNTIME_KINDS]
    return pairs + [(rt["spec"], c) for rt in runtimes for c in rt["spec"]["containers"]]


@pytest.mark.parametrize("version", kube_versions())
def test_builtin_kinds_pass_kubernetes_validate_strict(manifests: list[Manifest], version: str) -> None:
    builtin = [m for m in manifests if group(m) not in (KSERVE, PROM_OPERATOR)]
    assert {"Deployment", "ServiceAccount"} <= {m["kind"] for m in builtin}
    for manifest in builtin:
        kubernetes_validate.validate(manifest, version, strict=True)


def test_serving_runtime_matches_kserve_crd_schema(manifests: list[Manifest]) -> None:
    runtime = only(manifests, *RUNTIME_KINDS)
    jsonschema.validate(runtime, kserve_schema(runtime["kind"]))


def test_strict_kserve_schema_rejects_an_unknown_field(manifests: list[Manifest]) -> None:
    runtime = only(manifests, *RUNTIME_KINDS)
    bad = {**runtime, "spec": {**runtime["spec"], "protocolVersion": ["v2"]}}
    with pytest.raises(jsonschema.ValidationError, match="protocolVersion"):
        jsonschema.validate(bad, kserve_schema(runtime["kind"]))


def test_serving_runtime_contract(manifests: list[Manifest]) -> None:
    runtime = only(manifests, *RUNTIME_KINDS)
    spec = runtime["spec"]
    assert runtime["metadata"]["name"] == "batchpilot"
    assert spec["supportedModelFormats"] == [{"name": "batchpilot", "version": "1", "autoSelect": True}]
    assert spec["protocolVersions"] == ["v1", "v2", "grpc-v2"]
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"
    assert [container["command"][0], *container["args"]] == [
        "batchpilot",
        "serve",
        "--model-repository",
        "/mnt/models",
        "--http-port",
        "8080",
        "--grpc-port",
        "8081",
    ]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http1": 8080, "grpc": 8081}
    probe = container["readinessProbe"]["httpGet"]
    assert (probe["path"], probe["port"]) == ("/batchpilot/ready", 8080)
    annotations = spec["annotations"]
    assert annotations["prometheus.kserve.io/port"] == annotations["prometheus.io/port"] == "8080"
    assert annotations["prometheus.kserve.io/path"] == annotations["prometheus.io/path"] == "/metrics"


def test_every_container_is_locked_down(manifests: list[Manifest]) -> None:
    pairs = containers(manifests)
    assert len(pairs) == 2
    for pod, container in pairs:
        ctx = container.get("securityContext", {})
        run_as_non_root = ctx.get("runAsNonRoot", pod.get("securityContext", {}).get("runAsNonRoot"))
        assert run_as_non_root is True, container["name"]
        assert ctx.get("runAsUser", 1) != 0, container["name"]
        assert ctx.get("readOnlyRootFilesystem") is True, container["name"]
        assert ctx.get("allowPrivilegeEscalation") is False, container["name"]
        assert ctx.get("capabilities", {}).get("drop") == ["ALL"], container["name"]
        assert {"requests", "limits"} <= set(container.get("resources", {})), container["name"]
        # The read-only root needs a writable /tmp backed by an emptyDir of the same pod.
        (tmp,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert any(v["name"] == tmp["name"] and "emptyDir" in v for v in pod["volumes"]), container["name"]


def test_operator_liveness_probe_targets_kopfs_endpoint(manifests: list[Manifest]) -> None:
    (container,) = only(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    (liveness,) = [a.removeprefix("--liveness=") for a in container["args"] if a.startswith("--liveness=")]
    match = re.fullmatch(r"http://0\.0\.0\.0:(\d+)(/\S+)", liveness)
    assert match, liveness
    probe = container["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe["path"] == match.group(2)
    assert ports[probe["port"]] == int(match.group(1))


def test_cluster_wide_install(chart_defaults: list[Manifest]) -> None:
    args = only(chart_defaults, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args and not any(a.startswith("--namespace") for a in args)
    assert "--standalone" in args, "one replica and no RBAC for kopf's peering objects"
    assert {m["kind"] for m in chart_defaults} >= CLUSTER_SCOPED_KINDS
    assert not {"ServiceMonitor", "ConfigMap"} & {m["kind"] for m in chart_defaults}, (
        "optional parts are off by default"
    )
    (container,) = only(chart_defaults, *RUNTIME_KINDS)["spec"]["containers"]
    assert not any("gpu" in name for name in container["resources"].get("limits", {}))


def test_namespaced_install_templates_nothing_cluster_scoped(chart_full: list[Manifest]) -> None:
    args = only(chart_full, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={WATCHED}" in args and "--all-namespaces" not in args
    assert not CLUSTER_SCOPED_KINDS & {m["kind"] for m in chart_full}
    for kind in ("Role", "RoleBinding", "ServingRuntime"):
        assert only(chart_full, kind)["metadata"]["namespace"] == WATCHED
    subject = only(chart_full, "RoleBinding")["subjects"][0]
    assert (subject["name"], subject["namespace"]) == (
        only(chart_full, "ServiceAccount")["metadata"]["name"],
        NAMESPACE,
    )


def test_gpus_from_values(chart_full: list[Manifest]) -> None:
    (container,) = only(chart_full, *RUNTIME_KINDS)["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["resources"]["limits"]["memory"] == "8Gi", "the GPU is added to the default limits"


def test_service_monitor_scrapes_the_runtime_metrics_port(chart_full: list[Manifest]) -> None:
    monitor = only(chart_full, "ServiceMonitor")
    (container,) = only(chart_full, *RUNTIME_KINDS)["spec"]["containers"]
    (endpoint,) = monitor["spec"]["endpoints"]
    # KServe names the predictor Service's first port after the container's first port.
    assert endpoint["port"] == container["ports"][0]["name"]
    assert endpoint["path"] == "/metrics"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [WATCHED]}
    # It selects the predictor Services of the operator's InferenceServices, which carry the operator's label.
    keys = {e["key"] for e in monitor["spec"]["selector"]["matchExpressions"]}
    assert OWNER_LABEL in keys
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
