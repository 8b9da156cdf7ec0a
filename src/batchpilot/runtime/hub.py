"""The data plane: every model of one server and every question a protocol front-end can ask about them.

Transport-neutral, as KServe's DataPlane: server and model metadata, readiness, the server's extensions,
Triton's model configuration and statistics, the `/batching` state, and inference with the requested
outputs. Each front-end (REST: protocol/rest.py, gRPC: protocol/grpc_frontend.py) decodes the wire
format into `RawInput`s plus their data (protocol/*_codec.py), asks here, and encodes the answer.
Nothing here imports a front-end or a codec.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from batchpilot import __version__
from batchpilot.runtime.batching.batcher import Batcher
from batchpilot.runtime.batching.request import Outputs
from batchpilot.runtime.errors import InvalidRequest, ModelNotFound, ModelNotLoaded, RequestError, Unavailable
from batchpilot.runtime.kinds import kind_for
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.tensors import (
    Decoded,
    array_from_bytes,
    array_from_list,
    check_complete,
    check_input,
    select_outputs,
)
from batchpilot.runtime.triton_config import model_config_json
from batchpilot.spec.contracts import BatchingState
from batchpilot.spec.model import ModelSpec, TensorSpec

SERVER_NAME = "batchpilot"
SERVER_EXTENSIONS = ["model_configuration", "statistics", "binary_tensor_data", "batching", "model_repository"]


class Limits(Protocol):
    """What validation reads from a batcher."""

    @property
    def max_request_items(self) -> int: ...


@dataclass
class HostedModel:
    name: str
    spec: ModelSpec | None
    batcher: Batcher | None
    error: str | None = None  # why it is not serving, when it is not

    @property
    def ready(self) -> bool:
        b = self.batcher
        return b is not None and self.error is None and not b.draining and not b.hung


def _tensor_metadata(tensors: Sequence[TensorSpec]) -> list[dict[str, Any]]:
    return [{"name": t.name, "datatype": t.datatype, "shape": [-1, *t.shape]} for t in tensors]


@dataclass
class ModelHub:
    metrics: RuntimeMetrics
    models: dict[str, HostedModel] = field(default_factory=dict)
    #: time.monotonic() of the last inference request, answered or refused (the shutdown waits for quiet).
    last_request_at: float = 0.0

    def add(self, model: HostedModel) -> None:
        self.models[model.name] = model
        self.metrics.model_ready.labels(model=model.name).set(1 if model.ready else 0)

    def get(self, name: str) -> HostedModel:
        model = self.models.get(name)
        if model is None:
            raise ModelNotFound(f"model {name!r} is not hosted here (hosted: {', '.join(sorted(self.models))})")
        return model

    def spec(self, name: str) -> ModelSpec:
        """The model's spec; refused when its configuration could not be read."""
        model = self.get(name)
        if model.spec is None:
            raise ModelNotLoaded(f"model {name!r} has no valid configuration: {model.error}")
        return model.spec

    def serving(self, name: str) -> tuple[ModelSpec, Batcher]:
        model = self.get(name)
        if not model.ready:
            raise Unavailable(f"model {name!r} is not ready: {model.error or 'shutting down'}")
        assert model.spec is not None and model.batcher is not None
        return model.spec, model.batcher

    # -- metadata and readiness ------------------------------------------------------------------------------
    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": SERVER_EXTENSIONS}

    def model_metadata(self, name: str) -> dict[str, Any]:
        spec = self.spec(name)
        return {
            "name": spec.name,
            "versions": ["1"],
            "platform": "pytorch_libtorch",
            "inputs": _tensor_metadata(spec.inputs),
            "outputs": _tensor_metadata(spec.outputs),
        }

    @property
    def ready(self) -> bool:
        """Server readiness: every model finished loading and at least one serves."""
        return any(m.ready for m in self.models.values())

    def readiness(self) -> dict[str, bool]:
        """Each model's readiness."""
        return {name: m.ready for name, m in self.models.items()}

    def model_readiness(self, name: str) -> tuple[bool, str | None]:
        """Whether the model serves, and why not when it does not."""
        model = self.get(name)
        return model.ready, model.error

    # -- inference ------------------------------------------------------------------------------------------
    def build_inputs(self, spec: ModelSpec, limits: Limits, decoded: Sequence[Decoded]) -> dict[str, np.ndarray]:
        check_complete(spec, [raw.name for raw, _ in decoded])
        kind = getattr(limits, "kind", None) or kind_for(spec)  # a batcher holds its model's kind
        arrays: dict[str, np.ndarray] = {}
        for raw, data in decoded:
            check_input(spec, raw, limits.max_request_items)
            kind.check_input(raw)
            arrays[raw.name] = (
                array_from_bytes(raw, data) if isinstance(data, (bytes, memoryview)) else array_from_list(raw, data)
            )
        sizes = {a.shape[0] for a in arrays.values()}
        if len(sizes) != 1:
            raise InvalidRequest(f"inputs disagree on the batch dimension: {sorted(sizes)}")
        return {t.name: arrays[t.name] for t in spec.inputs}

    async def infer(
        self,
        name: str,
        decoded: Sequence[Decoded],
        *,
        outputs: list[str] | None = None,
        priority: int = 0,
        timeout_us: int | None = None,
    ) -> tuple[ModelSpec, Outputs]:
        """Run one request; the answer holds the requested outputs (all when none are named), in that order.
        Unknown outputs are refused before anything is queued."""
        self.last_request_at = time.monotonic()
        names = select_outputs(self.spec(name), outputs)
        spec, batcher = self.serving(name)
        try:
            inputs = self.build_inputs(spec, batcher, decoded)
            future = batcher.submit(inputs, priority=priority, timeout_us=timeout_us)
        except RequestError as exc:
            outcome = "rejected" if isinstance(exc, Unavailable) else "invalid"
            self.metrics.requests.labels(model=name, outcome=outcome).inc()
            raise
        result = await future
        return spec, {n: result[n] for n in names}

    # -- extensions: Triton's model configuration and statistics, BatchPilot's batching state ------------------
    def triton_config(self, name: str) -> dict[str, Any]:
        spec, batcher = self.serving(name)
        return model_config_json(spec, batcher.max_request_items, round(batcher.params.max_queue_delay_s * 1e6))

    def triton_stats(self, name: str = "") -> list[dict[str, Any]]:
        """One model's statistics, or every loaded model's when `name` is empty (Triton's "all models")."""
        if not name:
            return [m.batcher.stats.to_json(n) for n, m in self.models.items() if m.batcher is not None]
        _, batcher = self.serving(name)
        return [batcher.stats.to_json(name)]

    def batching(self, name: str) -> BatchingState:
        _, batcher = self.serving(name)
        return batcher.batching_state()
