"""Spec types: the one source of truth for model config files and the BatchedModel CRD, and the contracts between
the runtime and the operator (spec.contracts)."""

from batchpilot.spec.batchedmodel import (
    BatchedModelEntry,
    BatchedModelSpec,
    BatchedModelStatus,
    Condition,
    ModelBatchingStatus,
    ReplicaRange,
    RuntimeResources,
)
from batchpilot.spec.contracts import SPECS_ENV, WEIGHT_FILES, AutotuneState, BatchingState, RecentState
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
    "SPECS_ENV",
    "WEIGHT_FILES",
    "AutotuneBounds",
    "AutotuneSpec",
    "AutotuneState",
    "BatchedModelEntry",
    "BatchedModelSpec",
    "BatchedModelStatus",
    "BatchingSpec",
    "BatchingState",
    "Condition",
    "ModelBatchingStatus",
    "ModelSpec",
    "QueuePolicy",
    "RecentState",
    "ReplicaRange",
    "RuntimeResources",
    "SequenceSpec",
    "SpecModel",
    "TensorSpec",
]
