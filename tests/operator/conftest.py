"""Fixtures for the operator tests: the CRD and KServe's schemas, a schema+CEL validator for custom
resources, and a kmock Kubernetes emulator that behaves enough like an API server for kopf."""

from __future__ import annotations

import copy
import datetime
import itertools
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import celpy
import jsonpatch
import jsonschema
import kmock
import kubernetes
import pytest
import yaml

from batchpilot.operator.crdgen import build_crd

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
KSERVE_CRDS = ROOT.parent / "shared" / "kserve-crds"


# ---------------------------------------------------------------------------------------- schemas

def served_schema(crd: dict[str, Any]) -> dict[str, Any]:
    """The openAPIV3Schema of a CRD's storage version."""
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    return version["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def crd() -> dict[str, Any]:
    return build_crd()


@pytest.fixture(scope="session")
def isvc_schema() -> dict[str, Any]:
    path = KSERVE_CRDS / "serving.kserve.io_inferenceservices.yaml"
    assert path.exists(), f"KServe's CRDs are expected beside the repository, at {KSERVE_CRDS}"
    # libyaml's loader: the pure-Python one takes ~20 s on this 2 MB file.
    return served_schema(yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))


def _strict(schema: Any) -> Any:
    """Reject unknown fields like the API server with kubectl's default --validate=strict."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) if k in ("items", "anyOf", "allOf", "oneOf") else v for k, v in schema.items()}
    if "properties" in schema:
        out["properties"] = {k: _strict(v) for k, v in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in schema:
            out["additionalProperties"] = False
    return out


def _apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Structural-schema defaulting, which the API server does before validating."""
    if isinstance(obj, dict):
        for name, prop in schema.get("properties", {}).items():
            if name not in obj and "default" in prop:
                obj[name] = copy.deepcopy(prop["default"])
            if name in obj:
                _apply_defaults(prop, obj[name])
    elif isinstance(obj, list) and "items" in schema:
        for item in obj:
            _apply_defaults(schema["items"], item)
    return obj


_CEL = celpy.Environment()


def _cel_errors(schema: dict[str, Any], obj: Any, path: str) -> list[str]:
    """Evaluate every x-kubernetes-validations rule of `schema` on `obj` (CEL, as the API server would)."""
    errors = []
    for rule in schema.get("x-kubernetes-validations", []):
        program = _CEL.program(_CEL.compile(rule["rule"]))
        if not program.evaluate({"self": celpy.json_to_cel(obj)}):
            errors.append(f"{path}{rule.get('fieldPath', '')}: {rule['message']}")
    if isinstance(obj, dict):
        for name, prop in schema.get("properties", {}).items():
            if name in obj:
                errors += _cel_errors(prop, obj[name], f"{path}.{name}")
    elif isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            errors += _cel_errors(schema["items"], item, f"{path}[{i}]")
    return errors


Validator = Callable[[dict[str, Any]], list[str]]


@pytest.fixture(scope="session")
def validate_cr(crd: dict[str, Any]) -> Validator:
    """Errors the API server would answer for a BatchedModel manifest (schema, then CEL); [] if valid."""
    schema = served_schema(crd)
    checker = jsonschema.Draft4Validator(_strict(schema))  # OpenAPI v3.0 is closest to draft 4

    def validate(manifest: dict[str, Any]) -> list[str]:
        errors = [
            f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in checker.iter_errors(manifest)
        ]
        if errors:
            return errors
        return _cel_errors(schema, _apply_defaults(schema, copy.deepcopy(manifest)), "")

    return validate


@pytest.fixture(scope="session")
def isvc_validator(isvc_schema: dict[str, Any]) -> jsonschema.Draft4Validator:
    """KServe's own InferenceService schema, unknown fields rejected."""
    return jsonschema.Draft4Validator(_strict(isvc_schema))


@pytest.fixture(scope="session")
def examples() -> dict[str, dict[str, Any]]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(EXAMPLES.glob("*.yaml"))}


# ----------------------------------------------------------------------------------- kmock server

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


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator plus what kopf relies on and the stock one lacks: uid, resourceVersion and
    generation stamping, names from generateName, status kept apart from the rest when the resource
    has a status subresource, and 422 (not 500) for a JSON patch whose `test` fails."""

    _versions: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1), init=False)

    async def _handle(self, request: kmock.Request) -> Any:
        if request.resource is not None and isinstance(request.data, dict | list):
            # Rewritten in place: the request object itself must stay the one in the request log.
            if request.action == kmock.action.CREATE:
                _replace(request.data, self._created(request))
            elif request.action == kmock.action.UPDATE:
                _replace(request.data, self._patched(request))
        return await super()._handle(request)

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
        meta.update(uid=str(uuid.uuid4()), resourceVersion=str(next(self._versions)), generation=1,
                    creationTimestamp=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
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
            ops = [op for op in request.data if op["path"].startswith("/metadata/resourceVersion")
                   or allowed(op["path"].split("/")[1])]
            touched_spec = any(op["path"].startswith("/spec") for op in ops)
            ops.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
            if touched_spec:
                ops.append({"op": "add", "path": "/metadata/generation", "value": current["metadata"]["generation"] + 1})
            return ops
        patch = {k: v for k, v in request.data.items() if allowed(k) or (on_status and k == "metadata")}
        meta = dict(patch.get("metadata") or {}) if not on_status else {}
        meta["resourceVersion"] = version
        if "spec" in patch and _merge(current.get("spec"), patch["spec"]) != current.get("spec"):
            meta["generation"] = current["metadata"]["generation"] + 1
        patch["metadata"] = meta
        return patch


RESOURCES = {
    "v1/namespaces": {"namespaced": False, "kind": "Namespace", "verbs": ["get", "list", "watch"]},
    "v1/events": {"namespaced": True, "kind": "Event", "verbs": ["create", "get", "list"]},
    "apiextensions.k8s.io/v1/customresourcedefinitions": {
        "namespaced": False, "kind": "CustomResourceDefinition", "verbs": ["get", "list", "watch"]},
    "batchpilot.io/v1alpha1/batchedmodels": {
        "namespaced": True, "kind": "BatchedModel", "shortnames": ["bm"], "subresources": ["status"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
}
KSERVE_RESOURCE = {
    "serving.kserve.io/v1beta1/inferenceservices": {
        "namespaced": True, "kind": "InferenceService", "shortnames": ["isvc"], "subresources": ["status"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
}


@pytest.fixture()
def kserve_installed() -> bool:
    """Whether the emulated cluster serves InferenceServices; a test overrides it with parametrize."""
    return True


@pytest.fixture()
async def apiserver(kserve_installed: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A kmock API server on loopback, with KUBECONFIG pointing at it (for kopf and our client)."""
    async with ApiServer() as server, kmock.Server(server) as http:
        for name, info in {**RESOURCES, **(KSERVE_RESOURCE if kserve_installed else {})}.items():
            server.resources[name] = info
        server.objects["v1/namespaces", None, "default"] = {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": str(http.url).rstrip("/")}}],
            "users": [{"name": "test", "user": {"token": "test"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test", "namespace": "default"}}],
        }))
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        # kopf's login calls load_kube_config() bare, which reads a default frozen at import time.
        monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
        yield server
