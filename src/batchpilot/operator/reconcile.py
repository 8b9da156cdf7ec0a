"""What the operator does, free of kopf: bring a BatchedModel's InferenceService in line with its spec,
report status, refresh the per-model batching parameters, clean up.

kopf wiring is in handlers.py; API calls go through kube.Kube; events through an `emit` callable.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from batchpilot.operator import status as st
from batchpilot.operator.kube import Kube, retry_conflicts
from batchpilot.operator.mapping import OWNER_LABEL, inference_service, unsupported
from batchpilot.spec.batchedmodel import BatchedModelSpec
from batchpilot.spec.contracts import ISVC_API_VERSION, ISVC_PLURAL, BatchingState

logger = logging.getLogger("batchpilot.operator")

#: (object, "Normal" | "Warning", reason, message) -> posts a Kubernetes event about `object`.
Emit = Callable[[Mapping[str, Any], str, str, str], None]
#: (runtime base URL, model name) -> GET {url}/v2/models/{model}/batching (parsed, or its JSON).
FetchBatching = Callable[[str, str], BatchingState | dict[str, Any]]

OWNED_METADATA = ("labels", "annotations", "ownerReferences")


def fetch_batching(base_url: str, model: str, timeout_s: float = 5.0) -> BatchingState:
    """The runtime's view of one model's batching (spec.contracts.BatchingState; docs/design.md)."""
    with urllib.request.urlopen(f"{base_url.rstrip('/')}/v2/models/{model}/batching", timeout=timeout_s) as resp:
        return BatchingState.model_validate_json(resp.read())


def drift_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch that makes every field of `desired` hold in `current` ({} when none differs).

    Fields `current` has beyond `desired` (KServe's defaults, other controllers' annotations) are left
    alone; lists are compared whole, as a merge patch replaces them whole.
    """
    patch: dict[str, Any] = {}
    for key, want in desired.items():
        have = current.get(key)
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            sub = drift_patch(have, want)
            if sub:
                patch[key] = sub
        elif have != want:
            patch[key] = want
    return patch


def _owned_part(isvc: Mapping[str, Any]) -> dict[str, Any]:
    meta = isvc.get("metadata", {})
    return {"metadata": {k: meta[k] for k in OWNED_METADATA if k in meta}, "spec": isvc.get("spec", {})}


def _readable(error: ValidationError, limit: int = 10) -> str:
    """The first `limit` problems, one `path: message` each (garbage can have thousands)."""
    errors = error.errors(include_url=False)
    text = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {e['msg']}" for e in errors[:limit])
    return text + (f"; and {len(errors) - limit} more" if len(errors) > limit else "")


def _applied_generation(body: Mapping[str, Any]) -> int | None:
    """The generation the status says was applied (Reconciled True), else None."""
    conds = (body.get("status") or {}).get("conditions", [])
    done: dict[str, Any] = next((c for c in conds if c.get("type") == "Reconciled" and c.get("status") == "True"), {})
    return done.get("observedGeneration")


@dataclass
class Reconciler:
    kube: Kube
    emit: Emit
    fetch: FetchBatching = fetch_batching

    # ------------------------------------------------------------------ reconcile

    def reconcile(self, body: Mapping[str, Any]) -> st.Problem | None:
        """Create or correct the InferenceService, then write status. Returns what stood in the way."""
        meta = body["metadata"]
        spec, problem = self._check(body)
        isvc: dict[str, Any] | None = None
        if spec is not None and problem is None:
            desired = inference_service(meta["name"], meta["namespace"], meta["uid"], spec)
            try:
                isvc = self._apply(body, desired)
            except ApiException as error:
                problem = st.Problem("ApplyFailed", f"InferenceService API call failed: {error.status} {error.reason}")
        elif problem is not None and problem.reason != "KServeMissing":
            # The last good InferenceService keeps serving while the new spec cannot be honoured.
            isvc = self.kube.get_inference_service(meta["namespace"], meta["name"])
        self._write_status(body, spec, problem, isvc)
        return problem

    def _check(self, body: Mapping[str, Any]) -> tuple[BatchedModelSpec | None, st.Problem | None]:
        try:
            spec = BatchedModelSpec.model_validate(body.get("spec") or {})
        except ValidationError as error:
            # The CRD's CEL rules reject these on a real API server; older servers and emulators do not.
            return None, st.Problem("InvalidSpec", _readable(error))
        problems = unsupported(body["metadata"]["name"], spec)
        if problems:
            return spec, st.Problem("Unsupported", "; ".join(problems))
        if not self.kube.kserve_installed():
            return spec, st.Problem(
                "KServeMissing",
                "KServe is not installed: the API server does not serve "
                f"{ISVC_API_VERSION} {ISVC_PLURAL}; install KServe, the operator retries",
            )
        return spec, None

    def _apply(self, body: Mapping[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
        # A 409 (created or changed by someone else in between) is retried at once, with a fresh read.
        return retry_conflicts(lambda: self._apply_once(body, desired))

    def _apply_once(self, body: Mapping[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
        meta = desired["metadata"]
        ns, name = meta["namespace"], meta["name"]
        current = self.kube.get_inference_service(ns, name)
        if current is None:
            created = self.kube.create_inference_service(desired)
            self.emit(body, "Normal", "Created", f"created InferenceService {name}")
            return created
        patch = drift_patch(_owned_part(current), _owned_part(desired))
        if not patch:
            return current
        patched = self.kube.patch_inference_service(ns, name, patch)
        generation = body["metadata"].get("generation")
        if _applied_generation(body) == generation:
            self.emit(
                body,
                "Warning",
                "DriftReverted",
                f"InferenceService {name} was changed by hand; restored {sorted(_paths(patch))}",
            )
        else:
            self.emit(body, "Normal", "Updated", f"InferenceService {name} updated to generation {generation}")
        return patched

    def _write_status(
        self,
        body: Mapping[str, Any],
        spec: BatchedModelSpec | None,
        problem: st.Problem | None,
        isvc: dict[str, Any] | None,
    ) -> None:
        meta = body["metadata"]
        old = dict(body.get("status") or {})
        conds = st.conditions(
            generation=meta.get("generation"), problem=problem, isvc=isvc, previous=old.get("conditions", [])
        )
        url, _ = st.isvc_urls(isvc)
        new = {
            "observedGeneration": meta.get("generation"),
            "url": url,
            "inferenceService": isvc["metadata"]["name"] if isvc else None,
            "modelNames": ",".join(m.name for m in spec.models) if spec else old.get("modelNames"),
            "conditions": conds,
        }
        if not st.changed(old, new):
            return
        self.kube.patch_batched_model_status(meta["namespace"], meta["name"], new)
        self._announce(body, old.get("conditions", []), conds)

    def _announce(self, body: Mapping[str, Any], before: list[dict[str, Any]], after: list[dict[str, Any]]) -> None:
        """Events for the transitions people care about: Ready flips, Degraded appears or changes reason."""
        was = {c["type"]: c for c in before}
        for cond in after:
            prev = was.get(cond["type"], {})
            flipped = prev.get("status") != cond["status"]
            if cond["type"] == "Ready" and flipped and (cond["status"] == "True" or prev.get("status") == "True"):
                kind = "Normal" if cond["status"] == "True" else "Warning"
                self.emit(body, kind, "Ready" if cond["status"] == "True" else "NotReady", cond["message"])
            if (
                cond["type"] == "Degraded"
                and cond["status"] == "True"
                and (flipped or prev.get("reason") != cond["reason"])
            ):
                self.emit(body, "Warning", cond["reason"], cond["message"])

    # ------------------------------------------------------------------ children

    def on_child_event(self, event_type: str | None, isvc: Mapping[str, Any]) -> None:
        """An owned InferenceService changed: revert drift, recreate it if deleted, surface its readiness."""
        meta = isvc.get("metadata", {})
        ns, owner_name = meta.get("namespace"), meta.get("labels", {}).get(OWNER_LABEL)
        if not ns or not owner_name:
            return
        owner = self.kube.get_batched_model(ns, owner_name)
        if owner is None:
            if event_type != "DELETED" and self.kube.delete_inference_service(ns, meta["name"]):
                logger.info("deleted orphaned InferenceService %s/%s", ns, meta["name"])
            return
        if owner["metadata"].get("deletionTimestamp"):
            return
        self.reconcile(owner)

    def finalize(self, body: Mapping[str, Any]) -> None:
        """The BatchedModel is being deleted: delete its InferenceService (no orphans without a GC)."""
        meta = body["metadata"]
        if self.kube.delete_inference_service(meta["namespace"], meta["name"]):
            self.emit(body, "Normal", "Deleted", f"deleted InferenceService {meta['name']}")

    # ------------------------------------------------------------------ tuned parameters

    def refresh_models(self, body: Mapping[str, Any]) -> None:
        """Read each model's batching parameters in force from the runtime into status.models."""
        meta = body["metadata"]
        try:
            spec = BatchedModelSpec.model_validate(body.get("spec") or {})
        except ValidationError:
            return
        isvc = self.kube.get_inference_service(meta["namespace"], meta["name"])
        ready, _ = st.isvc_ready(isvc)
        _, base_url = st.isvc_urls(isvc)
        if not ready or not base_url:
            return
        old = {m.get("name"): m for m in (body.get("status") or {}).get("models", [])}
        models = []
        for model in spec.models:
            try:
                models.append(st.model_batching(model.name, self.fetch(base_url, model.name)))
            except Exception as error:  # one unreachable model must not hide the others
                logger.warning("reading batching of %s from %s failed: %s", model.name, base_url, error)
                if model.name in old:
                    models.append(old[model.name])
        self.kube.patch_batched_model_status(meta["namespace"], meta["name"], {"models": models})


def _paths(patch: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of a merge patch's leaves, for event messages."""
    out = []
    for key, value in patch.items():
        path = f"{prefix}.{key}" if prefix else key
        out.extend(_paths(value, path) if isinstance(value, Mapping) and value else [path])
    return out
