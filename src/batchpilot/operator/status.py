"""Pure functions that turn observations into the BatchedModel's status (camelCase dicts)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Literal

from batchpilot.spec.batchedmodel import Condition, ModelBatchingStatus
from batchpilot.spec.contracts import BatchingState

#: Condition.message's maxLength in the CRD: a longer message would fail validation, status and all.
MAX_MESSAGE = next(m.max_length for m in Condition.model_fields["message"].metadata if hasattr(m, "max_length"))


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Problem:
    """Why the operator cannot (yet) serve the spec: the Degraded condition's reason and message."""

    reason: str  # InvalidSpec, Unsupported, KServeMissing, ApplyFailed
    message: str


def isvc_ready(isvc: dict[str, Any] | None) -> tuple[bool, str]:
    """KServe's own Ready condition of the InferenceService: (ready, KServe's explanation)."""
    if isvc is None:
        return False, "the InferenceService does not exist yet"
    for cond in isvc.get("status", {}).get("conditions", []):
        if cond.get("type") == "Ready":
            text = cond.get("message") or cond.get("reason") or ""
            return cond.get("status") == "True", text
    return False, "KServe has not reported readiness yet"


def isvc_urls(isvc: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """(public URL for clients, in-cluster URL for the operator's own reads)."""
    status = (isvc or {}).get("status", {})
    public = status.get("url")
    internal = status.get("address", {}).get("url") or public
    return public, internal


def _condition(
    type_: str, ok: bool, reason: str, message: str, generation: int | None, previous: list[dict[str, Any]]
) -> dict[str, Any]:
    status: Literal["True", "False"] = "True" if ok else "False"
    before = next((c for c in previous if c.get("type") == type_), {})
    # The transition time moves only when the status flips (as metav1.Condition prescribes).
    since = before.get("lastTransitionTime") if before.get("status") == status else None
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    cond = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since or now(),
        observed_generation=generation,
    )
    return cond.model_dump(mode="json", by_alias=True, exclude_none=True)


def conditions(
    *, generation: int | None, problem: Problem | None, isvc: dict[str, Any] | None, previous: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Ready, Reconciled and Degraded for one observation."""
    ready, why = isvc_ready(isvc)
    if problem is not None:
        ready_reason, ready_msg = "NotReconciled", problem.message
        ready = False
    elif ready:
        ready_reason, ready_msg = "InferenceServiceReady", why or "KServe reports the InferenceService ready"
    else:
        ready_reason, ready_msg = "InferenceServiceNotReady", why
    return [
        _condition("Ready", ready, ready_reason, ready_msg, generation, previous),
        _condition(
            "Reconciled",
            problem is None,
            "Applied" if problem is None else problem.reason,
            "the InferenceService matches the spec" if problem is None else problem.message,
            generation,
            previous,
        ),
        _condition(
            "Degraded",
            problem is not None,
            "AsExpected" if problem is None else problem.reason,
            "" if problem is None else problem.message,
            generation,
            previous,
        ),
    ]


def model_batching(name: str, payload: BatchingState | dict[str, Any]) -> dict[str, Any]:
    """One model's entry of status.models from the runtime's GET /v2/models/{m}/batching."""
    state = payload if isinstance(payload, BatchingState) else BatchingState.model_validate(payload)
    entry = ModelBatchingStatus(
        name=name,
        max_batch_size=state.max_batch_size,
        max_queue_delay_microseconds=state.max_queue_delay_microseconds,
        autotune=state.autotune.enabled,
        latency_slo_p99_ms=state.autotune.latency_slo_p99_ms,
        slo_feasible=state.autotune.slo_feasible,
        autotune_changes=state.autotune.changes,
        recent_p99_ms=state.recent.p99_ms,
        recent_throughput_rps=state.recent.throughput_rps,
        updated=now(),
    )
    return entry.model_dump(mode="json", by_alias=True, exclude_none=True)


def changed(current: dict[str, Any], update: dict[str, Any]) -> bool:
    """Whether merging `update` into `current` (top-level keys) changes anything."""
    return any(current.get(key) != value for key, value in update.items())
