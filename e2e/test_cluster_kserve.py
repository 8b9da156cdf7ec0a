"""Our InferenceServices through KServe's own webhooks and controller (Standard mode) on the real control plane.

- Each example BatchedModel's InferenceService (the operator's pure mapping) passes KServe's validating
  webhook, and KServe's defaulting webhook changes none of the fields the operator owns (else the operator
  and KServe would patch the object back and forth forever).
- A mount path KServe must refuse is refused by KServe; the BatchedModel that would produce it never gets
  that far (our CRD refuses it first, naming the field: examples/invalid/name-dot-dot.yaml).
- KServe's controller turns a GPU model's InferenceService into the Deployment we expect: the
  ClusterServingRuntime's command and args in `kserve-container`, our env, resources and GPU limits, the
  storage initializer fetching every model's URI into its folder under the runtime's --model-repository;
  kwok runs its pods on the GPU node and KServe reports the InferenceService Ready with a URL.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusterkit import REPO, condition, get, maybe_get, wait_isvc_ready
from kmockkit import wait_for

from batchpilot.devcluster import LocalCluster
from batchpilot.devcluster.cluster import FAKE_NODE
from batchpilot.devcluster.process import ClusterError
from batchpilot.operator.mapping import MODEL_ROOT, inference_service
from batchpilot.operator.reconcile import drift_patch
from batchpilot.spec.batchedmodel import BatchedModelSpec
from batchpilot.spec.contracts import SPECS_ENV

pytestmark = pytest.mark.timeout(300)

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
FAKE_UID = "00000000-0000-0000-0000-000000000001"


def _isvc_for(path: Path, namespace: str = "default") -> dict[str, Any]:
    manifest = yaml.safe_load(path.read_text())
    spec = BatchedModelSpec.model_validate(manifest["spec"])
    isvc = inference_service(manifest["metadata"]["name"], namespace, FAKE_UID, spec)
    isvc["metadata"].pop("ownerReferences")  # no BatchedModel of that uid exists here
    return isvc


def _apply(cluster: LocalCluster, obj: dict[str, Any], *extra: str) -> dict[str, Any]:
    out = cluster.kubectl(
        "apply",
        "--server-side",
        "--field-manager=batchpilot-e2e",
        *extra,
        "-o",
        "json",
        "-f",
        "-",
        stdin=json.dumps(obj),
    )
    return json.loads(out)  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_kserve_webhooks_accept_and_keep_our_fields(
    cluster: LocalCluster, chart_objects: list[dict[str, Any]], path: Path
) -> None:
    desired = _isvc_for(path)
    admitted = _apply(cluster, desired, "--dry-run=server")  # through KServe's mutating + validating webhooks
    owned = {"metadata": {k: desired["metadata"][k] for k in ("labels", "annotations")}, "spec": desired["spec"]}
    assert drift_patch(admitted, owned) == {}, "KServe's defaulting changed fields the operator owns"
    model = admitted["spec"]["predictor"]["model"]
    assert model["runtime"] == "batchpilot" and model["modelFormat"]["name"] == "batchpilot"


@pytest.mark.parametrize(
    ("mount_path", "refusal"),
    [
        ("models/resnet", "mountPath in body should match '^/.*'"),  # KServe's CRD schema
        (f"{MODEL_ROOT}/a..b", "denied the request: storage path cannot contain '..'"),  # KServe's webhook
    ],
)
def test_kserve_refuses_bad_mount_paths(
    cluster: LocalCluster, chart_objects: list[dict[str, Any]], mount_path: str, refusal: str
) -> None:
    isvc = _isvc_for(REPO / "examples" / "both.yaml")
    isvc["spec"]["predictor"]["storageUris"][0]["mountPath"] = mount_path
    with pytest.raises(ClusterError) as refused:
        _apply(cluster, isvc, "--dry-run=server")
    assert refusal in str(refused.value)
    bad_name = REPO / "examples" / "invalid" / "name-dot-dot.yaml"
    with pytest.raises(ClusterError, match=r"spec.models\[0\].name") as ours:
        cluster.kubectl("apply", "--dry-run=server", "-n", "default", "-f", str(bad_name))
    assert "webhook" not in str(ours.value)  # the API server's own schema, before any webhook


def test_gpu_inference_service_becomes_the_deployment_we_expect(
    cluster: LocalCluster, chart_objects: list[dict[str, Any]]
) -> None:
    namespace = "vision"
    if maybe_get(cluster, "namespace", namespace) is None:
        cluster.kubectl("create", "namespace", namespace)
    desired = _isvc_for(REPO / "examples" / "cv.yaml", namespace)
    name = desired["metadata"]["name"]
    _apply(cluster, desired)
    try:
        deployment = wait_for(
            lambda: maybe_get(cluster, "deployment", f"{name}-predictor", "-n", namespace),
            "KServe's predictor Deployment",
            timeout_s=90,
        )
        pod_spec = deployment["spec"]["template"]["spec"]
        container = next(c for c in pod_spec["containers"] if c["name"] == "kserve-container")
        runtime = next(o for o in chart_objects if o["kind"] == "ClusterServingRuntime")["spec"]["containers"][0]
        assert container["command"] == runtime["command"]
        assert container["args"] == runtime["args"]
        repository = container["args"][container["args"].index("--model-repository") + 1]
        assert repository == MODEL_ROOT
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        ours = desired["spec"]["predictor"]["model"]
        assert env[SPECS_ENV] == ours["env"][0]["value"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert container["resources"]["requests"] == ours["resources"]["requests"]
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        assert {p.get("name"): p["containerPort"] for p in runtime["ports"]}.items() <= ports.items()

        # Every model's URI fetched by the storage initializer into its folder under the model repository.
        init = next(c for c in pod_spec.get("initContainers", []) if c["name"] == "storage-initializer")
        uris = {s["uri"]: s["mountPath"] for s in desired["spec"]["predictor"]["storageUris"]}
        pairs = dict(zip(init["args"][::2], init["args"][1::2], strict=True))
        assert pairs == uris, init["args"]
        mounted = {m["mountPath"] for m in container.get("volumeMounts", [])}
        assert all(any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounted) for path in uris.values()), (
            mounted
        )

        pods = wait_for(
            lambda: [
                p
                for p in get(cluster, "pods", "-n", namespace, "-l", f"serving.kserve.io/inferenceservice={name}")[
                    "items"
                ]
                if condition(p, "Ready").get("status") == "True"
            ],
            "the predictor pod Ready on kwok's GPU node",
            timeout_s=90,
        )
        assert pods[0]["spec"]["nodeName"] == FAKE_NODE
        isvc = wait_isvc_ready(cluster, name, namespace, timeout_s=90)
        assert isvc["status"]["url"].startswith("http")
        print(f"\nKServe made for {name}: Deployment {deployment['metadata']['name']}, url {isvc['status']['url']}")
        print(yaml.safe_dump(copy.deepcopy(container), sort_keys=False))
    finally:
        cluster.kubectl("delete", "isvc", name, "-n", namespace, "--ignore-not-found", "--wait=true", "--timeout=60s")
    wait_for(
        lambda: maybe_get(cluster, "deployment", f"{name}-predictor", "-n", namespace) is None,
        "the garbage collector to remove KServe's Deployment",
        timeout_s=90,
    )
