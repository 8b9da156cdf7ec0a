"""The operator on a real control plane when things go wrong: the API server restarts under its watches,
the operator itself is killed in the middle of a reconcile, and the operator is gone when a BatchedModel
is deleted (the garbage collector must then follow the ownerReferences alone)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from clusterkit import (
    NAMESPACE,
    StartOperator,
    alive,
    batched_model_manifest,
    event_reasons,
    get,
    isvc_max_batch,
    isvcs,
    maybe_get,
    reconciled,
)
from kmockkit import wait_for

from batchpilot.devcluster import LocalCluster
from batchpilot.devcluster.process import ClusterError

pytestmark = pytest.mark.timeout(420)


def test_api_server_restart_mid_watch(cluster: LocalCluster, start_operator: StartOperator, tmp_path: Path) -> None:
    name = "survivor"
    with start_operator("operator.log") as op:
        cluster.kubectl("apply", "-f", "-", stdin=batched_model_manifest(name))
        first = wait_for(lambda: isvcs(cluster, name), "the InferenceService", timeout_s=60)[0]
        wait_for(lambda: reconciled(cluster, name, 1), "Reconciled at generation 1")

        cluster.restart_apiserver(down_s=3)  # every watch and keep-alive connection breaks

        assert op.proc.poll() is None, "the operator died with the API server"
        cluster.kubectl("apply", "-f", "-", stdin=batched_model_manifest(name, max_batch_size=4))
        wait_for(
            lambda: isvcs(cluster, name) and isvc_max_batch(isvcs(cluster, name)[0]) == 4,
            "the change made after the restart to reach the InferenceService",
            timeout_s=120,
        )
        wait_for(lambda: reconciled(cluster, name, 2), "Reconciled at generation 2", timeout_s=60)
        children = isvcs(cluster, name)
        assert len(children) == 1 and children[0]["metadata"]["uid"] == first["metadata"]["uid"]
        assert alive(op)
        assert "DriftReverted" not in event_reasons(cluster, name)
        cluster.kubectl("delete", "bm", name, "-n", NAMESPACE, "--wait=true", "--timeout=60s")


def _hold_status_writes(cluster: LocalCluster, name: str) -> None:
    """A ValidatingAdmissionPolicy that refuses every status write to BatchedModel `name`: the operator's
    reconcile then stops after the InferenceService write and before its status write, every time."""
    rule = {
        "apiGroups": ["batchpilot.io"],
        "apiVersions": ["*"],
        "operations": ["UPDATE"],
        "resources": ["batchedmodels/status"],
    }
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [
                    {
                        "apiVersion": "admissionregistration.k8s.io/v1",
                        "kind": "ValidatingAdmissionPolicy",
                        "metadata": {"name": "hold-status"},
                        "spec": {
                            "failurePolicy": "Fail",
                            "matchConstraints": {"resourceRules": [rule]},
                            "validations": [
                                {
                                    "expression": f"object.metadata.name != '{name}'",
                                    "message": "status writes are held by the test",
                                }
                            ],
                        },
                    },
                    {
                        "apiVersion": "admissionregistration.k8s.io/v1",
                        "kind": "ValidatingAdmissionPolicyBinding",
                        "metadata": {"name": "hold-status"},
                        "spec": {"policyName": "hold-status", "validationActions": ["Deny"]},
                    },
                ],
            }
        ),
    )

    def held() -> bool:
        try:
            cluster.kubectl(
                "patch",
                "bm",
                name,
                "-n",
                NAMESPACE,
                "--subresource=status",
                "--type=merge",
                "-p",
                '{"status":{"modelNames":"probe"}}',
            )
        except ClusterError as refused:
            return "held by the test" in str(refused)
        return False

    wait_for(held, "the admission policy to hold status writes", timeout_s=30)


def test_operator_killed_mid_reconcile(cluster: LocalCluster, start_operator: StartOperator, tmp_path: Path) -> None:
    name = "interrupted"
    cluster.kubectl("apply", "-f", "-", stdin=batched_model_manifest(name))
    _hold_status_writes(cluster, name)
    try:
        with start_operator("first.log") as op:
            child = wait_for(lambda: isvcs(cluster, name), "the InferenceService", timeout_s=60)[0]
            # The reconcile is stuck between its two writes (kopf retries it): kill the operator there.
            wait_for(lambda: "held by the test" in op.log.read_text(), "the refused status write", timeout_s=60)
            op.proc.send_signal(signal.SIGKILL)
            op.proc.wait(timeout=10)
        assert reconciled(cluster, name, 1) is None
    finally:
        cluster.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", "hold-status")

    with start_operator("second.log") as op:
        bm = wait_for(
            lambda: reconciled(cluster, name, 1), "the restarted operator to finish the reconcile", timeout_s=120
        )
        children = isvcs(cluster, name)
        assert len(children) == 1 and children[0]["metadata"]["uid"] == child["metadata"]["uid"]
        assert bm["status"]["inferenceService"] == name
        assert "DriftReverted" not in event_reasons(cluster, name)
        assert alive(op)
        cluster.kubectl("delete", "bm", name, "-n", NAMESPACE, "--wait=true", "--timeout=60s")


def test_garbage_collector_follows_owner_references(
    cluster: LocalCluster, start_operator: StartOperator, tmp_path: Path
) -> None:
    """With the operator gone (uninstalled, crashed), deleting a BatchedModel still removes everything below
    it: the InferenceService (our ownerReference), then KServe's Deployment and pods (KServe's)."""
    name = "orphaned"
    with start_operator("operator.log"):
        cluster.kubectl("apply", "-f", "-", stdin=batched_model_manifest(name))
        wait_for(lambda: reconciled(cluster, name, 1), "Reconciled", timeout_s=60)
        wait_for(
            lambda: maybe_get(cluster, "deployment", f"{name}-predictor", "-n", NAMESPACE),
            "KServe's Deployment",
            timeout_s=90,
        )
    # The operator is stopped. Its finalizer would hold the deletion until it came back: an admin removes it.
    bm = get(cluster, "bm", name, "-n", NAMESPACE)
    assert bm["metadata"].get("finalizers"), "expected the operator's finalizer"
    cluster.kubectl("patch", "bm", name, "-n", NAMESPACE, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    t0 = time.monotonic()
    cluster.kubectl("delete", "bm", name, "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    wait_for(lambda: not isvcs(cluster, name), "the garbage collector to delete the InferenceService", timeout_s=90)
    wait_for(
        lambda: maybe_get(cluster, "deployment", f"{name}-predictor", "-n", NAMESPACE) is None,
        "the garbage collector to delete KServe's Deployment",
        timeout_s=90,
    )
    print(f"\ngarbage collected in {time.monotonic() - t0:.1f} s")
