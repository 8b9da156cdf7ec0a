"""A kmock Kubernetes API emulator that behaves enough like an API server for kopf, with fault injection,
and the helpers shared by the operator tests (tests/operator) and the end-to-end flow (e2e/).

Two ways to run it: the async `apiserver` fixture of tests/operator/conftest.py (served by the test's
own event loop; the operator runs in kopf's KopfRunner thread), or `threaded_apiserver()` (served by a
loop in a thread of its own, for synchronous tests that call it with blocking clients).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import datetime
import itertools
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs
import jsonpatch
import kmock
import pytest
import yaml
from kopf.testing import KopfRunner

from batchpilot.operator.handlers import post_event
from batchpilot.operator.kube import Kube, client_from_environment
from batchpilot.operator.main import build_registry
from batchpilot.operator.reconcile import FetchBatching, Reconciler

T = TypeVar("T")
Resources = dict[str, dict[str, Any]]

BM = kmock.resource("batchpilot.io/v1alpha1/batchedmodels")
ISVC = kmock.resource("serving.kserve.io/v1beta1/inferenceservices")
EVENTS = kmock.resource("v1/events")
BM_URL = "/apis/batchpilot.io/v1alpha1/namespaces/default/batchedmodels"
ISVC_URL = "/apis/serving.kserve.io/v1beta1/namespaces/default/inferenceservices"
MERGE = {"Content-Type": "application/merge-patch+json"}

#: What every emulated cluster serves; custom resources are added from their CRDs (`crd_resource`).
BASE_RESOURCES: Resources = {
    "v1/namespaces": {"namespaced": False, "kind": "Namespace", "verbs": ["get", "list", "watch"]},
    "v1/events": {"namespaced": True, "kind": "Event", "verbs": ["create", "get", "list"]},
    "apiextensions.k8s.io/v1/customresourcedefinitions": {
        "namespaced": False,
        "kind": "CustomResourceDefinition",
        "verbs": ["get", "list", "watch", "create"],
    },
}


def crd_resource(crd: Mapping[str, Any]) -> Resources:
    """The resource a CRD makes the API server serve (its storage version), as kmock declares it.
    kmock does not register a resource from a POSTed CRD, so tests declare it from the CRD itself."""
    spec = crd["spec"]
    version = next(v for v in spec["versions"] if v.get("storage"))
    return {
        f"{spec['group']}/{version['name']}/{spec['names']['plural']}": {
            "namespaced": spec["scope"] == "Namespaced",
            "kind": spec["names"]["kind"],
            "shortnames": spec["names"].get("shortNames", []),
            "subresources": sorted(version.get("subresources", {})),
            "verbs": ["get", "list", "watch", "create", "patch", "delete"],
        }
    }


# ----------------------------------------------------------------------------------- the emulator


def _merge(base: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _replace(container: dict[str, Any] | list[Any], content: Any) -> None:
    if isinstance(container, dict):
        container.clear()
        container.update(content)
    else:
        container[:] = content


@dataclasses.dataclass
class Fault:
    """Answer matching requests with an error instead of serving them (nothing is stored); or, `lose`,
    serve them (the write is stored) and cut the connection instead of answering."""

    action: kmock.action
    resource: kmock.resource
    subresource: str | None = None
    status: int = 409
    times: int | None = 1  # how many requests to fail; None: every one until removed
    hits: int = 0  # how many it failed so far
    lose: bool = False

    def matches(self, request: kmock.Request) -> bool:
        return (
            request.action == self.action
            and request.resource == self.resource
            and request.subresource == self.subresource
            and (self.times is None or self.hits < self.times)
        )


REASONS = {409: "Conflict", 500: "InternalError", 503: "ServiceUnavailable"}


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator plus what kopf relies on and the stock one lacks: uid, resourceVersion and
    generation stamping, names from generateName, status kept apart from the rest when the resource
    has a status subresource, and 422 (not 500) for a JSON patch whose `test` fails.

    `fail(...)` injects faults: the matching requests are answered with an API error and change nothing
    (kmock's own reactions cannot do that: the emulator stores a write before any reaction answers)."""

    faults: list[Fault] = attrs.field(factory=list, init=False)
    _versions: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1), init=False)

    def fail(
        self,
        action: kmock.action,
        resource: kmock.resource,
        *,
        subresource: str | None = None,
        status: int = 409,
        times: int | None = 1,
        lose: bool = False,
    ) -> Fault:
        fault = Fault(action, resource, subresource, status, times, lose=lose)
        self.faults.append(fault)
        return fault

    async def _handle(self, request: kmock.Request) -> Any:
        fault = next((f for f in self.faults if f.matches(request)), None) if request.resource is not None else None
        if fault is not None:
            fault.hits += 1
        if fault is not None and not fault.lose:
            reason = REASONS.get(fault.status, "Injected")
            return await self._render_error(
                kmock.KubernetesError(
                    status=fault.status, reason=reason, message=f"injected fault: {reason}", details={}
                )
            )
        if request.resource is not None and isinstance(request.data, dict | list):
            # Rewritten in place: the request object itself must stay the one in the request log.
            if request.action == kmock.action.CREATE:
                _replace(request.data, self._created(request))
            elif request.action == kmock.action.UPDATE:
                _replace(request.data, self._patched(request))
        response = await super()._handle(request)
        if fault is not None:  # a lost response: applied, then the connection is gone before the answer
            transport = request._raw_request.transport
            if transport is not None:
                transport.close()
        return response

    async def _render_error(self, exc: Exception) -> Any:
        if isinstance(exc, jsonpatch.JsonPatchTestFailed):
            exc = kmock.KubernetesError(status=422, reason="Invalid", message=str(exc))
        return await super()._render_error(exc)

    def _has_status(self, request: kmock.Request) -> bool:
        return request.resource in self.resources and "status" in self.resources[request.resource].subresources

    def _created(self, request: kmock.Request) -> dict[str, Any]:
        data = copy.deepcopy(request.data)
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if request.namespace:
            meta["namespace"] = request.namespace
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=str(next(self._versions)),
            generation=1,
            creationTimestamp=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        if self._has_status(request):
            data.pop("status", None)
        return data

    def _patched(self, request: kmock.Request) -> dict[str, Any] | list[Any]:
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return request.data  # the emulator answers 404
        current = self.objects[key].raw
        version = str(next(self._versions))
        on_status = request.subresource == "status"
        separate = self._has_status(request)

        def allowed(top: str) -> bool:  # which top-level fields this endpoint may change
            return top == "status" if on_status else not (separate and top == "status")

        if isinstance(request.data, list):  # JSON patch
            ops = [
                op
                for op in request.data
                if op["path"].startswith("/metadata/resourceVersion") or allowed(op["path"].split("/")[1])
            ]
            touched_spec = any(op["path"].startswith("/spec") for op in ops)
            ops.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
            if touched_spec:
                ops.append(
                    {"op": "add", "path": "/metadata/generation", "value": current["metadata"]["generation"] + 1}
                )
            return ops
        patch = {k: v for k, v in request.data.items() if allowed(k) or (on_status and k == "metadata")}
        meta = dict(patch.get("metadata") or {}) if not on_status else {}
        meta["resourceVersion"] = version
        if "spec" in patch and _merge(current.get("spec"), patch["spec"]) != current.get("spec"):
            meta["generation"] = current["metadata"]["generation"] + 1
        patch["metadata"] = meta
        return patch


def declare(server: ApiServer, resources: Resources) -> None:
    """Serve `resources` (plus the base ones) and the `default` namespace."""
    for name, info in {**BASE_RESOURCES, **resources}.items():
        server.resources[name] = info
    server.objects["v1/namespaces", None, "default"] = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "default"},
    }


def write_kubeconfig(path: Path, server_url: str) -> Path:
    """A kubeconfig whose current context is the emulator (namespace `default`)."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "kmock",
                "clusters": [{"name": "kmock", "cluster": {"server": server_url.rstrip("/")}}],
                "users": [{"name": "test", "user": {"token": "test"}}],
                "contexts": [
                    {"name": "kmock", "context": {"cluster": "kmock", "user": "test", "namespace": "default"}}
                ],
            }
        )
    )
    return path


@contextlib.asynccontextmanager
async def serving_apiserver(resources: Resources) -> AsyncIterator[tuple[ApiServer, str]]:
    """The emulator on a free loopback port of the running loop: (emulator, base URL)."""
    async with ApiServer() as server, kmock.Server(server) as http:
        declare(server, resources)
        yield server, str(http.url).rstrip("/")


@contextlib.contextmanager
def threaded_apiserver(resources: Resources, timeout_s: float = 10.0) -> Iterator[tuple[ApiServer, str]]:
    """`serving_apiserver` on an event loop of its own thread, for tests that call it with blocking clients."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="kmock", daemon=True)
    thread.start()
    stack = contextlib.AsyncExitStack()
    try:

        async def start() -> tuple[ApiServer, str]:
            return await stack.enter_async_context(serving_apiserver(resources))

        yield asyncio.run_coroutine_threadsafe(start(), loop).result(timeout_s)
    finally:
        asyncio.run_coroutine_threadsafe(stack.aclose(), loop).result(timeout_s)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        loop.close()


# ------------------------------------------------------------------------------ reading and waiting


def stored(
    server: kmock.KubernetesEmulator, resource: kmock.resource, name: str, namespace: str = "default"
) -> dict[str, Any] | None:
    """The object as the emulator stores it now (None when absent or deleted)."""
    key = (resource, namespace, name)
    return None if key not in server.objects or server.objects[key].deleted else server.objects[key].raw


def stored_all(server: kmock.KubernetesEmulator, resource: kmock.resource) -> list[dict[str, Any]]:
    return [obj.raw for (res, _, _), obj in list(server.objects.items()) if res == resource and not obj.deleted]


def condition(obj: Mapping[str, Any] | None, type_: str) -> dict[str, Any]:
    """One condition of an object's status ({} when absent)."""
    conds = (obj or {}).get("status", {}).get("conditions", [])
    return next((c for c in conds if c["type"] == type_), {})


def event_reasons(server: kmock.KubernetesEmulator) -> list[str]:
    return [e.get("reason", "") for e in stored_all(server, EVENTS)]


def watched_resources(server: kmock.KubernetesEmulator) -> set[kmock.resource]:
    return {r.resource for r in list(server) if r.action == kmock.action.WATCH and r.resource is not None}


def _deadline(what: str, timeout_s: float) -> Iterator[None]:
    """Yields until `timeout_s` have passed, then fails the test naming `what`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() <= deadline:
        yield
    pytest.fail(f"timed out after {timeout_s}s waiting for: {what}")


async def eventually(probe: Callable[[], T], what: str, timeout_s: float = 20.0) -> T:
    """Poll `probe` (without blocking the loop) until it returns something truthy; fail after the deadline."""
    for _ in _deadline(what, timeout_s):
        if value := probe():
            return value
        await asyncio.sleep(0.1)
    raise AssertionError("unreachable")


def wait_for(probe: Callable[[], T], what: str, timeout_s: float = 20.0, interval_s: float = 0.2) -> T:
    """`eventually` for synchronous tests."""
    for _ in _deadline(what, timeout_s):
        if value := probe():
            return value
        time.sleep(interval_s)
    raise AssertionError("unreachable")


async def call(server: kmock.KubernetesEmulator, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
    """One API call as kubectl would make it (kmock's own client); fails the test on an error status."""
    async with server.request(method, url, **kwargs) as response:
        assert response.status < 300, await response.text()
        return await response.json()  # type: ignore[no-any-return]


def manifest(examples: Mapping[str, Any], name: str = "multimodal") -> dict[str, Any]:
    """examples/both.yaml as BatchedModel `default/<name>`."""
    out = copy.deepcopy(dict(examples["both.yaml"]))
    out["metadata"] = {"name": name, "namespace": "default"}
    return out


# ------------------------------------------------------------------------------------ the operator


@contextlib.asynccontextmanager
async def running_operator(
    server: kmock.KubernetesEmulator,
    fetch: FetchBatching | None = None,
    watched: frozenset[kmock.resource] = frozenset({BM, ISVC}),
) -> AsyncIterator[KopfRunner]:
    """The real kopf operator (our registry and Reconciler) in KopfRunner's thread, against `server`
    (KUBECONFIG must point at it); short refresh and retry delays. Leaving stops it, re-raising its crash."""
    reconciler = Reconciler(Kube(client_from_environment()), emit=post_event)
    if fetch is not None:
        reconciler.fetch = fetch
    registry = build_registry(reconciler, refresh_interval_s=0.5, retry_delay_s=1.0)
    runner = KopfRunner(["run", "--standalone", "--all-namespaces"], registry=registry, timeout=30)
    await asyncio.to_thread(runner.__enter__)  # joins and waits block: keep the emulator's loop free
    try:
        # kmock can lose events between a watch's listing and its subscription: start on a quiet cluster.
        await eventually(
            lambda: watched <= watched_resources(server), f"the operator to watch {sorted(r.plural for r in watched)}"
        )
        await asyncio.sleep(0.5)
        yield runner
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)
