"""The hosted models of one server: lookup, honest readiness, and the validated path into each batcher.

Protocol front-ends (REST, gRPC, KServe's own dataplane) decode the wire format into `RawInput`s plus
their data, and hand them here; everything from validation on is shared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from batchpilot.spec.model import ModelSpec

from batchpilot.runtime.batching.batcher import Batcher
from batchpilot.runtime.batching.request import Outputs
from batchpilot.runtime.errors import InvalidRequest, ModelNotFound, RequestError, Unavailable
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.protocol.triton_config import model_config_json
from batchpilot.runtime.tensors import RawInput, array_from_bytes, array_from_list, check_complete, check_input

#: An input as decoded from the wire: its description and raw bytes, a JSON list, or the flat numeric
#: array the JSON reader made of that list.
Decoded = tuple[RawInput, "bytes | memoryview | list[Any] | np.ndarray"]


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


@dataclass
class ModelHub:
    metrics: RuntimeMetrics
    models: dict[str, HostedModel] = field(default_factory=dict)

    def add(self, model: HostedModel) -> None:
        self.models[model.name] = model
        self.metrics.model_ready.labels(model=model.name).set(1 if model.ready else 0)

    def get(self, name: str) -> HostedModel:
        model = self.models.get(name)
        if model is None:
            raise ModelNotFound(f"model {name!r} is not hosted here (hosted: {', '.join(sorted(self.models))})")
        return model

    def serving(self, name: str) -> tuple[ModelSpec, Batcher]:
        model = self.get(name)
        if not model.ready:
            raise Unavailable(f"model {name!r} is not ready: {model.error or 'shutting down'}")
        assert model.spec is not None and model.batcher is not None
        return model.spec, model.batcher

    @property
    def ready(self) -> bool:
        """Server readiness: every model finished loading and at least one serves."""
        return any(m.ready for m in self.models.values())

    def build_inputs(self, spec: ModelSpec, batcher: Batcher, decoded: Sequence[Decoded]) -> dict[str, np.ndarray]:
        check_complete(spec, [raw.name for raw, _ in decoded])
        arrays: dict[str, np.ndarray] = {}
        for raw, data in decoded:
            check_input(spec, raw, batcher.max_request_items)
            arrays[raw.name] = (
                array_from_bytes(raw, data) if isinstance(data, (bytes, memoryview)) else array_from_list(raw, data)
            )
        sizes = {a.shape[0] for a in arrays.values()}
        if len(sizes) != 1:
            raise InvalidRequest(f"inputs disagree on the batch dimension: {sorted(sizes)}")
        return {t.name: arrays[t.name] for t in spec.inputs}

    async def infer(
        self, name: str, decoded: Sequence[Decoded], *, priority: int = 0, timeout_us: int | None = None
    ) -> tuple[ModelSpec, Outputs]:
        spec, batcher = self.serving(name)
        try:
            inputs = self.build_inputs(spec, batcher, decoded)
            future = batcher.submit(inputs, priority=priority, timeout_us=timeout_us)
        except RequestError as exc:
            outcome = "rejected" if isinstance(exc, Unavailable) else "invalid"
            self.metrics.requests.labels(model=name, outcome=outcome).inc()
            raise
        return spec, await future

    # -- Triton's extensions, shared by the REST and gRPC front-ends ----------------------------------------
    def triton_config(self, name: str) -> dict[str, Any]:
        spec, batcher = self.serving(name)
        return model_config_json(spec, batcher.max_request_items, round(batcher.params.max_queue_delay_s * 1e6))

    def triton_stats(self, name: str = "") -> list[dict[str, Any]]:
        """One model's statistics, or every loaded model's when `name` is empty (Triton's "all models")."""
        if not name:
            return [m.batcher.stats.to_json(n) for n, m in self.models.items() if m.batcher is not None]
        _, batcher = self.serving(name)
        return [batcher.stats.to_json(name)]
