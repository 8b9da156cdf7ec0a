"""Extra benchmark models, written as BatchPilot model repositories (TorchScript + config.yaml)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from batchpilot.runtime.demo_models import write_model
from batchpilot.spec.model import ModelSpec


class Trivial(nn.Module):
    """Almost no compute: what is measured is the serving stack."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1.0


class BigImageProbe(nn.Module):
    """A 1x3x224x224 FP32 input reduced cheaply to 8 numbers: the request size dominates, not the model."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(4)
        self.fc = nn.Linear(3 * 16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(x).flatten(1))


def trivial_spec() -> ModelSpec:
    return ModelSpec.model_validate(
        {
            "name": "trivial",
            "type": "cv",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [4]}],
            "batching": {"max_batch_size": 64, "max_queue_delay_microseconds": 0},
        }
    )


def image224_spec() -> ModelSpec:
    return ModelSpec.model_validate(
        {
            "name": "image224",
            "type": "cv",
            "inputs": [{"name": "image", "datatype": "FP32", "shape": [3, 224, 224]}],
            "outputs": [{"name": "features", "datatype": "FP32", "shape": [8]}],
            "batching": {"max_batch_size": 16, "max_queue_delay_microseconds": 0},
        }
    )


def write_bench_models(repository: Path) -> None:
    torch.manual_seed(0)
    write_model(repository, trivial_spec(), Trivial())
    write_model(repository, image224_spec(), BigImageProbe().eval())
