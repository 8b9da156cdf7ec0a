"""Spec types: the one source of truth for model config files and the BatchedModel CRD."""

from batchpilot.spec.batchedmodel import (
    BatchedModelEntry,
    BatchedModelSpec,
    BatchedModelStatus,
    Condition,
    ModelBatchingStatus,
    ReplicaRange,
    RuntimeResources,
)
from batchpilot.spec.model import (
    AutotuneBounds,
    AutotuneSpec,
    BatchingSpec,
    ModelSpec,
    QueuePolicy,
    SequenceSpec,
    SpecModel,
    TensorSpec,
)

__all__ = [
    "AutotuneBounds", "AutotuneSpec", "BatchedModelEntry", "BatchedModelSpec", "BatchedModelStatus",
    "BatchingSpec", "Condition", "ModelBatchingStatus", "ModelSpec", "QueuePolicy", "ReplicaRange",
    "RuntimeResources", "SequenceSpec", "SpecModel", "TensorSpec",
]
