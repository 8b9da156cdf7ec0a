"""The pure parts of the operator: spec -> InferenceService, drift patches, status, RBAC, CLI."""

from __future__ import annotations

import argparse
import json
from typing import Any

import jsonschema
import pytest

from batchpilot.operator import mapping, status
from batchpilot.operator.cli import add_operator_parser
from batchpilot.operator.rbac import OPERATOR_RULES
from batchpilot.operator.reconcile import drift_patch
from batchpilot.spec import BatchedModelSpec, ModelSpec

UID = "8a5b1c1e-0000-4000-8000-000000000001"


def _isvc(manifest: dict[str, Any]) -> dict[str, Any]:
    spec = BatchedModelSpec.model_validate(manifest["spec"])
    return mapping.inference_service(manifest["metadata"]["name"], "ns", UID, spec)


def test_examples_map_to_valid_inference_services(
    examples: dict[str, Any], isvc_validator: jsonschema.Draft4Validator
) -> None:
    for name, manifest in examples.items():
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in isvc_validator.iter_errors(_isvc(manifest))]
        assert errors == [], name


def test_one_inference_service_hosts_every_model(examples: dict[str, Any]) -> None:
    isvc = _isvc(examples["both.yaml"])
    predictor = isvc["spec"]["predictor"]
    model = predictor["model"]
    assert model["modelFormat"] == {"name": "batchpilot"} and model["runtime"] == "batchpilot"
    assert predictor["storageUris"] == [
        {"uri": "pvc://model-store/cnn", "mountPath": "/mnt/models/cnn"},
        {"uri": "pvc://model-store/distilbert", "mountPath": "/mnt/models/distilbert"},
    ]
    env, subpaths = model["env"]
    assert env["name"] == "BATCHPILOT_MODEL_SPECS"
    specs = [ModelSpec.model_validate(s) for s in json.loads(env["value"])]  # the runtime's own type
    # KServe mounts a pvc:// claim's root (not its path) at the mount path: the runtime is told where to look.
    assert subpaths["name"] == "BATCHPILOT_MODEL_SUBPATHS"
    assert json.loads(subpaths["value"]) == {"cnn": "cnn", "distilbert": "distilbert"}
    expected = BatchedModelSpec.model_validate(examples["both.yaml"]["spec"]).models
    assert [s.model_dump() for s in specs] == [m.model_dump(exclude={"storage_uri"}) for m in expected]
    assert predictor["minReplicas"] == 1 and predictor["maxReplicas"] == 2
    assert model["resources"]["limits"] == {"cpu": "6", "memory": "24Gi", "nvidia.com/gpu": "1"}
    assert model["resources"]["requests"] == model["resources"]["limits"]


def test_no_subpaths_without_pvc_paths(examples: dict[str, Any]) -> None:
    manifest = json.loads(json.dumps(examples["both.yaml"]))
    manifest["spec"]["models"][0]["storageUri"] = "s3://bucket/cnn"
    manifest["spec"]["models"][1]["storageUri"] = "pvc://whole-claim"
    env = _isvc(manifest)["spec"]["predictor"]["model"]["env"]
    assert [e["name"] for e in env] == ["BATCHPILOT_MODEL_SPECS"]


def test_ownership_and_labels(examples: dict[str, Any]) -> None:
    meta = _isvc(examples["cv.yaml"])["metadata"]
    assert meta["name"] == "resnet" and meta["namespace"] == "ns"
    assert meta["labels"][mapping.OWNER_LABEL] == "resnet"
    (owner,) = meta["ownerReferences"]
    assert owner == {
        "apiVersion": "batchpilot.io/v1alpha1",
        "kind": "BatchedModel",
        "name": "resnet",
        "uid": UID,
        "controller": True,
        "blockOwnerDeletion": True,
    }


@pytest.mark.parametrize(
    ("given", "written"),
    [("Standard", "Standard"), ("RawDeployment", "Standard"), ("Knative", "Knative"), ("Serverless", "Knative")],
)
def test_deployment_mode_annotation(examples: dict[str, Any], given: str, written: str) -> None:
    manifest = {**examples["cv.yaml"], "spec": {**examples["cv.yaml"]["spec"], "deploymentMode": given}}
    assert _isvc(manifest)["metadata"]["annotations"] == {"serving.kserve.io/deploymentMode": written}


def test_runtime_override_and_cpu_only(examples: dict[str, Any]) -> None:
    manifest = {**examples["nlp.yaml"], "spec": {**examples["nlp.yaml"]["spec"], "runtime": "batchpilot-cpu"}}
    model = _isvc(manifest)["spec"]["predictor"]["model"]
    assert model["runtime"] == "batchpilot-cpu"
    assert "nvidia.com/gpu" not in model["resources"]["limits"]
    assert model["resources"]["limits"]["cpu"] == "8"  # an int in YAML becomes a quantity string


@pytest.mark.parametrize(
    ("name", "ok"), [("resnet", True), ("a" * 53, True), ("a" * 54, False), ("1resnet", False), ("res.net", False)]
)
def test_names_kserve_cannot_take_are_reported(examples: dict[str, Any], name: str, ok: bool) -> None:
    spec = BatchedModelSpec.model_validate(examples["cv.yaml"]["spec"])
    problems = mapping.unsupported(name, spec)
    assert (problems == []) == ok
    if not ok:
        assert "DNS-1035" in problems[0] and name in problems[0]


def test_drift_patch_reverts_only_owned_fields() -> None:
    desired = {"spec": {"predictor": {"minReplicas": 1, "model": {"runtime": "batchpilot", "env": [{"name": "A"}]}}}}
    current = {
        "spec": {
            "predictor": {
                "minReplicas": 1,
                "model": {"runtime": "other", "env": [{"name": "A"}], "name": "kserve-container"},
            }
        }
    }
    assert drift_patch(current, desired) == {"spec": {"predictor": {"model": {"runtime": "batchpilot"}}}}
    assert drift_patch(desired, desired) == {}
    current["spec"]["predictor"]["model"]["env"].append({"name": "B"})  # lists compare whole
    assert drift_patch(current, desired)["spec"]["predictor"]["model"]["env"] == [{"name": "A"}]


def _isvc_with_ready(state: str, message: str = "") -> dict[str, Any]:
    return {
        "metadata": {"name": "x"},
        "status": {
            "url": "http://x.ns.example.com",
            "address": {"url": "http://x-predictor.ns.svc.cluster.local"},
            "conditions": [{"type": "Ready", "status": state, "message": message}],
        },
    }


def test_conditions_follow_kserve_and_keep_transition_times() -> None:
    first = status.conditions(generation=1, problem=None, isvc=_isvc_with_ready("False", "Pending"), previous=[])
    by_type = {c["type"]: c for c in first}
    assert by_type["Ready"]["status"] == "False" and by_type["Ready"]["message"] == "Pending"
    assert by_type["Reconciled"]["status"] == "True" and by_type["Degraded"]["status"] == "False"
    old = [{**c, "lastTransitionTime": "2020-01-01T00:00:00Z"} for c in first]
    second = {
        c["type"]: c for c in status.conditions(generation=2, problem=None, isvc=_isvc_with_ready("True"), previous=old)
    }
    assert second["Ready"]["status"] == "True" and second["Ready"]["lastTransitionTime"] != "2020-01-01T00:00:00Z"
    assert second["Reconciled"]["lastTransitionTime"] == "2020-01-01T00:00:00Z"  # unchanged status
    assert second["Reconciled"]["observedGeneration"] == 2


def test_problem_degrades_and_unreadies() -> None:
    problem = status.Problem("KServeMissing", "KServe is not installed")
    conds = {
        c["type"]: c
        for c in status.conditions(generation=1, problem=problem, isvc=_isvc_with_ready("True"), previous=[])
    }
    assert conds["Ready"]["status"] == "False" and conds["Ready"]["reason"] == "NotReconciled"
    assert conds["Reconciled"]["reason"] == "KServeMissing"
    assert conds["Degraded"]["status"] == "True" and conds["Degraded"]["message"] == "KServe is not installed"


def test_model_batching_status_from_runtime_json() -> None:
    payload = {
        "model": "cnn",
        "max_batch_size": 16,
        "max_queue_delay_microseconds": 2000,
        "autotune": {
            "enabled": True,
            "latency_slo_p99_ms": 50.0,
            "slo_feasible": True,
            "latency_model": {"a_ms_per_item": 0.4, "b_ms": 1.2},
            "changes": 3,
        },
        "recent": {"window_s": 10.0, "p99_ms": 12.3, "throughput_rps": 450.1, "items_per_s": 450.1},
    }
    entry = status.model_batching("cnn", payload)
    assert entry.pop("updated")
    assert entry == {
        "name": "cnn",
        "maxBatchSize": 16,
        "maxQueueDelayMicroseconds": 2000,
        "autotune": True,
        "latencySloP99Ms": 50.0,
        "sloFeasible": True,
        "autotuneChanges": 3,
        "recentP99Ms": 12.3,
        "recentThroughputRps": 450.1,
    }


def test_isvc_urls_prefer_the_in_cluster_address() -> None:
    assert status.isvc_urls(_isvc_with_ready("True")) == (
        "http://x.ns.example.com",
        "http://x-predictor.ns.svc.cluster.local",
    )
    assert status.isvc_urls(None) == (None, None)


def test_rbac_rules_are_well_formed() -> None:
    resources = {(g, r) for rule in OPERATOR_RULES for g in rule["apiGroups"] for r in rule["resources"]}
    assert ("batchpilot.io", "batchedmodels/status") in resources and ("", "events") in resources
    assert ("serving.kserve.io", "inferenceservices") in resources
    for rule in OPERATOR_RULES:
        assert set(rule) == {"apiGroups", "resources", "verbs"} and "*" not in rule["verbs"]


def test_cli_registers_operator_and_crd() -> None:
    parser = argparse.ArgumentParser()
    add_operator_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["operator", "--namespace", "ml", "--liveness", "http://0.0.0.0:8080/healthz"])
    assert (args.namespace, args.liveness, args.standalone, callable(args.func)) == (
        "ml",
        "http://0.0.0.0:8080/healthz",
        False,
        True,
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["operator", "--namespace", "ml", "--all-namespaces"])
    assert callable(parser.parse_args(["crd"]).func)
