"""BatchedModel -> KServe InferenceService: a pure function of the spec (no I/O), plus the checks
for specs that the schema accepts but KServe cannot run.

One InferenceService per BatchedModel hosts all its models in one BatchPilot runtime (a batcher per
model); docs/operator.md says why. Objects are plain camelCase dicts: KServe's typed SDK models
serialize to snake_case and do not round-trip through the kubernetes client.
"""

from __future__ import annotations

import json
import re
from typing import Any

from batchpilot.spec import batchedmodel as bm
from batchpilot.spec.batchedmodel import BatchedModelSpec
from batchpilot.spec.contracts import ISVC_API_VERSION, SPECS_ENV, SUBPATHS_ENV

OWNER_LABEL = f"{bm.API_GROUP}/batchedmodel"
MANAGED_BY_LABELS = {"app.kubernetes.io/managed-by": "batchpilot-operator", "app.kubernetes.io/part-of": "batchpilot"}
DEPLOYMENT_MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
MODEL_FORMAT = "batchpilot"
MODEL_ROOT = "/mnt/models"  # the runtime's --model-repository; each model is a subfolder
GPU_RESOURCE = "nvidia.com/gpu"

#: KServe 0.21 calls the modes Standard and Knative and still reads the old names; writing the current
#: name keeps the annotation stable should KServe ever normalise it (else drift revert would fight it).
CANONICAL_DEPLOYMENT_MODE = {"RawDeployment": "Standard", "Serverless": "Knative"}

#: KServe names the predictor's Service and Deployment `<name>-predictor`; that must stay a DNS-1035 label.
MAX_NAME_LENGTH = 63 - len("-predictor")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{bm.API_GROUP}/{bm.API_VERSION}",
        "kind": bm.KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def model_specs_json(spec: BatchedModelSpec) -> str:
    """The runtime's BATCHPILOT_MODEL_SPECS: ModelSpec objects (camelCase), without the storage URI."""
    specs = [m.model_dump(mode="json", by_alias=True, exclude={"storage_uri"}) for m in spec.models]
    return json.dumps(specs, separators=(",", ":"), sort_keys=True)


def pvc_subpaths(spec: BatchedModelSpec) -> dict[str, str]:
    """{model: path} for `pvc://claim/path` URIs. KServe mounts the claim's root at the model's mount path (it
    drops `path`; e2e/test_cluster_flow.py shows it), so the runtime must look for the files at `path` in it."""
    subpaths = {}
    for m in spec.models:
        if m.storage_uri.startswith("pvc://"):
            _, _, path = m.storage_uri.removeprefix("pvc://").partition("/")
            if path.strip("/"):
                subpaths[m.name] = path.strip("/")
    return subpaths


def _env(spec: BatchedModelSpec) -> list[dict[str, str]]:
    env = [{"name": SPECS_ENV, "value": model_specs_json(spec)}]
    subpaths = pvc_subpaths(spec)
    if subpaths:
        env.append({"name": SUBPATHS_ENV, "value": json.dumps(subpaths, separators=(",", ":"), sort_keys=True)})
    return env


def _resources(spec: BatchedModelSpec) -> dict[str, dict[str, str]]:
    amounts = {"cpu": spec.resources.cpu, "memory": spec.resources.memory}
    if spec.resources.gpus:
        amounts[GPU_RESOURCE] = str(spec.resources.gpus)
    # Requests equal limits: a batcher tuned against a p99 target needs a CPU share that does not move.
    return {"requests": dict(amounts), "limits": dict(amounts)}


def inference_service(name: str, namespace: str, uid: str, spec: BatchedModelSpec) -> dict[str, Any]:
    """The InferenceService that serves BatchedModel `namespace/name` (uid: the owner's, for GC)."""
    return {
        "apiVersion": ISVC_API_VERSION,
        "kind": "InferenceService",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {OWNER_LABEL: name, **MANAGED_BY_LABELS},
            "annotations": {
                DEPLOYMENT_MODE_ANNOTATION: CANONICAL_DEPLOYMENT_MODE.get(spec.deployment_mode, spec.deployment_mode)
            },
            "ownerReferences": [owner_reference(name, uid)],
        },
        "spec": {
            "predictor": {
                "minReplicas": spec.replicas.min,
                "maxReplicas": spec.replicas.max,
                # One download per model, each into its own subfolder of the runtime's model repository.
                "storageUris": [{"uri": m.storage_uri, "mountPath": f"{MODEL_ROOT}/{m.name}"} for m in spec.models],
                "model": {
                    "modelFormat": {"name": MODEL_FORMAT},
                    "runtime": spec.runtime,
                    "protocolVersion": "v2",
                    "env": _env(spec),
                    "resources": _resources(spec),
                },
            },
        },
    }


def unsupported(name: str, spec: BatchedModelSpec) -> list[str]:
    """Why KServe could not run this (schema-valid) BatchedModel; empty when it can."""
    problems = []
    if not _DNS_1035.match(name) or len(name) > MAX_NAME_LENGTH:
        problems.append(
            f"name {name!r} cannot name an InferenceService: KServe needs a DNS-1035 label (a lowercase letter "
            f"first, then lowercase letters, digits or '-') of at most {MAX_NAME_LENGTH} characters"
        )
    return problems
