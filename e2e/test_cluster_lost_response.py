"""The operator on a real control plane when the answer to one of its writes is lost: the API server applied
the create (or patch) of the InferenceService, then the connection was cut before the response reached the
operator. It must converge to exactly one child, without taking its own write for someone's drift.

The operator reaches the API server through lossyproxy.LossyProxy (TLS on loopback, the cluster's CA), which
forwards the armed request, reads the API server's whole answer, then closes the connection instead."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clusterkit import (
    NAMESPACE,
    OperatorProcess,
    StartOperator,
    alive,
    batched_model_manifest,
    event_reasons,
    get,
    isvc_max_batch,
    kubeconfig_via,
    reconciled,
)
from kmockkit import wait_for
from lossyproxy import LossyProxy

from batchpilot.devcluster import LocalCluster
from batchpilot.operator.mapping import OWNER_LABEL

pytestmark = pytest.mark.timeout(420)

ISVCS = f"/apis/serving.kserve.io/v1beta1/namespaces/{NAMESPACE}/inferenceservices"
BOOKKEEPING = {"batchpilot.io/kopf-managed", "batchpilot.io/last-handled-configuration"}


@pytest.fixture
def lossy(cluster: LocalCluster) -> Iterator[LossyProxy]:
    assert cluster.ca is not None
    pair = cluster.ca.serving_pair("lossy-proxy")
    with LossyProxy(cluster.server, cluster.ca_path, pair.cert, pair.key) as proxy:
        yield proxy


def _children(cluster: LocalCluster, name: str) -> list[dict[str, Any]]:
    """Every InferenceService that says it belongs to BatchedModel `name`, whatever its own name."""
    return list(get(cluster, "isvc", "-n", NAMESPACE, "-l", f"{OWNER_LABEL}={name}")["items"])


def _handlers_pending(cluster: LocalCluster, name: str) -> list[str]:
    """kopf's progress annotations on the BatchedModel: the handlers it has yet to finish (or to retry)."""
    annotations = get(cluster, "bm", name, "-n", NAMESPACE)["metadata"].get("annotations") or {}
    return [k for k in annotations if k.startswith("batchpilot.io/") and k not in BOOKKEEPING]


def _settle(
    cluster: LocalCluster, name: str, uid: str, generation: int, op: OperatorProcess, t0: float
) -> tuple[float, float]:
    """Wait for Reconciled at `generation`, then for the operator's interrupted handler to be retried to its
    end, checking all along that the BatchedModel has one child, `uid`. (seconds to each, from `t0`)"""

    def one_child() -> None:
        assert [c["metadata"]["uid"] for c in _children(cluster, name)] == [uid]

    def reconciled_now() -> Any:
        one_child()
        return reconciled(cluster, name, generation)

    def handlers_done() -> bool:
        one_child()
        assert alive(op)
        return not _handlers_pending(cluster, name)

    wait_for(reconciled_now, f"Reconciled at generation {generation}", timeout_s=120)
    converged_s = time.monotonic() - t0
    wait_for(handlers_done, "the interrupted handler to be retried to its end", timeout_s=120, interval_s=0.5)
    return converged_s, time.monotonic() - t0


def _report(lossy: LossyProxy, op: OperatorProcess, writes: str, sent: int, times: tuple[float, float]) -> None:
    log = op.log.read_text()
    print(
        f"\nresponses lost: {[(lost.method, lost.path, lost.status) for lost in lossy.lost]}; {writes} sent: {sent}; "
        f"handler failures: {log.count('failed temporarily')} temporary, {log.count('failed with an exception')} "
        f"other; from the apply: Reconciled after {times[0]:.1f} s, handler done after {times[1]:.1f} s"
    )


def test_lost_create_response(
    cluster: LocalCluster, start_operator: StartOperator, operator_kubeconfig: Path, lossy: LossyProxy, tmp_path: Path
) -> None:
    name = "lost-create"
    kubeconfig = kubeconfig_via(operator_kubeconfig, lossy.server, tmp_path / "kubeconfig")
    lossy.lose_next("POST", ISVCS)
    with start_operator("operator.log", kubeconfig=kubeconfig) as op:
        t0 = time.monotonic()
        cluster.kubectl("apply", "-f", "-", stdin=batched_model_manifest(name))
        wait_for(lambda: lossy.lost, "the proxy to lose the create's response", timeout_s=60)
        [child] = _children(cluster, name)  # the API server applied the create whose answer was lost
        times = _settle(cluster, name, child["metadata"]["uid"], 1, op, t0)
        _report(lossy, op, "creates", lossy.count("POST", ISVCS), times)
        assert [(lost.method, lost.path, lost.status) for lost in lossy.lost] == [("POST", ISVCS, 201)]
        assert lossy.count("POST", ISVCS) == 1, "the operator created the child again"
        assert "DriftReverted" not in event_reasons(cluster, name), event_reasons(cluster, name)
        assert alive(op)
        cluster.kubectl("delete", "bm", name, "-n", NAMESPACE, "--wait=true", "--timeout=60s")


def test_lost_patch_response(
    cluster: LocalCluster, start_operator: StartOperator, operator_kubeconfig: Path, lossy: LossyProxy, tmp_path: Path
) -> None:
    name = "lost-patch"
    child_path = f"{ISVCS}/{name}"
    kubeconfig = kubeconfig_via(operator_kubeconfig, lossy.server, tmp_path / "kubeconfig")
    with start_operator("operator.log", kubeconfig=kubeconfig) as op:
        cluster.kubectl("apply", "-f", "-", stdin=batched_model_manifest(name))
        wait_for(lambda: reconciled(cluster, name, 1), "Reconciled at generation 1", timeout_s=120)
        [child] = _children(cluster, name)
        patches_before = lossy.count("PATCH", child_path)
        lossy.lose_next("PATCH", child_path)
        t0 = time.monotonic()
        cluster.kubectl("apply", "-f", "-", stdin=batched_model_manifest(name, max_batch_size=4))
        wait_for(lambda: lossy.lost, "the proxy to lose the patch's response", timeout_s=60)
        assert isvc_max_batch(_children(cluster, name)[0]) == 4  # the API server applied the patch
        times = _settle(cluster, name, child["metadata"]["uid"], 2, op, t0)
        patches = lossy.count("PATCH", child_path) - patches_before
        _report(lossy, op, "patches", patches, times)
        assert [(lost.method, lost.path, lost.status) for lost in lossy.lost] == [("PATCH", child_path, 200)]
        assert patches == 1, "the operator patched the child again"
        assert isvc_max_batch(_children(cluster, name)[0]) == 4
        assert "DriftReverted" not in event_reasons(cluster, name), event_reasons(cluster, name)
        assert alive(op)
        cluster.kubectl("delete", "bm", name, "-n", NAMESPACE, "--wait=true", "--timeout=60s")
