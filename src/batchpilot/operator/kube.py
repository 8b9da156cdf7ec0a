"""The few Kubernetes API calls the operator makes besides kopf's own (see rbac.OPERATOR_RULES).

Blocking calls of the official client: kopf runs sync handlers in its thread pool.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

import kubernetes
from kubernetes.client import ApiClient, CustomObjectsApi
from kubernetes.client.rest import ApiException

from batchpilot.spec import batchedmodel as bm
from batchpilot.spec.contracts import ISVC_GROUP, ISVC_PLURAL, ISVC_VERSION

MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT_S = 10.0
CONFLICT_ATTEMPTS = 3

logger = logging.getLogger("batchpilot.operator")
T = TypeVar("T")


def retry_conflicts(call: Callable[[], T], attempts: int = CONFLICT_ATTEMPTS) -> T:
    """Run `call` again when the API server answers 409 Conflict (someone wrote in between), at most
    `attempts` times in all. `call` must read afresh what it writes, or write something idempotent."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except ApiException as error:
            if error.status != 409 or attempt == attempts:
                raise
            logger.info("conflicting write (attempt %d of %d), retrying: %s", attempt, attempts, error.reason)
    raise AssertionError("unreachable")


def client_from_environment() -> ApiClient:
    """In-cluster service account, else KUBECONFIG / ~/.kube/config, as kubectl finds the cluster."""
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        # Read KUBECONFIG now: the client library's default was frozen when it was imported.
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=config)
    return ApiClient(configuration=config)


class Kube:
    """BatchedModels and their InferenceServices."""

    def __init__(self, client: ApiClient) -> None:
        self._api = CustomObjectsApi(client)

    def kserve_installed(self) -> bool:
        """Whether the cluster serves InferenceServices (KServe's CRD is installed)."""
        try:
            found = self._api.get_api_resources(ISVC_GROUP, ISVC_VERSION, _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return any(r.name == ISVC_PLURAL for r in found.resources)

    # --- BatchedModels

    def get_batched_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(bm.API_GROUP, bm.API_VERSION, bm.PLURAL, namespace, name)

    def patch_batched_model_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        # A merge patch without a resourceVersion is idempotent: a conflict is retried as it is.
        retry_conflicts(
            lambda: self._api.patch_namespaced_custom_object_status(
                bm.API_GROUP,
                bm.API_VERSION,
                namespace,
                bm.PLURAL,
                name,
                {"status": status},
                _content_type=MERGE_PATCH,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        )

    # --- InferenceServices

    def get_inference_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(ISVC_GROUP, ISVC_VERSION, ISVC_PLURAL, namespace, name)

    def create_inference_service(self, body: dict[str, Any]) -> dict[str, Any]:
        namespace = body["metadata"]["namespace"]
        return self._api.create_namespaced_custom_object(  # type: ignore[return-value]
            ISVC_GROUP, ISVC_VERSION, namespace, ISVC_PLURAL, body, _request_timeout=REQUEST_TIMEOUT_S
        )

    def patch_inference_service(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._api.patch_namespaced_custom_object(  # type: ignore[return-value]
            ISVC_GROUP,
            ISVC_VERSION,
            namespace,
            ISVC_PLURAL,
            name,
            patch,
            _content_type=MERGE_PATCH,
            _request_timeout=REQUEST_TIMEOUT_S,
        )

    def delete_inference_service(self, namespace: str, name: str) -> bool:
        """Delete it; False when it was already gone."""
        try:
            self._api.delete_namespaced_custom_object(
                ISVC_GROUP, ISVC_VERSION, namespace, ISVC_PLURAL, name, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def _get(self, group: str, version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._api.get_namespaced_custom_object(  # type: ignore[return-value]
                group, version, namespace, plural, name, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
