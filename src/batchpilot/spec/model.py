"""Per-model configuration: the model repository's `config.yaml` and the per-model part of the CRD.

These types describe *what* a model is and how it should be batched; they know nothing about the
runtime's internals. Field names follow Triton's model configuration where Triton has the knob
(`max_batch_size`, `max_queue_delay_microseconds`, `preferred_batch_size`, ...), in snake_case in
Python and YAML files, camelCase in Kubernetes manifests (both spellings are accepted).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

#: Open Inference Protocol v2 datatypes the runtime can batch (BYTES/strings are not tensors).
Datatype = Literal[
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
]
TOKEN_DATATYPES = ("INT32", "INT64")

NAME_PATTERN = r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$"
TENSOR_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$"


class SpecModel(BaseModel):
    """Base for every spec type: camelCase aliases, unknown keys rejected, validated on assignment."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_assignment=True)


class TensorSpec(SpecModel):
    """One input or output. `shape` is per item: the batch dimension is implied and never listed."""

    name: str = Field(pattern=TENSOR_NAME_PATTERN, description="Tensor name as clients send it.")
    datatype: Datatype = Field(description="Open Inference Protocol v2 datatype, e.g. FP32 or INT64.")
    shape: list[int] = Field(
        max_length=8,
        description="Shape of one item without the batch dimension; -1 marks a variable dimension.",
    )

    @model_validator(mode="after")
    def _dims(self) -> TensorSpec:
        if any(d == 0 or d < -1 for d in self.shape):
            raise ValueError(f"tensor {self.name!r}: every dimension must be positive or -1")
        return self


class QueuePolicy(SpecModel):
    """Triton's `default_queue_policy`: what happens to requests that wait too long or find the queue full."""

    timeout_action: Literal["REJECT", "DELAY"] = Field(
        default="REJECT",
        description="REJECT fails a request whose timeout expired; DELAY keeps it but serves it after the others.",
    )
    default_timeout_microseconds: int = Field(
        default=0, ge=0, description="Queue timeout of a request that sets none; 0 means no timeout."
    )
    allow_timeout_override: bool = Field(
        default=True, description="Whether a request's `timeout` parameter may lower the default."
    )
    max_queue_size: int = Field(
        default=1024,
        ge=0,
        description="Requests allowed to wait; more are refused at once (HTTP 503 + Retry-After). 0 = unbounded.",
    )


class BatchingSpec(SpecModel):
    """Static batching parameters (the autotuner, when on, moves size and delay within its bounds)."""

    max_batch_size: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="Most items (along dim 0, not requests) in one model call; also the largest request accepted.",
    )
    max_queue_delay_microseconds: int = Field(
        default=2000,
        ge=0,
        le=10_000_000,
        description="How long a batch may wait for company, counted from its first request.",
    )
    preferred_batch_size: list[int] = Field(
        default_factory=list,
        max_length=32,
        description="Batch sizes to release at once when reached (e.g. sizes a compiled model is fast at).",
    )
    priority_levels: int = Field(
        default=0, ge=0, le=16, description="Number of priority levels (1 is highest); 0 disables priorities."
    )
    default_priority_level: int = Field(
        default=0, ge=0, le=16, description="Level of a request that names none (0 = the lowest level)."
    )
    default_queue_policy: QueuePolicy = Field(default_factory=QueuePolicy)
    preserve_ordering: bool = Field(
        default=False, description="Answer requests in arrival order (batches are then formed strictly FIFO)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> BatchingSpec:
        too_big = [s for s in self.preferred_batch_size if s < 1 or s > self.max_batch_size]
        if too_big:
            raise ValueError(f"preferred_batch_size {too_big} must lie in 1..max_batch_size ({self.max_batch_size})")
        if self.default_priority_level > self.priority_levels:
            raise ValueError("default_priority_level must not exceed priority_levels")
        return self


class AutotuneBounds(SpecModel):
    """The box the autotuner searches in."""

    min_batch_size: int = Field(default=1, ge=1, le=4096)
    max_batch_size: int = Field(default=64, ge=1, le=4096)
    min_queue_delay_microseconds: int = Field(default=0, ge=0, le=10_000_000)
    max_queue_delay_microseconds: int = Field(default=10_000, ge=0, le=10_000_000)

    @model_validator(mode="after")
    def _ordered(self) -> AutotuneBounds:
        if self.min_batch_size > self.max_batch_size:
            raise ValueError("autotune bounds: min_batch_size must not exceed max_batch_size")
        if self.min_queue_delay_microseconds > self.max_queue_delay_microseconds:
            raise ValueError(
                "autotune bounds: min_queue_delay_microseconds must not exceed max_queue_delay_microseconds"
            )
        return self


class AutotuneSpec(SpecModel):
    """Online tuning of max batch size and queue delay against a p99 latency objective."""

    enabled: bool = Field(default=False, description="Tune max_batch_size and max_queue_delay online.")
    latency_slo_p99_ms: float = Field(
        default=100.0, gt=0, le=600_000, description="p99 end-to-end latency objective in milliseconds."
    )
    bounds: AutotuneBounds = Field(default_factory=AutotuneBounds)


class SequenceSpec(SpecModel):
    """Variable-length token input of an NLP model: how sequences are grouped and padded."""

    max_length: int = Field(default=512, ge=1, le=1_000_000, description="Longest sequence accepted.")
    pad_value: int = Field(default=0, description="Token id used for padding.")
    max_padding_waste: float = Field(
        default=0.25,
        ge=0.0,
        lt=1.0,
        description="Largest share of padded (wasted) token slots a batch may have when grouping by length.",
    )


class ModelSpec(SpecModel):
    """One hosted model."""

    name: str = Field(pattern=NAME_PATTERN, description="Model name in URLs (lowercase, digits, '-', '_', '.').")
    type: Literal["cv", "nlp"] = Field(
        description="cv: fixed-shape tensors stacked along dim 0; nlp: token sequences grouped by length."
    )
    format: Literal["torchscript", "torch_export"] = Field(
        default="torchscript", description="torchscript: model.pt (torch.jit); torch_export: model.pt2 (torch.export)."
    )
    inputs: list[TensorSpec] = Field(min_length=1, max_length=16)
    outputs: list[TensorSpec] = Field(min_length=1, max_length=16)
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    autotune: AutotuneSpec = Field(default_factory=AutotuneSpec)
    sequence: SequenceSpec = Field(
        default_factory=SequenceSpec, description="NLP models only: sequence length limits and padding."
    )

    @model_validator(mode="after")
    def _coherent(self) -> ModelSpec:
        if ".." in self.name:  # the name is a folder of the model repository: KServe refuses '..' in mount paths
            raise ValueError("a model name must not contain '..' (it names the model's folder)")
        for kind, tensors in (("input", self.inputs), ("output", self.outputs)):
            names = [t.name for t in tensors]
            if len(set(names)) != len(names):
                raise ValueError(f"{kind} names must be unique, got {names}")
        if self.type == "nlp":
            tokens = self.inputs[0]
            if len(self.inputs) != 1 or tokens.datatype not in TOKEN_DATATYPES or tokens.shape != [-1]:
                raise ValueError("an nlp model takes exactly one input: token ids, datatype INT64 or INT32, shape [-1]")
        return self

    @property
    def advertised_max_batch_size(self) -> int:
        """Largest request (in items) accepted: the autotuner's ceiling when it is on."""
        if self.autotune.enabled:
            return max(self.batching.max_batch_size, self.autotune.bounds.max_batch_size)
        return self.batching.max_batch_size
