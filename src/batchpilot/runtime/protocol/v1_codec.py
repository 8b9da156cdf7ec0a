"""KServe v1 `:predict`: {"instances": [...]} in, {"predictions": [...]} out.

An instance is one item: a nested list for a single-input model, or an object keyed by input name.
The model's kind groups instances into requests (an NLP model queues each sequence on its own, so the
batcher can group it with others of similar length).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.kinds import kind_for
from batchpilot.runtime.tensors import Decoded
from batchpilot.spec.model import ModelSpec

MAX_INSTANCES = 4096


def decode(spec: ModelSpec, body: bytes) -> list[list[Decoded]]:
    """One request (list of decoded inputs) per group of instances that is queued together."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    instances = doc.get("instances") if isinstance(doc, dict) else None
    if not isinstance(instances, list) or not instances:
        raise InvalidRequest("v1 requests need a non-empty 'instances' list")
    if len(instances) > MAX_INSTANCES:
        raise InvalidRequest(f"{len(instances)} instances exceed the limit of {MAX_INSTANCES}")
    per_input: dict[str, list[Any]] = {t.name: [] for t in spec.inputs}
    for instance in instances:
        if len(spec.inputs) == 1 and not isinstance(instance, dict):
            instance = {spec.inputs[0].name: instance}
        if not isinstance(instance, dict) or set(instance) != set(per_input):
            raise InvalidRequest(f"each instance must give exactly the inputs {sorted(per_input)}")
        for name, value in instance.items():
            per_input[name].append(value)
    return kind_for(spec).v1_groups(per_input)


def encode(spec: ModelSpec, results: list[dict[str, np.ndarray]]) -> bytes:
    predictions: list[Any] = []
    for outputs in results:
        n = next(iter(outputs.values())).shape[0]
        for i in range(n):
            if len(outputs) == 1:
                predictions.append(next(iter(outputs.values()))[i])
            else:
                predictions.append({name: a[i] for name, a in outputs.items()})
    return orjson.dumps({"predictions": predictions}, option=orjson.OPT_SERIALIZE_NUMPY)
