"""The chart and the manifests on a real API server (kube-apiserver + etcd + controllers + kwok).

- `helm template | kubectl apply --server-side`, as a user without the helm binary would: the CRD is
  Established (so the API server accepted its schema and its CEL rules' cost), the ClusterServingRuntime
  passes KServe's own validating webhook, RBAC objects are accepted, and the operator Deployment's pod is
  scheduled onto kwok's node and reported Running and Ready.
- `kubectl apply -f examples/` is accepted; every manifest in examples/invalid/ is refused by the API
  server itself (schema or CEL) with a message naming the field (its `# field:` line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from clusterkit import CHART_NAMESPACE, REPO, condition, get, maybe_get
from kmockkit import wait_for

from batchpilot.devcluster import LocalCluster
from batchpilot.devcluster.cluster import FAKE_NODE
from batchpilot.devcluster.process import ClusterError

pytestmark = pytest.mark.timeout(300)

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
INVALID = sorted((REPO / "examples" / "invalid").glob("*.yaml"))


def _of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind)


def test_crd_is_established_with_its_cel_rules(cluster: LocalCluster, chart_objects: list[dict[str, Any]]) -> None:
    crd = get(cluster, "crd", "batchedmodels.batchpilot.io")
    assert condition(crd, "Established")["status"] == "True"
    assert condition(crd, "NamesAccepted")["status"] == "True"
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = [r["rule"] for r in _walk_rules(schema)]
    assert len(rules) >= 5, rules  # the server kept (and cost-checked) the CEL rules
    served = cluster.kubectl("api-resources", "--api-group=batchpilot.io", "-o", "name")
    assert "batchedmodels.batchpilot.io" in served


def _walk_rules(schema: dict[str, Any]) -> list[dict[str, Any]]:
    found = list(schema.get("x-kubernetes-validations", []))
    for child in (schema.get("properties") or {}).values():
        found += _walk_rules(child)
    if isinstance(schema.get("items"), dict):
        found += _walk_rules(schema["items"])
    return found


def test_chart_objects_accepted(cluster: LocalCluster, chart_objects: list[dict[str, Any]]) -> None:
    runtime = _of_kind(chart_objects, "ClusterServingRuntime")
    live = get(cluster, "clusterservingruntime", runtime["metadata"]["name"])
    assert live["spec"]["containers"][0]["args"] == runtime["spec"]["containers"][0]["args"]
    role = _of_kind(chart_objects, "ClusterRole")
    assert get(cluster, "clusterrole", role["metadata"]["name"])["rules"]
    binding = _of_kind(chart_objects, "ClusterRoleBinding")
    assert (
        get(cluster, "clusterrolebinding", binding["metadata"]["name"])["roleRef"]["name"] == role["metadata"]["name"]
    )


def test_operator_deployment_pod_runs_on_kwok(cluster: LocalCluster, chart_objects: list[dict[str, Any]]) -> None:
    deployment = _of_kind(chart_objects, "Deployment")
    name = deployment["metadata"]["name"]
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())

    def running_pod() -> dict[str, Any] | None:
        pods = get(cluster, "pods", "-n", CHART_NAMESPACE, "-l", selector)["items"]
        ready = [
            p for p in pods if p["status"].get("phase") == "Running" and condition(p, "Ready").get("status") == "True"
        ]
        return ready[0] if ready else None

    try:
        pod = wait_for(running_pod, f"a Running, Ready pod of Deployment {name}", timeout_s=90)
    except BaseException:
        print(cluster.kubectl("get", "pods,nodes", "-A", "-o", "wide"), cluster.kubectl("describe", "nodes"))
        raise
    assert pod["spec"]["nodeName"] == FAKE_NODE
    assert pod["spec"]["serviceAccountName"] == deployment["spec"]["template"]["spec"]["serviceAccountName"]
    live = wait_for(
        lambda: (
            (d := maybe_get(cluster, "deployment", name, "-n", CHART_NAMESPACE))
            and d["status"].get("availableReplicas") == 1
            and d
        ),
        f"Deployment {name} available",
        timeout_s=60,
    )
    assert condition(live, "Available")["status"] == "True"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_accepted(cluster: LocalCluster, chart_objects: list[dict[str, Any]], path: Path) -> None:
    namespace = yaml.safe_load(path.read_text())["metadata"].get("namespace", "default")
    if maybe_get(cluster, "namespace", namespace) is None:
        cluster.kubectl("create", "namespace", namespace)
    out = cluster.kubectl("apply", "--dry-run=server", "-f", str(path))
    assert "created (server dry run)" in out, out


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_rejected_by_api_server(cluster: LocalCluster, chart_objects: list[dict[str, Any]], path: Path) -> None:
    lines = path.read_text().splitlines()
    field = next(line.removeprefix("# field: ") for line in lines if line.startswith("# field: "))
    says = next(line.removeprefix("# api-server says: ") for line in lines if line.startswith("# api-server says: "))
    with pytest.raises(ClusterError) as refused:
        cluster.kubectl("apply", "--dry-run=server", "-n", "default", "-f", str(path))
    text = str(refused.value)
    assert field in text and says in text, text
    # The only problem reported is the one the file is about (a YAML 1.1 `y` once made outputs' names booleans).
    assert "must be of type" not in text, text
