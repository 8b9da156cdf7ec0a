"""The BatchedModel custom resource: spec (what the user asks for) and status (what the operator reports).

The CRD's openAPIV3Schema is generated from these types (`python -m batchpilot.operator.crdgen`), so a
field added here appears in the CRD and is understood by the operator at once. Cross-field rules live in
the pydantic validators; the CRD carries the same rules as CEL (see `batchpilot.operator.crdgen`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema, model_validator

from batchpilot.spec.model import ModelSpec, SpecModel

API_GROUP = "batchpilot.io"
API_VERSION = "v1alpha1"
KIND = "BatchedModel"
PLURAL = "batchedmodels"
SINGULAR = "batchedmodel"
SHORT_NAMES = ("bm",)

#: Kubernetes resource.Quantity syntax ("2", "500m", "16Gi", "1e3").
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
#: DNS-1123 label: names of ServingRuntimes and ClusterServingRuntimes.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def _quantity_to_str(value: object) -> object:
    # YAML users write `cpu: 2` as often as `cpu: "2"`; Kubernetes accepts both (int-or-string).
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


#: A Kubernetes quantity; an int-or-string in the CRD exactly like core resource fields.
Quantity = Annotated[
    str,
    BeforeValidator(_quantity_to_str),
    Field(pattern=QUANTITY_PATTERN, max_length=64),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]

DeploymentMode = Literal["Standard", "RawDeployment", "Knative", "Serverless"]


class BatchedModelEntry(ModelSpec):
    """One model of a BatchedModel: its ModelSpec plus where its files are."""

    storage_uri: str = Field(
        min_length=1,
        max_length=2048,
        pattern=r"^[A-Za-z][A-Za-z0-9+.-]*://\S+$",
        description="Folder holding model.pt or model.pt2 (any scheme KServe's storage initializer takes: "
        "s3://, gs://, pvc://, hf://, https://, ...). Mounted at /mnt/models/<name>.",
    )


class RuntimeResources(SpecModel):
    """Resources of one runtime replica (all models share it)."""

    gpus: int = Field(default=0, ge=0, le=16, description="NVIDIA GPUs per replica (nvidia.com/gpu).")
    cpu: Quantity = Field(default="1", description="CPU request and limit per replica.")
    memory: Quantity = Field(default="2Gi", description="Memory request and limit per replica.")


class ReplicaRange(SpecModel):
    """How far KServe may scale the runtime."""

    min: int = Field(default=1, ge=0, le=1000, description="Fewest replicas (0 allows scale to zero where supported).")
    max: int = Field(default=1, ge=1, le=1000, description="Most replicas.")

    @model_validator(mode="after")
    def _ordered(self) -> ReplicaRange:
        if self.min > self.max:
            raise ValueError(f"replicas: min ({self.min}) must not exceed max ({self.max})")
        return self


class BatchedModelSpec(SpecModel):
    """Models served together by one BatchPilot runtime, with a dynamic batcher each."""

    models: list[BatchedModelEntry] = Field(min_length=1, max_length=32, description="The hosted models.")
    resources: RuntimeResources = Field(default_factory=RuntimeResources)
    replicas: ReplicaRange = Field(default_factory=ReplicaRange)
    deployment_mode: DeploymentMode = Field(
        default="Standard",
        description="KServe deployment mode: Standard (alias RawDeployment) or Knative (alias Serverless).",
    )
    runtime: str = Field(
        default="batchpilot",
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description="ServingRuntime or ClusterServingRuntime to run the models with.",
    )

    @model_validator(mode="after")
    def _unique_names(self) -> BatchedModelSpec:
        names = [m.name for m in self.models]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"model names must be unique, repeated: {duplicates}")
        return self


# ---------------------------------------------------------------------------------------------- status

ConditionType = Literal["Ready", "Reconciled", "Degraded"]


class Condition(SpecModel):
    """A Kubernetes-style condition (metav1.Condition's fields)."""

    type: str = Field(max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(default="", max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: str | None = Field(default=None, description="RFC 3339 time of the last status change.")
    observed_generation: int | None = Field(default=None, ge=0)


class ModelBatchingStatus(SpecModel):
    """Batching parameters in force for one model, as the runtime reports them."""

    name: str
    max_batch_size: int | None = None
    max_queue_delay_microseconds: int | None = None
    autotune: bool | None = Field(default=None, description="Whether the autotuner moves the parameters.")
    latency_slo_p99_ms: float | None = None
    slo_feasible: bool | None = None
    autotune_changes: int | None = None
    recent_p99_ms: float | None = None
    recent_throughput_rps: float | None = None
    updated: str | None = Field(default=None, description="RFC 3339 time the runtime was last read.")


class BatchedModelStatus(SpecModel):
    """What the operator observed."""

    observed_generation: int | None = None
    url: str | None = Field(default=None, description="Where clients call the models (KServe's URL).")
    inference_service: str | None = Field(default=None, description="Name of the child InferenceService.")
    model_names: str | None = Field(default=None, description="Comma-separated model names (for kubectl get).")
    conditions: list[Condition] = Field(default_factory=list)
    models: list[ModelBatchingStatus] = Field(default_factory=list)
