"""Model kinds: the registry picks one by `ModelSpec.type`, and a new kind is one class plus one registry line.

The "tabular" kind below is defined here only, to show what adding a kind takes: rows of a fixed number of
features, every request of the model batched together (no variable dimension is allowed), and v1
instances queued one request per row.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from batchpilot.runtime import kinds
from batchpilot.runtime.batching.batcher import Batcher
from batchpilot.runtime.batching.executor import Executor
from batchpilot.runtime.batching.policy import LengthGroupPolicy, StackPolicy
from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.kinds.base import StackedKind
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.tensors import Decoded, RawInput
from batchpilot.spec.model import ModelSpec


class TabularKind(StackedKind):
    """Fixed-width feature rows; a v1 instance is one row, queued on its own."""

    name: ClassVar[str] = "tabular"

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        if any(-1 in t.shape for t in spec.inputs):
            raise ValueError(f"tabular model {spec.name!r}: every feature dimension must be fixed")

    def v1_groups(self, per_input: dict[str, list[Any]]) -> list[list[Decoded]]:
        return [
            [
                (RawInput(t.name, t.datatype, (1, len(row))), [row])
                for t, row in zip(self.spec.inputs, rows, strict=True)
            ]
            for rows in zip(*(per_input[t.name] for t in self.spec.inputs), strict=True)
        ]


kinds.register(TabularKind.name, TabularKind)  # the one registry line


def tabular_spec() -> ModelSpec:
    # `type` is a closed set in the CRD (cv, nlp): a test kind is named on a validated spec's copy.
    spec = ModelSpec.model_validate(
        {
            "name": "credit",
            "type": "cv",
            "inputs": [{"name": "features", "datatype": "FP32", "shape": [3]}],
            "outputs": [{"name": "score", "datatype": "FP32", "shape": [1]}],
            "batching": {"max_batch_size": 8, "max_queue_delay_microseconds": 20_000},
        }
    )
    return spec.model_copy(update={"type": "tabular"})


class Score(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        self.batches.append(features.shape[0])
        return features.sum(dim=1, keepdim=True)


def test_registry_picks_the_kind_by_type() -> None:
    cv = ModelSpec.model_validate(
        {
            "name": "img",
            "type": "cv",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [3, -1]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}],
        }
    )
    nlp = cv.model_copy(update={"type": "nlp"})
    assert isinstance(kinds.kind_for(cv), kinds.CvKind)
    assert isinstance(kinds.kind_for(cv).batch_policy(), StackPolicy)
    assert isinstance(kinds.kind_for(nlp).batch_policy(), LengthGroupPolicy)
    assert isinstance(kinds.kind_for(tabular_spec()), TabularKind)
    with pytest.raises(ValueError, match="unknown model type"):
        kinds.kind_for(cv.model_copy(update={"type": "audio"}))


def test_tabular_kind_groups_v1_instances_one_row_each() -> None:
    groups = kinds.kind_for(tabular_spec()).v1_groups({"features": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]})
    assert [[raw.shape for raw, _ in g] for g in groups] == [[(1, 3)], [(1, 3)]]
    assert kinds.kind_for(tabular_spec()).example_inputs(2)[0].shape == (2, 3)


async def test_tabular_kind_is_served_through_the_batcher() -> None:
    spec = tabular_spec()
    module = Score()
    batcher = Batcher(spec, Executor(spec, module, torch.device("cpu")), RuntimeMetrics(CollectorRegistry()))
    rows = [np.full((1, 3), i, dtype=np.float32) for i in range(6)]
    outs = await asyncio.gather(*(batcher.submit({"features": r}) for r in rows))
    assert [float(o["score"][0, 0]) for o in outs] == [3.0 * i for i in range(6)]
    assert module.batches == [6]  # one batch: every row has the same shape
    assert batcher.batching_state().to_json()["max_batch_size"] == 8
    await batcher.drain()


def test_nlp_kind_refuses_sequences_over_max_length() -> None:
    spec = ModelSpec.model_validate(
        {
            "name": "tok",
            "type": "nlp",
            "inputs": [{"name": "ids", "datatype": "INT64", "shape": [-1]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}],
            "sequence": {"max_length": 4},
        }
    )
    with pytest.raises(InvalidRequest, match="exceeds max_length"):
        kinds.kind_for(spec).check_input(RawInput("ids", "INT64", (1, 5)))
