"""The real kopf operator (KopfRunner, own thread and loop) against kmock's Kubernetes emulator over HTTP.

The test's event loop serves the emulator, so the test only awaits: it talks to the emulator over
HTTP (as kubectl would) and reads its object store; the operator's blocking client runs in kopf's threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import kmock
import pytest
import yaml
from kopf.testing import KopfRunner

from batchpilot.operator.handlers import post_event
from batchpilot.operator.kube import Kube, client_from_environment
from batchpilot.operator.main import build_registry
from batchpilot.operator.rbac import OPERATOR_RULES
from batchpilot.operator.reconcile import Reconciler

pytestmark = pytest.mark.timeout(120)

BM = kmock.resource("batchpilot.io/v1alpha1/batchedmodels")
ISVC = kmock.resource("serving.kserve.io/v1beta1/inferenceservices")
EVENTS = kmock.resource("v1/events")
BM_URL = "/apis/batchpilot.io/v1alpha1/namespaces/default/batchedmodels"
ISVC_URL = "/apis/serving.kserve.io/v1beta1/namespaces/default/inferenceservices"
MERGE = {"Content-Type": "application/merge-patch+json"}


def _object(server: kmock.KubernetesEmulator, resource: kmock.resource, name: str) -> dict[str, Any] | None:
    key = (resource, "default", name)
    return None if key not in server.objects or server.objects[key].deleted else server.objects[key].raw


def _condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    conds = (obj or {}).get("status", {}).get("conditions", [])
    return next((c for c in conds if c["type"] == type_), {})


def _event_reasons(server: kmock.KubernetesEmulator) -> list[str]:
    return [obj.raw.get("reason") for (res, _, _), obj in server.objects.items() if res == EVENTS and not obj.deleted]


async def eventually(probe: Callable[[], Any], what: str, timeout_s: float = 20.0) -> Any:
    """Poll `probe` until it returns something truthy; fail with `what` after the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for: {what}")
        await asyncio.sleep(0.1)


async def _call(server: kmock.KubernetesEmulator, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
    async with server.request(method, url, **kwargs) as response:
        assert response.status < 300, await response.text()
        return await response.json()  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def running_operator(server: kmock.KubernetesEmulator, fetch: Any = None,
                           watched: frozenset[kmock.resource] = frozenset({BM, ISVC})) -> AsyncIterator[KopfRunner]:
    reconciler = Reconciler(Kube(client_from_environment()), emit=post_event)
    if fetch is not None:
        reconciler.fetch = fetch
    registry = build_registry(reconciler, refresh_interval_s=0.5, retry_delay_s=1.0)
    runner = KopfRunner(["run", "--standalone", "--all-namespaces"], registry=registry, timeout=30)
    await asyncio.to_thread(runner.__enter__)  # joins and waits block: keep the emulator's loop free
    try:
        # kmock can lose events between a watch's listing and its subscription: start on a quiet cluster.
        await eventually(lambda: watched <= {r.resource for r in server if r.action == kmock.action.WATCH},
                         f"the operator to watch {sorted(r.plural for r in watched)}")
        await asyncio.sleep(0.5)
        yield runner
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)


def _manifest(examples: dict[str, Any], name: str = "multimodal") -> dict[str, Any]:
    manifest = copy.deepcopy(examples["both.yaml"])
    manifest["metadata"] = {"name": name, "namespace": "default"}
    return manifest


def _fake_runtime(calls: list[tuple[str, str]]) -> Callable[[str, str], dict[str, Any]]:
    def fetch(base_url: str, model: str) -> dict[str, Any]:
        calls.append((base_url, model))
        return {"model": model, "max_batch_size": 24, "max_queue_delay_microseconds": 1500,
                "autotune": {"enabled": True, "latency_slo_p99_ms": 80.0, "slo_feasible": True, "changes": 2},
                "recent": {"window_s": 10.0, "p99_ms": 31.5, "throughput_rps": 812.0}}
    return fetch


async def test_lifecycle(apiserver: kmock.KubernetesEmulator, examples: dict[str, Any]) -> None:
    calls: list[tuple[str, str]] = []
    async with running_operator(apiserver, fetch=_fake_runtime(calls)):
        await _call(apiserver, "POST", BM_URL, json=_manifest(examples))

        # Create: one InferenceService with the runtime, every model, and the owner reference.
        isvc = await eventually(lambda: _object(apiserver, ISVC, "multimodal"), "the InferenceService")
        owner = _object(apiserver, BM, "multimodal")
        assert owner is not None
        assert isvc["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
        assert isvc["metadata"]["labels"]["batchpilot.io/batchedmodel"] == "multimodal"
        model = isvc["spec"]["predictor"]["model"]
        assert model["runtime"] == "batchpilot" and model["modelFormat"] == {"name": "batchpilot"}
        assert [m["name"] for m in json.loads(model["env"][0]["value"])] == ["cnn", "distilbert"]
        await eventually(lambda: _condition(_object(apiserver, BM, "multimodal"), "Reconciled").get("status") == "True",
                         "Reconciled=True")
        assert _condition(_object(apiserver, BM, "multimodal"), "Ready")["status"] == "False"

        # KServe reports Ready: it flows up to the BatchedModel, and the runtime's tuned parameters follow.
        await _call(apiserver, "PATCH", f"{ISVC_URL}/multimodal/status", headers=MERGE, json={"status": {
            "url": "http://multimodal.default.example.com",
            "address": {"url": "http://multimodal-predictor.default.svc.cluster.local"},
            "conditions": [{"type": "Ready", "status": "True"}]}})
        await eventually(lambda: _condition(_object(apiserver, BM, "multimodal"), "Ready").get("status") == "True",
                         "Ready=True on the BatchedModel")
        bm = await eventually(lambda: (o := _object(apiserver, BM, "multimodal")) and len(o["status"].get("models", [])) == 2 and o,
                              "status.models from the runtime")
        assert bm["status"]["url"] == "http://multimodal.default.example.com"
        assert bm["status"]["models"][0]["maxBatchSize"] == 24 and bm["status"]["models"][1]["recentP99Ms"] == 31.5
        assert ("http://multimodal-predictor.default.svc.cluster.local", "cnn") in calls
        # Printed after the runner exits: click's CliRunner swaps sys.stdout while kopf runs.
        dump = "\n$ kubectl get bm multimodal -o yaml  # (metadata trimmed)\n" + yaml.safe_dump({
            "apiVersion": bm["apiVersion"], "kind": bm["kind"],
            "metadata": {k: bm["metadata"][k] for k in ("name", "namespace", "generation", "finalizers")},
            "status": bm["status"]}, sort_keys=False)

        # A spec change propagates to the child, and the status names the generation it reflects.
        changed = _manifest(examples)["spec"]
        changed["models"][0]["batching"]["maxBatchSize"] = 8
        changed["models"][0]["batching"]["preferredBatchSize"] = [8]
        await _call(apiserver, "PATCH", f"{BM_URL}/multimodal", headers=MERGE, json={"spec": changed})

        def env_batch_size() -> int:
            env = (_object(apiserver, ISVC, "multimodal") or {})["spec"]["predictor"]["model"]["env"][0]
            return json.loads(env["value"])[0]["batching"]["maxBatchSize"]  # type: ignore[no-any-return]

        await eventually(lambda: env_batch_size() == 8, "the new maxBatchSize in the InferenceService")
        await eventually(lambda: _object(apiserver, BM, "multimodal")["status"]["observedGeneration"] == 2,
                         "observedGeneration 2")

        # A hand edit of the child is reverted.
        await _call(apiserver, "PATCH", f"{ISVC_URL}/multimodal", headers=MERGE,
                    json={"spec": {"predictor": {"maxReplicas": 9, "model": {"runtime": "tampered"}}}})
        await eventually(lambda: (o := _object(apiserver, ISVC, "multimodal"))
                         and o["spec"]["predictor"]["model"]["runtime"] == "batchpilot"
                         and o["spec"]["predictor"]["maxReplicas"] == 2, "the hand edit reverted")

        # A name KServe cannot take: Degraded with the reason, and no child.
        await _call(apiserver, "POST", BM_URL, json=_manifest(examples, name="9lives"))
        degraded = await eventually(lambda: _condition(_object(apiserver, BM, "9lives"), "Degraded"),
                                    "Degraded on 9lives")
        assert degraded["status"] == "True" and degraded["reason"] == "Unsupported", degraded
        assert "DNS-1035" in degraded["message"] and _object(apiserver, ISVC, "9lives") is None

        # Delete: the child goes too (kmock has no garbage collector; the operator deletes it).
        for name in ("multimodal", "9lives"):
            await _call(apiserver, "DELETE", f"{BM_URL}/{name}")
        await eventually(lambda: _object(apiserver, BM, "multimodal") is None and _object(apiserver, BM, "9lives") is None,
                         "the BatchedModels gone (finalizer released)")
        await eventually(lambda: _object(apiserver, ISVC, "multimodal") is None, "the InferenceService deleted")
        assert not any(res == ISVC and not obj.deleted for (res, _, _), obj in apiserver.objects.items())

    print(dump)
    reasons = _event_reasons(apiserver)
    for reason in ("Created", "Ready", "Updated", "DriftReverted", "Unsupported", "Deleted"):
        assert reason in reasons, f"no {reason} event in {reasons}"
    _assert_rbac_covers_requests(apiserver)


VERBS = {kmock.action.LIST: "list", kmock.action.WATCH: "watch", kmock.action.FETCH: "get",
         kmock.action.CREATE: "create", kmock.action.UPDATE: "patch", kmock.action.DELETE: "delete"}


def _assert_rbac_covers_requests(server: kmock.KubernetesEmulator) -> None:
    """The API calls the operator made (kopf's client and ours, not the test's) are exactly OPERATOR_RULES:
    nothing missing from the chart's ClusterRole, nothing granted in vain."""
    granted = {(g, r, v) for rule in OPERATOR_RULES for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    used = {
        (req.resource.group, req.resource.plural + (f"/{req.subresource}" if req.subresource else ""), VERBS[req.action])
        for req in server
        if req.resource is not None and req.resource.plural and req.action in VERBS and not req.headers.get("User-Agent", "").startswith("kmock")
    }
    assert used <= granted, f"not granted by OPERATOR_RULES: {sorted(used - granted)}"
    assert granted <= used, f"granted but never used: {sorted(granted - used)}"


async def test_resume_reverts_what_changed_while_down(apiserver: kmock.KubernetesEmulator,
                                                      examples: dict[str, Any]) -> None:
    async with running_operator(apiserver):
        await _call(apiserver, "POST", BM_URL, json=_manifest(examples))
        await eventually(lambda: _object(apiserver, ISVC, "multimodal"), "the InferenceService")
    # The operator is down: someone deletes the child.
    await _call(apiserver, "DELETE", f"{ISVC_URL}/multimodal")
    async with running_operator(apiserver):
        isvc = await eventually(lambda: _object(apiserver, ISVC, "multimodal"), "the InferenceService recreated")
        assert isvc["spec"]["predictor"]["model"]["runtime"] == "batchpilot"


@pytest.mark.parametrize("kserve_installed", [False])
async def test_kserve_missing_is_degraded(apiserver: kmock.KubernetesEmulator, examples: dict[str, Any]) -> None:
    async with running_operator(apiserver, watched=frozenset({BM})):
        await _call(apiserver, "POST", BM_URL, json=_manifest(examples))
        degraded = await eventually(lambda: _condition(_object(apiserver, BM, "multimodal"), "Degraded"),
                                    "Degraded on the BatchedModel")
        assert degraded["status"] == "True" and degraded["reason"] == "KServeMissing"
        assert "KServe is not installed" in degraded["message"]
        assert _condition(_object(apiserver, BM, "multimodal"), "Ready")["status"] == "False"
