"""Fixtures for the operator tests: the CRD and KServe's schemas, a schema+CEL validator for custom
resources, and a kmock Kubernetes emulator that behaves enough like an API server for kopf
(the emulator itself and the helpers around it are in kmockkit.py, shared with e2e/)."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes
import pytest
import yaml
from kmockkit import ApiServer, crd_resource, serving_apiserver, write_kubeconfig

from batchpilot.operator.crdgen import build_crd

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
KSERVE_CRDS = (
    ROOT / ".tools" / "kserve" / "config" / "crd" / "full"
)  # the pinned KServe module source (make controlplane)


# ---------------------------------------------------------------------------------------- schemas


def served_schema(crd: dict[str, Any]) -> dict[str, Any]:
    """The openAPIV3Schema of a CRD's storage version."""
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    return version["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def crd() -> dict[str, Any]:
    return build_crd()


@pytest.fixture(scope="session")
def isvc_schema(kserve_crd: dict[str, Any]) -> dict[str, Any]:
    return served_schema(kserve_crd)


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


@pytest.fixture(scope="session")
def kserve_crd() -> dict[str, Any]:
    path = KSERVE_CRDS / "serving.kserve.io_inferenceservices.yaml"
    assert path.exists(), f"KServe's CRDs come from its Go module: run make controlplane (looked in {KSERVE_CRDS})"
    # libyaml's loader: the pure-Python one takes ~20 s on this 2 MB file.
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # type: ignore[no-any-return]


@pytest.fixture()
def kserve_installed() -> bool:
    """Whether the emulated cluster serves InferenceServices; a test overrides it with parametrize."""
    return True


@pytest.fixture()
async def apiserver(
    kserve_installed: bool,
    crd: dict[str, Any],
    kserve_crd: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[ApiServer]:
    """A kmock API server on loopback serving BatchedModels (and InferenceServices when KServe is
    installed), with KUBECONFIG pointing at it (for kopf and our client)."""
    resources = {**crd_resource(crd), **(crd_resource(kserve_crd) if kserve_installed else {})}
    async with serving_apiserver(resources) as (server, url):
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        # kopf's login calls load_kube_config() bare, which reads a default frozen at import time.
        monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
        yield server
