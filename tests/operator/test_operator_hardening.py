"""Operator hardening (issue 6): the real kopf operator against kmock's emulator, with faults injected.

A restart in the middle of a reconcile converges to the same child; conflicting writes (409) are
retried in place; failed API calls are retried; a child deleted by hand is recreated; specs the operator
cannot use, down to garbage the emulator stores because it has no schema, are reported as Degraded and
never stop it from serving the other BatchedModels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kmock
import pytest
from kmockkit import (
    BM,
    BM_URL,
    ISVC,
    ISVC_URL,
    MERGE,
    ApiServer,
    call,
    condition,
    event_reasons,
    eventually,
    manifest,
    running_operator,
    stored,
    stored_all,
)

Validator = Callable[[dict[str, Any]], list[str]]  # the validate_cr fixture: the API server's errors, [] if valid

pytestmark = pytest.mark.timeout(120)

NAME = "multimodal"


def _converged(server: ApiServer, name: str = NAME, generation: int = 1) -> dict[str, Any] | None:
    """The BatchedModel once its status says generation `generation` is applied and nothing is wrong."""
    obj = stored(server, BM, name)
    ok = (
        obj is not None
        and obj.get("status", {}).get("observedGeneration") == generation
        and condition(obj, "Reconciled").get("status") == "True"
        and condition(obj, "Degraded").get("status") == "False"
    )
    return obj if ok else None


@pytest.mark.parametrize(
    ("action", "resource", "subresource", "status"),
    [
        pytest.param(kmock.action.CREATE, ISVC, None, 409, id="conflict-on-child-create"),
        pytest.param(kmock.action.UPDATE, ISVC, None, 409, id="conflict-on-child-patch"),
        pytest.param(kmock.action.UPDATE, BM, "status", 409, id="conflict-on-status-write"),
        pytest.param(kmock.action.CREATE, ISVC, None, 503, id="unavailable-on-child-create"),
        pytest.param(kmock.action.UPDATE, BM, "status", 503, id="unavailable-on-status-write"),
    ],
)
async def test_failed_write_is_retried(
    apiserver: ApiServer,
    examples: dict[str, Any],
    action: kmock.action,
    resource: kmock.resource,
    subresource: str | None,
    status: int,
) -> None:
    fault = apiserver.fail(action, resource, subresource=subresource, status=status)
    async with running_operator(apiserver):
        await call(apiserver, "POST", BM_URL, json=manifest(examples))
        await eventually(lambda: _converged(apiserver), "the first generation applied")
        # A spec change, so that the child is patched too (where the patch fault waits).
        await call(apiserver, "PATCH", f"{BM_URL}/{NAME}", headers=MERGE, json={"spec": {"replicas": {"max": 3}}})
        await eventually(lambda: _converged(apiserver, generation=2), "the second generation applied")
    assert fault.hits == 1, "the fault was never injected"
    [child] = stored_all(apiserver, ISVC)
    assert child["spec"]["predictor"]["maxReplicas"] == 3
    # A conflict is retried on the spot, with a fresh read; other failures surface and are retried later.
    assert ("ApplyFailed" in event_reasons(apiserver)) == (status != 409 and resource == ISVC), event_reasons(apiserver)


def _handlers_pending(server: ApiServer, name: str = NAME) -> list[str]:
    """kopf's progress annotations on the BatchedModel: the handlers it has yet to finish (or to retry)."""
    annotations = (stored(server, BM, name) or {}).get("metadata", {}).get("annotations", {})
    bookkeeping = {"batchpilot.io/kopf-managed", "batchpilot.io/last-handled-configuration"}
    return [k for k in annotations if k.startswith("batchpilot.io/") and k not in bookkeeping]


@pytest.mark.parametrize(
    ("action", "generation"),
    [
        pytest.param(kmock.action.CREATE, 1, id="lost-create-response"),
        pytest.param(kmock.action.UPDATE, 2, id="lost-patch-response"),
    ],
)
async def test_lost_response_of_a_child_write(
    apiserver: ApiServer, examples: dict[str, Any], action: kmock.action, generation: int
) -> None:
    """The API server applies the create (or patch) of the child, then the connection is cut before its answer:
    the operator sees no API error but a broken connection. It converges on the one child, its own write not
    taken for drift, and retries the interrupted handler after its retry delay (not kopf's default minute)."""
    lost = apiserver.fail(action, ISVC, lose=True)
    async with running_operator(apiserver):
        await call(apiserver, "POST", BM_URL, json=manifest(examples))
        await eventually(lambda: _converged(apiserver), "the first generation applied")
        if generation == 2:
            await call(apiserver, "PATCH", f"{BM_URL}/{NAME}", headers=MERGE, json={"spec": {"replicas": {"max": 3}}})
            await eventually(lambda: _converged(apiserver, generation=2), "the second generation applied")
        await eventually(lambda: not _handlers_pending(apiserver), "the interrupted handler retried to its end")
    assert lost.hits == 1, "the response was never lost"
    [child] = stored_all(apiserver, ISVC)
    assert generation == 1 or child["spec"]["predictor"]["maxReplicas"] == 3
    assert "DriftReverted" not in event_reasons(apiserver), event_reasons(apiserver)


async def test_child_deleted_by_hand_is_recreated(apiserver: ApiServer, examples: dict[str, Any]) -> None:
    async with running_operator(apiserver):
        await call(apiserver, "POST", BM_URL, json=manifest(examples))
        first = await eventually(lambda: stored(apiserver, ISVC, NAME), "the InferenceService")
        await call(apiserver, "DELETE", f"{ISVC_URL}/{NAME}")
        second = await eventually(
            lambda: (o := stored(apiserver, ISVC, NAME)) and o["metadata"]["uid"] != first["metadata"]["uid"] and o,
            "the InferenceService recreated",
        )
    assert second["spec"] == first["spec"]
    assert second["metadata"]["ownerReferences"] == first["metadata"]["ownerReferences"]
    assert event_reasons(apiserver).count("Created") == 2


def _junk_spec(examples: dict[str, Any]) -> dict[str, Any]:
    """A spec with thousands of unknown keys: thousands of validation errors, far beyond a condition's size."""
    return {**manifest(examples)["spec"], **{f"junk{i:05d}": i for i in range(5000)}}


async def test_invalid_specs_are_degraded_and_never_stop_the_operator(
    apiserver: ApiServer, examples: dict[str, Any], validate_cr: Validator
) -> None:
    good = manifest(examples, "good")
    bad = {
        # The schema (and its CEL rules) accept a dotted name; KServe cannot derive its Service names from it.
        "dotted.name": ("Unsupported", manifest(examples, "dotted.name")),
        # Garbage only a server without the CRD's schema stores (kmock has none).
        "string-spec": ("InvalidSpec", {**manifest(examples, "string-spec"), "spec": "garbage"}),
        "wrong-types": (
            "InvalidSpec",
            {
                **manifest(examples, "wrong-types"),
                "spec": {"models": [{"name": 7, "inputs": "x", "batching": []}], "replicas": {"min": 3, "max": 1}},
            },
        ),
        "junk-keys": ("InvalidSpec", {**manifest(examples, "junk-keys"), "spec": _junk_spec(examples)}),
    }
    assert validate_cr(bad["dotted.name"][1]) == []
    assert all(validate_cr(body) for name, (_, body) in bad.items() if name != "dotted.name")

    async with running_operator(apiserver) as runner:
        for _, body in bad.values():
            await call(apiserver, "POST", BM_URL, json=body)
        await call(apiserver, "POST", BM_URL, json=good)
        for name, (reason, _) in bad.items():
            degraded = await eventually(
                lambda name=name: condition(stored(apiserver, BM, name), "Degraded"), f"Degraded on {name}"
            )
            assert (degraded["status"], degraded["reason"]) == ("True", reason), (name, degraded)
            assert len(degraded["message"]) <= 4096, f"{name}: a {len(degraded['message'])}-character message"
            assert condition(stored(apiserver, BM, name), "Ready")["status"] == "False"
        # The others are served all along, and a fixed spec recovers.
        await eventually(
            lambda: _converged(apiserver, "good") and stored(apiserver, ISVC, "good"), "the good one served"
        )
        await call(apiserver, "PATCH", f"{BM_URL}/wrong-types", headers=MERGE, json={"spec": good["spec"]})
        await eventually(lambda: _converged(apiserver, "wrong-types", generation=2), "wrong-types fixed")
        assert {o["metadata"]["name"] for o in stored_all(apiserver, ISVC)} == {"good", "wrong-types"}
    # No handler crashed on the way (kopf would retry it a minute later, with no Degraded to show for it).
    assert "Handler 'register.<locals>.reconcile' succeeded" in runner.output  # the log is there to read
    assert "failed with an exception" not in runner.output, runner.output[-3000:]
