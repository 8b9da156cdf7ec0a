"""Run the operator in this process: `run_operator(...)`, used by `batchpilot operator`."""

from __future__ import annotations

import asyncio
import logging

import kopf

from batchpilot.operator.handlers import post_event, register
from batchpilot.operator.kube import Kube, client_from_environment
from batchpilot.operator.reconcile import Reconciler


def build_registry(
    reconciler: Reconciler, *, refresh_interval_s: float = 30.0, retry_delay_s: float = 30.0
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    register(registry, reconciler, refresh_interval_s=refresh_interval_s, retry_delay_s=retry_delay_s)
    return registry


def run_operator(
    namespace: str | None = None,
    *,
    all_namespaces: bool = False,
    liveness_endpoint: str | None = None,
    standalone: bool = False,
    refresh_interval_s: float = 30.0,
    json_logs: bool = True,
) -> None:
    """Serve BatchedModels of one namespace, or of all (`all_namespaces`), until interrupted.

    The cluster is found as kubectl finds it: in-cluster service account, else KUBECONFIG.
    `liveness_endpoint` (e.g. http://0.0.0.0:8080/healthz) serves kopf's health probe;
    `standalone` skips kopf's peering (leader hand-over between replicas).
    """
    if (namespace is None) == (not all_namespaces):
        raise ValueError("give exactly one of namespace or all_namespaces")
    # kopf's handler alone on the root logger: another one (the CLI's basicConfig) would print every line twice,
    # once not as JSON.
    logging.getLogger().handlers.clear()
    kopf.configure(log_format=kopf.LogFormat.JSON if json_logs else kopf.LogFormat.FULL)
    reconciler = Reconciler(Kube(client_from_environment()), emit=post_event)
    registry = build_registry(reconciler, refresh_interval_s=refresh_interval_s)
    asyncio.run(
        kopf.operator(
            registry=registry,
            clusterwide=all_namespaces,
            namespaces=[namespace] if namespace else [],
            liveness_endpoint=liveness_endpoint,
            standalone=standalone,
        )
    )
