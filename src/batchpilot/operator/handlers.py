"""kopf wiring: which events call which part of the Reconciler.

Handlers go into a registry passed in (not kopf's global one), so a process or a test can run an
operator with its own Reconciler (API client, HTTP fetcher) and timings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import kopf
import urllib3.exceptions
from kubernetes.client.rest import ApiException

from batchpilot.operator.mapping import OWNER_LABEL
from batchpilot.operator.reconcile import Reconciler
from batchpilot.spec import batchedmodel as bm
from batchpilot.spec.contracts import ISVC_GROUP, ISVC_PLURAL, ISVC_VERSION

logger = logging.getLogger("batchpilot.operator")

BATCHED_MODELS: dict[str, Any] = {"group": bm.API_GROUP, "version": bm.API_VERSION, "plural": bm.PLURAL}
INFERENCE_SERVICES: dict[str, Any] = {"group": ISVC_GROUP, "version": ISVC_VERSION, "plural": ISVC_PLURAL}
#: Problems that go away by themselves (KServe installed later, API hiccup): retried with a delay.
RETRYABLE = {"KServeMissing", "ApplyFailed"}


def post_event(obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """Emit through kopf's poster (batched, retried, works from handler threads)."""
    kopf.event(obj, type=type_, reason=reason, message=message[:1024])  # type: ignore[arg-type]


@contextlib.contextmanager
def retried_soon(delay_s: float) -> Iterator[None]:
    """An API error escaping a handler is retried after `delay_s`, not kopf's default minute: an error
    answer, and as much a call that got no answer at all (connection refused, cut before the response,
    timed out). The write may then have been applied: the retry reads afresh and finds it done."""
    try:
        yield
    except ApiException as error:
        raise kopf.TemporaryError(
            f"Kubernetes API call failed: {error.status} {error.reason}", delay=delay_s
        ) from error
    except urllib3.exceptions.HTTPError as error:
        raise kopf.TemporaryError(f"Kubernetes API call got no answer: {error}", delay=delay_s) from error


def register(
    registry: kopf.OperatorRegistry,
    reconciler: Reconciler,
    *,
    refresh_interval_s: float = 30.0,
    retry_delay_s: float = 30.0,
) -> None:
    """Attach the operator's handlers to `registry`."""

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # kopf's bookkeeping under our own names; nothing in .status (our schema would prune it).
        settings.persistence.finalizer = f"{bm.API_GROUP}/finalizer"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=bm.API_GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=bm.API_GROUP, key="last-handled-configuration"
        )
        settings.posting.level = logging.INFO

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A fresh registry lacks kopf's default login handlers: find the cluster as kubectl does.
        return kopf.login_via_client(**kwargs)

    @kopf.on.resume(**BATCHED_MODELS, registry=registry)
    @kopf.on.create(**BATCHED_MODELS, registry=registry)
    @kopf.on.update(**BATCHED_MODELS, field="spec", registry=registry)
    def reconcile(body: kopf.Body, **_: Any) -> None:
        with retried_soon(retry_delay_s):
            problem = reconciler.reconcile(body)
        if problem is not None and problem.reason in RETRYABLE:
            raise kopf.TemporaryError(problem.message, delay=retry_delay_s)

    @kopf.on.delete(**BATCHED_MODELS, registry=registry)
    def finalize(body: kopf.Body, **_: Any) -> None:
        with retried_soon(retry_delay_s):
            reconciler.finalize(body)

    @kopf.on.event(**INFERENCE_SERVICES, labels={OWNER_LABEL: kopf.PRESENT}, registry=registry)
    def child_changed(event: kopf.RawEvent, **_: Any) -> None:
        reconciler.on_child_event(event.get("type"), event["object"])

    @kopf.daemon(**BATCHED_MODELS, cancellation_timeout=1.0, registry=registry)
    async def refresh(stopped: kopf.DaemonStopped, body: kopf.Body, **_: Any) -> None:
        # A daemon, not a timer, so that the interval is a run-time setting. It sleeps with
        # asyncio.sleep: kopf 1.45's `stopped.wait(timeout)` leaves a task behind when the daemon is
        # cancelled, whose late TimeoutError kopf then re-raises at operator exit.
        while not stopped:
            try:
                await asyncio.to_thread(reconciler.refresh_models, body)
            except Exception:  # keep refreshing; the next round may succeed
                logger.exception("refreshing batching status of %s failed", body.metadata.name)
            await asyncio.sleep(refresh_interval_s)
