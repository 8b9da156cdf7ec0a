"""What crosses the process boundary between the runtime and the operator, defined once.

- `BATCHPILOT_MODEL_SPECS`: the environment variable through which the operator hands the runtime its
  ModelSpecs (a JSON list, camelCase).
- `SUBPATHS_ENV`: `BATCHPILOT_MODEL_SUBPATHS`, where each model's files sit inside its mount when storage
  mounts a whole volume: KServe (0.20, `storageUris`) mounts the root of a `pvc://claim/path` claim, not
  `path`, so the operator says `{model: path}` and the runtime looks there first.
- `WEIGHT_FILES`: the file each model format is read from in a model folder.
- `ISVC_*`: the KServe InferenceService the operator writes and the runtime is served by.
- `BatchingState`: the JSON of the runtime's `GET /v2/models/{m}/batching`, produced by the runtime's
  batchers and parsed by the operator into `status.models`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

SPECS_ENV = "BATCHPILOT_MODEL_SPECS"
SUBPATHS_ENV = "BATCHPILOT_MODEL_SUBPATHS"

WEIGHT_FILES: dict[Literal["torchscript", "torch_export"], str] = {
    "torchscript": "model.pt",
    "torch_export": "model.pt2",
}

ISVC_GROUP = "serving.kserve.io"
ISVC_VERSION = "v1beta1"
ISVC_PLURAL = "inferenceservices"
ISVC_API_VERSION = f"{ISVC_GROUP}/{ISVC_VERSION}"


class _Wire(BaseModel):
    # A newer runtime may report more: the operator reads what it knows and ignores the rest.
    model_config = ConfigDict(extra="ignore")


class LatencyModel(_Wire):
    """The autotuner's fit of batch latency: d(n) = a * n + b."""

    a_ms_per_item: float
    b_ms: float


class PlanState(_Wire):
    """The queue model's reading of the load and its prediction for the setting in force, beside what
    that setting measured (its latest measurement epoch)."""

    load: Literal["closed-loop", "open-loop"]
    arrival_rate: float
    clients: int | None = None  # closed loop: the population
    think_ms: float | None = None  # closed loop: a client's time outside the server per round trip
    frontend_cpu_ms: float | None = None  # one core: front-end CPU per item (beyond every executor), charged
    background_cpu: float | None = None  # one core: share of the core other models took, left out of this one's
    planned_beside: list[str] = []  # one core: the other models whose closed loops the plan simulated with this one
    feasible: bool
    predicted_items_per_s: float | None = None
    predicted_p99_ms: float | None = None
    measured_items_per_s: float | None = None
    measured_p99_ms: float | None = None


class AutotuneState(_Wire):
    """Whether the autotuner runs and, when it does, what it concluded."""

    enabled: bool | None = None
    latency_slo_p99_ms: float | None = None
    slo_feasible: bool | None = None
    latency_model: LatencyModel | None = None  # wall time per batch
    cpu_latency_model: LatencyModel | None = None  # the executor's CPU per batch (one core: what plans price)
    alone_latency_model: LatencyModel | None = None  # wall time per batch as the model ran alone at load
    changes: int | None = None
    plan: PlanState | None = None


class RecentState(_Wire):
    """Latency and throughput over the last `window_s` seconds."""

    window_s: float | None = None
    p99_ms: float | None = None
    throughput_rps: float | None = None
    items_per_s: float | None = None


class BatchingState(_Wire):
    """`GET /v2/models/{m}/batching`: the batching parameters in force and how they perform.

    The runtime fills every field; `to_json()` leaves out what it did not set (the autotuner's figures
    when the autotuner is off), which keeps the JSON documented in docs/design.md.
    """

    model: str | None = None
    batching: bool | None = None
    max_batch_size: int | None = None
    max_queue_delay_microseconds: int | None = None
    max_padding_waste: float | None = None  # NLP with the autotuner on: the length grouping's budget in force
    queue_depth: int | None = None
    autotune: AutotuneState = AutotuneState()
    recent: RecentState = RecentState()

    def to_json(self) -> dict[str, object]:
        return self.model_dump(mode="json", exclude_unset=True)
