"""The real kopf operator (KopfRunner, own thread and loop) against kmock's Kubernetes emulator over HTTP.

The test's event loop serves the emulator, so the test only awaits: it talks to the emulator over
HTTP (as kubectl would) and reads its object store; the operator's blocking client runs in kopf's threads.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import kmock
import pytest
import yaml
from kmockkit import (
    BM,
    BM_URL,
    ISVC,
    ISVC_URL,
    MERGE,
    call,
    condition,
    event_reasons,
    eventually,
    manifest,
    running_operator,
    stored,
    stored_all,
)

from batchpilot.operator.rbac import OPERATOR_RULES

pytestmark = pytest.mark.timeout(120)


def _fake_runtime(calls: list[tuple[str, str]]) -> Callable[[str, str], dict[str, Any]]:
    def fetch(base_url: str, model: str) -> dict[str, Any]:
        calls.append((base_url, model))
        return {
            "model": model,
            "max_batch_size": 24,
            "max_queue_delay_microseconds": 1500,
            "autotune": {"enabled": True, "latency_slo_p99_ms": 80.0, "slo_feasible": True, "changes": 2},
            "recent": {"window_s": 10.0, "p99_ms": 31.5, "throughput_rps": 812.0},
        }

    return fetch


async def test_lifecycle(apiserver: kmock.KubernetesEmulator, examples: dict[str, Any]) -> None:
    calls: list[tuple[str, str]] = []
    async with running_operator(apiserver, fetch=_fake_runtime(calls)):
        await call(apiserver, "POST", BM_URL, json=manifest(examples))

        # Create: one InferenceService with the runtime, every model, and the owner reference.
        isvc = await eventually(lambda: stored(apiserver, ISVC, "multimodal"), "the InferenceService")
        owner = stored(apiserver, BM, "multimodal")
        assert owner is not None
        assert isvc["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
        assert isvc["metadata"]["labels"]["batchpilot.io/batchedmodel"] == "multimodal"
        model = isvc["spec"]["predictor"]["model"]
        assert model["runtime"] == "batchpilot" and model["modelFormat"] == {"name": "batchpilot"}
        assert [m["name"] for m in json.loads(model["env"][0]["value"])] == ["cnn", "distilbert"]
        await eventually(
            lambda: condition(stored(apiserver, BM, "multimodal"), "Reconciled").get("status") == "True",
            "Reconciled=True",
        )
        assert condition(stored(apiserver, BM, "multimodal"), "Ready")["status"] == "False"

        # KServe reports Ready: it flows up to the BatchedModel, and the runtime's tuned parameters follow.
        await call(
            apiserver,
            "PATCH",
            f"{ISVC_URL}/multimodal/status",
            headers=MERGE,
            json={
                "status": {
                    "url": "http://multimodal.default.example.com",
                    "address": {"url": "http://multimodal-predictor.default.svc.cluster.local"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                }
            },
        )
        await eventually(
            lambda: condition(stored(apiserver, BM, "multimodal"), "Ready").get("status") == "True",
            "Ready=True on the BatchedModel",
        )
        bm = await eventually(
            lambda: (o := stored(apiserver, BM, "multimodal")) and len(o["status"].get("models", [])) == 2 and o,
            "status.models from the runtime",
        )
        assert bm["status"]["url"] == "http://multimodal.default.example.com"
        assert bm["status"]["models"][0]["maxBatchSize"] == 24 and bm["status"]["models"][1]["recentP99Ms"] == 31.5
        assert ("http://multimodal-predictor.default.svc.cluster.local", "cnn") in calls
        # Printed after the runner exits: click's CliRunner swaps sys.stdout while kopf runs.
        dump = "\n$ kubectl get bm multimodal -o yaml  # (metadata trimmed)\n" + yaml.safe_dump(
            {
                "apiVersion": bm["apiVersion"],
                "kind": bm["kind"],
                "metadata": {k: bm["metadata"][k] for k in ("name", "namespace", "generation", "finalizers")},
                "status": bm["status"],
            },
            sort_keys=False,
        )

        # A spec change propagates to the child, and the status names the generation it reflects.
        changed = manifest(examples)["spec"]
        changed["models"][0]["batching"]["maxBatchSize"] = 8
        changed["models"][0]["batching"]["preferredBatchSize"] = [8]
        await call(apiserver, "PATCH", f"{BM_URL}/multimodal", headers=MERGE, json={"spec": changed})

        def env_batch_size() -> int:
            env = (stored(apiserver, ISVC, "multimodal") or {})["spec"]["predictor"]["model"]["env"][0]
            return json.loads(env["value"])[0]["batching"]["maxBatchSize"]  # type: ignore[no-any-return]

        await eventually(lambda: env_batch_size() == 8, "the new maxBatchSize in the InferenceService")
        await eventually(
            lambda: stored(apiserver, BM, "multimodal")["status"]["observedGeneration"] == 2, "observedGeneration 2"
        )

        # A hand edit of the child is reverted.
        await call(
            apiserver,
            "PATCH",
            f"{ISVC_URL}/multimodal",
            headers=MERGE,
            json={"spec": {"predictor": {"maxReplicas": 9, "model": {"runtime": "tampered"}}}},
        )
        await eventually(
            lambda: (
                (o := stored(apiserver, ISVC, "multimodal"))
                and o["spec"]["predictor"]["model"]["runtime"] == "batchpilot"
                and o["spec"]["predictor"]["maxReplicas"] == 2
            ),
            "the hand edit reverted",
        )

        # A name KServe cannot take: Degraded with the reason, and no child.
        await call(apiserver, "POST", BM_URL, json=manifest(examples, name="9lives"))
        degraded = await eventually(
            lambda: condition(stored(apiserver, BM, "9lives"), "Degraded"), "Degraded on 9lives"
        )
        assert degraded["status"] == "True" and degraded["reason"] == "Unsupported", degraded
        assert "DNS-1035" in degraded["message"] and stored(apiserver, ISVC, "9lives") is None

        # Delete: the child goes too (kmock has no garbage collector; the operator deletes it).
        for name in ("multimodal", "9lives"):
            await call(apiserver, "DELETE", f"{BM_URL}/{name}")
        await eventually(
            lambda: stored(apiserver, BM, "multimodal") is None and stored(apiserver, BM, "9lives") is None,
            "the BatchedModels gone (finalizer released)",
        )
        await eventually(lambda: stored(apiserver, ISVC, "multimodal") is None, "the InferenceService deleted")
        assert stored_all(apiserver, ISVC) == []

    print(dump)
    reasons = event_reasons(apiserver)
    for reason in ("Created", "Ready", "Updated", "DriftReverted", "Unsupported", "Deleted"):
        assert reason in reasons, f"no {reason} event in {reasons}"
    _assert_rbac_covers_requests(apiserver)


VERBS = {
    kmock.action.LIST: "list",
    kmock.action.WATCH: "watch",
    kmock.action.FETCH: "get",
    kmock.action.CREATE: "create",
    kmock.action.UPDATE: "patch",
    kmock.action.DELETE: "delete",
}


def _assert_rbac_covers_requests(server: kmock.KubernetesEmulator) -> None:
    """The API calls the operator made (kopf's client and ours, not the test's) are exactly OPERATOR_RULES:
    nothing missing from the chart's ClusterRole, nothing granted in vain."""
    granted = {
        (g, r, v)
        for rule in OPERATOR_RULES
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    used = {
        (
            req.resource.group,
            req.resource.plural + (f"/{req.subresource}" if req.subresource else ""),
            VERBS[req.action],
        )
        for req in server
        if req.resource is not None
        and req.resource.plural
        and req.action in VERBS
        and not req.headers.get("User-Agent", "").startswith("kmock")
    }
    assert used <= granted, f"not granted by OPERATOR_RULES: {sorted(used - granted)}"
    assert granted <= used, f"granted but never used: {sorted(granted - used)}"


async def test_resume_reverts_what_changed_while_down(
    apiserver: kmock.KubernetesEmulator, examples: dict[str, Any]
) -> None:
    async with running_operator(apiserver):
        await call(apiserver, "POST", BM_URL, json=manifest(examples))
        await eventually(lambda: stored(apiserver, ISVC, "multimodal"), "the InferenceService")
    # The operator is down: someone deletes the child.
    await call(apiserver, "DELETE", f"{ISVC_URL}/multimodal")
    async with running_operator(apiserver):
        isvc = await eventually(lambda: stored(apiserver, ISVC, "multimodal"), "the InferenceService recreated")
        assert isvc["spec"]["predictor"]["model"]["runtime"] == "batchpilot"


@pytest.mark.parametrize("kserve_installed", [False])
async def test_kserve_missing_is_degraded(apiserver: kmock.KubernetesEmulator, examples: dict[str, Any]) -> None:
    async with running_operator(apiserver, watched=frozenset({BM})):
        await call(apiserver, "POST", BM_URL, json=manifest(examples))
        degraded = await eventually(
            lambda: condition(stored(apiserver, BM, "multimodal"), "Degraded"), "Degraded on the BatchedModel"
        )
        assert degraded["status"] == "True" and degraded["reason"] == "KServeMissing"
        assert "KServe is not installed" in degraded["message"]
        assert condition(stored(apiserver, BM, "multimodal"), "Ready")["status"] == "False"
